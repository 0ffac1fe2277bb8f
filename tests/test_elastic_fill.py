"""``fill_idle`` (issue 22, a flag): GPUs still free after an elastic round in which no request waits
are offered to the running jobs at the boundary, shortest remaining work first, each growth priced as
any; with the ``srpt`` rules running jobs keep their current size when nothing waits."""

from __future__ import annotations

from bandpilot import queue as q
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
from bandpilot.scheduling.elastic import Candidate, elastic_quotas, rebalance

from tests.test_elastic import new_store


def test_keep_gives_running_jobs_their_size_back_before_the_shortest_grows():
    a = Candidate("a", 16, 4, 32, 1, 0.5, True, remaining=10.0)
    b = Candidate("b", 16, 4, 32, 1, 0.5, True, remaining=20.0)
    # nothing waits: both claim 8; the 16 left go to the shortest (a 24, b back to 8) or, kept, 16 each
    assert elastic_quotas([a, b], 32, "srpt-suspend", host=8) == {"a": 24, "b": 8}
    assert elastic_quotas([a, b], 32, "srpt-suspend", host=8, keep=True) == {"a": 16, "b": 16}
    # sizes are kept shortest first while the budget lasts; what is left still grows the shortest
    assert elastic_quotas([a, b], 28, "srpt-suspend", host=8, keep=True) == {"a": 16, "b": 12}
    small = Candidate("s", 2, 1, 4, 1, 0.5, True, remaining=1.0)
    assert elastic_quotas([small, b], 32, "srpt-suspend", host=8, keep=True) == {"s": 4, "b": 28}
    # a request waits (too big for what is left): no leftovers, keep changes nothing
    w = Candidate("w", 32, 32, 32, 1, 0.5, False, remaining=1e9)
    assert elastic_quotas([a, b, w], 32, "srpt-suspend", host=8, keep=True) == {"a": 8, "b": 8}
    # the other rules ignore it
    assert elastic_quotas([a, b], 32, "fit-k", keep=True) == elastic_quotas([a, b], 32, "fit-k")


def _two_long_jobs_at_8(s, t):
    """Seed 001's J1 shape twice (k = 16, share 0.45, eta 0.9) at 8 GPUs each beside two short fixed
    gangs, which then finish: 16 GPUs free, nothing pending (the srpt-suspend tail, README issue 22)."""
    d = Dispatcher(make_fabric(s.spec))
    q.submit(s, [{"id": i, "k": 16, "min_k": 4, "max_k": 32, "comm_fraction": 0.45, "scaling": 0.9,
                  "submitted_at": 900.0} for i in ("a", "b")]
             + [{"id": g, "k": 8, "submitted_at": 900.0} for g in ("x", "y")])
    q.set_estimates(s, {"a": 4000.0, "b": 8000.0, "x": 10.0, "y": 10.0})
    rebalance(s, d, admission="srpt-suspend")
    assert {i: len(q.assignment(s, i)["gpus"]) for i in "abxy"} == {"a": 8, "b": 8, "x": 8, "y": 8}
    q.release(s, "x")
    q.release(s, "y")
    t[0] = 1100.0
    return d


def test_fill_idle_grows_the_job_the_leftover_rule_passed_over(tmp_path):
    got = {}
    for fill in (False, True):
        t = [1000.0]
        with use_clock(lambda: t[0]):
            s = new_store(tmp_path / str(fill))  # 4 hosts x 8 GPUs
            try:
                d = _two_long_jobs_at_8(s, t)
                rep = rebalance(s, d, admission="srpt-suspend", current_share=True, fill_idle=fill)
                assert q.check_invariants(s) == []
                # the leftovers (16) go to a, the shorter: 24 over three hosts is slower than 16 over two
                assert rep.quotas["a"] == 16 and len(q.assignment(s, "a")["gpus"]) == 16
                got[fill] = (len(q.assignment(s, "b")["gpus"]), len(rep.resized), sorted(r["job"] for r in rep.resized))
            finally:
                s.close()
    # without fill_idle b stays at 8 beside 8 idle GPUs; with it b's growth onto them is priced and taken
    assert got == {False: (8, 1, ["a"]), True: (16, 2, ["a", "b"])}


def test_fill_idle_leaves_gpus_free_while_a_request_waits(tmp_path):
    t = [1000.0]
    with use_clock(lambda: t[0]):
        s = new_store(tmp_path)
        try:
            d = _two_long_jobs_at_8(s, t)
            q.submit(s, [{"id": "big", "k": 32, "min_k": 32, "max_k": 32, "submitted_at": 1050.0}])
            q.set_estimates(s, {"big": 1e6})
            rep = rebalance(s, d, admission="srpt-suspend", current_share=True, fill_idle=True)
            assert rep.waiting == ["big"] and [r["job"] for r in rep.resized] == []
            assert len(q.assignment(s, "b")["gpus"]) == 8 and q.check_invariants(s) == []
        finally:
            s.close()
