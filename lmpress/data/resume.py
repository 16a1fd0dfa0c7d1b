"""What a batch job leaves beside its output, and how a re-run picks up from it.

The output OUT (say ans.jsonl) is the one record of which rows are done: each line is written
whole and flushed, so after a crash it holds every finished row and at most one torn last
line, which is cut off. A Parquet output cannot be appended to, so its record is a journal:
- OUT.journal.jsonl   every row done (and, with its error, every row that failed) as JSONL,
                      from which OUT (ans.parquet) is written at the end of each run
Beside them:
- OUT.errors.jsonl    rows that failed (retried on the next run unless told not to)
- OUT.summary.json    the last run's summary
- OUT.fingerprint.json  the settings the output was started with; a re-run with other
                      settings is refused, so results of two configurations never mix.
- OUT.lock            locked while a job writes the output, so a second job on it is refused
                      (`data.output_lock`); kept when the job ends, never removed.

Side files are named from the whole output file name (ans.jsonl.lock, ans.parquet.lock), so
ans.jsonl and ans.parquet in one folder share none. Earlier versions named them from the
stem (ans.lock for both, so one output's settings refused the other's run, and each blocked
the other): an output started under those names keeps them (`JobFiles.found`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpress.configs.schema import RunConfig
from lmpress.data.file_formats import FileFormat
from lmpress.data.idkeys import IdKeys
from lmpress.data.jsonl import read_lines
from lmpress.data.row_shapes import output_row_id, row_id
from lmpress.data.selection import RowSelection
from lmpress.data.sources import Source
from lmpress.data.targets import COMPRESSED, is_compressed, write_text_atomically
from lmpress.version import __version__
from lmpress.vocabulary.errors import InputError, OutputWriteError
from lmpress.vocabulary.types import SCHEDULING_FIELDS, GenerationParams


@dataclass(frozen=True)
class JobFiles:
    output: Path
    errors: Path
    summary: Path
    fingerprint: Path
    journal: Path | None = None  # a Parquet output's record; None: the output is its own

    @classmethod
    def beside(cls, output: str | Path, file_format: FileFormat = FileFormat.JSONL) -> JobFiles:
        """The side files of a new output: named from its whole file name."""
        out = Path(output).expanduser()
        return cls._named(out, out.name, file_format)

    @classmethod
    def found(cls, output: str | Path, file_format: FileFormat = FileFormat.JSONL) -> JobFiles:
        """The side files an output has: those `beside` names, or, for an output an earlier
        lmpress started under the names it gave then (from the stem: ans.fingerprint.json for
        ans.jsonl), those, so that it resumes."""
        files = cls.beside(output, file_format)
        stem = files.output.name
        for suffix in (*COMPRESSED, ".jsonl", ".parquet", ".pq"):  # out.jsonl.gz -> out
            stem = stem.removesuffix(suffix)
        older = cls._named(files.output, stem, file_format)
        if older != files and older.started and not files.started:
            return older
        return files

    @classmethod
    def _named(cls, out: Path, base: str, file_format: FileFormat) -> JobFiles:
        parquet = file_format is FileFormat.PARQUET
        return cls(
            out,
            out.with_name(f"{base}.errors.jsonl"),
            out.with_name(f"{base}.summary.json"),
            out.with_name(f"{base}.fingerprint.json"),
            out.with_name(f"{base}.journal.jsonl") if parquet else None,
        )

    @property
    def started(self) -> bool:
        """Whether a job has written to this output under these names (rows, or provider
        batches sent), with the record of its settings."""
        work = _nonempty(self.record) or _nonempty(self.batches / "state.jsonl")
        return work and self.fingerprint.exists()

    @property
    def batches(self) -> Path:
        """A provider-batch job's state and chunks (`batch/provider/state.py`)."""
        stem = self.summary.name.removesuffix(".summary.json")
        return self.output.with_name(f"{stem}.batches")

    @property
    def lock(self) -> Path:
        """Locked by the job writing the output (`data.output_lock`)."""
        stem = self.summary.name.removesuffix(".summary.json")
        return self.output.with_name(f"{stem}.lock")

    @property
    def record(self) -> Path:
        """The file that says which rows are done: the journal, or the JSONL output itself."""
        return self.journal or self.output

    @property
    def side_files(self) -> list[Path]:
        """What lmpress writes beside the output."""
        side = [self.errors, self.summary, self.fingerprint, self.lock]
        return side + [self.journal] if self.journal else side

    def remove_all(self) -> None:
        """Start over: everything but the lock, which the job removing them holds (removed,
        a second job could lock a new file of that name)."""
        for path in (self.output, *self.side_files):
            if path != self.lock:
                path.unlink(missing_ok=True)
        if self.batches.is_dir():
            import shutil

            shutil.rmtree(self.batches)


