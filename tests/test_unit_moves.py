"""Issue 24: the unit-level local search's moves, built with one mask over (unit, size) pairs x
targets, are the rows the per-unit loop built (same rows, same order: the same picks)."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.dispatch.search import unit_rows
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import UNIT_TARGETS, Units, _move_rows, _unit_moves, _unit_starts
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from tests.test_domain_model import nvl_spec
from tests.test_domain_search import random_state


def _unit_moves_loop(units: Units, d: np.ndarray, seg: int, cap: np.ndarray) -> np.ndarray:
    """The per-unit loop the vectorised (unit, size) x target pairs replaced; the targets and the
    rows from the pairs come from the same code."""
    src, unused, targets, room = unit_rows.move_targets(units, d, cap, UNIT_TARGETS)
    A, B, T = [], [], []
    for a in src:
        for t in sorted({seg, 4 * seg, int(d[a])}):
            if t > d[a] or t % seg:
                continue
            bs = targets[(room[targets] >= t) & (targets != a)]
            A.append(np.full(bs.size, a))
            B.append(bs)
            T.append(np.full(bs.size, t))
    if not A or sum(b.size for b in B) == 0:
        return np.zeros((0, units.U), dtype=np.int64)
    return _move_rows(units, d, np.union1d(src, unused), np.concatenate(A), np.concatenate(B), np.concatenate(T))


@pytest.mark.parametrize("seed,busy", [(0, 0.0), (1, 0.3), (2, 0.5)])
def test_vectorised_moves_equal_the_loop(seed, busy):
    spec = nvl_spec(domains=10, trays=4)
    fab = make_fabric(spec)
    rng = np.random.default_rng(seed)
    st = State.idle(spec) if busy == 0 else random_state(spec, fab, rng, busy_frac=busy)
    checked = 0
    for k in (20, 28, 44):
        ctx = SearchContext(fab, st, st.free, k)
        units = Units(ctx)
        for seg in (1, 2, 4):
            eligible = np.ones(units.U, dtype=bool)
            cap = units.free // seg * seg
            starts = _unit_starts(units, k - k % seg, seg, eligible)
            # the starts plus random splits of the same size (units with d[a] = seg, 4 seg, ...)
            for d in starts + [np.where(rng.random(units.U) < 0.5, cap, 0) for _ in range(3)]:
                got, want = _unit_moves(units, d, seg, cap), _unit_moves_loop(units, d, seg, cap)
                assert np.array_equal(got, want)
                checked += want.shape[0]
    assert checked > 100


def _move_rows_full(units: Units, d: np.ndarray, cols: np.ndarray, a_: np.ndarray, b_: np.ndarray, t_: np.ndarray) -> np.ndarray:
    """The full-row path ``_move_rows`` replaced: every move's row built, its nonzero cells
    compacted by a per-row argsort, de-duplicated on those sequences."""
    R = unit_rows.moves_sorted(d[cols], np.searchsorted(cols, a_), np.searchsorted(cols, b_), t_)
    sig_id: dict[tuple, int] = {}
    sid = np.array([sig_id.setdefault(units.signature(int(u)), len(sig_id) + 1) for u in cols], dtype=np.int64)
    code = np.where(R > 0, sid[None, :] * (int(R.max()) + 1) + R, 0)
    seq = np.take_along_axis(code, np.argsort(code == 0, axis=1, kind="stable"), axis=1)
    first = unit_rows.first_rows(seq)
    out = np.tile(d, (first.size, 1))
    out[:, cols] = R[first]
    return out


@pytest.mark.parametrize("seed,busy", [(0, 0.0), (1, 0.3), (2, 0.5)])
def test_move_rows_from_the_moves_equal_the_full_rows(seed, busy):
    """Rows built from each move's source and target (sequences from the base's, no per-row
    compaction) are the full-row path's: the same rows in the same order, on the searches' moves
    and on random ones (sources emptied or not, targets used or not, repeats)."""
    spec = nvl_spec(domains=10, trays=4)
    fab = make_fabric(spec)
    rng = np.random.default_rng(seed)
    st = State.idle(spec) if busy == 0 else random_state(spec, fab, rng, busy_frac=busy)
    ctx = SearchContext(fab, st, st.free, 24)
    units = Units(ctx)
    kept = total = 0
    for _ in range(40):
        cap = units.free.copy()
        d = np.where(rng.random(units.U) < 0.5, cap, 0)
        src = np.flatnonzero(d > 0)
        if src.size == 0:
            continue
        cols = np.union1d(src, np.flatnonzero((d == 0) & (cap > 0)))
        n = int(rng.integers(1, 200))
        a = rng.choice(src, size=n)
        b = rng.choice(cols, size=n)
        t = rng.integers(1, d[a] + 1)
        ok = a != b
        a, b, t = np.r_[a[ok], a[ok][:5]], np.r_[b[ok], b[ok][:5]], np.r_[t[ok], t[ok][:5]]
        if a.size == 0:
            continue
        got, want = _move_rows(units, d, cols, a, b, t), _move_rows_full(units, d, cols, a, b, t)
        assert np.array_equal(got, want)
        kept, total = kept + want.shape[0], total + a.size
        # no two units alike (a trained model's distinct trays): the distinct moves, in order
        sig = units.signature
        units.signature = lambda u, coarse=False: ("unit", u)
        got, want = _move_rows(units, d, cols, a, b, t), _move_rows_full(units, d, cols, a, b, t)
        units.signature = sig
        assert np.array_equal(got, want) and want.shape[0] == np.unique(np.c_[a, b, t], axis=0).shape[0]
    assert 0 < kept < total  # some moves were alike (interchangeable targets, repeats)


@pytest.mark.parametrize("seed", range(8))
def test_move_sequences_are_the_compacted_rows(seed):
    """Each move's sequence of nonzero (signature, count) cells equals its full row compacted, on
    random bases with few signatures (many alike cells) - dropped sources, inserted targets."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(2, 12))
    base = rng.integers(0, 4, size=width) * rng.integers(0, 2, size=width)
    base[rng.integers(0, width)] = 3
    sid = rng.integers(1, 4, size=width)
    src = np.flatnonzero(base)
    n = 300
    pa = rng.choice(src, size=n)
    pb = rng.integers(0, width, size=n)
    t = rng.integers(1, base[pa] + 1)
    ok = pa != pb
    pa, pb, t = pa[ok], pb[ok], t[ok]
    R = np.tile(base, (pa.size, 1))
    R[np.arange(pa.size), pa] -= t
    R[np.arange(pa.size), pb] += t
    seq = unit_rows.move_sequences(base, sid, pa, pb, t)
    W = int(max(base.max(), R.max())) + 1
    for i in range(pa.size):
        nz = np.flatnonzero(R[i])
        want = np.zeros(src.size + 1, dtype=np.int64)
        want[: nz.size] = sid[nz] * W + R[i, nz]
        assert np.array_equal(seq[i], want), i
    with pytest.raises(ValueError, match="at most"):
        unit_rows.move_sequences(base, sid, pa[:1], pb[:1], base[pa[:1]] + 1)
