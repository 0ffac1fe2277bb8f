"""The GPU request queue's batch runs: order, quotas, constraints, deferrals, misbehaving dispatchers, rollback, cancel."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.scheduling.batch import load_pending
from bandpilot.scheduling.policies import Pending
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import ModelError, RequestError
from bandpilot.fabric.emulator import make_fabric

# Helpers and fixtures live in test_queue.py (pytest puts tests/ on sys.path).
from test_queue import GreedyDispatcher, assert_consistent, assigned_rows, domain_spec, new_store, reqs, scenario_basic
from test_queue import disp, spec, store, url  # noqa: F401  (pytest fixtures)
from bandpilot.scheduling.profile import SchedulerProfile


# ------------------------------------------------------------------------------------------
# Batch runs
# ------------------------------------------------------------------------------------------
def test_batch_fifo_contention_and_release(store, disp):
    scenario_basic(store, disp)


def test_later_requests_see_earlier_assignments_as_contention(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, reqs(3, k=4))
    sched.run_batch(store, g, SchedulerProfile("test"))
    states = [s for _, s, _ in g.calls]
    assert [len(s.jobs) for s in states] == [0, 1, 2]
    assert states[2].jobs[0].demand_gbps > 0
    assert states[2].n_free == 24


def test_batch_output_fields(store, disp):
    q.submit(store, [{"id": "a", "k": 8, "tenant": "t"}])
    rep = sched.run_batch(store, disp, SchedulerProfile("test"), model_uri="models:/bandpilot-h100@champion")
    o = rep.assigned[0].to_dict()
    assert o["status"] == "assigned" and len(o["gpus"]) == 8 and o["predicted_gbps"] > 0
    assert o["algorithm"] == "bandpilot" and o["model_version"] and o["time"]
    assert rep.model_uri == "models:/bandpilot-h100@champion"
    row = q.list_requests(store, status="assigned")[0]
    assert row["gpus"] == o["gpus"] and row["model_version"] == o["model_version"]
    doc = json.loads(json.dumps(rep.to_dict()))  # the Prefect flow reads these keys
    assert doc["counts"]["assigned"] == 1 and doc["batch_id"] == rep.batch_id
    assert doc["outcomes"][0]["request_id"] == "a" and doc["outcomes"][0]["gpus"] == o["gpus"]


def test_priority_and_utility_order(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, [
        {"id": "low", "k": 16, "priority": 0, "utility": 0.9},
        {"id": "high", "k": 16, "priority": 5, "utility": 0.1},
        {"id": "mid", "k": 16, "priority": 1, "utility": 0.5},
    ])
    with store.read() as conn:
        pend, _ = load_pending(conn)
    assert [p.req.id for p in sched.order_pending(pend, "fifo")] == ["low", "high", "mid"]
    assert [p.req.id for p in sched.order_pending(pend, "priority")] == ["high", "mid", "low"]
    assert [p.req.id for p in sched.order_pending(pend, "utility")] == ["low", "mid", "high"]
    rep = sched.run_batch(store, g, SchedulerProfile("test", queue_sort="priority"))
    assert [o.request_id for o in rep.assigned] == ["high", "mid"]
    with pytest.raises(sched.ProfileError, match="queue_sort: unknown value 'lifo'"):
        SchedulerProfile("test", queue_sort="lifo")


def test_utility_quotas_proportional_when_competing(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, reqs(8, k=4, prefix="a", tenant="A", utility=0.9) + reqs(8, k=4, prefix="b", tenant="B", utility=0.3))
    rep = sched.run_batch(store, g, SchedulerProfile("test", queue_sort="utility"))
    assert rep.quotas == {"A": 24, "B": 8}  # 32 * 7.2/9.6 and 32 * 2.4/9.6
    per = {}
    for o in rep.assigned:
        per[o.tenant] = per.get(o.tenant, 0) + o.k
    assert per == {"A": 24, "B": 8}
    held = [o for o in rep.deferred if o.tenant == "A"]
    assert held and all("tenant's utility quota" in o.detail for o in held)


def test_utility_quota_is_work_conserving_and_off_without_competition(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, reqs(3, k=8, prefix="a", tenant="A", utility=0.9) + [{"id": "b0", "k": 4, "tenant": "B", "utility": 0.9}])
    rep = sched.run_batch(store, g, SchedulerProfile("test", queue_sort="utility"))
    assert rep.quotas is None and rep.counts()["assigned"] == 4
    q.submit(store, reqs(2, k=4, prefix="c", tenant="C", utility=0.1) + reqs(2, k=2, prefix="d", tenant="D", utility=0.9))
    for j in ("a0", "a1"):
        q.release(store, j)
    rep = sched.run_batch(store, g, SchedulerProfile("test", queue_sort="utility"))  # 12 wanted, 16 free: no competition
    assert rep.quotas is None and rep.counts()["assigned"] == 4


def test_quota_apportionment_sums_to_free():
    counter = iter(range(1, 1000))

    def pend(t, u, k=1):
        i = next(counter)
        return Pending(q.Request(f"p{i}", k, t, 0, u), i, float(i))

    ps = [pend("a", 1.0, 5), pend("b", 1.0, 5), pend("c", 1.0, 5)]
    quotas = sched.utility_quotas(ps, 10)
    assert sum(quotas.values()) == 10 and sorted(quotas.values()) == [3, 3, 4]
    assert sched.utility_quotas(ps, 15) is None
    ps = [pend("a", 0.0, 20), pend("b", 0.0, 20)]
    assert sched.utility_quotas(ps, 7) in ({"a": 4, "b": 3}, {"a": 3, "b": 4})
    ps = [pend("a", None, 20), pend("b", 0.5, 20)]  # unknown utility takes the mean prior
    assert sched.utility_quotas(ps, 8) == {"a": 4, "b": 4}


def test_constraints_single_host_allowed_and_min_gbps(store, disp):
    q.submit(store, [
        {"id": "fill", "k": 5, "constraints": {"allowed_hosts": ["h100-0"]}},
        {"id": "sh", "k": 6, "constraints": {"single_host": True, "allowed_hosts": ["h100-0", "h100-1"]}},
        {"id": "sh2", "k": 4, "constraints": {"single_host": True, "allowed_hosts": ["h100-0", "h100-1"]}},
        {"id": "gpus", "k": 2, "constraints": {"allowed_gpus": ["h100-3:6", "h100-3:7", "h100-2:0"]}},
        {"id": "never", "k": 8, "constraints": {"min_gbps": 1e6}},
    ])
    rep = sched.run_batch(store, disp, SchedulerProfile("test"))
    out = {o.request_id: o for o in rep.outcomes}
    assert all(g.startswith("h100-0:") for g in out["fill"].gpus)
    assert {g.rpartition(":")[0] for g in out["sh"].gpus} == {"h100-1"}
    assert out["sh2"].status == "deferred" and out["sh2"].reason == "constraint_unmet"
    assert set(out["gpus"].gpus) <= {"h100-3:6", "h100-3:7", "h100-2:0"}
    assert out["never"].status == "rejected" and "idle cluster" in out["never"].detail
    rows = {r["id"]: r for r in q.list_requests(store)}
    assert rows["never"]["status"] == "rejected" and rows["sh2"]["reason"] == "constraint_unmet"
    assert_consistent(store)


def test_single_domain_constraint_and_domain_fragmentation(tmp_path):
    spec = domain_spec(2)
    s = new_store(f"sqlite:///{tmp_path / 'd.db'}", spec)
    d = Dispatcher(make_fabric(spec))
    q.submit(s, [{"id": "a", "k": 12}, {"id": "b", "k": 12, "constraints": {"single_domain": True}}])
    rep = sched.run_batch(s, d, SchedulerProfile("test"))
    b = next(o for o in rep.outcomes if o.request_id == "b")
    assert b.status == "assigned"
    doms = {spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain for g in b.gpus}
    assert len(doms) == 1
    f = q.fragmentation(s)
    assert {d_["domain"] for d_ in f["domains"]} == {"h100-d0", "h100-d1"}
    assert f["largest_placeable"]["single_domain"] == max(d_["free"] for d_ in f["domains"])
    q.submit(s, [{"id": "c", "k": 8, "constraints": {"single_domain": True}}])
    rep = sched.run_batch(s, d, SchedulerProfile("test"))
    assert rep.outcomes[0].status == "deferred" and rep.outcomes[0].reason == "constraint_unmet"
    assert_consistent(s)


def test_limit_and_deferral_reason_retried(store, disp):
    q.submit(store, reqs(5, k=8))
    rep = sched.run_batch(store, disp, SchedulerProfile("test"), limit=2)
    assert [o.request_id for o in rep.outcomes] == ["r0", "r1"]
    rep = sched.run_batch(store, disp, SchedulerProfile("test"))
    assert rep.counts() == {"assigned": 2, "deferred": 1, "rejected": 0, "skipped": 0}
    row = q.list_requests(store, status="pending")[0]
    assert row["reason"] == "insufficient_gpus" and row["attempts"] == 1
    assert q.status(store)["deferral_reasons"] == {"insufficient_gpus": 1}
    q.release(store, "r0")
    assert sched.run_batch(store, disp, SchedulerProfile("test")).assigned[0].request_id == "r4"


def test_invalid_request_in_store_is_rejected(store, disp):
    q.submit(store, [{"id": "a", "k": 4}])
    with store.write() as conn:  # e.g. left over from an earlier, larger cluster
        conn.execute(sa.update(q.T_REQ).where(q.T_REQ.c.id == "a").values(k=64))
    rep = sched.run_batch(store, disp, SchedulerProfile("test"))
    assert rep.outcomes[0].status == "rejected" and rep.outcomes[0].reason == "invalid_request"
    assert q.list_requests(store)[0]["status"] == "rejected"


def test_model_for_another_cluster_assigns_nothing(store):
    other = Dispatcher(make_fabric(domain_spec()))
    q.submit(store, reqs(2))
    with pytest.raises(ModelError, match="built for cluster 'h100dom'"):
        sched.run_batch(store, other, SchedulerProfile("test"))
    assert q.status(store)["requests"]["pending"] == 2 and assigned_rows(store) == []


class _EvilDispatcher(GreedyDispatcher):
    """Returns a GPU that is already busy (or too few GPUs): the queue must not trust it."""

    def select(self, k, state, algorithm="bandpilot", *, constraints=None):
        sel = super().select(k, state, algorithm, constraints=constraints)
        if state.jobs:
            sel.gpus = list(state.jobs[0].gpus[:1]) + sel.gpus[1:]
        else:
            sel.gpus = sel.gpus[:-1]
        return sel


def test_misbehaving_dispatcher_never_double_assigns(store, spec):
    q.submit(store, reqs(3, k=2))
    rep = sched.run_batch(store, _EvilDispatcher(spec), SchedulerProfile("test"))
    assert {o.reason for o in rep.outcomes} == {"dispatcher_error"}
    assert assigned_rows(store) == [] and q.status(store)["requests"]["pending"] == 3
    assert_consistent(store)


def test_crash_inside_batch_rolls_back(store, spec):
    class Boom(GreedyDispatcher):
        def select(self, k, state, algorithm="bandpilot", *, constraints=None):
            if state.jobs:
                raise RuntimeError("model exploded")
            return super().select(k, state, algorithm, constraints=constraints)

    q.submit(store, reqs(3))
    with pytest.raises(RuntimeError):
        sched.run_batch(store, Boom(spec), SchedulerProfile("test"))
    assert assigned_rows(store) == [] and q.status(store)["requests"]["pending"] == 3
    with pytest.raises(RuntimeError):
        sched.run_batch(store, Boom(spec), SchedulerProfile("test"), commit="request")
    assert len(assigned_rows(store)) == 1  # per-request commits: the first one stuck, fully
    assert_consistent(store)


def test_commit_per_request_mode(store, disp):
    q.submit(store, reqs(6, k=8))
    rep = sched.run_batch(store, disp, SchedulerProfile("test"), commit="request")
    assert rep.counts()["assigned"] == 4 and rep.counts()["deferred"] == 2
    assert_consistent(store)


def test_cancel(store):
    q.submit(store, reqs(2))
    q.cancel(store, "r0")
    with pytest.raises(RequestError, match="is cancelled, not pending"):
        q.cancel(store, "r0")
    with pytest.raises(RequestError, match="no request"):
        q.cancel(store, "zz")
    sched.run_batch(store, GreedyDispatcher(store.spec), SchedulerProfile("test"))
    with pytest.raises(RequestError, match="release the job instead"):
        q.cancel(store, "r1")