def scan_input(
    source: Source, selection: RowSelection, id_column: str | None = None
) -> tuple[int, IdKeys]:
    """One pass before any work: count the rows the job runs, refuse duplicate ids, pick the
    sample, and return the count and the id keys of the picked rows that have one. An input
    (or a shard of it) with no rows is a job with nothing to do: 0 rows, not an error."""
    every = IdKeys()  # every row of the shard, for duplicates
    picked = IdKeys() if selection.limit is not None else every
    sampled: dict[int, int] = {}  # place -> key, of the rows in the reservoir
    total = 0
    for ordinal, line in enumerate(source.lines()):
        if not selection.in_shard(ordinal):
            continue
        place = selection.place(ordinal)
        key = None
        if not line.error and isinstance(line.value, dict):
            key = id_key(row_id(line.value, line.number, id_column))
            every.add(key)
        taken = selection.offer(place)
        if taken is None:
            continue
        total += 1
        if selection.sample is not None:
            sampled.pop(taken, None)
            if key is not None:
                sampled[place] = key
        elif picked is not every and key is not None:
            picked.add(key)
    selection.scanned()
    repeated = every.freeze()
    if repeated is not None:
        _refuse_duplicate(source, selection, id_column, repeated)
    if selection.sample is not None:
        total = min(total, selection.sample)
        picked = IdKeys(sampled.values())
    picked.freeze()
    return total, picked


def _refuse_duplicate(
    source: Source, selection: RowSelection, id_column: str | None, key: int
) -> None:
    """A second pass, only when an id repeats: name both lines."""
    first = None
    for ordinal, line in enumerate(source.lines()):
        if not selection.in_shard(ordinal) or line.error or not isinstance(line.value, dict):
            continue
        rid = row_id(line.value, line.number, id_column)
        if id_key(rid) != key:
            continue
        if first is not None:
            raise InputError(
                f"{source.where(line.number)}: duplicate id '{rid}' (first at {source.unit} "
                f"{first}); ids must be unique for a job to resume safely"
            )
        first = line.number


@dataclass
class EarlierRun:
    """What earlier runs of a job left in its output and errors files."""

    done: IdKeys  # rows written
    set_aside: IdKeys  # rows that failed and are not to be retried
    fresh: bool  # nothing to resume (or --overwrite): the side files are started over


def read_earlier_run(
    files: JobFiles,
    settings: dict[str, Any],
    *,
    overwrite: bool,
    retry_failed: bool,
    say: Callable[[str], None],
    id_column: str | None = None,
) -> EarlierRun:
    """The rows earlier runs finished, the output checked against `settings` (refused when
    they changed) and its torn tail repaired; `say` is told what was done."""
    record = files.record
    # A provider-batch job may have batches out before it has written a row.
    started = _nonempty(record) or _nonempty(files.batches / "state.jsonl")
    if overwrite or not started:
        if not overwrite and files.journal and _nonempty(files.output):
            raise InputError(
                f"{files.output}: exists but its journal ({files.journal.name}) is missing, so "
                f"lmpress cannot tell which rows are done; use --overwrite to start over, or "
                f"choose a new output path"
            )
        return EarlierRun(IdKeys(), IdKeys(), fresh=True)
    check_fingerprint(files, settings)
    if repair_torn_tail(record):
        say(f"{record}: cut off a half-written last line from the last run")
    repair_torn_tail(files.errors)
    if retry_failed and files.journal and _nonempty(files.errors):
        drop_failed_rows(files.journal)  # those rows are tried again
    done = IdKeys(id_key(rid) for rid in done_ids(record, id_column))
    done.freeze()
    set_aside = IdKeys()
    if retry_failed:
        files.errors.unlink(missing_ok=True)  # those rows are tried again
    else:
        for rid in done_ids(files.errors, id_column):
            if (key := id_key(rid)) not in done:
                set_aside.add(key)
    set_aside.freeze()
    if done or set_aside:
        say(
            f"resuming {files.output}: {len(done)} rows done"
            + (f", {len(set_aside)} failed rows left aside" if set_aside else "")
        )
    return EarlierRun(done, set_aside, fresh=False)


