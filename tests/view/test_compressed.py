"""A compressed output in the viewer (lmpress/view/plain_copy.py): real `lmpress batch` outputs
written .gz and .zst show the rows and overview the plain output shows, read through a plain
copy in lmpress's cache; a copy follows a file that grows and is made again for one replaced;
nothing is written beside the user's file."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import zstandard

from lmpress.data.targets import open_read
from lmpress.view import plain_copy
from lmpress.view.plain_copy import PlainCopy
from lmpress.view.sources import OpenSource
from tests.conftest import REPO, run_lmpress
from tests.view.conftest import all_rows, client, input_rows, run_batch, write_rows

SHOWN = ("n", "id", "status", "error_kind", "preview")


WRITTEN_BY_THE_JOBS: set[str] = set()  # the outputs' folder before any viewer opened one


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compressed")
    rows = input_rows()
    made = {name: run_batch(folder, rows, name) for name in ("out.jsonl", "c.jsonl.gz", "c.zst")}
    WRITTEN_BY_THE_JOBS.update(os.listdir(folder))
    return made


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LMPRESS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def shown(viewer) -> list[dict]:
    return [{key: row.get(key) for key in SHOWN} for row in all_rows(viewer)]


def counts(overview: dict) -> dict:
    return {key: overview[key] for key in ("rows", "tokens", "errors_by_kind")}


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.zst"])
def test_a_compressed_output_shows_what_the_plain_one_does(outputs, name, cache, tmp_path):
    folder = outputs[name].parent
    # The same rows decompressed by hand (a batch writes rows as they finish, so another
    # run's order may differ), and beside them the side files the job wrote.
    unpacked = tmp_path / "plain.jsonl"
    with open_read(outputs[name]) as source, open(unpacked, "wb") as copy:
        shutil.copyfileobj(source, copy)
    for side in ("errors.jsonl", "summary.json"):
        shutil.copy(folder / f"{name}.{side}", tmp_path / f"plain.jsonl.{side}")
    plain, packed = client(unpacked), client(outputs[name])
    assert shown(packed) == shown(plain)
    by_id = sorted(shown(client(outputs["out.jsonl"])), key=lambda row: row["id"])
    assert [{**row, "n": 0} for row in sorted(shown(packed), key=lambda row: row["id"])] == [
        {**row, "n": 0} for row in by_id
    ]
    assert counts(packed.get("/api/overview").json()) == counts(plain.get("/api/overview").json())
    row = packed.get("/api/row", params={"n": 0}).json()
    assert row == plain.get("/api/row", params={"n": 0}).json()
    hits = packed.get("/api/rows", params={"q": "NUMBER 4"}).json()["rows"]
    assert [r["id"] for r in hits] == ["g4"]
    # Beside the user's file: only what a plain output gets too (its errors file's index),
    # whichever of this module's tests opened it first.
    gained = {e for e in set(os.listdir(folder)) - WRITTEN_BY_THE_JOBS if e.startswith(name)}
    assert gained == {f"{name}.errors.jsonl.view-index"}
    assert list((cache / "view" / "plain").glob("*-c*"))  # the copy is in the cache


def test_a_copy_follows_a_growing_file_and_is_made_again_for_a_replaced_one(outputs, tmp_path):
    path = tmp_path / "grow.jsonl.gz"
    lines = outputs["out.jsonl"].read_bytes().splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(lines[:4])))
    source = OpenSource(str(path))
    assert source.wait().rows == 4
    with open(path, "ab") as handle:  # a resumed job adds a member
        handle.write(gzip.compress(b"".join(lines[4:7])))
    assert source.wait().rows == 7
    assert [r.value["id"] for r in source.read(source.snapshot, [0, 6])] == ids(lines[0], lines[6])
    source.close()
    again = OpenSource(str(path))  # opened again: the copy made before is read back
    assert again.wait().rows == 7
    scratch = tmp_path / "new.gz"
    scratch.write_bytes(gzip.compress(b"".join(lines[8:10])))
    os.replace(scratch, path)  # replaced by another output
    snapshot = again.wait()
    assert snapshot.rows == 2
    assert [r.value["id"] for r in again.read(snapshot, [0, 1])] == ids(lines[8], lines[9])
    again.close()
    assert sorted(os.listdir(tmp_path)) == ["cache", "grow.jsonl.gz"]


def ids(*lines: bytes) -> list[str]:
    return [json.loads(line)["id"] for line in lines]


def test_a_cut_off_compressed_file_shows_its_whole_rows(outputs, tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(outputs["out.jsonl"].read_bytes())
    path.write_bytes(whole[: len(whole) // 2])
    source = OpenSource(str(path))
    rows = source.wait().rows
    assert 0 < rows < 11
    source.close()


def test_a_copy_opened_again_is_used_as_made_and_read_on_from_its_last_member(outputs, tmp_path):
    """As a new viewer process finds it: the record beside the copy, no decompressor."""
    path = tmp_path / "again.jsonl.zst"
    plain = outputs["out.jsonl"].read_bytes()
    first, second = plain[: len(plain) // 2], plain[len(plain) // 2 :]
    path.write_bytes(zstandard.ZstdCompressor().compress(first))
    made = PlainCopy(path)
    made.update()
    made.close()
    assert made.path.read_bytes() == first
    stamp = made.path.stat().st_mtime_ns
    unchanged = PlainCopy(path)
    unchanged.update()
    unchanged.close()
    assert unchanged.path == made.path
    assert made.path.stat().st_mtime_ns == stamp and unchanged.generation == 0
    with open(path, "ab") as handle:
        handle.write(zstandard.ZstdCompressor().compress(second))
    grown = PlainCopy(path)
    grown.update()
    grown.close()
    assert grown.generation == 0 and grown.path.read_bytes() == plain
    path.write_bytes(zstandard.ZstdCompressor().compress(second))  # written over in place
    replaced = PlainCopy(path)
    replaced.update()
    assert replaced.generation == 1 and replaced.path.read_bytes() == second
    assert sorted(os.listdir(tmp_path)) == ["again.jsonl.zst", "cache"]


def test_a_second_process_viewing_the_file_makes_a_copy_of_its_own(outputs, cache):
    """Two viewers appending to one copy would interleave their rows."""
    held = OpenSource(str(outputs["c.jsonl.gz"]))
    assert held.wait().rows == 13
    shared = sorted(p.name for p in (cache / "view" / "plain").iterdir())
    other = run_python(
        "from lmpress.view.sources import OpenSource\n"
        f"s = OpenSource({str(outputs['c.jsonl.gz'])!r}); n = s.wait().rows\n"
        "print(n, s.snapshot.indexes[0].path.name)\n",
        env={"LMPRESS_CACHE": str(cache)},
    )
    rows, name = other.split()
    assert rows == "13" and name not in shared
    held.close()
    assert sorted(p.name for p in (cache / "view" / "plain").iterdir()) == shared  # its own: gone


def run_python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_compressed_models_output_shows_each_models_part(tmp_path):
    """--models writes each model's part compressed as the output is (OUT.models/NN-M.jsonl.gz)."""
    rows = [r for r in input_rows(4) if r["id"].startswith("g")]
    source = write_rows(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl.gz"
    run = run_lmpress(
        "batch", "--models", "tiny-native,tiny-llamacpp", "-i", str(source), "-o", str(out),
        "--generation.max_new_tokens", "4", "--cache", "off",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "out.jsonl.gz.models").glob("*.gz"))
    viewer = client(out)
    (found,) = viewer.get("/api/sources").json()["sources"]
    assert found["kind"] == "models"
    assert found["parts"] == [
        {"name": "tiny-native", "rows": 4},
        {"name": "tiny-llamacpp", "rows": 4},
    ]
    with open_read(out) as merged:
        written = [json.loads(line) for line in merged]
    shown = viewer.get("/api/rows", params={"model": "tiny-llamacpp"}).json()["rows"]
    assert sorted(r["id"] for r in shown) == sorted(
        row["id"] for row in written if row["model"] == "tiny-llamacpp"
    )


