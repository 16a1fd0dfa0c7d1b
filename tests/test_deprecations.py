"""The suite's guard against deprecated calls (tests/conftest.py): it blames lmpress for a
deprecation warning only when lmpress's own code made the call."""

from __future__ import annotations

import os
import sysconfig
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


SITE = "/venv/lib/python3.11/site-packages"


def test_a_call_through_the_warning_library_and_torch_modules_is_lmpress_s():
    """lmpress calls transformers' generate, which calls the model through torch's
    Module.__call__ with arguments lmpress passed: the deprecated call is lmpress's."""
    stack = [
        frame(str(REPO / "lmpress" / "engines" / "local" / "native" / "engine.py"), 88),
        frame(f"{SITE}/transformers/generation/utils.py"),
        frame(f"{SITE}/torch/nn/modules/module.py"),
        frame(f"{SITE}/transformers/models/llama/modeling_llama.py"),
        frame(f"{SITE}/transformers/utils/deprecation.py"),
    ]
    assert lmpress_caller(stack) == "lmpress/engines/local/native/engine.py:88"


def test_another_library_s_deprecated_call_under_lmpress_code_is_not():
    """PEFT's get_peft_model asks transformers' deprecated `is_gradient_checkpointing`: PEFT
    made that call, and lmpress (building its test adapters) cannot change it."""
    stack = [
        frame(str(REPO / "lmpress" / "builtin_models" / "lora.py"), 62),
        frame(f"{SITE}/peft/mapping_func.py"),
        frame(f"{SITE}/transformers/modeling_utils.py", 3312),
    ]
    assert lmpress_caller(stack) is None


def test_a_standard_module_s_warning_is_blamed_on_the_lmpress_code_that_called_it():
    stdlib = sysconfig.get_paths()["stdlib"]
    stack = [
        frame(str(REPO / "lmpress" / "serve" / "app.py"), 12),
        frame(os.path.join(stdlib, "asyncio", "base_events.py")),
        frame(os.path.join(stdlib, "asyncio", "events.py")),
    ]
    assert lmpress_caller(stack) == "lmpress/serve/app.py:12"