def fingerprint(
    config: RunConfig, job_settings: dict[str, Any], adapters: dict[str, str] | None = None
) -> dict[str, Any]:
    """The settings that decide what the output holds: the config's, and the job's own
    (`BatchOptions.output_settings()`, read from the fields marked as changing the output).
    `adapters`: `model.adapters` by the content of their files (the job hashes them), so a
    moved adapter resumes and a changed one is refused; a run with none records none, as
    outputs started before adapters existed did."""
    model = dataclasses.asdict(config.model)
    model["adapters"] = adapters if adapters is not None else model["adapters"]
    if not model["adapters"]:
        del model["adapters"]
    return {
        "engine": config.engine,
        "task": config.task,
        "model": model,
        "generation": _results_only(dataclasses.asdict(config.generation)),
        "remote_params": {"api_url": config.remote_params.api_url},
        **job_settings,
    }


def check_fingerprint(files: JobFiles, current: dict[str, Any]) -> None:
    """Refuse to add to an output started with other settings, saying what changed."""
    if not files.fingerprint.exists():
        raise InputError(
            f"{files.output}: exists but lmpress has no record of how it was made "
            f"({files.fingerprint.name} is missing); use --overwrite to start over, or "
            f"choose a new output path"
        )
    try:
        stored = json.loads(files.fingerprint.read_text(encoding="utf-8"))["settings"]
        if isinstance(stored.get("generation"), dict):  # older versions kept some of them
            # A setting added since had its default when the output was started.
            defaults = _results_only(dataclasses.asdict(GenerationParams()))
            stored["generation"] = {**defaults, **_results_only(stored["generation"])}
        stored.setdefault("task", "generate")  # older versions generated, and said nothing
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise InputError(f"{files.fingerprint}: unreadable ({exc}); use --overwrite") from exc
    changes = _differences(stored, current)
    if changes:
        listed = "; ".join(changes[:6]) + ("; ..." if len(changes) > 6 else "")
        raise InputError(
            f"{files.output} was started with other settings ({listed}); results of two "
            f"configurations must not mix in one file: use --overwrite to start over, or "
            f"choose a new output path"
        )


def write_fingerprint(files: JobFiles, current: dict[str, Any], recipe: str | None) -> None:
    record = {
        "lmpress": __version__,
        "recipe": recipe,
        "recipe_sha256": _sha256(recipe),
        "settings": current,
    }
    text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    try:
        write_text_atomically(files.fingerprint, text)
    except OSError as exc:  # written before any row: nothing has started
        raise OutputWriteError(files.fingerprint, exc, started=False) from exc


def repair_torn_tail(path: Path) -> bool:
    """Cut off a last line that a crash left half-written. True if something was cut."""
    if not path.exists() or is_compressed(path):  # a compressed tail cannot be cut by bytes
        return False
    size = path.stat().st_size
    if size == 0:
        return False
    with path.open("rb+") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        # Scan back for the last complete line's newline.
        end = size
        block = 1 << 16
        keep = 0
        while end > 0:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        handle.truncate(keep)
    return True


def done_ids(path: Path, id_column: str | None = None) -> Iterator[str]:
    """The row id of every line in an output (or errors) file, the file read as a stream."""
    if not path.exists():
        return
    for line in read_lines(path):
        if line.error:
            raise InputError(
                f"{path}:{line.number}: {line.error}, so the output cannot be resumed; "
                f"repair that line or use --overwrite"
            )
        rid = output_row_id(line.value, id_column) if isinstance(line.value, dict) else None
        if rid is not None:
            yield rid


def drop_failed_rows(journal: Path) -> None:
    """Rewrite a journal without its failed rows, so that they run again; the rows done are
    copied line by line, and the copy replaces the journal only once it is whole."""
    tmp = journal.with_name(f".{journal.name}.tmp")
    with journal.open("rb") as src, tmp.open("wb") as dst:
        for raw in src:
            if b'"error":' in raw and _failed(raw):
                continue
            dst.write(raw)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, journal)


def _failed(raw: bytes) -> bool:
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("error") is not None


def _nonempty(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def id_key(rid: str) -> int:
    """A compact, collision-resistant key for a row id (8 bytes instead of the string)."""
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "big")


def _results_only(generation: dict[str, Any]) -> dict[str, Any]:
    """Generation settings without the scheduling ones, which change speed, not results."""
    return {k: v for k, v in generation.items() if k not in SCHEDULING_FIELDS}


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    if old != new:
        return [f"{prefix.rstrip('.')} was {json.dumps(old)}, now {json.dumps(new)}"]
    return []


def _sha256(path: str | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
