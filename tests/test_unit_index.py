"""Segmented per-unit reductions (fabric/units.py) against the dense one-hot matmul they replace."""

import numpy as np
from hypothesis import given, settings, strategies as st

from bandpilot.fabric.units import UnitIndex, unit_index
from bandpilot.topology.cluster import load_cluster


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.integers(0, 2**31))
def test_sums_match_one_hot(unit_list, seed):
    _, unit = np.unique(np.array(unit_list), return_inverse=True)  # units 0..U-1, any host order
    U = int(unit.max()) + 1
    ix = UnitIndex(unit, np.ones(U, dtype=bool))
    x = np.random.default_rng(seed).integers(0, 4, size=(7, unit.size))
    onehot = np.zeros((unit.size, U), dtype=np.int64)
    onehot[np.arange(unit.size), unit] = 1
    assert np.array_equal(ix.sum(x), x @ onehot)
    assert np.array_equal(ix.any(x), (x != 0) @ onehot > 0)
    assert np.array_equal(ix.sum(x > 0), (x > 0) @ onehot)
    assert sorted(np.concatenate(ix.members).tolist()) == list(range(unit.size))
    assert all(np.all(unit[m] == u) for u, m in enumerate(ix.members))


def test_cached_per_spec():
    spec = load_cluster("params/clusters/nvl72x16.yaml")
    a = unit_index(spec)
    assert a is unit_index(spec)
    assert a.U == 16 and all(m.size == 18 for m in a.members)
