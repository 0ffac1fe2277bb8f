"""The "nothing fits" extension point: the placer asks its PostFilter plug-ins, in order, when a
request is deferred or rejected; the default records the reason; a plug-in's plan is what is stored."""

from __future__ import annotations

from bandpilot import queue as q
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.scheduling import batch
from bandpilot.scheduling.placer import Deferred, Placer
from bandpilot.scheduling.postfilter import Plan, RecordReason, Unschedulable
from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

SPEC = load_cluster("params/clusters/h100.yaml")


class Evict:
    """A toy preemption plug-in: proposes evicting every running job for a deferred request."""

    name = "evict"

    def __init__(self):
        self.seen: list[Unschedulable] = []

    def post_filter(self, u):
        self.seen.append(u)
        if u.status != "deferred" or not u.state.jobs:
            return None
        return Plan(self.name, "preemption_planned", f"evict {len(u.state.jobs)} jobs", tuple(j.id for j in u.state.jobs))

    def evicted(self, ids, planned):
        """Its plans are never carried out (a plain Plan, not a preemption plan)."""


def test_default_plugin_records_why_nothing_fit():
    placer = Placer(SPEC, Dispatcher(make_fabric(SPEC)), "bandpilot")
    placer.set_state(State.idle(SPEC))
    req = Request("r", 64)
    try:
        placer.place(req)
    except Deferred as d:
        plan = placer.post_filter(req, d)
    assert isinstance(placer.post_filters[-1], RecordReason)
    assert (plan.plugin, plan.reason, plan.victims) == ("record_reason", "invalid_request", ())
    assert "exceeds the cluster size" in plan.detail


def test_a_plugin_plan_is_stored_and_the_default_still_answers_otherwise(tmp_path, monkeypatch):
    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(SPEC)
    plugin = Evict()
    orig = Placer.__init__

    def with_plugin(self, *a, **kw):
        orig(self, *a, **kw)
        self.add_post_filter(plugin)

    monkeypatch.setattr(Placer, "__init__", with_plugin)
    q.submit(store, [{"id": "big", "k": 32}, {"id": "more", "k": 8}, {"id": "huge", "k": 99}], partial=True)
    rep = batch.run_batch(store, Dispatcher(make_fabric(SPEC)), SchedulerProfile("test"))
    by = {o.request_id: o for o in rep.outcomes}
    assert by["big"].status == "assigned"
    assert (by["more"].reason, by["more"].detail) == ("preemption_planned", "evict 1 jobs")
    assert [u.request.id for u in plugin.seen] == ["more"]
    assert plugin.seen[0].reason == "insufficient_gpus" and plugin.seen[0].state.jobs[0].id == "big"
    rows = {r["id"]: r for r in q.list_requests(store)}
    assert rows["more"]["reason"] == "preemption_planned" and rows["more"]["status"] == "pending"
