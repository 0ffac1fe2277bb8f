"""Non-local moves of the shape search's refinement (relocate a TP group, evacuate a host)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.search.shape import candidates, from_ranks, score
from bandpilot.dispatch.search.shape_moves import nonlocal_moves, refine_nonlocal
from bandpilot.dispatch.search.shape_refine import tp_aligned as _aligned
from bandpilot.dispatch.search.shape_refine import refine
from bandpilot.dispatch.shape import Shape
from bandpilot.dispatch.shaped import default_refiners
from bandpilot.dispatch.state import State
from tests.test_shape import H100, H100_SHAPES, NVL, _shaped_states


def _check_valid(fab, state, shp, targets):
    pred = ContentionPredictor(fab, state)
    unit = fab.spec.units[0]
    base = candidates(fab.spec, state.free, shp, pred, {})[0]
    H, Ix = nonlocal_moves(fab.spec, base, state.free, shp, 500, np.random.default_rng(0), targets, pred.exposed)
    assert H.shape == Ix.shape and H.shape[1] == shp.k
    for h, i in zip(H, Ix):
        assert len(set(zip(h.tolist(), i.tolist()))) == shp.k  # k distinct GPUs
        assert all(int(state.free[a]) >> int(b) & 1 for a, b in zip(h, i))  # all free
        assert not (np.array_equal(h, base.hosts) and np.array_equal(i, base.idx))  # a real move
    if _aligned(base.hosts[None, :], unit, shp.tp)[0] and H.shape[0]:
        assert _aligned(H, unit, shp.tp).all()  # the TP rule survives every move
    score(pred, shp, [base])
    out = refine_nonlocal(pred, shp, base, state.free)
    assert out.step_ms <= base.step_ms


@settings(max_examples=40, deadline=None)
@given(_shaped_states(H100, H100_SHAPES))
def test_nonlocal_moves_are_valid_and_never_worse(case):
    state, shp = case
    if shp.k <= state.n_free:
        _check_valid(H100, state, shp, 4)
        _check_valid(H100, state, shp, None)


@settings(max_examples=6, deadline=None)
@given(_shaped_states(NVL, [(4, 2, 8), (8, 1, 4), (2, 4, 4)]))
def test_nonlocal_moves_are_valid_nvl(case):
    state, shp = case
    if shp.k <= state.n_free:
        _check_valid(NVL, state, shp, 4)


def _contended_case():
    """tp=4,dp=2 on h100-0 and h100-2; a heavy cross-host tenant (h100-0:7, h100-1:7) shares h100-0;
    h100-2 and h100-3 are free and clean."""
    spec = H100.spec
    free = [f"h100-{h}:{i}" for h in (0, 1) for i in range(4)] + [f"h100-{h}:{i}" for h in (2, 3) for i in range(8)]
    state = State.from_dict(spec, {"free": free, "jobs": [{"id": "t", "gpus": ["h100-0:7", "h100-1:7"],
                                                          "demand_gbps": 200.0}]})
    shp = Shape.parse("tp=4,dp=2")
    start = from_ranks(spec, [f"h100-{h}:{i}" for h in (0, 2) for i in range(4)])
    return state, shp, start


def test_evacuation_leaves_a_contended_host_local_moves_cannot():
    """Each DP group spans a host a heavy tenant's traffic crosses; leaving it needs a whole TP group
    to leave its host at once. The local refinement keeps every TP group in its host (the TP rule),
    so it stays on h100-0; the non-local pass moves h100-0's ranks to a clean host."""
    state, shp, start = _contended_case()
    pred = ContentionPredictor(H100, state)
    score(pred, shp, [start])
    local = refine(pred, shp, start, state.free)
    assert 0 in local.hosts
    moved = refine_nonlocal(pred, shp, start, state.free)
    assert moved.step_ms < start.step_ms * 0.99
    assert 0 not in moved.hosts and moved.label.endswith("+moved")
    assert moved.axis_gbps["dp"] > start.axis_gbps["dp"]


def test_default_refiners_and_the_dispatcher_setting():
    # measured: no non-local gain on NVLink-domain clusters, the rail layout gains there
    assert default_refiners(NVL.spec) == ("local", "rail")
    assert default_refiners(H100.spec) == ("local", "nonlocal", "repair")
    state, shp, _ = _contended_case()
    disp = Dispatcher(H100)
    assert disp.shape_refiners is None
    full = disp.select(shp.k, state, shape=shp).placement
    disp.shape_refiners = ()
    bare = disp.select(shp.k, state, shape=shp).placement
    assert full["step_ms"] <= bare["step_ms"]
    assert "+refined" not in bare["layout"] and "+moved" not in bare["layout"]


def test_gap_oracle_never_above_its_starts_and_leaves_the_contended_host():
    """``bench_shape_gap``'s oracle (climbs + kicks on the truth) returns a placement no slower than
    its best start point, and here one off the contended host."""
    from benchmarks.bench_shape_gap import search

    state, shp, start = _contended_case()
    truth = ContentionPredictor(H100, state)
    other = from_ranks(H100.spec, [f"h100-{h}:{i}" for h in (2, 3) for i in range(4, 8)])
    score(truth, shp, [start, other])
    best = search(truth, shp, [start, other], state.free, rounds=5, rows=5000, kicks=2, seed=0)
    assert best.step_ms <= min(start.step_ms, other.step_ms)
    assert 0 not in best.hosts and best.step_ms < start.step_ms


def test_nonlocal_budget_counts_the_rows_sent():
    """The non-local pass's row budget counts the rows the incremental scorer sends: the groups a
    move touches (here its stage's DP groups and the PP groups beside it), fewer than full re-scores,
    and at least the distinct rows the model evaluates."""
    from bandpilot.dispatch.search import shape_moves
    from bandpilot.dispatch.search.shape import group_ranks
    from bandpilot.dispatch.search.shape_delta import MoveScorer
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.topology.cluster import load_cluster

    big = make_fabric(load_cluster("params/clusters/h100-128.yaml"))
    spec = big.spec
    # tp=4,pp=4,dp=2 on GPUs 0-3 of hosts 0-7 (a stage per host pair); a tenant on GPUs 4-7 of those
    # hosts crosses them all; hosts 8-15 are free and clean
    free = [f"{spec.hosts[h].name}:{i}" for h in range(8) for i in range(4)] + \
        [f"{spec.hosts[h].name}:{i}" for h in range(8, 16) for i in range(8)]
    tenant = [f"{spec.hosts[h].name}:{i}" for h in range(8) for i in range(4, 8)]
    state = State.from_dict(spec, {"free": free, "jobs": [{"id": "t", "gpus": tenant, "demand_gbps": 300.0}]})
    shp = Shape.parse("tp=4,pp=4,dp=2")
    start = from_ranks(spec, free[:32])
    pred = ContentionPredictor(big, state)
    score(pred, shp, [start])
    each = 2 * sum(g.shape[0] for g in group_ranks(shp).values())
    cap = max(shape_moves.ROUND_ROWS // each, shape_moves.MIN_ROUND)
    H, Ix = nonlocal_moves(spec, start, state.free, shp, cap, np.random.default_rng(0), shape_moves.TARGETS,
                           pred.exposed)
    scorer = MoveScorer(pred, shp, start)
    before = pred.evaluations
    scorer.step_ms(H, Ix)
    assert 0 < pred.evaluations - before <= scorer.rows_sent < H.shape[0] * each
