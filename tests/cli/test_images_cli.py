"""Images from the command line: `infer --image`, a batch file mixing text and image rows, and
chat's /image, through the real `lmpress` command on the tiny LLaVA-style model."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_lmpress, with_plugin
from tests.image_files import CORRUPT_PNG, data_url, picture, picture_file

pytest.importorskip("PIL")

VLM = ["--engine", "NATIVE", "--model.model_name", "tiny:llava", "--generation.max_new_tokens", "8"]
TOKENS_PER_IMAGE = 16


def image_row(rid: str, text: str, *images: dict) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]}  # fmt: skip


def write_mixed_rows(folder) -> None:
    """in.jsonl, 50 rows: text only, one image (OpenAI part with a path, Oumi image_path), two
    images (data: URLs), and one corrupt image (row 7)."""
    tmp_path = folder
    for seed in range(3):
        picture_file(tmp_path, seed)
    (tmp_path / "broken.png").write_bytes(CORRUPT_PNG)
    rows = []
    for i in range(50):
        kind = i % 4
        if kind == 0:
            rows.append(
                {"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}
            )
        elif kind == 1:
            url = {
                "type": "image_url",
                "image_url": {"url": str(tmp_path / f"picture-{i % 3}.png")},
            }
            rows.append(image_row(f"r{i}", "What is this?", url))
        elif kind == 2:
            rows.append(image_row(f"r{i}", f"Describe {i}.",
                                  {"type": "image_path", "content": f"picture-{i % 3}.png"}))  # fmt: skip
        else:
            pair = [
                {"type": "image_url", "image_url": {"url": data_url(picture(i + k))}}
                for k in (0, 1)
            ]
            rows.append(image_row(f"r{i}", f"Compare {i}.", *pair))
    rows[6]["messages"][0]["content"][0] = {"type": "image_path", "content": "broken.png"}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_batch_of_50_mixed_rows_and_infer_give_the_same_replies(tmp_path):
    """The corrupt image fails alone; `infer --image` answers as its row did."""
    write_mixed_rows(tmp_path)
    run = run_lmpress("batch", *VLM, "-i", "in.jsonl", "-o", "out.jsonl", cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # one row failed; the others ran
    assert (
        "in.jsonl:7: image 1 (file://" in run.stderr
        and "broken.png): cannot be decoded" in run.stderr
    )
    assert "Traceback" not in run.stderr
    out = {row["id"]: row for row in map(json.loads, (tmp_path / "out.jsonl").open())}
    failed = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").open()]
    assert len(out) == 49 and [row["id"] for row in failed] == ["r6"]
    assert all(row["response"]["text"] for row in out.values())
    tokens = {rid: row["response"]["usage"]["prompt_tokens"] for rid, row in out.items()}
    # r1 and r5 ask the same question of different pictures: only the pixels differ.
    assert (
        tokens["r1"] == tokens["r5"]
        and out["r1"]["response"]["text"] != out["r5"]["response"]["text"]
    )
    assert tokens["r3"] == tokens["r7"] and tokens["r3"] >= tokens["r1"] + TOKENS_PER_IMAGE

    infer = run_lmpress("infer", *VLM, "--image", str(tmp_path / "picture-1.png"), "What is this?")
    assert infer.returncode == 0, infer.stderr
    assert infer.stdout.rstrip("\n") == out["r1"]["response"]["text"]


@pytest.mark.slow  # ~30 s here: each image row's prefill chunks cost ~0.4 s on these CPUs
def test_batch_of_50_mixed_rows_on_llamacpp_with_a_projector(tmp_path):
    pytest.importorskip("llama_cpp.mtmd_cpp")
    write_mixed_rows(tmp_path)
    run = run_lmpress(
        "batch", "--engine", "LLAMACPP", "--model.model_name", "tiny-gguf:llama",
        "--model.model_kwargs.mmproj", "tiny-gguf:llama-mmproj",
        "--generation.max_new_tokens", "8", "-i", "in.jsonl", "-o", "out.jsonl", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "in.jsonl:7: image 1 (file://" in run.stderr and "Traceback" not in run.stderr
    out = {row["id"]: row for row in map(json.loads, (tmp_path / "out.jsonl").open())}
    assert len(out) == 49 and "r6" not in out
    tokens = {rid: row["response"]["usage"]["prompt_tokens"] for rid, row in out.items()}
    assert (
        tokens["r1"] == tokens["r5"]
        and out["r1"]["response"]["text"] != out["r5"]["response"]["text"]
    )
    assert tokens["r3"] >= tokens["r1"] + TOKENS_PER_IMAGE


def test_chat_image_attaches_to_the_next_message_and_stays_in_the_history(echo_plugin, tmp_path):
    cat = picture_file(tmp_path, 1, "cat.png")
    (tmp_path / "notes.txt").write_text("not an image")
    script = (
        "/image notes.txt\n/image cat.png\n/image\nWhat is this?\nAnd now?\n"
        "/image cat.png\n/image clear\nNo image.\n/save saved.jsonl\n"
    )
    run = run_lmpress(
        "chat", "--engine", "ECHO", input=script, env=with_plugin(echo_plugin), cwd=tmp_path
    )
    assert run.returncode == 1  # the text file was refused, and the chat went on
    assert "error: /image: notes.txt: is not a PNG, JPEG, GIF or WebP image" in run.stderr
    assert f"attached: {cat.as_uri()}" in run.stderr
    replies = [json.loads(line[len("ECHO ") :]) for line in run.stdout.splitlines()]
    image = {"type": "image_url", "image_url": {"url": cat.as_uri()}}
    asked = {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}
    assert replies[0] == [asked]
    assert replies[1][0] == asked and replies[1][2] == {"role": "user", "content": "And now?"}
    assert replies[2][-1] == {"role": "user", "content": "No image."}  # cleared before sending
    saved = json.loads((tmp_path / "saved.jsonl").read_text())
    assert saved["messages"][0] == asked  # /save keeps the image for a batch replay
