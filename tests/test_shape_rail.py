"""Rail layout of a shaped placement (bandpilot/dispatch/search/shape_rail.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import candidates, group_ranks, score
from bandpilot.dispatch.search.shape_rail import rail_layout, refine_rail
from bandpilot.dispatch.search.shape_refine import tp_aligned
from bandpilot.dispatch.shape import Shape
from bandpilot.dispatch.state import State
from tests.test_shape import NVL, _shaped_states


def test_rail_layout_puts_one_dp_group_on_each_tray():
    """Idle NVL72, tp=4,dp=32 (128 GPUs: two domains, so the DP rings cross domains): the re-deal
    keeps the GPU set and every TP group inside its domain, spreads each TP group over 4 trays and
    puts 4 replicas of one TP index - one DP group's ranks - on (almost) each tray; it is predicted faster
    (the DP rings no longer share trays) and the refiner keeps it."""
    state = State.idle(NVL.spec)
    pred = ContentionPredictor(NVL, state)
    shp = Shape.parse("tp=4,dp=32")
    unit = NVL.spec.units[0]
    start = candidates(NVL.spec, state.free, shp, pred, {})[0]
    rail = rail_layout(start, shp, unit)
    assert sorted(zip(rail.hosts.tolist(), rail.idx.tolist())) == sorted(zip(start.hosts.tolist(), start.idx.tolist()))
    assert tp_aligned(rail.hosts[None, :], unit, shp.tp)[0]
    tp_groups = group_ranks(shp)["tp"]
    assert all(len(set(rail.hosts[g].tolist())) == 4 for g in tp_groups)
    dp_of = np.empty(shp.k, dtype=np.int64)
    for i, g in enumerate(group_ranks(shp)["dp"]):
        dp_of[g] = i
    per_tray = [len(set(dp_of[rail.hosts == h].tolist())) for h in np.unique(rail.hosts)]
    # a domain holds 18 replicas, 4.5 trays' worth per TP index: the boundary trays hold two
    assert max(per_tray) <= 2 and per_tray.count(1) >= 0.75 * len(per_tray)
    score(pred, shp, [start, rail])
    assert rail.step_ms < start.step_ms
    got = refine_rail(pred, shp, start, state.free)
    assert got.step_ms == min(rail.step_ms, got.step_ms) and "+rail" in got.label


@settings(max_examples=8, deadline=None)
@given(_shaped_states(NVL, [(4, 2, 8), (8, 1, 4), (2, 4, 4)]))
def test_rail_refiner_keeps_the_units_ranks_and_is_never_worse(case):
    state, shp = case
    if shp.k > state.n_free:
        return
    pred = ContentionPredictor(NVL, state)
    unit = NVL.spec.units[0]
    start = candidates(NVL.spec, state.free, shp, pred, {})[0]
    for first in (True, False):
        r = rail_layout(start, shp, unit, first)
        assert np.array_equal(np.sort(unit[r.hosts]), np.sort(unit[start.hosts]))
        assert sorted(zip(r.hosts.tolist(), r.idx.tolist())) == sorted(zip(start.hosts.tolist(), start.idx.tolist()))
        if tp_aligned(start.hosts[None, :], unit, shp.tp)[0]:
            assert tp_aligned(r.hosts[None, :], unit, shp.tp)[0]
    score(pred, shp, [start])
    assert refine_rail(pred, shp, start, state.free).step_ms <= start.step_ms
