"""Issue 21, slice 1: run-time and preemption fields on requests (schema v6) and the demand model
(co-tenant pressure ``full`` or scaled by the communication fraction), the same in the simulator's
truth and in the pressure the queue stores for the dispatcher's predictor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.demand import pressure, pressure_factor
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue import schema as q_schema
from bandpilot.simulation.bandwidth import TrueBandwidth
from bandpilot.simulation.engine import SimConfig, SimulationError, simulate
from bandpilot.simulation.trace import TraceJob
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

H100 = Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml"


@pytest.fixture(scope="module")
def spec():
    return load_cluster(H100)


@pytest.fixture(scope="module")
def fab(spec):
    return make_fabric(spec)


@pytest.fixture
def store(tmp_path, spec):
    s = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    s.init_cluster(spec)
    yield s
    s.close()


def test_runtime_fields_round_trip_through_the_store(store):
    q.submit(store, [{"id": "a", "k": 2, "time_limit_s": 3600, "comm_fraction": 0.3, "preemptible": True,
                      "checkpoint_s": 120, "checkpoint_every_s": 900}, {"id": "b", "k": 1}])
    rows = {r["id"]: r for r in q.list_requests(store)}
    assert rows["a"]["time_limit_s"] == 3600.0 and rows["a"]["comm_fraction"] == 0.3
    assert rows["a"]["preemptible"] is True and rows["a"]["checkpoint_s"] == 120.0 and rows["a"]["checkpoint_every_s"] == 900.0
    assert rows["b"]["time_limit_s"] is None and rows["b"]["preemptible"] is False
    with store.read() as conn:
        pend = {p.req.id: p.req for p in sched.batch.load_pending(conn)[0]}
    assert pend["a"].time_limit_s == 3600.0 and pend["a"].preemptible and pend["a"].checkpoint_s == 120.0
    assert q.Request.from_dict(pend["a"].to_dict()).runtime_dict() == pend["a"].runtime_dict()


@pytest.mark.parametrize("extra, needle", [
    ({"time_limit_s": 0}, "'time_limit_s' must be a number > 0"),
    ({"time_limit_s": float("inf")}, "'time_limit_s'"),
    ({"comm_fraction": 1.5}, "'comm_fraction' must be a number in \\[0, 1\\]"),
    ({"comm_fraction": True}, "'comm_fraction'"),
    ({"preemptible": "yes"}, "'preemptible' must be true or false"),
    ({"checkpoint_s": 60}, "need 'preemptible': true"),
    ({"preemptible": True, "checkpoint_s": -1}, "'checkpoint_s' must be"),
])
def test_bad_runtime_fields_are_refused_with_the_key(extra, needle):
    with pytest.raises(RequestError, match=needle):
        q.Request.from_dict({"id": "x", "k": 2, **extra})


@settings(max_examples=60, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(["time_limit_s", "comm_fraction", "preemptible", "checkpoint_s", "checkpoint_every_s"]),
                           st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=3))))
def test_runtime_fields_fuzz_only_request_errors(doc):
    try:
        r = q.Request.from_dict({"id": "x", "k": 2, **doc})
    except RequestError:
        return
    assert r.time_limit_s is None or r.time_limit_s > 0
    assert r.comm_fraction is None or 0 <= r.comm_fraction <= 1
    assert q.Request.from_dict(r.to_dict()) == r


def test_a_v5_store_opens_at_v6_and_old_requests_read_as_not_given(tmp_path, monkeypatch, spec):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    v5_cols = [c for c in q_schema.T_REQ.c if c.name not in dict(q_schema.V6_REQUEST_COLUMNS)]
    old_meta = sa.MetaData()
    old_req = sa.Table("bp_requests", old_meta, *[sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                                                  for c in v5_cols])
    monkeypatch.setattr(q_schema, "MIGRATIONS", [m for m in q_schema.MIGRATIONS if m[0] <= 5])
    monkeypatch.setattr(q_schema, "_V1_TABLES", [t if t.name != "bp_requests" else old_req for t in q_schema._V1_TABLES])
    monkeypatch.setattr(q_schema, "_m1_initial", lambda conn: (old_meta.create_all(conn), q_schema.metadata.create_all(
        conn, tables=[t for t in q_schema._V1_TABLES[1:] if t.name != "bp_requests"], checkfirst=True)))
    monkeypatch.setattr(q_schema, "MIGRATIONS", [(1, "initial schema", q_schema._m1_initial)] + q_schema.MIGRATIONS[1:])
    old = q.Store(url)
    old.init_cluster(spec)
    with old.write() as conn:
        conn.execute(old_req.insert().values(id="legacy", tenant="t", k=2, priority=0, submitted_at=1.0, status="pending",
                                             attempts=0, updated_at=1.0))
        assert "time_limit_s" not in {c["name"] for c in sa.inspect(conn).get_columns("bp_requests")}
    old.close()
    monkeypatch.undo()
    s = q.Store(url)
    with s.read() as conn:
        assert s.current_version(conn) == q.schema_version() >= 6
        assert sa.inspect(conn).has_table("bp_reservations")
    (row,) = q.list_requests(s)
    assert row["id"] == "legacy" and row["time_limit_s"] is None and row["preemptible"] is False
    assert q.check_invariants(s) == []


# ------------------------------------------------------------------------------------------
# the demand model
# ------------------------------------------------------------------------------------------
def test_pressure_factor_and_vector_agree():
    assert pressure_factor(0.3, "full") == 1.0 and pressure_factor(0.3, "comm") == 0.3
    assert pressure_factor(None, "comm") == 1.0  # no fraction given: presses fully
    np.testing.assert_allclose(pressure(np.array([10.0, 10.0]), np.array([0.25, np.nan]), "comm"), [2.5, 10.0])
    with pytest.raises(ValueError, match="unknown demand model"):
        pressure_factor(0.3, "half")


def test_truth_scales_co_tenant_pressure(spec, fab):
    # two 8-GPU jobs each 4+4 over the same two hosts: they share both hosts' NICs
    a = spec.to_mask([f"{spec.hosts[0].name}:{i}" for i in range(4)] + [f"{spec.hosts[1].name}:{i}" for i in range(4)])
    b = spec.to_mask([f"{spec.hosts[0].name}:{i}" for i in range(4, 8)] + [f"{spec.hosts[1].name}:{i}" for i in range(4, 8)])
    tb = TrueBandwidth(fab)
    full, solo = tb.achieved(np.array([a, b]))
    silent, _ = tb.achieved(np.array([a, b]), np.array([0.0, 0.0]))
    part, _ = tb.achieved(np.array([a, b]), np.array([0.5, 0.5]))
    assert np.all(full < solo - 1e-6)  # contended under full pressure
    np.testing.assert_allclose(silent, solo)  # co-tenants that never talk do not slow anyone
    assert np.all(part >= full - 1e-9) and np.all(part <= solo + 1e-9)


def test_queue_stores_the_pressure_the_predictor_charges(store, fab):
    q.submit(store, [{"id": "a", "k": 12, "comm_fraction": 0.25}, {"id": "b", "k": 12}])
    rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"), demand="comm")
    got = {o.request_id: o for o in rep.assigned}
    with store.read() as conn:
        d = dict(conn.execute(sa.select(q_schema.T_JOBS.c.id, q_schema.T_JOBS.c.demand_gbps)).all())
    assert d["a"] == pytest.approx(0.25 * got["a"].standalone_gbps)
    assert d["b"] == pytest.approx(got["b"].standalone_gbps)  # no fraction given: full pressure
    with pytest.raises(RequestError, match="unknown demand model"):
        sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"), demand="nope")


def test_simulated_jobs_run_faster_when_co_tenants_talk_less(fab):
    jobs = [TraceJob("a", 0.0, 12, "t", 3600.0, 0.3), TraceJob("b", 0.0, 12, "t", 3600.0, 0.3)]
    out = {}
    for demand in ("full", "comm"):
        res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="hrrn", backfill="conservative", reservations=2, start_or_wait=True, placement="default"), demand=demand))
        out[demand] = sum(j.service_s for j in res.jobs)
    assert out["comm"] < out["full"]
    with pytest.raises(SimulationError, match="unknown demand model"):
        simulate(jobs, Dispatcher(fab), fab, SimConfig(demand="nope"))


def test_truth_matches_the_contention_formula_job_by_job(fab):
    """Every running job against all the others (single-host, cross-host, idle ones mixed) equals
    the formula applied to that one job: contenders share a host, capacity is the worst union."""
    spec = fab.spec
    rng = np.random.default_rng(4)
    free = spec.full_masks.copy()
    masks = []
    while free.any() and len(masks) < 12:
        hs = rng.choice(np.flatnonzero(free), size=min(int(rng.integers(1, 4)), int((free != 0).sum())), replace=False)
        m = np.zeros(spec.n_hosts, dtype=np.int64)
        for h in hs:
            bits = [b for b in range(8) if free[h] >> b & 1]
            for b in rng.choice(bits, size=min(len(bits), int(rng.integers(1, 4))), replace=False):
                m[h] |= np.int64(1) << int(b)
        free &= ~m
        masks.append(m)
    masks = np.array(masks)
    f = rng.uniform(0.0, 1.0, len(masks))
    got, solo = TrueBandwidth(fab).achieved(masks, f)
    for i, m in enumerate(masks):
        d = float(fab.predict_masks(m[None, :])[0])
        assert solo[i] == pytest.approx(d)
        cross = lambda x: (x != 0).sum() >= 2 and fab.predict_masks(x[None, :])[0] > 0  # noqa: E731
        cont = [j for j in range(len(masks)) if j != i and cross(m) and cross(masks[j]) and ((m != 0) & (masks[j] != 0)).any()]
        if not cont:
            assert got[i] == pytest.approx(d)
            continue
        cap = min(float(fab.predict_masks((m | masks[j])[None, :])[0]) for j in cont)
        dem = d + sum(f[j] * float(fab.predict_masks(masks[j][None, :])[0]) for j in cont)
        assert got[i] == pytest.approx(d if dem <= cap else d / dem * cap, rel=1e-9)
