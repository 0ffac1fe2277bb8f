"""The ``hesrpt-suspend`` elastic admission rule (issue 22, a flag): heSRPT shares by rank in remaining
work, the shortest the most, a running job whose share is below its ``min_k`` suspended; and growth
pricing from the collective share at the current size (:func:`current_share`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.scheduling.elastic import Candidate, elastic_quotas
from bandpilot.scheduling.elastic_hesrpt import hesrpt_quotas, hesrpt_shares
from bandpilot.scheduling.elastic_pricing import current_share, grow_ratio
from bandpilot.simulation.elastic import epoch_time


def test_hesrpt_shares_add_up_and_favour_the_shortest():
    for n in (1, 2, 7, 14):
        for p in (0.3, 0.6, 0.85):
            s = hesrpt_shares(n, p)
            assert math.isclose(sum(s), 1.0) and all(a > b for a, b in zip(s, s[1:]))
    # the flatter the speedup (smaller p), the flatter the shares: the shortest gets less
    assert hesrpt_shares(10, 0.5)[0] < hesrpt_shares(10, 0.85)[0]
    assert hesrpt_shares(1, 0.6) == [1.0]


def test_hesrpt_quotas_share_by_rank_and_suspend_the_longest():
    cands = [Candidate(f"j{i}", 4, 1, 8, 1, 0.5, False, remaining=float(10 ** i)) for i in range(4)]
    got = elastic_quotas(cands, 8, "hesrpt-suspend", host=8)
    # p = 0.6 over 4 jobs on 8 GPUs: shares 0.51, 0.31, 0.15, 0.03 -> 4, 2(+carry), 1, the last waits
    assert got == {"j0": 4, "j1": 3, "j2": 1}
    run_long = Candidate("long", 8, 4, 16, 1, 0.5, True, remaining=1e9)
    got = hesrpt_quotas([run_long, *cands], 8, host=8, p=0.6)
    assert got["long"] == 0  # a running job whose share is below its min_k: suspended (kept in the result)
    assert sum(got.values()) <= 8


def test_hesrpt_keeps_a_running_size_close_to_its_share():
    # a running job at 6 whose share is 4 keeps 6 (no resize for a factor below KEEP_FACTOR) ...
    a = Candidate("a", 6, 1, 8, 1, 0.5, True, remaining=1.0)
    b = Candidate("b", 2, 1, 8, 1, 0.5, False, remaining=2.0)
    assert hesrpt_quotas([a, b], 8, host=8, p=0.0)["a"] == 6  # p = 0: equal shares (4 each)
    # ... but one at 1 whose share is 4 grows
    a1 = Candidate("a", 1, 1, 8, 1, 0.5, True, remaining=1.0)
    assert hesrpt_quotas([a1, b], 8, host=8, p=0.0)["a"] == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3), st.integers(1, 3), st.booleans(),
                          st.floats(1.0, 1e6), st.integers(1, 16)), min_size=1, max_size=14),
       st.integers(4, 48), st.floats(0.0, 0.9))
def test_fuzz_hesrpt_quotas_respect_budget_ranges_and_host(rows, g, p):
    # a running job holds a size of its range; a pending one requests any k
    cands = [Candidate(f"j{i}", lo + step * min(extra, k) if run else k, lo, lo + extra * step, step, 0.5, run,
                       remaining=rem) for i, (lo, extra, step, run, rem, k) in enumerate(rows)]
    got = hesrpt_quotas(cands, g, host=8, p=p)
    assert sum(got.values()) <= g
    for c in cands:
        if c.running:
            assert c.id in got
        q = got.get(c.id, 0)
        if q:
            assert c.lo <= q <= max(c.lo, min(c.hi, 8)) and (q - c.lo) % c.step == 0
        else:
            assert c.id not in got or c.running


@pytest.mark.parametrize("f,k_req,k,b,k1,b1", [
    (0.45, 16, 8, 235.0, 16, 152.0),  # seed 001's J1 at 8 on one host, grown back across the NICs
    (0.35, 8, 4, 244.0, 8, 235.0),
    (0.30, 4, 2, 207.0, 12, 98.0),
    (0.10, 1, 2, 207.0, 4, 244.0),  # a 1-GPU request: its share refers to 2 GPUs
])
def test_grow_ratio_from_the_current_share_is_the_runtime_models_ratio(f, k_req, k, b, k1, b1):
    b_ref = {1: 207.0, 4: 244.0, 8: 235.0, 16: 152.0}[k_req] if k_req > 1 else 207.0
    eta = 0.9
    now = current_share(f, k_req, b_ref, k, b, eta)
    want = (epoch_time(1.0, k_req, k1, f, eta, b_ref, b1) / epoch_time(1.0, k_req, k, f, eta, b_ref, b))
    assert math.isclose(grow_ratio(now, k, b, k1, b1, eta), want, rel_tol=1e-9)
    if (f, k_req, k) == (0.45, 16, 8):
        # the declared share taken as the share now: the growth looks slower (refused) though it is faster
        assert grow_ratio(f, k, b, k1, b1, eta) > 1.0 > want


def test_current_share_falls_back_to_the_declared_one():
    assert current_share(0.3, 8, 200.0, 1, 0.0) == 0.3
    assert current_share(0.3, 8, float("inf"), 4, 100.0) == 0.3
    assert math.isclose(current_share(0.3, 8, 200.0, 8, 200.0), 0.3)  # at its requested size on b_ref


def test_current_share_lets_a_large_job_on_one_host_grow_back_across_the_nics(fab):
    """Seed 001's J1 (k = 16, share 0.45 across the NICs) shrunk to 8 GPUs on one host, the other
    hosts idle: from its share now (far less than 0.45 over NVLink) 16 GPUs are faster and the growth is
    taken; the declared share read as the share now prices it slower and refuses it."""
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.dispatch.state import State
    from bandpilot.scheduling.elastic import _grow_priced, _placer, _Round
    from bandpilot.scheduling.elastic_gpus import idle_best_gbps
    from bandpilot.scheduling.elastic_pricing import PRICERS

    spec, d = fab.spec, Dispatcher(fab, seed=0)
    mine = spec.to_mask([f"{spec.hosts[0].name}:{i}" for i in range(8)])
    got = {}
    for now in (True, False):
        rnd = _Round(fab, False, "full", {}, {"x": Candidate("x", 8, 4, 32, 1, 1.0, True)}, {"x": 0.45},
                     PRICERS["welfare"], "srpt-suspend", lambda k: idle_best_gbps(d, k), {"x": 0.9}, True,
                     _placer(d, "bandpilot"), {"x": 16}, now)
        got[now] = _grow_priced(rnd, State.idle(spec), "x", mine, 8, 16)[2]
    assert got == {True: 16, False: 8}
