"""What the Hugging Face hub reads from a dataset card's YAML front matter: which file holds
the data (`configs`), its splits and features (`dataset_info`), its size and tags.

Features are written only where the dataset's file carries a schema (Parquet, a save_to_disk
directory), read from its metadata without reading rows; a JSONL dataset's card names its
file and size and lets the hub infer the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The hub's size categories, by upper bound (huggingface_hub's DatasetCardData).
SIZES = (
    (1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
    (10**7, "1M<n<10M"), (10**8, "10M<n<100M"), (10**9, "100M<n<1B"), (10**10, "1B<n<10B"),
    (10**11, "10B<n<100B"), (10**12, "100B<n<1T"),
)  # fmt: skip


def front_matter(directory: Path, data_path: str, data_format: str, rows: int) -> dict[str, Any]:
    """The keys the hub reads: the data file (`data_path` under `directory`) as the default
    config's train split, its size, its features where its file has a schema, and tags."""
    data = data_path
    if data_format == "hf":  # a save_to_disk directory: the hub reads its Arrow files
        data = f"{data.rstrip('/')}/data-*.arrow"
    info: dict[str, Any] = {}
    features = hf_features(dataset_schema(directory / data_path))
    if features is not None:
        info["features"] = features
    info["splits"] = [{"name": "train", "num_examples": rows}]
    return {
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": data}]}],
        "dataset_info": info,
        "size_categories": [size_category(rows)],
        "language_creators": ["machine-generated"],
        "tags": ["lmpress", "synthetic"],
    }


def size_category(rows: int) -> str:
    return next((name for bound, name in SIZES if rows < bound), "n>1T")


def dataset_schema(path: Path) -> Any | None:
    """The Arrow schema of a Parquet file or a save_to_disk directory, read from its metadata
    (no rows); None for JSONL, which has none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.is_file() and path.suffix == ".parquet":
            return pq.read_schema(path)
        if path.is_dir():
            arrow = sorted(path.glob("data-*.arrow"))
            if arrow:
                with pa.memory_map(str(arrow[0])) as source:
                    return pa.ipc.open_stream(source).schema
    except (OSError, pa.ArrowException):
        pass
    return None


def hf_features(schema: Any | None) -> list[dict[str, Any]] | None:
    """`dataset_info.features` as the hub writes them, for the types a pipeline's dataset
    has (text, numbers, booleans, lists and structs of them); None where a column has another
    type, so a card never claims a feature it cannot spell."""
    if schema is None:
        return None
    try:
        return [{"name": f.name, **_feature(f.type)} for f in schema]
    except _Unspelled:
        return None


class _Unspelled(Exception):
    """An Arrow type this card does not write as a feature."""


def _feature(kind: Any) -> dict[str, Any]:
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return {"struct": [{"name": f.name, **_feature(f.type)} for f in kind]}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = _feature(kind.value_type)
        return {"list": inner.get("dtype", inner.get("struct", inner))}
    return {"dtype": _dtype(kind)}


def _dtype(kind: Any) -> str:
    import pyarrow as pa

    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_null(kind):
        return "null"
    if pa.types.is_integer(kind):
        return str(kind)  # int64, uint8...: the names datasets gives them
    if pa.types.is_floating(kind):
        return f"float{kind.bit_width}"  # Arrow calls them halffloat, float and double
    raise _Unspelled(str(kind))
