"""`open_source` refuses a text input that is not what it claims, reading only its start
(`data.file_kinds`), and lets a good file with a few bad lines through to be read line by line;
a stream is recognised as one and read once (`data.spool`)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from lmpress.data.file_formats import FileFormat
from lmpress.data.sources import is_stream, open_source
from lmpress.data.spool import spooled
from lmpress.vocabulary.errors import InputError


def refusal(path, **kw) -> str:
    with pytest.raises(InputError) as caught:
        open_source(str(path), **kw)
    return str(caught.value)


def test_gzip_data_named_jsonl_is_named_for_what_it_is(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_bytes(gzip.compress(b'{"prompt": "hi"}\n'))
    assert refusal(src) == (
        f"{src}: looks like gz-compressed data (name it with a .gz suffix), not JSON lines; "
        f"nothing was run"
    )


def test_utf16_text_is_told_to_be_saved_as_utf8(tmp_path):
    src = tmp_path / "rows.csv"
    src.write_bytes("id,prompt\nr1,hi\n".encode("utf-16"))
    assert "looks like UTF-16 text (save it as UTF-8), not CSV text" in refusal(src)


def test_a_csv_file_of_rows_that_never_match_their_header_is_refused(tmp_path):
    src = tmp_path / "rows.csv"
    src.write_text("id\n" + "".join(f"r{i},a,b\n" for i in range(30)))
    message = refusal(src)
    assert message.startswith(f"{src}: the first 20 lines cannot be read (line 2: has 3 fields")


@pytest.mark.parametrize("bad", [19, 20])
def test_twenty_bad_lines_first_are_refused_and_fewer_are_read(tmp_path, bad):
    """Below the bar, a stray non-UTF-8 byte is a bad line, not a binary file, and 19 bad
    lines before a good one are 19 failures, not a refusal."""
    src = tmp_path / "rows.jsonl"
    lines = [b"not json"] * bad + [json.dumps({"prompt": "caf\u00e9"}).encode(), b'"caf\xe9"']
    src.write_bytes(b"\n".join(lines) + b"\n")
    if bad == 20:
        assert refusal(src) == (
            f"{src}: the first 20 lines cannot be read (line 1: not valid JSON (Expecting "
            f"value at column 1)); it does not look like JSON lines: check the file, or name "
            f"its format with --input-format; nothing was run"
        )
        return
    read = list(open_source(str(src)).lines())
    assert [line.error is None for line in read] == [False] * 19 + [True, False]


def test_a_fifo_is_a_stream_and_a_file_or_folder_is_not(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    assert is_stream(str(fifo)) and is_stream("-")
    assert not is_stream(str(tmp_path)) and not is_stream(str(tmp_path / "absent.jsonl"))
    source = open_source(str(fifo))  # not opened: a FIFO blocks until a writer comes
    assert source.stream and source.format is FileFormat.JSONL


def test_a_spooled_stream_is_read_twice_under_its_own_name(tmp_path):
    read, write = os.pipe()
    os.write(write, gzip.compress(b'{"id": "a", "prompt": "hi"}\n{"id": "b"\n'))
    os.close(write)
    source = open_source(f"/dev/fd/{read}")
    with spooled(source, tmp_path, "out.jsonl") as copy:
        first = [(line.number, line.error is None) for line in copy.lines()]
        again = [(line.number, line.error is None) for line in copy.lines()]
        assert first == again == [(1, True), (2, False)]
        assert copy.where(2) == f"/dev/fd/{read}:2"
        (spool,) = tmp_path.iterdir()
        assert spool.name.startswith(".out.jsonl.input-") and spool.name.endswith(".gz")
    os.close(read)
    assert list(tmp_path.iterdir()) == []  # the copy is gone
