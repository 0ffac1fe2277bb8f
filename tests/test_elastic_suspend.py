"""The ``srpt-suspend`` and ``srpt-host`` elastic admission rules (issue 22, flags): quotas by
remaining work, each job claiming twice its ``min_k`` up to a host; with suspension a running job left
without GPUs goes back to pending at its epoch boundary and resumes later with its progress."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
from bandpilot.queue.generations import Resize, resize
from bandpilot.scheduling.batch import run_batch
from bandpilot.scheduling.elastic import Candidate, elastic_quotas, rebalance
from bandpilot.scheduling.elastic_remaining import remaining_work

from tests.test_elastic import _Lowest, new_store
from bandpilot.scheduling.profile import SchedulerProfile


def test_srpt_suspend_gives_the_shortest_their_claims_and_suspends_the_longest():
    long_run = Candidate("long", 8, 4, 16, 1, 0.9, True, remaining=1e6)
    mid_run = Candidate("mid", 4, 2, 8, 1, 0.1, True, remaining=5e4)
    short_p = Candidate("short", 4, 1, 8, 1, 0.1, False, remaining=1e3)
    # 8 GPUs: short claims 2, mid 4, long (claim 8) gets the 2 left? below its min_k 4: suspended
    assert elastic_quotas([long_run, mid_run, short_p], 8, "srpt-suspend", host=8) == {"short": 2, "mid": 4, "long": 0}
    # the same without suspension: the running jobs keep their min_k first, short takes what is left
    assert elastic_quotas([long_run, mid_run, short_p], 8, "srpt-host", host=8) == {"short": 2, "mid": 2, "long": 4}
    # claims stop at one host and at max_k; what is left goes to a job at >= its min_k
    big = Candidate("big", 16, 8, 32, 1, 0.5, False, remaining=10.0)
    waits = Candidate("w", 16, 16, 32, 1, 0.5, False, remaining=1e9)  # too big for what is left: it waits
    assert elastic_quotas([big, waits], 20, "srpt-suspend", host=8) == {"big": 8}
    assert elastic_quotas([big, short_p, waits], 12, "srpt-suspend", host=8) == {"big": 8, "short": 2}
    assert elastic_quotas([big, short_p, waits], 9, "srpt-suspend", host=8) == {"big": 8, "short": 1}
    stepped = Candidate("st", 8, 2, 10, 4, 0.5, False, remaining=1.0)  # sizes 2, 6, 10
    assert elastic_quotas([stepped, waits], 5, "srpt-suspend", host=8) == {"st": 2}
    # when nothing waits, what is left grows the shortest first, up to max_k (work conserving)
    assert elastic_quotas([big], 32, "srpt-suspend", host=8) == {"big": 32}
    assert elastic_quotas([big, short_p], 12, "srpt-suspend", host=8) == {"big": 10, "short": 2}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3), st.integers(1, 3), st.booleans(),
                          st.floats(1.0, 1e6)), min_size=1, max_size=12),
       st.integers(8, 48), st.booleans())
def test_fuzz_srpt_quotas_respect_budget_ranges_and_suspension(rows, g, suspend):
    cands = [Candidate(f"j{i}", lo, lo, lo + extra * step, step, 0.5, run, remaining=rem)
             for i, (lo, extra, step, run, rem) in enumerate(rows)]
    floors = sum(c.lo for c in cands if c.running)
    if not suspend and floors > g:
        return
    got = elastic_quotas(cands, g, "srpt-suspend" if suspend else "srpt-host", host=8)
    assert sum(got.values()) <= g
    for c in cands:
        if c.running:
            assert c.id in got  # a running job always has a quota ...
        if got.get(c.id, 0) == 0:
            assert c.id not in got or (c.running and suspend)  # ... 0 only when suspended
        else:
            assert c.lo <= got[c.id] <= c.hi and (got[c.id] - c.lo) % c.step == 0


def test_rebalance_suspends_at_the_boundary_and_resumes_with_its_remaining_work(tmp_path):
    t = [1000.0]
    with use_clock(lambda: t[0]):
        s = new_store(tmp_path)  # 4 hosts x 8 GPUs
        d = Dispatcher(make_fabric(s.spec))
        try:
            q.submit(s, [{"id": f"long{i}", "k": 16, "min_k": 4, "max_k": 32, "submitted_at": 900.0} for i in range(4)])
            q.set_estimates(s, {f"long{i}": 8000.0 for i in range(4)})
            rebalance(s, d, admission="srpt-suspend")  # four long jobs, 8 GPUs each
            assert {len(q.assignment(s, f"long{i}")["gpus"]) for i in range(4)} == {8}
            t[0] = 3000.0  # 2,000 s at 8 GPUs: 1/2 of 16 GPUs' speed at eta 1 -> 1/8 of the work done
            q.submit(s, [{"id": "short", "k": 8, "min_k": 4, "max_k": 16, "submitted_at": 2990.0}])
            q.set_estimates(s, {"short": 100.0})
            rep = rebalance(s, d, at_boundary=["long3"], admission="srpt-suspend")
            assert rep.suspended == ["long3"] and set(rep.admitted) == {"short"}
            assert q.check_invariants(s) == []
            row = next(r for r in q.list_requests(s) if r["id"] == "long3")
            assert row["status"] == "pending" and row["reason"] == "suspended"
            with s.read() as conn:  # its estimate is now the remaining run time at k = 16
                rem = remaining_work(conn, {}, [q.Request(id="long3", k=16)], t[0], {})["long3"]
            assert rem == pytest.approx(8000.0 * (1 - 1 / 8) * 16)
            q.release(s, "short")
            t[0] = 3100.0
            rep = rebalance(s, d, admission="srpt-suspend")
            assert "long3" in rep.admitted and q.check_invariants(s) == []
            assert q.assignment(s, "long3")["generation"] == 1  # the resume is a new generation (from 0 GPUs)
        finally:
            s.close()


def test_remaining_work_counts_only_the_generations_since_a_resume(tmp_path):
    t = [1000.0]
    with use_clock(lambda: t[0]):
        s = new_store(tmp_path)
        try:
            q.submit(s, [{"id": "e", "k": 8, "min_k": 2, "max_k": 16}])
            q.set_estimates(s, {"e": 4000.0})
            run_batch(s, _Lowest(s.spec), SchedulerProfile("test"))
            t[0] = 2000.0
            resize(s, Resize("e", tuple(q.assignment(s, "e")["gpus"][:4])))  # a generation before the suspension
            t[0] = 2500.0
            d = Dispatcher(make_fabric(s.spec))
            # a 32-GPU short job takes the cluster: e is suspended with 1000 s at 8 + 500 s at 4 done
            q.submit(s, [{"id": "x", "k": 32, "min_k": 32, "max_k": 32}])
            q.set_estimates(s, {"x": 10.0})
            rep = rebalance(s, d, at_boundary=["e"], admission="srpt-suspend")
            assert rep.suspended == ["e"] and "x" in rep.admitted
            left = 4000.0 - 1000.0 - 500.0 * 0.5
            q.release(s, "x")
            t[0] = 3000.0
            assert "e" in rebalance(s, d, admission="srpt-suspend").admitted
            t[0] = 3400.0
            held = len(q.assignment(s, "e")["gpus"])
            with s.read() as conn:  # the old generation (before the resume) is not counted again
                got = remaining_work(conn, {"e": held}, [], t[0], {})["e"]
            assert got == pytest.approx(8 * (left - 400.0 * held / 8))
            assert math.isfinite(got) and q.check_invariants(s) == []
        finally:
            s.close()


@pytest.mark.slow
def test_elastic_simulation_with_suspension_completes_and_keeps_invariants(monkeypatch):
    from bandpilot.simulation import elastic as sim_el
    from bandpilot.simulation.engine import SimConfig
    from bandpilot.simulation.report import summarize
    from bandpilot.topology.cluster import load_cluster

    from tests.test_elastic_sim import H100, _elastic_jobs

    fab = make_fabric(load_cluster(H100))
    orig = sim_el.ElasticSim._batch

    kept: dict[str, float] = {}
    resumed: set[str] = set()

    def checking(self, t):
        n = orig(self, t)
        assert q.check_invariants(self.store) == []
        kept.update({jid: p for jid, (p, _) in self._kept.items()})
        for jid, r in self.running.items():  # a resumed job goes on from its progress, less one resize
            if jid in kept and jid not in resumed:
                assert r.progress == pytest.approx(kept[jid] - self.cfg.resize_s * r.rate)
                resumed.add(jid)
        return n

    monkeypatch.setattr(sim_el.ElasticSim, "_batch", checking)
    from dataclasses import replace

    jobs = [replace(j, submit_s=j.submit_s / 20) for j in _elastic_jobs(30)]  # seed 001's burst, 20x faster
    res = sim_el.simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), elastic=True, interval_s=30, admission="srpt-suspend"))
    out = summarize(res)
    assert out["completed"] == len(jobs)
    assert sum(r.preemptions for r in res.jobs) > 0 and resumed  # some job was suspended and resumed
    # a suspended job's service counts from its first start: its record spans the suspension
    assert all(r.end_s > r.start_s >= r.submit_s for r in res.jobs)
