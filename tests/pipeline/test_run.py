"""`lmpress run` end to end on the loopback OpenAI server: rows fan out, are filtered, mapped
and judged, failures are set aside without stopping the job, and the journal makes a rerun
cost only what is unfinished or changed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from typing import NamedTuple

import pytest

from tests.conftest import REPO, CliRun
from tests.pipeline.helpers import DATA, KEY_ENV, read_jsonl, remote_model, run, write
from tests.servers.llm_server import Faults, LLMServer, reply_text

TOPICS = [{"topic": t} for t in ("cats", "dogs", "owls", "cats")]

FUNCTIONS = """
def first_words(row):
    row["words"] = row["answer"].split()[2:4]
    return row


def refuse_owls(row):
    if "owls" in row["topic"]:
        raise ValueError("no owls here")
    return row
"""


def steps(server, third: str = "Judge {answer}") -> str:
    return f"""models:
  m: {remote_model(server)}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "Tell me about {{topic}}", n: 2}}
  - {{name: first, kind: filter, expr: "'#1' not in answer"}}
  - {{name: words, kind: generate, model: m, prompt: "{third}", output: verdict}}
  - {{name: owls, kind: map, function: "fns:refuse_owls"}}
  - {{name: split, kind: map, function: "fns:first_words", makes: [words], explode: words}}
"""


def test_rows_fan_out_filter_map_and_fail_alone(tmp_path):
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    with LLMServer() as server:
        write(tmp_path, steps(server), TOPICS)
        result = run(tmp_path, "out", "--keep-steps")
    assert result.returncode == 1, result.stderr  # a row failed: said by the exit code
    rows = read_jsonl(tmp_path / "out" / DATA)
    # n=2 fans out, the filter keeps sample 0, owls fail in the map, the explode splits in two.
    expected = []
    for topic in ("cats", "dogs", "cats"):
        answer = reply_text(f"Tell me about {topic}")
        verdict = reply_text(f"Judge {answer}")
        for word in ("Tell", "me"):
            expected.append({"topic": topic, "answer": answer, "verdict": verdict, "words": word})
    assert rows == expected
    rejects = read_jsonl(tmp_path / "out" / "rejects.jsonl")
    dropped = [r["key"] for r in rejects if r["step"] == "first"]
    assert dropped == ["000000000/0001", "000000001/0001", "000000002/0001", "000000003/0001"]
    [failed] = [r for r in rejects if r["step"] == "owls"]
    assert failed["key"] == "000000002/0000"
    assert failed["failed"] == "fns:refuse_owls raised ValueError: no owls here"
    assert len(read_jsonl(tmp_path / "out" / "steps" / "answer.jsonl")) == 8
    assert "step owls: 4 in, 3 out, 0 dropped, 1 failed" in result.stderr


def test_a_judge_on_a_second_model_scores_and_a_filter_keeps_the_good(tmp_path):
    # The judge's question starts with the rubric, whose first words the loopback server's
    # reply echoes: a rubric that is a verdict in the judge's JSON gets a reply holding it.
    with LLMServer() as server:
        write(tmp_path, f"""models:
  writer: {remote_model(server)}
  judge: {{engine: OPENAI, model: judge-model, api_url: '{server.openai_url}'}}
steps:
  - {{name: answer, kind: generate, model: writer, prompt: "About {{topic}}"}}
  - {{name: judge, kind: judge, model: judge, rubric: '{{"explanation": "ok", "score": 8}}', columns: [answer]}}
  - {{name: good, kind: filter, expr: "score >= 7"}}
""", TOPICS[:2])  # fmt: skip
        result = run(tmp_path, "out")
        models = {body["model"] for _, body in server.stats.bodies}
    assert result.returncode == 0, result.stderr
    assert models == {"test-model", "judge-model"}
    rows = read_jsonl(tmp_path / "out" / DATA)
    assert [(r["topic"], r["score"]) for r in rows] == [("cats", 8), ("dogs", 8)]
    assert "README.md" in os.listdir(tmp_path / "out")


def test_an_edited_step_reruns_from_there_on(tmp_path):
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    with LLMServer() as server:
        write(tmp_path, steps(server), TOPICS)
        first = run(tmp_path, "out", "--cache", "off")
        assert first.returncode == 1, first.stderr
        server.reset()
        write(tmp_path, steps(server, third="Weigh {answer}"), TOPICS)
        second = run(tmp_path, "out", "--cache", "off")
        asked = [body["messages"][-1]["content"] for _, body in server.stats.bodies]
    assert second.returncode == 1, second.stderr
    assert len(asked) == 4 and all(text.startswith("Weigh Reply-") for text in asked)
    rows = read_jsonl(tmp_path / "out" / DATA)
    assert [r["verdict"] for r in rows[::2]] == [
        reply_text(f"Weigh {reply_text(f'Tell me about {t}')}") for t in ("cats", "dogs", "cats")
    ]


def test_kill_9_mid_run_then_the_same_command_finishes_the_same_dataset(tmp_path):
    whole_asked, killed = interrupted(tmp_path, signal.SIGKILL)
    assert killed.rerun.returncode == 0, killed.rerun.stderr
    # The rerun asks for exactly what the journal did not hold when the run died: a row of a
    # generating step is one request (n=2 is one request of two choices).
    assert whole_asked == 80 and killed.held >= 10
    assert killed.asked == whole_asked - killed.held
    for name in (DATA, "rejects.jsonl"):
        assert (tmp_path / "killed" / name).read_text() == (tmp_path / "whole" / name).read_text()


# Each step's kill: the server holds replies after the first few (3: the writer's first rows
# only, none yet asked the second question; 50: the 40 first questions and 10 second ones),
# and the kill comes once the journal shows rows done in that step, not all of them.
EACH_STEP = [("answer", 3), ("first", 3), ("words", 50), ("owls", 50), ("split", 50)]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The uninterrupted run's dataset and rejects, shared by the kills of each step."""
    tmp = tmp_path_factory.mktemp("whole")
    (tmp / "fns.py").write_text(FUNCTIONS)
    with LLMServer() as server:
        write(tmp, steps(server), KILL_TOPICS)
        whole = run(tmp, "whole", "--cache", "off")
    assert whole.returncode == 0, whole.stderr
    return {name: (tmp / "whole" / name).read_text() for name in (DATA, "rejects.jsonl")}


