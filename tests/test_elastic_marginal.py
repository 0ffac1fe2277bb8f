"""The ``srpt-marginal`` elastic admission rule (issue 22, a flag): ``srpt-suspend`` with each claim
sized by marginal gain on the job's priced speed curve - the size minimising ``t(k)·(1 + m·k/G)`` with
``m`` the jobs waiting on its GPU-hours."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
from bandpilot.scheduling.elastic import Candidate, elastic_quotas, rebalance
from bandpilot.scheduling.elastic_marginal import curves_of, marginal_claims, speed_curve, with_curves
from bandpilot.simulation.elastic import epoch_time

from tests.test_elastic import new_store

#: Best idle bandwidth by size on the measured h100-16m tables (GB/s; README issue 22).
BEST = {2: 207.4, 4: 244.14, 8: 234.94, 16: 152.08}


def _best(k: int) -> float:
    return BEST[k]


def test_speed_curve_is_the_runtime_models_ratio():
    # seed 001's J3 (k = 8, f = 0.5, eta 0.9): the curve the claims are sized on is the simulator's
    # epoch time at each size on the best placement, relative to the requested k
    curve = dict(speed_curve(8, 0.5, 0.9, [2, 4, 8], _best))
    for k in (2, 4, 8):
        want = epoch_time(1.0, 8, k, 0.5, 0.9, BEST[8], BEST[k]) / epoch_time(1.0, 8, 8, 0.5, 0.9, BEST[8], BEST[8])
        assert curve[k] == pytest.approx(want, rel=1e-9)
    assert curve[2] > curve[4] > curve[8] == pytest.approx(1.0)
    # a 1-GPU request refers its share to 2 GPUs; at 1 GPU it has no collective
    one = dict(speed_curve(1, 0.1, 0.9, [1, 2], _best))
    assert one[2] < one[1]


def _job(jid: str, lo: int, hi: int, rem: float, running: bool = False, k: int | None = None) -> Candidate:
    return Candidate(jid, k or hi, lo, hi, 1, 0.5, running, remaining=rem)


def test_claims_shrink_with_the_jobs_waiting_behind():
    # a J3-like job (2..8, f 0.5): alone it claims its fastest size on one host; with many jobs
    # behind it, the GPU-hours it would hold for them cost more than the time a larger gang saves
    info = {"j3": (8, 0.5, 0.9)}
    alone = with_curves([_job("j3", 2, 16, 1.0)], info, 8, _best)
    assert [k for k, _ in alone[0].curve] == [2, 4, 8]  # sizes that tile a host, up to one host
    assert marginal_claims(alone, 32) == {"j3": 8}
    crowd = [_job(f"w{i}", 4, 16, 10.0 + i) for i in range(30)]
    many = with_curves([_job("j3", 2, 16, 1.0), *crowd], {**info, **{c.id: (16, 0.45, 0.9) for c in crowd}}, 8, _best)
    got = marginal_claims(many, 32)
    assert got["j3"] == 2  # 31 jobs wait on it: the cheapest gang
    assert got["w29"] == 8  # the last job: nothing waits on it, its fastest one-host size
    # running jobs not in the round but with more remaining work count as waiting on it
    assert marginal_claims([c if c.id != "j3" else c.__class__(**{**c.__dict__, "behind": 30})
                            for c in alone], 32) == {"j3": 2}


def test_a_running_job_keeps_a_size_within_the_restart_margin():
    # the best size by cost is 8, but a running job at 4 whose cost there is within 2 % keeps 4
    c = Candidate("r", 4, 2, 8, 1, 0.5, True, remaining=1.0, curve=((2, 2.0), (4, 1.0), (8, 0.5)), behind=0)
    assert marginal_claims([c], 32)["r"] == 8  # 1.0·1.125 vs 0.5·1.25: 8 wins by far
    # 8 at 0.88: cost 1.1 vs 1.125 at 4, a gain of 2.3 %: the job is resized
    flat = Candidate("r", 4, 2, 8, 1, 0.5, True, remaining=1.0, curve=((2, 2.0), (4, 1.0), (8, 0.88)), behind=0)
    assert marginal_claims([flat], 32)["r"] == 8
    # 8 at 0.895: cost 1.11875 vs 1.125, a gain of 0.6 %: not worth a restart, it keeps 4 ...
    flatter = Candidate("r", 4, 2, 8, 1, 0.5, True, remaining=1.0, curve=((2, 2.0), (4, 1.0), (8, 0.895)), behind=0)
    assert marginal_claims([flatter], 32)["r"] == 4
    # ... while a pending job with the same curve takes the best size
    assert marginal_claims([Candidate("p", 4, 2, 8, 1, 0.5, False, remaining=1.0, curve=flatter.curve)], 32)["p"] == 8


def test_srpt_marginal_quotas_suspend_the_longest_and_respect_claims():
    info = {"short": (4, 0.2, 0.9), "mid": (8, 0.35, 0.9), "long": (16, 0.45, 0.9)}
    cands = with_curves([Candidate("long", 8, 4, 32, 1, 0.5, True, remaining=1e6),
                         Candidate("mid", 4, 2, 16, 1, 0.5, True, remaining=5e4),
                         Candidate("short", 4, 1, 8, 1, 0.5, False, remaining=1e3)], info, 8, _best)
    got = elastic_quotas(cands, 8, "srpt-marginal", host=8, n_cluster=8)
    claims = marginal_claims(cands, 8)
    assert got["short"] == claims["short"] and sum(got.values()) <= 8
    assert got["long"] == 0  # the longest gets what is left: below its min_k, suspended
    with pytest.raises(RequestError, match="unknown elastic admission"):
        rebalance(None, None, admission="srpt-marginl")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3), st.integers(1, 3), st.booleans(),
                          st.floats(1.0, 1e6), st.floats(0.0, 0.9)), min_size=1, max_size=12),
       st.integers(8, 48))
def test_fuzz_srpt_marginal_quotas_respect_budget_ranges_and_host(rows, g):
    cands = [Candidate(f"j{i}", lo, lo, lo + extra * step, step, 0.5, run, remaining=rem)
             for i, (lo, extra, step, run, rem, _) in enumerate(rows)]
    info = {f"j{i}": (lo + extra * step, f, 0.9) for i, (lo, extra, step, _, _, f) in enumerate(rows)}
    cands = with_curves(cands, info, 8, lambda k: 200.0 if k <= 8 else 100.0)
    claims = marginal_claims(cands, g)
    for c in cands:
        assert c.lo <= claims[c.id] <= max(c.lo, min(c.hi, 8)) and (claims[c.id] - c.lo) % c.step == 0
    got = elastic_quotas(cands, g, "srpt-marginal", host=8)
    assert sum(got.values()) <= g
    for c in cands:
        if c.running:
            assert c.id in got
        if got.get(c.id, 0):
            assert c.lo <= got[c.id] <= c.hi and (got[c.id] - c.lo) % c.step == 0


def test_rebalance_srpt_marginal_sizes_the_shortest_small_when_many_wait(tmp_path):
    t = [1000.0]
    with use_clock(lambda: t[0]):
        s = new_store(tmp_path)  # 4 hosts x 8 GPUs
        d = Dispatcher(make_fabric(s.spec))
        try:
            # 20 long jobs and one short one, all declaring eta 0.9: the short one has 21 jobs waiting
            # on its GPU-hours and starts at its cheapest tiling size; srpt-suspend would give it 2 x min_k
            q.submit(s, [{"id": f"long{i}", "k": 16, "min_k": 8, "max_k": 32, "scaling": 0.9, "comm_fraction": 0.45,
                          "submitted_at": 900.0} for i in range(20)]
                     + [{"id": "short", "k": 8, "min_k": 2, "max_k": 8, "scaling": 0.9, "comm_fraction": 0.5,
                         "submitted_at": 900.0}])
            q.set_estimates(s, {**{f"long{i}": 8000.0 for i in range(20)}, "short": 3000.0})
            rep = rebalance(s, d, admission="srpt-marginal")
            assert len(q.assignment(s, "short")["gpus"]) == 2
            assert rep.quotas["short"] == 2
            assert sum(len(g) for g in rep.admitted.values()) <= 32
            rep2 = rebalance(new_store(tmp_path / "b"), Dispatcher(make_fabric(s.spec)), admission="srpt-marginal")
            assert rep2.quotas == {}  # an empty queue: nothing to size
        finally:
            s.close()


def test_curves_of_counts_running_jobs_outside_the_round():
    class Row:
        def __init__(self, jid, k):
            self.id, self.k, self.comm_fraction, self.scaling = jid, k, 0.3, 0.9

    c = Candidate("a", 4, 1, 8, 1, 0.5, True, remaining=10.0)
    got = curves_of([c], [Row("a", 4), Row("b", 8), Row("c", 8)], [], 8, _best,
                    remaining={"a": 10.0, "b": 50.0, "c": 5.0})
    assert got[0].behind == 1  # b has more remaining work and is not in the round; c has less
    assert [k for k, _ in got[0].curve] == [1, 2, 4, 8]
