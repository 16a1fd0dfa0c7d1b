"""Compare (lmpress/view/compare.py) through the API: two real outputs of overlapping rows,
paired by id, with what differs, what only one side has, and one row's word diff; and the two
models of one --models output."""

from __future__ import annotations

import pytest

from tests.conftest import run_lmpress
from tests.view.conftest import client, input_rows, read_rows, write_rows


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A: rows g0..g9 at 8 new tokens; B: rows g3..g12 at 3 new tokens (greedy, so B's
    replies are A's first tokens: the rows both have differ, mostly by their end)."""
    folder = tmp_path_factory.mktemp("compare")
    rows = {r["id"]: r for r in input_rows(13) if r["id"].startswith("g")}
    outputs = []
    for name, ids, tokens in (("a", range(10), "8"), ("b", range(3, 13), "3")):
        source = write_rows(folder / f"{name}.in.jsonl", [rows[f"g{i}"] for i in ids])
        out = folder / f"{name}.jsonl"
        run = run_lmpress(
            "batch", "-i", str(source), "-o", str(out), "--engine", "LLAMACPP",
            "--model.model_name", "tiny-gguf:llama", "--generation.max_new_tokens", tokens,
            "--cache", "off",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        outputs.append(out)
    return outputs


def texts(path) -> dict[str, str]:
    return {row["id"]: row["response"]["text"] for row in read_rows(path)}


def listed(viewer, **params) -> list[dict]:
    answer = viewer.get("/api/compare", params={**params, "limit": 1000}).json()
    assert answer["total"] == len(answer["rows"])
    return answer["rows"]


def test_rows_are_paired_by_id(pair):
    a, b = texts(pair[0]), texts(pair[1])
    viewer = client(*pair)
    rows = listed(viewer)
    assert [r["id"] for r in rows] == [*a, *(i for i in b if i not in a)]
    for row in rows:
        assert (row["a"] or {}).get("text") == a.get(row["id"])
        assert (row["b"] or {}).get("text") == b.get(row["id"])
        assert row["same"] == (row["id"] in a and a.get(row["id"]) == b.get(row["id"]))
    only_a = [i for i in a if i not in b]
    only_b = [i for i in b if i not in a]
    assert sorted(only_a) == ["g0", "g1", "g2"] and sorted(only_b) == ["g10", "g11", "g12"]
    assert [r["id"] for r in listed(viewer, only="only_a")] == only_a
    assert [r["id"] for r in listed(viewer, only="only_b")] == only_b
    differs = [i for i in a if i in b and a[i] != b[i]]
    assert differs and [r["id"] for r in listed(viewer, only="differs")] == differs
    sources = viewer.get("/api/sources").json()["sources"]
    assert [s["id"] for s in sources] == ["a", "b"]


def test_one_row_is_diffed_word_by_word(pair):
    a, b = texts(pair[0]), texts(pair[1])
    viewer = client(*pair)
    rid = next(i for i in a if i in b and a[i] != b[i])
    answer = viewer.get("/api/compare_row", params={"id": rid}).json()
    assert answer["a"]["reply"]["text"] == a[rid] and answer["b"]["reply"]["text"] == b[rid]
    diff = answer["diff"]
    assert "".join(d["a"] for d in diff) == a[rid]
    assert "".join(d["b"] for d in diff) == b[rid]
    assert {d["op"] for d in diff} <= {"equal", "delete", "insert", "replace"}
    assert any(d["op"] != "equal" for d in diff)
    only = viewer.get("/api/compare_row", params={"id": "g0"}).json()
    assert only["b"] is None and only["diff"] == [{"op": "delete", "a": a["g0"], "b": ""}]


def test_the_models_of_one_models_output(tmp_path):
    rows = [r for r in input_rows(4) if r["id"].startswith("g")]
    source = write_rows(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    run = run_lmpress(
        "batch", "--models", "tiny-native,tiny-llamacpp", "-i", str(source), "-o", str(out),
        "--generation.max_new_tokens", "6", "--cache", "off",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    by_model: dict[str, dict[str, str]] = {}
    for row in read_rows(out):
        by_model.setdefault(row["model"], {})[row["id"]] = row["response"]["text"]
    viewer = client(out)
    (source_info,) = viewer.get("/api/sources").json()["sources"]
    assert source_info["kind"] == "models"
    assert source_info["parts"] == [
        {"name": "tiny-native", "rows": 4},
        {"name": "tiny-llamacpp", "rows": 4},
    ]
    overview = viewer.get("/api/overview").json()
    assert [p["name"] for p in overview["by_part"]] == ["tiny-native", "tiny-llamacpp"]
    assert overview["plots"]["cost_by_part"]["names"] == ["tiny-native", "tiny-llamacpp"]
    model_rows = viewer.get("/api/rows", params={"model": "tiny-llamacpp"}).json()
    assert model_rows["total"] == 4
    assert {r["model"] for r in model_rows["rows"]} == {"tiny-llamacpp"}
    rows = listed(viewer, a="a:tiny-native", b="a:tiny-llamacpp")
    native, gguf = by_model["tiny-native"], by_model["tiny-llamacpp"]
    assert [r["id"] for r in rows] == list(native)
    assert [(r["a"]["text"], r["b"]["text"]) for r in rows] == [
        (native[i], gguf[i]) for i in native
    ]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """Two outputs written with `--id-column key` from inputs whose own `id`s differ (each
    input file numbered its rows), so that only the chosen column pairs them: A has k0..k4,
    B k2..k6 and a row that fails (its id, in the errors file, is its key)."""
    folder = tmp_path_factory.mktemp("keyed")
    outputs = []
    for name, keys in (("a", range(5)), ("b", range(2, 7))):
        rows = [{"id": f"{name}-{i}", "key": f"k{i}", "prompt": f"number {i}"} for i in keys]
        if name == "b":
            rows.append({"id": "b-bad", "key": "k-bad", "messages": [{"role": "x", "content": ""}]})
        source = write_rows(folder / f"{name}.in.jsonl", rows)
        out = folder / f"{name}.jsonl"
        run = run_lmpress(
            "batch", "-i", str(source), "-o", str(out), "--engine", "LLAMACPP",
            "--model.model_name", "tiny-gguf:llama", "--generation.max_new_tokens", "4",
            "--cache", "off", "--id-column", "key",
        )  # fmt: skip
        assert run.returncode == (1 if name == "b" else 0), run.stderr
        outputs.append(out)
    return outputs


def test_outputs_written_with_id_column_pair_and_show_by_that_column(keyed):
    a, b = ({row["key"]: row for row in read_rows(path)} for path in keyed)
    assert a["k2"]["id"] == "a-2" and b["k2"]["id"] == "b-2"  # the inputs' own ids stay
    viewer = client(*keyed)
    rows = listed(viewer)
    assert [r["id"] for r in rows] == [*a, *(k for k in b if k not in a), "k-bad"]
    assert sorted(r["id"] for r in listed(viewer, only="only_a")) == ["k0", "k1"]
    assert sorted(r["id"] for r in listed(viewer, only="only_b")) == ["k-bad", "k5", "k6"]
    both = [r for r in rows if r["a"] and r["b"]]
    assert sorted(r["id"] for r in both) == ["k2", "k3", "k4"] and all(r["same"] for r in both)
    one = viewer.get("/api/compare_row", params={"id": "k3"}).json()
    assert one["a"]["reply"]["text"] == a["k3"]["response"]["text"]
    assert one["b"]["reply"]["text"] == b["k3"]["response"]["text"]
    shown = viewer.get("/api/rows", params={"source": "b", "limit": 100}).json()["rows"]
    assert [r["id"] for r in shown] == [*b, "k-bad"]
