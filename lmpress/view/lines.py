"""A JSONL file's lines as its index (index.py) reads them, in two passes of very different
cost: `find_lines`, where each whole line starts and how long it is (numpy over CHUNK bytes at
a time, no line parsed: a million rows, 668 MB, in well under a second), and `read_facts`,
each line parsed (orjson) and its row's facts taken (records.facts), which costs seconds for a
million rows and so runs behind the page, a block of lines at a time: in this process, or (many
rows) in processes of their own (`Reader`, `python -m lmpress.view.lines`), one a core, where
the parse neither holds this process's interpreter lock against the page's requests nor
leaves a core idle. A reader is a plain child process fed through its stdin (not
multiprocessing, which re-runs a script's main module in each child): it ends when its stdin
does, the viewer's end included.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

from lmpress.view.records import RowKind, facts
from lmpress.view.table import Table, TableBuilder

CHUNK = 8 << 20  # bytes read at a time
SPACES = np.frombuffer(b" \t\r\x0b\x0c", np.uint8)  # what bytes.strip() strips, but the newline


def decode_line(data: bytes) -> object:
    """A line's JSON; a line with invalid UTF-8 is read with those bytes replaced; None for a
    line that is no JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        return None


def find_lines(path: Path, begin: int, end: int, ended: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """The lines of the file's bytes begin:end that are whole and not blank, as (starts,
    lengths), and the byte after the last of them (where the next look begins). A line is
    whole once its newline is there; `ended` (no job writes the file): a last line without
    one is whole too, where it is JSON."""
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    with open(path, "rb") as handle:
        handle.seek(begin)
        offset, pending = begin, b""
        while offset + len(pending) < end:
            block = handle.read(min(CHUNK, end - offset - len(pending)))
            if not block:
                break
            data = pending + block
            buffer = np.frombuffer(data, np.uint8)
            stops = np.flatnonzero(buffer == 10)
            if len(stops):
                firsts = np.concatenate([[0], stops[:-1] + 1])
                keep = _not_blank(data, buffer, firsts, stops - firsts)
                starts.append(firsts[keep] + offset)
                lengths.append((stops - firsts)[keep])
                done = int(stops[-1]) + 1
            else:
                done = 0
            offset += done
            pending = data[done:]
    if ended and pending.strip() and decode_line(pending) is not None:
        starts.append(np.array([offset], np.int64))
        lengths.append(np.array([len(pending)], np.int64))
        offset += len(pending)
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32), offset
    return (
        np.concatenate(starts).astype(np.int64),
        np.concatenate(lengths).astype(np.uint32),
        offset,
    )


def _not_blank(
    data: bytes, buffer: np.ndarray, firsts: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """Which lines hold more than spaces: a line is taken by its first byte, unless that is a
    space (rare: then the line itself is looked at)."""
    keep = lengths > 0
    doubt = np.flatnonzero(keep & np.isin(buffer[firsts], SPACES))
    for i in doubt.tolist():
        keep[i] = bool(data[firsts[i] : firsts[i] + lengths[i]].strip())
    return keep


def read_facts(
    path: Path,
    kind: RowKind,
    step: str | None,
    model: str | None,
    id_column: str | None,
    starts: np.ndarray,
    lengths: np.ndarray,
    first: int,
) -> Table:
    """The facts of these lines, rows first, first + 1, ... of the file, as a Table with labels
    of its own (one read for the block)."""
    builder = TableBuilder(first=first)
    if not len(starts):
        return builder.table()
    low = int(starts[0])
    with open(path, "rb") as handle:
        data = os.pread(handle.fileno(), int(starts[-1]) + int(lengths[-1]) - low, low)
    for begin, length in zip((starts - low).tolist(), lengths.tolist(), strict=True):
        row = decode_line(data[begin : begin + length])
        builder.add(facts(kind, row, step, model, id_column))
    return builder.table()


class Reader:
    """A process that reads facts: read_facts's arguments sent, its Table received, one block
    at a time (so neither side waits on a full pipe)."""

    def __init__(self) -> None:
        package = Path(__file__).resolve().parents[2]  # where this lmpress is imported from
        path = os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lmpress.view.lines"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)},
        )

    def send(self, *args: object) -> None:
        pickle.dump(args, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.flush()

    def receive(self) -> Table:
        """The block's facts; EOFError where the process died (a file it could not read)."""
        return pickle.load(self.process.stdout)

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """A Reader's side: each block's facts answered, until its requests end. Ctrl-C in the
    viewer's terminal reaches its readers too: they leave it to the viewer, and end with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            args = pickle.load(requests)
        except EOFError:
            return
        try:
            pickle.dump(read_facts(*args), answers, protocol=pickle.HIGHEST_PROTOCOL)
            answers.flush()
        except BrokenPipeError:  # the viewer ended first: nobody to answer, nothing to say
            os._exit(0)  # (not sys.exit, whose flush of stdout would fail again)


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
