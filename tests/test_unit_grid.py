"""Issue 24: the prior's token grid of a local-search batch, built from the cells that differ from
its first row, equals the grid scattered from every nonzero cell (so the stand-in's ranking, and
every pick, is unchanged)."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.dispatch.search.screen import _part_jobs
from bandpilot.model.unit_grid import changed_parts, token_grid, token_grid_dense
from bandpilot.topology.cluster import dense_unique


def _features(us: np.ndarray, ts: np.ndarray) -> np.ndarray:
    # distinct per (unit, count) and nonzero in feature 0, like a part's GPU count
    return np.stack([ts.astype(np.float32), us * 1.5 + ts, np.sqrt(us + ts), -ts / (us + 1.0)], axis=1).astype(np.float32)


def _moves(rng: np.random.Generator, U: int, n: int) -> np.ndarray:
    """Rows of one ``d`` with ``t`` GPUs moved from a used unit to another (used or not), as
    :func:`bandpilot.dispatch.search.domains._unit_moves` builds them."""
    d = np.zeros(U, dtype=np.int64)
    used = rng.choice(U, size=U // 3, replace=False)
    d[used] = rng.integers(1, 9, size=used.size) * 8
    rows = [d.copy()]
    while len(rows) < n:
        a = int(rng.choice(used))
        t = int(rng.choice([8, 32, int(d[a])]))
        if t > d[a]:
            continue
        b = int(rng.integers(U))
        if b == a:
            continue
        row = d.copy()
        row[a] -= t
        row[b] += t
        rows.append(row)
    return np.array(rows[1:] if rng.random() < 0.5 else rows)


@pytest.mark.parametrize("seed", range(6))
def test_grid_from_changed_cells_equals_full_scatter(seed):
    rng = np.random.default_rng(seed)
    D = _moves(rng, U=40 + seed * 10, n=300)
    X, lu = token_grid(D, _features, 4)
    X0, lu0 = token_grid_dense(D, _features, 4)
    assert np.array_equal(lu, lu0)
    assert np.array_equal(X, X0)


def test_grid_without_shared_structure_and_edge_rows():
    rng = np.random.default_rng(7)
    D = rng.integers(0, 3, size=(50, 20)) * rng.integers(0, 2, size=(50, 20))
    D[0] = 0  # an empty first row: every part comes from the changed cells
    D[5] = 0
    for M in (D, D[:1], np.zeros((3, 20), dtype=np.int64)):
        X, lu = token_grid(M, _features, 4)
        X0, lu0 = token_grid_dense(M, _features, 4)
        assert np.array_equal(lu, lu0) and np.array_equal(X, X0)


def test_grid_differs_when_a_changed_cell_is_dropped():
    # the check can fail: a grid that ignores one row's move is not the scatter's
    rng = np.random.default_rng(3)
    D = _moves(rng, U=30, n=50)
    X0, _ = token_grid_dense(D, _features, 4)
    Xbad, _ = token_grid(np.tile(D[0], (D.shape[0], 1)), _features, 4)
    assert Xbad.shape != X0.shape or not np.array_equal(Xbad, X0)


def _contention(seed: int, U: int = 30, per_unit: int = 6, n_jobs: int = 9):
    """A predictor and units stand-in: unit ``u``'s part of ``t`` GPUs takes its first ``t % 6 + 1``
    trays; each tray holds a random set of jobs (exposed where it holds one)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    on = rng.random((n_jobs, U * per_unit)) < 0.08
    def part_hosts(u: int, t: int) -> np.ndarray:
        return u * per_unit + np.arange(t % per_unit + 1)[::-1] if t else np.zeros(0, dtype=np.int64)

    def parts(us: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        hs = [part_hosts(a, b) for a, b in zip(us.tolist(), ts.tolist())]
        return np.r_[0, np.cumsum([h.size for h in hs])], np.concatenate([np.zeros(0, dtype=np.int64), *hs]), None

    def jobs_of_parts(ptr: np.ndarray, hosts: np.ndarray) -> np.ndarray:
        return np.array([on[:, hosts[a:b]].any(axis=1) for a, b in zip(ptr[:-1], ptr[1:])]).reshape(-1, n_jobs)

    pred = SimpleNamespace(n_jobs=n_jobs, exposed=on.any(axis=0), jobs_of_parts=jobs_of_parts)
    return pred, SimpleNamespace(parts=parts)


@pytest.mark.parametrize("seed", range(5))
def test_contended_jobs_from_changed_cells_equal_or_over_parts(seed):
    from bandpilot.dispatch.search.screen import _contended

    pred, units = _contention(seed)
    rng = np.random.default_rng(seed + 10)
    D = _moves(rng, U=30, n=200)
    got, want = _contended(pred, D, units), _contended_dense(pred, D, units)
    assert want.any() and not want.all()
    assert np.array_equal(got, want)
    assert np.array_equal(_contended(pred, D, units, changed_parts(D)), want)  # the screen's shared cells
    E = rng.integers(0, 3, size=(40, 30)) * (rng.random((40, 30)) < 0.3)  # no shared first row
    assert np.array_equal(_contended(pred, E, units), _contended_dense(pred, E, units))


def _contended_dense(pred, D: np.ndarray, units) -> np.ndarray:
    """:func:`_contended` by OR-ing every nonzero cell's part (the reference)."""
    r, u = np.nonzero(D)  # row-major: each row's parts together
    width = int(D.max(initial=0)) + 1
    keys, inv = dense_unique(u * width + D[r, u], D.shape[1] * width)
    bits = _part_jobs(pred, units, keys // width, keys % width)
    out = np.zeros((D.shape[0], pred.n_jobs), dtype=bool)
    np.logical_or.at(out, r, bits[inv])
    return out