@pytest.mark.parametrize(("step", "hold_after"), EACH_STEP)
def test_kill_9_during_each_step_then_the_rerun_finishes_the_same_dataset(
    tmp_path, whole_run, step, hold_after
):
    def partly_done(journal) -> bool:
        return 0 < _done_rows(journal, step) < 40

    rerun = kill_and_rerun(tmp_path, signal.SIGKILL, hold_after, partly_done).rerun
    assert rerun.returncode == 0, rerun.stderr
    for name, text in whole_run.items():
        assert (tmp_path / "killed" / name).read_text() == text


def test_sigterm_stops_cleanly_and_the_rerun_resumes(tmp_path):
    _, killed = interrupted(tmp_path, signal.SIGTERM)
    assert killed.stopped.returncode == 143
    assert killed.stopped.stderr.strip().splitlines()[-1] == "lmpress: stopped by SIGTERM"
    assert killed.rerun.returncode == 0, killed.rerun.stderr
    assert (tmp_path / "killed" / DATA).read_text() == (tmp_path / "whole" / DATA).read_text()


KILL_TOPICS = [{"topic": f"topic {i}"} for i in range(40)]


class Resumed(NamedTuple):
    stopped: CliRun  # the run sent the signal
    held: int  # requests whose replies its journal held once it had stopped
    rerun: CliRun
    asked: int  # requests the rerun made


def interrupted(tmp_path, sig) -> tuple[int, Resumed]:
    """An uninterrupted run into whole/ (the requests it made), and a run into killed/ sent
    `sig` once its journal holds 10 replies, then run again."""
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    with LLMServer() as server:
        write(tmp_path, steps(server), KILL_TOPICS)
        whole = run(tmp_path, "whole", "--cache", "off")
        assert whole.returncode == 0, whole.stderr
        whole_asked = server.stats.requests
    return whole_asked, kill_and_rerun(
        tmp_path, sig, 30, lambda journal: _done_requests(journal) >= 10
    )


GENERATING = ("answer", "words")  # the steps of `steps()` that ask the model


def _done_requests(journal) -> int:
    """Requests whose replies the journal holds: rows done in a generating step."""
    return sum(_done_rows(journal, step) for step in GENERATING)


def kill_and_rerun(tmp_path, sig, hold_after: int, ready) -> Resumed:
    """A run into killed/ sent `sig` once the server holds replies after `hold_after` and
    `ready(journal)`, then run again against a fresh server on the same port: the first may
    still be reading requests the killed run sent, which are not the rerun's."""
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    with LLMServer(Faults(hold_after=hold_after)) as server:
        write(tmp_path, steps(server), KILL_TOPICS)
        args = ["run", "pipe.yaml", "-i", "in.jsonl", "-o", "killed", "--cache", "off"]
        env = {**os.environ, **KEY_ENV, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "lmpress", *args], cwd=tmp_path, env=env,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        journal = tmp_path / "killed" / ".lmpress" / "pipeline.sqlite"
        try:
            assert server.holding.wait(120)
            deadline = time.monotonic() + 60
            while not ready(journal) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert ready(journal)
        finally:
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        stopped = CliRun(proc.returncode, "", stderr)
        held = _done_requests(journal)  # the process is gone: nothing more is journaled
        server.release()
    assert not (tmp_path / "killed" / DATA).exists()
    with LLMServer(port=server.port) as again:
        rerun = run(tmp_path, "killed", "--cache", "off")
    return Resumed(stopped, held, rerun, again.stats.requests)


