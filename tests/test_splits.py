"""Every registered env has three disjoint splits: train (rollouts, demonstrations), val (in-training
evaluation, every recipe choice) and test (final tables only); train and test keep the ids that earlier
results were measured on (docs/evaluation.md)."""
from __future__ import annotations

import shutil

import pytest

from envs import REGISTRY, make

# (train, val, test) sizes with default options; test sizes are those of the published tables.
SIZES = {"babyai": (40_000, 200, 200), "textcraft": (394, 50, 100), "sciworld": (3592, 1796, 1819), "searchqa": (672, 85, 192),
         "webarena": (178, 26, 52), "miniwob": (10_000, 100, 100)}  # MiniWoB++: seeds, times the offered pages


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_splits_are_disjoint_and_stable(name):
    if name == "sciworld" and shutil.which("java") is None:
        pytest.skip("SciWorld's simulator needs java")
    env = make(name)
    try:
        splits = {s: env.tasks(s) for s in ("train", "val", "test")}
        assert all(splits.values()), {s: len(ids) for s, ids in splits.items()}
        for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
            assert not set(splits[a]) & set(splits[b]), (name, a, b)
        assert all(len(set(ids)) == len(ids) for ids in splits.values())
        assert env.tasks("val") == splits["val"] and env.tasks("test") == splits["test"]  # fixed, not drawn per call
        if name in SIZES:
            pages = len(env.pages) if name == "miniwob" else 1
            assert tuple(len(splits[s]) for s in ("train", "val", "test")) == tuple(n * pages for n in SIZES[name])
        with pytest.raises(ValueError, match="val"):  # an unknown split names the ones there are
            env.tasks("validation")
    finally:
        env.close()


def test_babyai_ids_of_the_splits():
    env = make("babyai")
    val, test = env.tasks("val"), env.tasks("test")
    assert test[:2] == [4_000_000, 4_000_001] and val[:2] == [2_000_000, 2_000_001]  # seeds 100000 and 50000
    assert len({env.subtask(t) for t in val[:40]}) == len({env.subtask(t) for t in test[:40]})  # every family
    assert [t % 40 for t in val[:40]] == list(range(40))  # the first 40: one task of each level
    fresh = env.tasks("fresh")  # the protocol's test: 400 tasks outside train, val and test
    assert len(fresh) == 400 and not set(fresh) & (set(val) | set(test) | set(env.tasks("train")))


def test_miniwob_val_seeds_follow_train():
    env = make("miniwob", pages=["click-button", "enter-text"], test_seeds=3, train_seeds=5, val_seeds=2)
    assert {env.page_seed(t)[1] for t in env.tasks("val")} == {8, 9}
    assert {env.page_seed(t)[1] for t in env.tasks("train")} == set(range(3, 8))
    env.close()
