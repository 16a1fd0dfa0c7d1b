"""The suite's guard against deprecated calls (tests/conftest.py): it blames lmpress for a
deprecation warning only when lmpress's own code made the call."""

from __future__ import annotations

import traceback

from tests.conftest import REPO, lmpress_caller


def frame(path: str, line: int = 1) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, "f")


def test_a_warning_raised_under_lmpress_code_is_lmpress_s():
    stack = [
        frame(str(REPO / "lmpress" / "engines" / "local" / "native" / "scheduling.py"), 140),
        frame("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"),
        frame("/venv/lib/python3.11/site-packages/transformers/utils/deprecation.py"),
    ]
    assert lmpress_caller(stack) == "lmpress/engines/local/native/scheduling.py:140"


def test_a_library_warning_about_itself_while_imported_is_not():
    stack = [
        frame(str(REPO / "lmpress" / "batch" / "cluster" / "connect.py")),
        frame("<frozen importlib._bootstrap>"),
        frame("/venv/lib/python3.11/site-packages/ray/__init__.py"),
    ]
    assert lmpress_caller(stack) is None


def test_a_warning_with_no_lmpress_frame_is_not():
    assert lmpress_caller([frame(str(REPO / "tests" / "test_x.py")), frame("/lib/x.py")]) is None
