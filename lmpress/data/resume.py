"""What a batch job leaves beside its output, and how a re-run picks up from it.

OUT.jsonl is the one record of which rows are done: each line is written whole and flushed,
so after a crash it holds every finished row and at most one torn last line, which is cut off.
Beside it:
- OUT.errors.jsonl    rows that failed (retried on the next run unless told not to)
- OUT.summary.json    the last run's summary
- OUT.fingerprint.json  the settings the output was started with; a re-run with other
                      settings is refused, so results of two configurations never mix.
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

from lmpress import __version__
from lmpress.configs.schema import RunConfig
from lmpress.data.formats import output_row_id, row_id
from lmpress.data.idkeys import IdKeys
from lmpress.data.jsonl import read_lines
from lmpress.data.targets import COMPRESSED, is_compressed
from lmpress.errors import InputError
from lmpress.types import SCHEDULING_FIELDS


@dataclass(frozen=True)
class JobFiles:
    output: Path
    errors: Path
    summary: Path
    fingerprint: Path

    @classmethod
    def beside(cls, output: str | Path) -> JobFiles:
        out = Path(output).expanduser()
        stem = out.name
        for suffix in (*COMPRESSED, ".jsonl"):  # out.jsonl.gz -> out.errors.jsonl
            stem = stem.removesuffix(suffix)
        return cls(
            out,
            out.with_name(f"{stem}.errors.jsonl"),
            out.with_name(f"{stem}.summary.json"),
            out.with_name(f"{stem}.fingerprint.json"),
        )

    def remove_all(self) -> None:
        for path in (self.output, self.errors, self.summary, self.fingerprint):
            path.unlink(missing_ok=True)


def scan_input(path: str, in_shard: Callable[[int], bool]) -> tuple[int, IdKeys]:
    """One pass before any work: count the shard's rows, refuse duplicate ids, and return the
    count and the id keys of the rows that have one."""
    keys = IdKeys()
    total = 0
    for ordinal, line in enumerate(read_lines(path)):
        if not in_shard(ordinal):
            continue
        total += 1
        if line.error or not isinstance(line.value, dict):
            continue
        keys.add(id_key(row_id(line.value, line.number)))
    if total == 0:
        raise InputError(f"{path}: the input has no rows")
    repeated = keys.freeze()
    if repeated is not None:
        _refuse_duplicate(path, in_shard, repeated)
    return total, keys


def _refuse_duplicate(path: str, in_shard: Callable[[int], bool], key: int) -> None:
    """A second pass, only when an id repeats: name both lines."""
    first = None
    for ordinal, line in enumerate(read_lines(path)):
        if not in_shard(ordinal) or line.error or not isinstance(line.value, dict):
            continue
        rid = row_id(line.value, line.number)
        if id_key(rid) != key:
            continue
        if first is not None:
            raise InputError(
                f"{path}:{line.number}: duplicate id '{rid}' (first at line {first}); ids "
                f"must be unique for a job to resume safely"
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
) -> EarlierRun:
    """The rows earlier runs finished, the output checked against `settings` (refused when
    they changed) and its torn tail repaired; `say` is told what was done."""
    if overwrite or not (files.output.exists() and files.output.stat().st_size > 0):
        return EarlierRun(IdKeys(), IdKeys(), fresh=True)
    check_fingerprint(files, settings)
    if repair_torn_tail(files.output):
        say(f"{files.output}: cut off a half-written last line from the last run")
    repair_torn_tail(files.errors)
    done = IdKeys(id_key(rid) for rid in done_ids(files.output))
    done.freeze()
    set_aside = IdKeys()
    if retry_failed:
        files.errors.unlink(missing_ok=True)  # those rows are tried again
    else:
        for rid in done_ids(files.errors):
            if (key := id_key(rid)) not in done:
                set_aside.add(key)
    set_aside.freeze()
    if done or set_aside:
        say(
            f"resuming {files.output}: {len(done)} rows done"
            + (f", {len(set_aside)} failed rows left aside" if set_aside else "")
        )
    return EarlierRun(done, set_aside, fresh=False)


def fingerprint(config: RunConfig, output_format: str, shard: str | None) -> dict[str, Any]:
    """The settings that decide what the output holds."""
    return {
        "engine": config.engine,
        "model": dataclasses.asdict(config.model),
        "generation": _results_only(dataclasses.asdict(config.generation)),
        "remote_params": {"api_url": config.remote_params.api_url},
        "output_format": output_format,
        "shard": shard,
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
            stored["generation"] = _results_only(stored["generation"])
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
    _write_atomically(files.fingerprint, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


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


def done_ids(path: Path) -> Iterator[str]:
    """The row id of every line in an output (or errors) file, the file read as a stream."""
    if not path.exists():
        return
    for line in read_lines(path):
        if line.error:
            raise InputError(
                f"{path}:{line.number}: {line.error}, so the output cannot be resumed; "
                f"repair that line or use --overwrite"
            )
        rid = output_row_id(line.value) if isinstance(line.value, dict) else None
        if rid is not None:
            yield rid


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


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
