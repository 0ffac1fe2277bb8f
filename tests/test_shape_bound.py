"""The certified step-time lower bound of issue 23's headroom benchmark (benchmarks/shape_bound.py):
never above the true step time of any placement (checked exhaustively on small states), and tight
where the optimum is known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.search.shape import Placement, from_ranks, score
from bandpilot.dispatch.shape import Shape
from bandpilot.dispatch.state import State
from benchmarks.bench_shape_bound import small_state
from benchmarks.shape_bound import Bounder, lower_bound
from tests.test_shape import H100, NVL


def _small_state(seed: int) -> State:
    return small_state(H100, seed)


@pytest.mark.parametrize("seed", range(10))
def test_bound_is_below_every_placement_of_a_small_state(seed):
    state = _small_state(seed)
    truth = ContentionPredictor(H100, state)
    b = Bounder(H100)
    fb = b.state(state.free, truth.host_exposure)
    spec = H100.spec
    free = [spec.parse_gpu(g, "free") for g in spec.from_mask(state.free)]
    for tp, pp, dp in ((2, 1, 2), (2, 2, 1), (1, 2, 2)):
        shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
        lb, _ = lower_bound(b, fb, shp)
        cands = [Placement(np.array([h for h, _ in p]), np.array([i for _, i in p]))
                 for p in itertools.permutations(free, shp.k)]  # every rank map: the exact optimum
        score(truth, shp, cands)
        best = min(c.step_ms for c in cands)
        assert lb <= best * (1 + 1e-9), (seed, str(shp), lb, best)


def test_bound_is_below_the_searches_on_a_large_busy_state():
    from benchmarks.bench_dispatch import random_state

    for fab in (H100, NVL):
        state = random_state(fab.spec, fab, np.random.default_rng(3), "heavy", 64)
        truth = ContentionPredictor(fab, state)
        b = Bounder(fab)
        fb = b.state(state.free, truth.host_exposure)
        disp = Dispatcher(fab)
        for tp, pp, dp in ((8, 1, 4), (4, 2, 4), (2, 4, 2)):
            shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
            if shp.k > state.n_free:
                continue
            lb, _ = lower_bound(b, fb, shp)
            picks = [from_ranks(fab.spec, disp.select(shp.k, state, a, shape=shp).ranks)
                     for a in ("shape", "blind", "segment")]
            score(truth, shp, picks)
            assert lb <= min(p.step_ms for p in picks) * (1 + 1e-9), (fab.spec.name, str(shp))


def test_bound_is_attained_where_one_domain_holds_the_job():
    """Idle NVL72 cluster, tp=8,dp=8 (64 GPUs in one 72-GPU domain): every group inside the domain
    at its best in-domain bandwidth, which the compact placement achieves - bound = optimum."""
    state = State.idle(NVL.spec)
    truth = ContentionPredictor(NVL, state)
    b = Bounder(NVL)
    shp = Shape.parse("tp=8,dp=8")
    lb, at = lower_bound(b, b.state(state.free), shp)
    blind = from_ranks(NVL.spec, Dispatcher(NVL).select(shp.k, state, "blind", shape=shp).ranks)
    score(truth, shp, [blind])
    assert at == "tp:in,dp:in"
    assert lb == pytest.approx(blind.step_ms, rel=1e-9)


def _racked() -> "object":
    """The emulated 4 x 8 H100 cluster in 2 racks of 2 hosts: the rack lemma's smallest case."""
    import yaml

    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.topology.cluster import spec_from_dict

    doc = yaml.safe_load(open("params/clusters/h100.yaml"))
    doc["name"], doc["host_groups"][0]["domain_size"] = "h100-racked", 2
    return make_fabric(spec_from_dict(doc, source="h100-racked"))


RACKED = _racked()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), sh=st.sampled_from([(2, 1, 2), (2, 2, 1), (1, 2, 2), (4, 1, 1)]),
       racked=st.booleans())
@example(seed=185, sh=(4, 1, 1), racked=False)  # a lone spanning group's tenant capacity is not a free-GPU row
def test_rack_and_tenant_lemmas_stay_below_every_placement(seed, sh, racked):
    """The rack lemma (2 racks: axes whose groups must cross) and the per-host tenant lemma (the
    tenants themselves, ``truth``) on random small states: never above the exact optimum."""
    fab = RACKED if racked else H100
    b = Bounder(fab)
    assert b.rack_lemma == racked
    state = small_state(fab, seed)
    truth = ContentionPredictor(fab, state)
    fb = b.state(state.free, truth.host_exposure, truth)
    spec = fab.spec
    free = [spec.parse_gpu(g, "free") for g in spec.from_mask(state.free)]
    tp, pp, dp = sh
    shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
    cands = [Placement(np.array([h for h, _ in p]), np.array([i for _, i in p]))
             for p in itertools.permutations(free, shp.k)]
    score(truth, shp, cands)
    lb, _ = lower_bound(b, fb, shp)
    assert lb <= min(c.step_ms for c in cands) * (1 + 1e-9), (seed, str(shp))
