"""Issue 21, preemption on a cluster of NVLink domains (the small cousin of ``bench_jct --only plan``'s
nvl72x16 case): a starving gang on a full domain cluster evicts only preemptible jobs, the plan is
made per domain, and the gang starts in the same batch. Real SQLite store and emulated fabric."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_REQ
from bandpilot.topology.cluster import spec_from_dict
from bandpilot.scheduling.profile import SchedulerProfile

H = 3600.0
TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]


def nvl(domains: int = 3, trays: int = 4):
    """``domains`` NVLink domains of ``trays`` 4-GPU trays (48 GPUs by default, 16 a domain)."""
    return spec_from_dict({"name": "nvl-pre", "gpus_per_host": 4, "network": {"nic_gbps": 400, "rails_per_host": 4},
                           "host_groups": [{"prefix": "t", "count": domains * trays, "gpu": "GB200", "topology": TRAY,
                                            "nvlink_domain_size": trays}]})


@pytest.fixture(scope="module")
def fab():
    """The domain cluster; conftest's ``store`` fixture builds its queue store on it."""
    return make_fabric(nvl())


def _domain(spec, gpu: str) -> str:
    return spec.hosts[spec.host_index[gpu.rpartition(":")[0]]].domain


def _full_cluster(store, fab) -> dict[str, list[str]]:
    """Every GPU busy at t=0: N1/N2 (16 + 8 GPUs) may not be evicted; P1-P3 (8 each) checkpoint
    every 10 min. Returns the GPUs of each job."""
    pre = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600}
    with use_clock(lambda: 0.0):
        q.submit(store, [{"id": "N1", "k": 16, "submitted": 0, "time_limit_s": 20 * H},
                         {"id": "N2", "k": 8, "submitted": 0, "time_limit_s": 20 * H}]
                 + [{"id": f"P{i}", "k": 8, "submitted": 0, "time_limit_s": 20 * H, **pre} for i in (1, 2, 3)])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="greedy", locality=0.5))
    assert len(rep.assigned) == 5
    return {o.request_id: o.gpus for o in rep.assigned}


@pytest.mark.parametrize("k", [8, 16, 24])
def test_a_plan_on_a_domain_cluster_evicts_only_preemptible_jobs_and_starts_the_gang(store, fab, k):
    spec = fab.spec
    held = _full_cluster(store, fab)
    with use_clock(lambda: 1.0):
        q.submit(store, [{"id": "G", "k": k, "submitted": 1, "time_limit_s": 2 * H}])
    with use_clock(lambda: 5 * H + 300):  # G waited 5 h: starving; the P jobs lost 300 s since their checkpoint
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="hrrn", backfill="conservative", reservations=16, preempt=True))
    out = {o.request_id: o for o in rep.outcomes}
    assert out["G"].status == "assigned" and len(out["G"].gpus) == k, out["G"].detail
    assert len(rep.preempted) == 1 and rep.preempted[0]["request_id"] == "G"
    victims = rep.preempted[0]["victims"]
    assert victims and set(victims) <= {"P1", "P2", "P3"}
    assert len(victims) == k // 8 + (k % 8 > 0)  # no victim more than the gang needs
    gang = set(out["G"].gpus)
    assert gang == {g for v in victims for g in held[v]}  # the gang runs exactly on what its victims held
    assert not gang & set(held["N1"] + held["N2"])
    if k <= 16:  # fits one NVLink domain: planned inside one
        assert len({_domain(spec, g) for g in gang}) == 1
    with store.read() as conn:
        status = dict(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status)).all())
    assert status["N1"] == status["N2"] == "assigned" and all(status[v] == "pending" for v in victims)
    assert q.check_invariants(store) == []
