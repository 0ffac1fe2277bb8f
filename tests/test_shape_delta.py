"""Incremental scoring of moved placements (shape_delta.MoveScorer) equals the full re-score."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, candidates, score
from bandpilot.dispatch.search.shape_delta import MoveScorer
from bandpilot.dispatch.search.shape_moves import nonlocal_moves
from bandpilot.dispatch.search.shape_refine import _moves
from tests.test_shape import H100, H100_SHAPES, NVL, _shaped_states


def _random_moves(fab, state, shp, base, rng):
    """Swaps, replacements, regroupings (one or two ranks / two TP groups) and non-local moves
    (a TP group or a host's ranks elsewhere), a random sample of each."""
    unit = fab.spec.units[0]
    H1, I1 = _moves(base, state.free, shp, unit, int(fab.spec.gpus_per_host.max()), 40, rng, cover=0.0)
    pred = ContentionPredictor(fab, state)
    H2, I2 = nonlocal_moves(fab.spec, base, state.free, shp, 40, rng, None, pred.exposed)
    return np.concatenate([H1, H2]), np.concatenate([I1, I2])


def _check(fab, case, seed):
    state, shp = case
    if shp.k > state.n_free:
        return
    pred = ContentionPredictor(fab, state)
    for base in candidates(fab.spec, state.free, shp, pred, {})[:2]:
        full_base = Placement(base.hosts, base.idx)
        score(pred, shp, [full_base])
        scorer = MoveScorer(pred, shp, base)
        assert base.step_ms == full_base.step_ms and base.axis_gbps == full_base.axis_gbps
        H, Ix = _random_moves(fab, state, shp, base, np.random.default_rng(seed))
        if not H.shape[0]:
            continue
        moved = [Placement(H[j], Ix[j]) for j in range(H.shape[0])]
        score(pred, shp, moved)
        # exact, not approximate: the refinement must pick the same move as the full re-score
        np.testing.assert_array_equal(scorer.step_ms(H, Ix), [m.step_ms for m in moved])
        # a base fully scored by ``score`` hands its groups' figures to the scorer: the same figures
        assert full_base.groups is not None
        handed = MoveScorer(pred, shp, full_base)
        for a, b in scorer.base.items():
            for key, v in b.items():
                np.testing.assert_array_equal(handed.base[a][key], v, err_msg=f"{a} {key}")
        np.testing.assert_array_equal(handed.step_ms(H, Ix), [m.step_ms for m in moved])
        # the next round's base, built from the touched groups alone, is the full score too
        j = int(np.random.default_rng(seed).integers(H.shape[0]))
        child = scorer.child(j, "moved")
        assert child.placement.step_ms == moved[j].step_ms and child.placement.axis_gbps == moved[j].axis_gbps
        H2, I2 = _random_moves(fab, state, shp, child.placement, np.random.default_rng(seed + 1))
        if H2.shape[0]:
            moved2 = [Placement(H2[i], I2[i]) for i in range(H2.shape[0])]
            score(pred, shp, moved2)
            np.testing.assert_array_equal(child.step_ms(H2, I2), [m.step_ms for m in moved2])
            # the winner hands its figures to the next pass's scorer (local -> non-local)
            assert child.placement.groups is not None
            np.testing.assert_array_equal(MoveScorer(pred, shp, child.placement).step_ms(H2, I2),
                                          [m.step_ms for m in moved2])


@settings(max_examples=40, deadline=None)
@given(_shaped_states(H100, H100_SHAPES))
def test_incremental_score_equals_full_rescore(case):
    _check(H100, case, 0)


@settings(max_examples=6, deadline=None)
@given(_shaped_states(NVL, [(4, 2, 8), (8, 1, 4), (2, 4, 4)]))
def test_incremental_score_equals_full_rescore_nvl(case):
    _check(NVL, case, 1)
