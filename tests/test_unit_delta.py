"""The unit-level shortcuts of the domain search (issue 24) give exactly what they replace: the
emulator's per-unit delta prediction equals its dense column prediction bit for bit, mask rows built
as base + changed units equal the rows scattered part by part, and the hash de-duplication keeps
``np.unique``'s rows and order."""

import numpy as np
import pytest

from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units, _unit_moves
from bandpilot.dispatch.search.unit_rows import first_rows, moves_sorted, unique_sorted
from bandpilot.fabric import unit_delta
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster

SPEC = "params/clusters/nvl72x16.yaml"


@pytest.fixture(scope="module")
def fab():
    return make_fabric(load_cluster(SPEC))


def _busy(fab, seed: int):
    from benchmarks.scale_states import busy_state  # the scale benchmark's state generator

    return busy_state(fab.spec, fab, np.random.default_rng(seed), 0.5, "moderate", reserve=256)


def _near_rows(rng, n_hosts: int, n: int) -> np.ndarray:
    """A base row over many trays and rows that change a few trays of it (local-search batches),
    plus rows unlike it, single-tray and empty rows."""
    base = np.where(rng.random(n_hosts) < 0.6, rng.integers(1, 16, n_hosts), 0)
    rows = np.tile(base, (n, 1))
    for i in range(n):
        hs = rng.choice(n_hosts, size=int(rng.integers(1, 3)), replace=False)
        rows[i, hs] = np.where(rng.random(hs.size) < 0.3, 0, rng.integers(1, 16, hs.size))
    rows[n // 3] = np.where(rng.random(n_hosts) < 0.2, rng.integers(1, 16, n_hosts), 0)
    rows[n // 2] = 0
    rows[n // 2, rng.integers(n_hosts)] = 7
    rows[n // 2 + 1] = 0
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delta_prediction_equals_the_dense_one(fab, seed):
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(fab.spec.n_hosts, size=150, replace=False))
    if seed == 2:  # columns not grouped by unit: the delta path sorts them first
        cols = rng.permutation(cols)
    masks = _near_rows(rng, cols.size, 80)
    assert masks.shape[0] >= unit_delta.DELTA_FROM
    got = unit_delta.predict_columns_delta(fab, masks, cols)
    assert got is not None  # rows like a local-search batch: the delta path
    dense = np.array([fab.predict_columns(m[None, :], cols)[0] for m in masks])  # one row: the dense path
    np.testing.assert_array_equal(got, dense)
    np.testing.assert_array_equal(fab.predict_columns(masks, cols), dense)
    full = np.zeros((masks.shape[0], fab.spec.n_hosts), dtype=np.int64)
    full[:, cols] = masks
    np.testing.assert_allclose(got, fab.predict_masks(full), rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_mask_rows_equal_the_parts_scattered(fab, seed):
    st = _busy(fab, seed)
    ctx = SearchContext(fab, st, st.free, 160)
    units = Units(ctx)
    rng = np.random.default_rng(seed)
    d = np.zeros(units.U, dtype=np.int64)
    used = rng.choice(np.flatnonzero(units.free >= 8), size=5, replace=False)
    d[used] = rng.integers(1, units.free[used] + 1)
    D = np.vstack([d, _unit_moves(units, d, 1, units.free), np.minimum(units.free, 3)])
    masks, cols = units.mask_rows(D)
    want = np.zeros((D.shape[0], ctx.H), dtype=np.int64)
    for i, row in enumerate(D):
        counts = sum((units.part(u, int(t)) for u, t in enumerate(row) if t), np.zeros(ctx.H, dtype=np.int64))
        want[i] = ctx.masks_from_counts(counts)[0]
    assert np.array_equal(cols, np.flatnonzero(want.any(axis=0)))
    assert np.array_equal(masks, want[:, cols])


def test_hash_dedup_keeps_numpys_rows_and_order():
    rng = np.random.default_rng(3)
    rows = rng.integers(-3, 4, size=(400, 6))
    rows[200:] = rows[rng.integers(0, 200, 200)]  # many duplicates, out of order
    assert np.array_equal(unique_sorted(rows), np.unique(rows, axis=0))
    assert np.array_equal(first_rows(rows), np.sort(np.unique(rows, axis=0, return_index=True)[1]))
    assert first_rows(rows[:1]).tolist() == [0]


def test_unrelated_rows_take_the_dense_path(fab):
    rng = np.random.default_rng(4)
    cols = np.sort(rng.choice(fab.spec.n_hosts, size=150, replace=False))
    masks = np.where(rng.random((64, cols.size)) < 0.5, rng.integers(1, 16, (64, cols.size)), 0)
    assert unit_delta.predict_columns_delta(fab, masks, cols) is None
    dense = np.array([fab.predict_columns(m[None, :], cols)[0] for m in masks])
    np.testing.assert_array_equal(fab.predict_columns(masks, cols), dense)


@pytest.mark.parametrize("seed", range(6))
def test_moves_sorted_is_numpys_unique_of_the_move_rows(seed):
    """Rows of moves (t GPUs from one column to another of one base row), repeats included:
    ordered and de-duplicated from the moves alone, as np.unique orders the rows."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(2, 9))
    base = rng.integers(0, 6, size=width)
    n = int(rng.integers(1, 300))
    pa = rng.integers(0, width, size=n)
    pb = (pa + rng.integers(1, width, size=n)) % width  # never the source
    t = rng.integers(1, 4, size=n)
    pick = rng.integers(0, n, size=n // 2)
    pa, pb, t = (np.r_[x, x[pick]] for x in (pa, pb, t))  # the same moves again
    rows = np.tile(base, (pa.size, 1))
    rows[np.arange(pa.size), pa] -= t
    rows[np.arange(pa.size), pb] += t
    assert np.array_equal(moves_sorted(base, pa, pb, t), np.unique(rows, axis=0))
    with pytest.raises(ValueError, match="t > 0"):
        moves_sorted(base, pa, pa, t)
