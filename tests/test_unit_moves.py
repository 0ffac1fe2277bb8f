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