def _done_rows(journal, step: str | None = None) -> int:
    """Rows the journal shows done (in `step`, or in any)."""
    if not journal.exists():
        return 0
    where, args = ("WHERE step = ?", (step,)) if step else ("", ())
    try:
        with sqlite3.connect(journal) as db:
            return db.execute(f"SELECT COUNT(*) FROM done {where}", args).fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def test_limit_from_dedupe_and_the_dataset_formats(tmp_path):
    import datasets
    import pyarrow.parquet as pq

    from lmpress.data.file_formats import FileFormat
    from lmpress.pipeline.export import DATASET_NAMES

    with LLMServer() as server:
        write(tmp_path, f"""models:
  m: {remote_model(server)}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "About {{topic}}"}}
  - {{name: uniq, kind: dedupe, method: exact, columns: [answer]}}
""", TOPICS)  # fmt: skip
        first = run(tmp_path, "out", "--limit", "2", "--cache", "off", "--format", "parquet")
        assert first.returncode == 0, first.stderr
        parquet = tmp_path / "out" / DATASET_NAMES[FileFormat.PARQUET]
        assert [r["topic"] for r in pq.read_table(parquet).to_pylist()] == ["cats", "dogs"]
        assert server.stats.requests == 2
        whole = run(tmp_path, "out", "--cache", "off")  # two more rows: two more requests
        assert whole.returncode == 0, whole.stderr
        assert server.stats.requests == 4
        rows = read_jsonl(tmp_path / "out" / DATA)
        assert [r["topic"] for r in rows] == ["cats", "dogs", "owls"]  # the second cats: a copy
        [copy] = read_jsonl(tmp_path / "out" / "rejects.jsonl")
        assert copy["key"] == "000000003" and copy["step"] == "uniq"
        assert "000000000" in copy["dropped"]
        again = run(tmp_path, "out", "--cache", "off", "--from", "answer", "--format", "hf")
        assert again.returncode == 0, again.stderr
        assert server.stats.requests == 8  # --from: every row asked again
    saved = datasets.load_from_disk(str(tmp_path / "out" / DATASET_NAMES[FileFormat.HF]))
    assert saved.to_list() == rows


def test_an_edited_map_function_reruns_its_step_only(tmp_path):
    (tmp_path / "fns.py").write_text(FUNCTIONS)
    with LLMServer() as server:
        write(tmp_path, f"""models:
  m: {remote_model(server)}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "Tell me about {{topic}}"}}
  - {{name: split, kind: map, function: "fns:first_words", makes: [words]}}
""", TOPICS[:2])  # fmt: skip
        assert run(tmp_path, "out", "--cache", "off").returncode == 0
        # An edit of the same size with the same mtime as the first version: what an edit
        # within the same second looks like to Python's bytecode cache.
        written = (tmp_path / "fns.py").stat()
        (tmp_path / "fns.py").write_text(FUNCTIONS.replace("[2:4]", "[2:3]"))
        os.utime(tmp_path / "fns.py", ns=(written.st_atime_ns, written.st_mtime_ns))
        server.reset()
        again = run(tmp_path, "out", "--cache", "off")
        assert server.stats.requests == 0  # the generate step's rows came from the journal
    assert again.returncode == 0, again.stderr
    assert "re-running steps split" in again.stderr
    assert [r["words"] for r in read_jsonl(tmp_path / "out" / DATA)] == [["Tell"], ["Tell"]]


def test_steps_sharing_a_remote_model_get_the_requests_in_flight_they_ask_for(tmp_path):
    # One engine serves both steps, its pacer letting num_workers (32 by default) out in all:
    # sized to the steps' 40 + 8, the first step's 40 rows are all asked at once (the server
    # answers none until 40 are in flight).
    with LLMServer(Faults(gather=40)) as server:
        write(tmp_path, f"""models:
  m: {remote_model(server)}
steps:
  - {{name: answer, kind: generate, model: m, prompt: "About {{topic}}", concurrency: 40}}
  - {{name: again, kind: generate, model: m, prompt: "Again {{answer}}", concurrency: 8, output: more}}
""", KILL_TOPICS)  # fmt: skip
        result = run(tmp_path, "out", "--cache", "off")
        peak = server.stats.max_in_flight
    assert result.returncode == 0, result.stderr
    assert "model m: remote_params.num_workers 48, the sum of its steps' concurrency" in (
        result.stderr
    )
    assert peak >= 40
    assert len(read_jsonl(tmp_path / "out" / DATA)) == 40


def test_an_embedding_dedupe_decides_again_on_a_rerun_from_the_response_cache(tmp_path):
    with LLMServer() as server:
        write(tmp_path, f"""models:
  m: {remote_model(server)}
steps:
  - {{name: uniq, kind: dedupe, method: embedding, model: m, columns: [topic], threshold: 0.99}}
""", TOPICS)  # fmt: skip
        first = run(tmp_path, "out")
        embedded = [path for path, _ in server.stats.bodies if path.endswith("/embeddings")]
        server.reset()
        again = run(tmp_path, "out")
        asked_again = len(server.stats.bodies)
    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr
    assert embedded  # the first run embedded the rows; the rerun's embeddings were all kept
    assert asked_again == 0
    assert [r["topic"] for r in read_jsonl(tmp_path / "out" / DATA)] == ["cats", "dogs", "owls"]
