"""The prior's per-row reductions of a batch of moves, patched from its first row
(:class:`bandpilot.model.move_reduce.MoveReduce`), equal the full token grid's exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bandpilot.model.move_reduce import MoveReduce
from bandpilot.model.unit_grid import token_grid_dense

NAMES = ("cnt", "rails", "intra", "speed")


def _batch(rng, n=300, U=40, max_changed=4):
    """Rows equal to a first row but in 0..``max_changed`` cells (moves: a unit emptied, filled,
    or changed), unit counts 0..12."""
    ref = np.where(rng.random(U) < 0.5, rng.integers(1, 13, U), 0)
    D = np.tile(ref, (n, 1))
    for i in range(1, n):
        k = int(rng.integers(0, max_changed + 1))
        D[i, rng.choice(U, k, replace=False)] = rng.integers(0, 13, k)
    return D


def _features(rng, U):
    table = rng.integers(0, 6, (U, 13, 4)).astype(np.float32)  # small ints: many ties among mins
    table[..., 2] = rng.choice([0.5, 1.0, 2.0], (U, 13))
    table[rng.random((U, 13)) < 0.05, 0] = 0.0  # a part of count 0: padding in the grid
    return lambda us, ts: table[us, ts]


@pytest.mark.parametrize("seed", range(12))
def test_reductions_equal_the_dense_grid(seed):
    rng = np.random.default_rng(seed)
    D = _batch(rng, max_changed=1 + seed % 4)
    feats = _features(rng, D.shape[1])
    u_rail = rng.choice([1.0, 2.0, 4.0], D.shape[1])
    red = MoveReduce(D, feats, NAMES, u_rail)
    X, lu = token_grid_dense(D, feats, 4)
    live = X[..., 0] > 0
    inf = np.float32(np.inf)
    assert red.exact
    assert np.array_equal(red.rows["n_hosts"].numpy(), live.sum(axis=1).astype(np.float32))
    assert np.array_equal(red.rows["sum_cnt"].numpy(), np.where(live, X[..., 0], 0).sum(axis=1, dtype=np.float32))
    rail = np.broadcast_to(u_rail[lu].astype(np.float32), live.shape)
    assert np.array_equal(red.rail_min.numpy(), np.where(live, rail, inf).min(axis=1))
    # an arbitrary per-part value and eligibility, from the parts' features (the grid's alike)
    val = red.tokens["intra"][0] * 3.0 + red.tokens["speed"][0]
    elig = red.tokens["rails"][0] >= 2
    grid_val = X[..., 2] * 3.0 + X[..., 3]
    want = np.where(live & (X[..., 1] >= 2), grid_val, inf).min(axis=1)
    assert np.array_equal(red.min(val, elig).numpy(), want)
    assert np.array_equal(red.min(red.tokens["cnt"][0], None).numpy(), np.where(live, X[..., 0], inf).min(axis=1))


def test_non_integer_counts_are_not_exact():
    rng = np.random.default_rng(0)
    D = _batch(rng)
    red = MoveReduce(D, lambda us, ts: np.full((us.size, 4), 1.5, np.float32), NAMES, np.ones(D.shape[1]))
    assert not red.exact
    assert torch.all(red.rows["n_hosts"] >= 0)