def test_damaged_compressed_data_shows_the_rows_before_it_and_says_so(outputs, tmp_path):
    path = tmp_path / "damaged.jsonl.gz"
    lines = outputs["out.jsonl"].read_bytes().splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(lines[:5])) + b"this is no gzip member")
    viewer = client(path)
    (found,) = viewer.get("/api/sources").json()["sources"]
    assert found["rows"] == 5
    (problem,) = found["problems"]
    assert problem.startswith("damaged.jsonl.gz: the compressed data is damaged after byte")
    assert [r["id"] for r in all_rows(viewer)] == ids(*lines[:5])


def test_a_member_still_being_written_is_followed_as_its_blocks_come(outputs, tmp_path):
    """A running job's compressor, flushed: one gzip member read on by the open decompressor."""
    path = tmp_path / "live.jsonl.gz"
    lines = outputs["out.jsonl"].read_bytes().splitlines(keepends=True)
    with gzip.open(path, "wb") as writer:
        writer.write(b"".join(lines[:3]))
        writer.flush()
        source = OpenSource(str(path))
        assert source.wait().rows == 3
        writer.write(b"".join(lines[3:8]))
        writer.flush()
        assert source.wait().rows == 8
    assert source.wait().rows == 8  # the member's end: nothing more, nothing twice
    assert [r.value["id"] for r in source.read(source.snapshot, list(range(8)))] == ids(*lines[:8])
    source.close()


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
def test_a_copy_read_a_few_bytes_at_a_time_is_the_file_decompressed(
    outputs, tmp_path, monkeypatch, suffix
):
    """Reads that end inside a member and members that end inside a read, in every format."""
    import bz2
    import lzma

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
                ".zst": zstandard.ZstdCompressor().compress}[suffix]  # fmt: skip
    monkeypatch.setattr(plain_copy, "READ_BYTES", 37)
    plain = outputs["out.jsonl"].read_bytes()
    path = tmp_path / f"out.jsonl{suffix}"
    path.write_bytes(b"".join(compress(plain[i : i + 500]) for i in range(0, len(plain), 500)))
    made = PlainCopy(path)
    made.update()
    made.close()
    assert made.path.read_bytes() == plain and made.problem is None


