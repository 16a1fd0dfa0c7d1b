"""The pooling a model directory declares, and `pool` against sentence-transformers' own
Pooling module on the same hidden states."""

from __future__ import annotations

import json

import pytest
import torch

from lmpress.engines.common.pooling import pool, read_pooling
from lmpress.vocabulary.errors import ModelLoadError

MODES = {"mean": "mean", "cls": "cls", "max": "max", "last": "lasttoken",
         "mean_sqrt_len": "mean_sqrt_len_tokens"}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_pool_equals_sentence_transformers(mode):
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    reference = Pooling(8, MODES[mode])({"token_embeddings": hidden, "attention_mask": mask})[
        "sentence_embedding"
    ]
    torch.testing.assert_close(pool(hidden, mask, mode), reference)


def write_model(root, modules, pooling=None):
    (root / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
         for i, (t, p) in enumerate(modules)]
    ))  # fmt: skip
    if pooling is not None:
        (root / "1_Pooling").mkdir()
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def test_a_directory_declares_its_pooling(tmp_path):
    assert read_pooling(tmp_path).mode == "mean"  # a plain directory: mean, no norm
    write_model(tmp_path, [("Transformer", ""), ("Pooling", "1_Pooling")],
                {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})  # fmt: skip
    (tmp_path / "config_sentence_transformers.json").write_text('{"truncate_dim": 64}')
    pooling = read_pooling(tmp_path)
    assert (pooling.mode, pooling.normalize, pooling.truncate_dim) == ("cls", False, 64)


@pytest.mark.parametrize(
    ("modules", "pooling", "says"),
    [
        ([("Transformer", ""), ("Dense", "2_Dense")], None, "module 'sentence_transformers"),
        ([("Pooling", "1_Pooling")], {"pooling_mode_cls_token": True,
                                      "pooling_mode_mean_tokens": True}, "exactly one of"),
    ],
)  # fmt: skip
def test_pooling_lmpress_cannot_apply_is_refused(tmp_path, modules, pooling, says):
    write_model(tmp_path, modules, pooling)
    with pytest.raises(ModelLoadError, match=says):
        read_pooling(tmp_path)
