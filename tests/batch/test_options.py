"""`lmpress/batch/options.py` and the one dispatch in `batch/run.py`: every option that changes
what the output holds is declared once, reaches the fingerprint (a resume with it changed is
refused), and reaches every runner; the runner is chosen from one field."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from lmpress.batch import BatchMode, BatchOptions, run_batch
from lmpress.batch.job import BatchJob
from lmpress.batch.options import output_fields
from lmpress.batch.rows import RowParser, RowReader
from lmpress.batch.run import RUNNERS, batch_mode
from lmpress.configs import load_config
from lmpress.data.columns import RowMapping
from lmpress.data.jsonl import Line
from lmpress.data.resume import JobFiles, check_fingerprint, fingerprint, write_fingerprint
from lmpress.data.row_shapes import OutputShape
from lmpress.vocabulary.errors import ConfigError, InputError
from tests.plugins.lmpress_echo import EchoEngine

# A value other than the default for each option that changes the output. A new such option
# fails `test_every_output_option_has_another_value_here` until it is added here, and then
# every test below covers it.
OTHER = {
    "shard": (1, 2),
    "output_shape": OutputShape.OPENAI,
    "mapping": RowMapping(system="Answer in French."),
    "strict_model": True,
}
# Options that change how the job runs, not what it writes: a resume may change them.
NOT_OUTPUT = {"limit": 1, "ordered": True, "max_errors": 3, "grace_s": 1.0, "seed": 7}


def config(engine: str = "NATIVE"):
    """A config the ECHO engine (tests/plugins) runs in place of the engine named."""
    return load_config(None, {"generation.max_new_tokens": 8}, engine=engine)


def rows(tmp_path, n: int = 4):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"q{i}"}) + "\n" for i in range(n)))
    return src


def run(cfg, options: BatchOptions):
    return asyncio.run(run_batch(cfg, options, engine=EchoEngine(cfg)))


def test_every_output_option_has_another_value_here():
    assert {item.name for item in output_fields()} == set(OTHER)
    assert not set(NOT_OUTPUT) & set(OTHER)


@pytest.mark.parametrize("name", sorted(OTHER))
def test_changing_an_output_option_changes_the_fingerprint_and_resume_refuses(tmp_path, name):
    cfg = config()
    files = JobFiles.beside(tmp_path / "out.jsonl")
    first = BatchOptions("in.jsonl", "out.jsonl")
    write_fingerprint(files, fingerprint(cfg, first.output_settings()), None)
    check_fingerprint(files, fingerprint(cfg, first.output_settings()))  # the same: resumes
    changed = dataclasses.replace(first, **{name: OTHER[name]})
    assert changed.output_settings() != first.output_settings()
    with pytest.raises(InputError, match="was started with other settings"):
        check_fingerprint(files, fingerprint(cfg, changed.output_settings()))


@pytest.mark.parametrize("name", sorted(NOT_OUTPUT))
def test_an_option_that_changes_no_output_leaves_the_fingerprint(name):
    first = BatchOptions("in.jsonl", "out.jsonl")
    changed = dataclasses.replace(first, **{name: NOT_OUTPUT[name]})
    assert changed.output_settings() == first.output_settings()


def test_a_real_run_resumed_with_an_output_option_changed_is_refused(tmp_path):
    src, out = rows(tmp_path), tmp_path / "out.jsonl"
    cfg = config()
    summary = run(cfg, BatchOptions(str(src), str(out)))
    assert summary.rows_ok == 4
    for name, value in OTHER.items():
        options = dataclasses.replace(BatchOptions(str(src), str(out)), **{name: value})
        with pytest.raises(InputError, match="was started with other settings"):
            run(cfg, options)
    again = run(cfg, BatchOptions(str(src), str(out)))  # unchanged: resumes, nothing to do
    assert (again.rows_ok, again.rows_skipped) == (0, 4)


@pytest.mark.parametrize("mode", list(BatchMode))
def test_every_runner_is_built_from_the_options_and_fingerprints_them(tmp_path, mode):
    runner = RUNNERS[mode]()
    assert issubclass(runner, BatchJob)
    src = rows(tmp_path)
    cfg = config("OPENAI" if mode is BatchMode.PROVIDER else "NATIVE")
    base = BatchOptions(str(src), str(tmp_path / "out.jsonl"), mode=mode)
    engine = EchoEngine(config())
    seen = runner(cfg, base, engine)._fingerprint()
    assert seen == fingerprint(cfg, base.output_settings())
    for name, value in OTHER.items():
        options = dataclasses.replace(base, **{name: value})
        job = runner(cfg, options, engine)
        assert job.options is options
        assert job._fingerprint() != seen, name


def test_every_runner_reads_rows_with_the_options_that_shape_them(tmp_path):
    """Each runner, and the dry run, reads rows through `RowParser.for_job`: the output shape
    decides how a failed row is recorded, and the mapping makes the conversation."""
    options = BatchOptions("in", "out", output_shape=OTHER["output_shape"],
                           mapping=OTHER["mapping"])  # fmt: skip
    parser = RowParser.for_job(config(), options, EchoEngine)
    reader = RowReader.for_job(config(), options, EchoEngine, source=None)
    for read in (parser, reader):
        _, (row, request) = read.read(Line(1, {"id": "a", "prompt": "hi"}))
        assert [m.role for m in request.messages] == ["system", "user"]
        assert request.messages[0].text() == "Answer in French."
        _, failure = read.read(Line(2, {"id": "b"}))
        assert failure.openai  # recorded as an OpenAI Batch error line, as asked


def test_the_mode_is_chosen_in_one_place():
    cfg = config("OPENAI")
    live = BatchOptions("in", "out")
    assert batch_mode(cfg, live) is BatchMode.LIVE
    assert batch_mode(cfg, dataclasses.replace(live, mode=BatchMode.RAY)) is BatchMode.RAY
    cfg.remote_params.batch_completion_window = "24h"  # a recipe asking for a provider batch
    assert batch_mode(cfg, live) is BatchMode.PROVIDER
    with pytest.raises(ConfigError, match="a provider batch runs at the provider"):
        batch_mode(cfg, dataclasses.replace(live, mode=BatchMode.RAY))