def test_copies_of_gone_unused_or_crashed_viewers_sources_are_removed_and_held_ones_kept(
    outputs, cache, tmp_path
):
    """The cache does not keep every compressed output ever viewed at its plain size."""
    plain = outputs["out.jsonl"].read_bytes()
    sources = {}
    for name in ("gone", "unused", "held", "kept"):
        sources[name] = tmp_path / f"{name}.jsonl.gz"
        sources[name].write_bytes(gzip.compress(plain))
    copies = {name: PlainCopy(path) for name, path in sources.items()}
    for name, copy in copies.items():
        copy.update()
        (copy.path.parent / f"{copy.path.name}.view-index").write_bytes(b"index")
        if name != "held":
            copy.close()
    # A viewer that crashed while another held the shared copy leaves its own copy behind
    # (its first copy pruned the folder: before anything there was old or gone).
    crashed = run_python(
        "import os\nfrom lmpress.view.plain_copy import PlainCopy\n"
        f"c = PlainCopy.of({str(sources['held'])!r}); c.update(); print(c.path.name)\n"
        "import sys; sys.stdout.flush(); os._exit(0)\n",
        env={"LMPRESS_CACHE": str(cache)},
    ).strip()
    sources["gone"].unlink()
    month_ago = time.time() - 30 * 86400
    for name in ("unused", "held"):
        lock = copies[name].path.with_name(f"{copies[name].path.name}.lock")
        os.utime(lock, (month_ago, month_ago))
    folder = cache / "view" / "plain"
    assert (folder / crashed).exists()

    removed = plain_copy.prune(folder)

    assert sorted(removed) == sorted(
        [copies["gone"].path.name, copies["unused"].path.name, crashed]
    )
    left = {path.name for path in folder.iterdir()}
    for name in ("held", "kept"):
        beside = {copies[name].path.name + suffix for suffix in plain_copy.BESIDE}
        assert beside <= left
        left -= beside
    assert left == set()
    copies["held"].close()


def test_a_viewer_process_prunes_the_cache_when_it_first_makes_a_copy(outputs, cache, tmp_path):
    gone = tmp_path / "gone.jsonl.gz"
    gone.write_bytes(outputs["c.jsonl.gz"].read_bytes())
    copy = PlainCopy(gone)
    copy.update()
    copy.close()
    gone.unlink()
    run_python(
        f"from lmpress.view.sources import OpenSource\nOpenSource({str(outputs['c.zst'])!r}).wait()\n",
        env={"LMPRESS_CACHE": str(cache)},
    )
    assert not copy.path.exists() and not copy.record.exists()
    assert [p.name for p in (cache / "view" / "plain").iterdir() if p.name.endswith(".lock")] == [
        plain_copy.copy_path(outputs["c.zst"]).name + ".lock"
    ]
