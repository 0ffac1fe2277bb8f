"""Relocation on resize (``rebalance(relocate=True)``, ``--relocate``; README issue 22): a resize is a
checkpoint-restart, so a growing job may move onto a fresh placement (an idle host) instead of
growing around its old GPUs across the NICs, and a job spread over several hosts may move onto one.
On the emulated 4 x 8 H100 cluster with the fabric as a perfect model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.state import State
from bandpilot.queue.schema import T_AUDIT
from bandpilot.scheduling.batch import run_batch
from bandpilot.scheduling.elastic import Candidate, _grow_priced, _move_priced, _placer, _Round, rebalance
from bandpilot.scheduling.elastic_pricing import PRICERS
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent


def _gpus(spec, host, ids):
    return [f"{spec.hosts[host].name}:{i}" for i in ids]


def _hosts(spec, mask):
    return sorted(int(h) for h in np.flatnonzero(mask))


def _round(fab, relocate, fracs):
    cand = Candidate("x", 4, 2, 8, 1, 1.0, True)
    place = _placer(Dispatcher(fab, seed=0), "bandpilot") if relocate else None  # as rebalance(relocate=...)
    return _Round(fab, False, "full", {}, {"x": cand}, dict(fracs), PRICERS["welfare"], "fit-k",
                  etas={"x": 0.9}, place=place)


def _shared(fab):
    """x (4 GPUs) shares host 0 with y (4); hosts 1-2 hold a 16-GPU job; host 3 is idle."""
    spec = fab.spec
    st = State.idle(spec).with_job("y", _gpus(spec, 0, range(4, 8)), 0.0)
    st = st.with_job("big", _gpus(spec, 1, range(8)) + _gpus(spec, 2, range(8)), 0.0)
    return st, spec.to_mask(_gpus(spec, 0, range(4)))


def test_relocating_growth_takes_an_idle_host_the_grown_set_cannot(fab):
    st, mine = _shared(fab)
    fracs = {"x": 0.45, "y": 0.3, "big": 0.3}
    # around its old GPUs x can only add host 3's GPUs across the NIC (or not grow at all)
    kept, _, k_kept = _grow_priced(_round(fab, False, fracs), st, "x", mine, 4, 8)
    assert np.all(kept & mine == mine)
    moved, value, k = _grow_priced(_round(fab, True, fracs), st, "x", mine, 4, 8)
    assert k == 8 and _hosts(fab.spec, moved) == [3] and value is not None  # all 8 on the idle host
    b_kept = float(fab.predict_masks(kept[None, :])[0]) if k_kept > 1 else 0.0
    assert k > k_kept or float(fab.predict_masks(moved[None, :])[0]) > b_kept


def test_a_job_on_two_hosts_moves_onto_one_and_a_one_host_job_stays(fab):
    spec = fab.spec
    fracs = {"x": 0.45, "big": 0.3}
    st = State.idle(spec).with_job("big", _gpus(spec, 1, range(4, 8)) + _gpus(spec, 2, range(8)), 0.0)
    split = spec.to_mask(_gpus(spec, 0, range(2)) + _gpus(spec, 1, range(2)))
    moved, value = _move_priced(_round(fab, True, fracs), st, "x", split, 4)
    assert value is not None and len(_hosts(spec, moved)) == 1 and int(sum(bin(int(b)).count("1") for b in moved)) == 4
    one = spec.to_mask(_gpus(spec, 0, range(4)))
    same, v = _move_priced(_round(fab, True, fracs), st, "x", one, 4)
    assert v is None and np.array_equal(same, one)  # nothing to gain: no resize


class _Lowest:
    """Lowest free GPUs first (deterministic admissions for the store test)."""

    def __init__(self, spec):
        from types import SimpleNamespace

        self.model = SimpleNamespace(spec=spec, model_version="lowest-1", uri="test:lowest")

    def select(self, k, state, algorithm="bandpilot", *, constraints=None):
        from types import SimpleNamespace

        return SimpleNamespace(gpus=state.free_gpus[:k], predicted_gbps=100.0, standalone_gbps=100.0,
                               algorithm="lowest", search_ms=0.0, evaluations=1)


def _store(tmp_path):
    """x (4..8) on host 0's first 4 GPUs, y beside it, big on hosts 1-2, host 3 idle."""
    s = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    s.init_cluster(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))
    q.submit(s, [{"id": "x", "k": 4, "min_k": 4, "max_k": 8, "comm_fraction": 0.45, "scaling": 0.9},
                 {"id": "y", "k": 4, "comm_fraction": 0.3}, {"id": "big", "k": 16, "comm_fraction": 0.3}])
    run_batch(s, _Lowest(s.spec), SchedulerProfile("test"))
    return s


def test_rebalance_relocates_a_growth_in_one_audited_generation(tmp_path, fab):
    s = _store(tmp_path)
    try:
        before = q.assignment(s, "x")["gpus"]
        assert all(g.startswith(s.spec.hosts[0].name + ":") for g in before)
        rep = rebalance(s, Dispatcher(fab, seed=0), at_boundary=["x"])  # the default relocates
        after = q.assignment(s, "x")
        assert rep.resized and rep.resized[0]["job"] == "x" and after["generation"] == 1
        assert len(after["gpus"]) == 8 and {g.split(":")[0] for g in after["gpus"]} == {s.spec.hosts[3].name}
        assert sorted(rep.resized[0]["released"]) == sorted(before)  # moved: every old GPU given up
        with s.engine.connect() as c:
            detail = json.loads(c.execute(sa.select(T_AUDIT.c.detail).where(T_AUDIT.c.action == "resize")).scalar_one())
        assert detail["to_k"] == 8 and sorted(detail["released"]) == sorted(before)
        assert q.check_invariants(s) == []
    finally:
        s.close()


def test_no_relocation_and_blind_growth_keep_the_old_gpus(tmp_path, fab):
    for kw in ({"relocate": False}, {"blind": True}):
        s = _store(tmp_path / next(iter(kw)))
        try:
            before = set(q.assignment(s, "x")["gpus"])
            rebalance(s, Dispatcher(fab, seed=0), at_boundary=["x"], **kw)
            assert before <= set(q.assignment(s, "x")["gpus"]) and q.check_invariants(s) == []
        finally:
            s.close()
