"""Elastic growth/admission pricing (issue 22): the welfare pricer charges a growth or an admission
for the slowdown it imposes on the co-tenants of its NICs; the admission rules. On the emulated
4 x 8 H100 cluster with the fabric as a perfect model."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.state import State
from bandpilot.scheduling.elastic import Candidate, _grow_priced, _Round, elastic_quotas
from bandpilot.scheduling.elastic_pricing import PRICERS, Context, tenant_bandwidths
from bandpilot.scheduling.profile import SchedulerProfile


def _gpus(spec, host, ids):
    return [f"{spec.hosts[host].name}:{i}" for i in ids]


def _crowded(fab):
    """Host 0: job x (8 GPUs); host 3: a one-host job (8); hosts 1-2: a 4+4 cross-host job c that
    presses its NICs with its standalone bandwidth (demand ``full``); 8 GPUs free on hosts 1-2."""
    spec = fab.spec
    st = State.idle(spec)
    st = st.with_job("solo", _gpus(spec, 3, range(8)), 0.0)
    c = _gpus(spec, 1, range(4)) + _gpus(spec, 2, range(4))
    st = st.with_job("c", c, float(fab.predict_masks(spec.to_mask(c)[None, :])[0]))
    return st, spec.to_mask(_gpus(spec, 0, range(8)))


def _round(fab, pricing, fracs):
    cand = Candidate("x", 8, 4, 16, 1, 1.0, True)
    return _Round(fab, False, "full", {}, {"x": cand}, dict(fracs), PRICERS[pricing], "fit-k")


def test_tenant_bandwidth_is_the_predictor_without_the_job_itself(fab):
    st, mine = _crowded(fab)
    st = st.with_job("x", fab.spec.from_mask(mine | fab.spec.to_mask(_gpus(fab.spec, 1, [4]))), 100.0)
    got = tenant_bandwidths(fab, st, ["c", "x", "solo"])
    for jid, b in zip(["c", "x", "solo"], got):
        job = next(j for j in st.jobs if j.id == jid)
        want = ContentionPredictor(fab, st.without_job(jid)).predict(job.mask[None, :]).value[0]
        assert b == np.float64(want)
    assert got[0] < float(fab.predict_masks(st.jobs[1].mask[None, :])[0])  # c is slowed by x's NIC traffic


def test_welfare_refuses_a_growth_onto_a_cotenants_nics_that_self_takes(fab):
    st, mine = _crowded(fab)
    # x is compute-bound (f 0.05): 8 -> 16 over hosts 1-2 cuts its own epoch time by ~45 %, but the
    # communication-bound co-tenant c (f 0.9) shares those NICs and would lose most of its bandwidth
    fracs = {"x": 0.05, "c": 0.9, "solo": 0.3}
    _, _, k_self = _grow_priced(_round(fab, "self", fracs), st, "x", mine, 8, 16)
    _, _, k_welfare = _grow_priced(_round(fab, "welfare", fracs), st, "x", mine, 8, 16)
    assert k_self > 8 and k_welfare == 8
    # with a co-tenant that barely communicates (f 0.01) the same growth is a gain for everyone
    grown, _, k = _grow_priced(_round(fab, "welfare", {**fracs, "c": 0.01}), st, "x", mine, 8, 16)
    assert k > 8 and int((grown != 0).sum()) >= 2


def test_welfare_admission_stays_off_a_cotenants_nics(fab):
    spec = fab.spec
    st, _ = _crowded(fab)
    st = st.with_job("x", _gpus(spec, 0, range(4)), 0.0)  # host 0 keeps 4 GPUs free
    one_host = spec.to_mask(_gpus(spec, 0, range(4, 8)))
    spread = spec.to_mask(_gpus(spec, 0, range(4, 8)) + _gpus(spec, 1, range(4, 8)))
    options = [(8, spread, 0.0), (4, one_host, 0.0)]

    def own_cost(k, b):  # as _admit_one: epoch time relative to 8 GPUs at the 4+4 rate
        return 0.5 * 8 / k + 0.5 * (b and 1.0)

    ctx = Context(fab, st, "p", 0.5, {"c": 0.9, "x": 0.3, "p": 0.5}, "full")
    assert PRICERS["welfare"].admission(ctx, own_cost, options) == 1  # one host: c keeps its NICs
    assert PRICERS["self"].admission(ctx, own_cost, [(8, spread, 100.0), (4, one_host, 100.0)]) == 0


def test_fit_k_admits_while_the_requested_sizes_fit_and_min_k_while_the_minimums_do():
    cands = [Candidate("r", 8, 2, 16, 1, 0.5, True)] + [Candidate(f"p{i}", 8, 2, 16, 1, 0.5, False) for i in range(6)]
    fit = elastic_quotas(cands, 32, "fit-k")
    low = elastic_quotas(cands, 32, "min-k")
    assert set(fit) == {"r", "p0", "p1", "p2"} and sum(fit.values()) == 32  # 8 (r's min 2 counts) + 3 x 8
    assert set(low) == {"r", *(f"p{i}" for i in range(6))} and sum(low.values()) == 32


def test_idle_admission_fits_newcomers_into_idle_gpus_only():
    """Seed 001's text: a pending job is admitted only if it fits the GPUs idle now; fit-k may count
    what the running jobs at a boundary would give up down to their min_k."""
    cands = [Candidate("r", 8, 2, 16, 1, 0.5, True)] + [Candidate(f"p{i}", 8, 2, 16, 1, 0.5, False) for i in range(6)]
    assert set(elastic_quotas(cands, 32, "idle", n_idle=24)) == {"r", "p0", "p1", "p2"}
    assert set(elastic_quotas(cands, 32, "idle", n_idle=8)) == {"r", "p0"}
    assert set(elastic_quotas(cands, 32, "idle", n_idle=7)) == {"r"}
    assert set(elastic_quotas(cands, 32, "fit-k", n_idle=8)) == {"r", "p0", "p1", "p2"}


def test_growth_steps_count_alike_gpus_once_and_take_whole_hosts_when_far(fab):
    from bandpilot.scheduling.elastic_gpus import grow_steps

    spec = fab.spec
    st, mine = _crowded(fab)
    free = st.free & ~mine
    one = grow_steps(fab, mine, free, 1)
    assert sorted(h for h, _ in one) == [1, 2]  # one candidate per NVSwitch host (its GPUs are alike)
    far = grow_steps(fab, mine, free, 12)  # more than a host holds: each host's free GPUs as one chunk
    assert [(h, bin(b).count("1")) for h, b in far] == [(1, 4), (2, 4)]
    assert all(b & ~int(free[h]) == 0 for h, b in one + far) and spec.n_hosts == 4


@pytest.mark.slow
def test_simulator_skips_rounds_that_would_decide_the_same(fab, tmp_path, monkeypatch):
    from dataclasses import replace

    from bandpilot import queue as q
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.queue.clock import use_clock
    from bandpilot.simulation import elastic as sim_el
    from bandpilot.simulation.bandwidth import TrueBandwidth
    from bandpilot.simulation.engine import SimConfig
    from bandpilot.simulation.workloads import seed001_workload

    calls = []
    orig = sim_el.rebalance
    monkeypatch.setattr(sim_el, "rebalance", lambda store, d, **kw: calls.append(kw["at_boundary"]) or orig(store, d, **kw))
    jobs = [replace(j, submit_s=0.0, min_k=max(1, j.k // 4), max_k=min(32, 2 * j.k)) for j in seed001_workload(0)[:12]]
    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(fab.spec)
    sim = sim_el.ElasticSim(jobs, Dispatcher(fab), TrueBandwidth(fab), SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), elastic=True), store, None)
    with use_clock(lambda: 0.0):
        sim._to_submit += jobs
        sim.pending.update(j.id for j in jobs)
        assert sim._batch(0.0) > 0 and len(calls) == 1  # the burst: admissions
        assert sim.pending  # the rest waits on a full cluster
        assert sim._batch(60.0) == 0 and len(calls) == 1  # no boundary, nothing freed or queued: skipped
        sim.pending.add("late")  # a new arrival is a new state: the round runs again
        sim._batch(120.0)
        assert len(calls) == 2
    store.close()
