"""IdKeys: the compact set of row-id keys that resume and duplicate checks use."""

from __future__ import annotations

import random

from lmpress.data.idkeys import IdKeys
from lmpress.data.resume import id_key


def test_membership_matches_a_plain_set():
    rng = random.Random(0)
    added = {rng.getrandbits(64) for _ in range(20_000)}
    keys = IdKeys(added)
    assert keys.freeze() is None
    assert len(keys) == len(added) and set(keys) == added
    assert all(k in keys for k in rng.sample(sorted(added), 500))
    others = (rng.getrandbits(64) for _ in range(2_000))
    assert not any(k in keys for k in others if k not in added)
    # The edges of the key space land in the first and last buckets.
    edges = IdKeys([0, 2**64 - 1])
    assert 0 in edges and 2**64 - 1 in edges and 1 not in edges


def test_freeze_names_a_repeated_key():
    keys = IdKeys(id_key(f"row-{i}") for i in range(1_000))
    keys.add(id_key("row-417"))
    assert keys.freeze() == id_key("row-417")


def test_empty_and_truthiness():
    assert not IdKeys() and len(IdKeys()) == 0 and 5 not in IdKeys()
    assert IdKeys([7])


def test_repeats_counts_every_key_added_again_and_keys_can_still_be_added():
    rng = random.Random(1)
    added = [rng.getrandbits(64) for _ in range(5_000)]
    again = added[:40] + added[:3] + [added[7]] * 5
    keys = IdKeys(added + again)
    assert keys.repeats() == len(again) == len(added + again) - len(set(added))
    keys.add(added[100])
    assert keys.repeats() == len(again) + 1
    assert IdKeys().repeats() == 0
