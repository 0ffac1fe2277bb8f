"""The GPU request queue: store, migrations, requests, policies, batch runs, lifecycle, CLI,
crash recovery (kill -9), concurrent batch runs, and a stateful property test of the invariants.

PostgreSQL variants of the store scenarios live in ``test_queue_pg.py`` and reuse the helpers here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sqlalchemy as sa
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.queue import schema as q_schema
from bandpilot.scheduling.batch import load_pending
from bandpilot.scheduling.policies import Pending
from bandpilot.topology.cluster import ClusterSpec, load_cluster, popcount, spec_from_dict
from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.dispatcher import Dispatcher, PlacementError
from bandpilot.errors import ModelError, RequestError, StateError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.state import State

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "params" / "clusters" / "h100.yaml"


# ------------------------------------------------------------------------------------------
# Helpers shared with test_queue_pg.py
# ------------------------------------------------------------------------------------------
def h100() -> ClusterSpec:
    return load_cluster(H100)


def domain_spec(domain_size: int = 2, name: str = "h100dom") -> ClusterSpec:
    """h100 (4 hosts x 8) with hosts grouped into NVLink-style domains of ``domain_size`` hosts."""
    doc = yaml.safe_load(H100.read_text())
    doc["name"] = name
    doc["host_groups"][0]["domain_size"] = domain_size
    return spec_from_dict(doc, H100.parent, name)


class GreedyDispatcher:
    """A fast, deterministic stand-in with the Dispatcher contract (lowest free GPUs first,
    the fabric as predictor); used where many batches run (property test)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.fabric = make_fabric(spec)
        self.model = SimpleNamespace(spec=spec, model_version="greedy-1", uri="test:greedy")
        self.spec = spec
        self.calls: list[tuple[int, State, dict]] = []

    def select(self, k, state, algorithm="bandpilot", *, constraints=None):
        c = Constraints.parse(constraints).to_dict()
        self.calls.append((k, state, c))
        spec = self.spec
        if k > state.n_free:
            raise PlacementError("insufficient_gpus", f"{k} > {state.n_free} free")
        free = state.free.copy()
        if c.get("allowed_hosts") is not None:
            keep = np.zeros(spec.n_hosts, dtype=bool)
            keep[[spec.host_index[h] for h in c["allowed_hosts"]]] = True
            free = np.where(keep, free, 0)
        counts = popcount(free)
        mask = np.zeros(spec.n_hosts, dtype=np.int64)
        hosts = range(spec.n_hosts)
        if c.get("single_host"):
            fits = np.flatnonzero(counts >= k)
            if not fits.size:
                raise PlacementError("constraint_unmet", "no single host fits")
            hosts = [int(fits[0])]
        need = k
        for h in hosts:
            m = int(free[h])
            while m and need:
                bit = m & -m
                mask[h] |= bit
                m ^= bit
                need -= 1
        if need:
            raise PlacementError("constraint_unmet", "not enough allowed GPUs")
        solo = float(self.fabric.bandwidth_masks(mask[None, :])[0])
        pred = solo * (0.9 if state.jobs else 1.0)
        if c.get("min_gbps") is not None and pred < c["min_gbps"]:
            raise PlacementError("constraint_unmet", f"{pred:.1f} < min_gbps")
        return SimpleNamespace(gpus=spec.from_mask(mask), predicted_gbps=pred, standalone_gbps=solo,
                               algorithm="greedy", search_ms=0.01, evaluations=1)


def new_store(url: str, spec: ClusterSpec | None = None, **kw) -> q.Store:
    s = q.Store(url, **kw)
    s.init_cluster(spec or h100())
    return s


def reqs(n: int, k: int = 2, prefix: str = "r", **extra) -> list[dict]:
    return [{"id": f"{prefix}{i}", "k": k, **extra} for i in range(n)]


def assert_consistent(store: q.Store) -> None:
    bad = q.check_invariants(store)
    assert bad == [], bad


def assigned_rows(store: q.Store) -> list[tuple[str, list[str]]]:
    with store.read() as conn:
        rows = conn.execute(sa.select(q.T_ASSIGN.c.request_id, q.T_ASSIGN.c.gpus)).all()
    return [(r, json.loads(g)) for r, g in rows]


def scenario_basic(store: q.Store, dispatcher) -> None:
    """Submit, batch, contention visible to later requests, release, re-batch."""
    q.submit(store, reqs(10, k=4))
    rep = sched.run_batch(store, dispatcher, policy="fifo")
    assert rep.counts()["assigned"] == 8 and rep.counts()["deferred"] == 2
    assert [o.request_id for o in rep.assigned] == [f"r{i}" for i in range(8)]
    assert {o.reason for o in rep.deferred} == {"insufficient_gpus"}
    gpus = [g for o in rep.assigned for g in o.gpus]
    assert len(gpus) == len(set(gpus)) == 32
    doc = q.export_state(store)
    st_ = State.from_dict(store.spec, doc)
    assert st_.n_free == 0 and len(st_.jobs) == 8
    by_id = {o.request_id: o for o in rep.assigned}
    for j in doc["jobs"]:  # demand = predicted standalone bandwidth
        assert j["demand_gbps"] == pytest.approx(by_id[j["id"]].standalone_gbps)
    assert_consistent(store)
    q.release(store, "r0")
    q.release(store, "r1")
    rep2 = sched.run_batch(store, dispatcher, policy="fifo")
    assert [o.request_id for o in rep2.assigned] == ["r8", "r9"]
    assert_consistent(store)
    rows = {r["id"]: r for r in q.list_requests(store)}
    assert rows["r0"]["status"] == "released" and rows["r9"]["status"] == "assigned"
    assert rows["r9"]["attempts"] == 2


# Subprocess batch runner (crash and concurrency tests); argv: url schema spec commit policy sleep
RUNNER = r"""
import sys
from bandpilot.topology.cluster import load_cluster
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue import Store
from bandpilot.scheduling import run_batch
import time
url, schema, spec_path, commit, policy, sleep = sys.argv[1:7]
store = Store(url, schema=schema or None)
d = Dispatcher(make_fabric(load_cluster(spec_path)))
print("START", flush=True)
rep = run_batch(store, d, policy=policy, commit=commit, after_each=lambda o: time.sleep(float(sleep)))
print("DONE " + " ".join(o.request_id for o in rep.assigned), flush=True)
"""


def spawn_batch(url: str, commit: str, sleep: float, schema: str = "", policy: str = "fifo") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(  # after_each sleeps after every request: a window to kill -9 mid-batch
        [sys.executable, "-c", RUNNER, url, schema, str(H100), commit, policy, str(sleep)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT),
    )


def wait_start(p: subprocess.Popen, timeout: float = 60) -> None:
    line = p.stdout.readline()
    assert line.strip() == "START", (line, p.stderr.read() if p.poll() is not None else "")


def scenario_kill9(store: q.Store, url: str, commit: str, schema: str = "") -> None:
    """SIGKILL a batch mid-way; the re-run assigns every request exactly once."""
    q.submit(store, reqs(12, k=2, prefix="c"))
    p = spawn_batch(url, commit, sleep=0.25, schema=schema)
    try:
        wait_start(p)
        deadline = time.time() + 30
        if commit == "request":  # wait until some requests are committed, then kill mid-batch
            while time.time() < deadline and len(assigned_rows(store)) < 3:
                time.sleep(0.05)
        else:
            time.sleep(1.0)
        assert p.poll() is None, "batch finished before it could be killed"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    done = assigned_rows(store)
    if commit == "batch":
        assert done == []  # one transaction: all or nothing
    else:
        assert 3 <= len(done) < 12
        assert q.status(store)["last_batch"]["interrupted"]
    assert_consistent(store)
    rep = sched.run_batch(store, Dispatcher(make_fabric(store.spec)))
    assert len(rep.assigned) == 12 - len(done)
    rows = assigned_rows(store)
    assert sorted(r for r, _ in rows) == sorted(f"c{i}" for i in range(12))
    gpus = [g for _, gs in rows for g in gs]
    assert len(gpus) == len(set(gpus)) == 24
    assert_consistent(store)


def scenario_concurrent(store: q.Store, url: str, commit: str, schema: str = "") -> None:
    """Two batch processes at once: no GPU twice, no request twice, capacity fully used."""
    # Priorities reverse the FIFO order, so the fifo run and the priority run work from opposite
    # ends of the queue and interleave their assignments until they meet.
    q.submit(store, [{"id": f"x{i}", "k": 1, "priority": i} for i in range(40)])
    procs = [spawn_batch(url, commit, sleep=0.02, schema=schema, policy=pol) for pol in ("fifo", "priority")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    got = [line.split()[1:] for o in outs for line in o.splitlines() if line.startswith("DONE")]
    assert len(got) == 2
    both = got[0] + got[1]
    assert len(both) == len(set(both)) == 32, (len(got[0]), len(got[1]))
    rows = assigned_rows(store)
    assert sorted(r for r, _ in rows) == sorted(both)
    gpus = [g for _, gs in rows for g in gs]
    assert len(gpus) == len(set(gpus)) == 32
    assert_consistent(store)


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spec() -> ClusterSpec:
    return h100()


@pytest.fixture(scope="module")
def disp(spec) -> Dispatcher:
    return Dispatcher(make_fabric(spec))


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.fixture
def store(url, spec):
    s = new_store(url, spec)
    yield s
    s.close()


# ------------------------------------------------------------------------------------------
# Store, schema, migrations
# ------------------------------------------------------------------------------------------
def test_store_sqlite_wal_and_schema(store, url):
    with store.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert store.current_version(conn) == q.schema_version()
    again = q.Store(url)  # reopening is a no-op migration
    assert again.spec.fingerprint() == store.spec.fingerprint()
    assert again.migrate() == q.schema_version()


def test_spec_round_trip_and_init_idempotent(store, spec):
    assert store.spec.fingerprint() == spec.fingerprint()
    assert store.spec.gpu_ids == spec.gpu_ids
    assert store.init_cluster(spec) is False
    with pytest.raises(q.StoreError, match="already holds cluster 'h100'"):
        store.init_cluster(domain_spec())
    q.submit(store, reqs(1))
    sched.run_batch(store, GreedyDispatcher(spec))
    with pytest.raises(q.StoreError, match="still active"):
        store.init_cluster(domain_spec(), force=True)
    q.release(store, "r0")
    assert store.init_cluster(domain_spec(), force=True) is True
    assert store.spec.name == "h100dom"


def test_spec_stored_as_json_and_yaml_stores_still_open(tmp_path, spec):
    """Specs are stored as JSON (YAML took minutes at 100,008 GPUs); stores written before hold
    YAML and must still open as the same cluster."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    store = q.Store(url)
    store.init_cluster(spec)
    with store.read() as conn:
        text = conn.execute(sa.select(q_schema.T_CLUSTER.c.spec_yaml)).scalar()
    assert json.loads(text)["name"] == spec.name
    old = yaml.safe_dump(json.loads(text), sort_keys=False)  # what the earlier code wrote
    with store.write() as conn:
        conn.execute(sa.update(q_schema.T_CLUSTER).values(spec_yaml=old))
    reopened = q.Store(url)
    assert reopened.spec.fingerprint() == spec.fingerprint()
    assert reopened.spec.gpu_ids == spec.gpu_ids
    assert reopened.init_cluster(spec) is False
    q.submit(reopened, reqs(1))
    assert sched.run_batch(reopened, GreedyDispatcher(spec)).counts()["assigned"] == 1


def test_uninitialised_and_bad_urls(tmp_path):
    s = q.Store(f"sqlite:///{tmp_path / 'x' / 'new.db'}")
    with pytest.raises(q.StoreError, match="cluster init"):
        _ = s.spec
    with pytest.raises(q.StoreError, match="unsupported store URL"):
        q.Store("mysql://u@h/db")
    with pytest.raises(q.StoreError, match="PostgreSQL"):
        q.Store(f"sqlite:///{tmp_path / 'y.db'}", schema="abc")


def test_migrations_ordered_once_and_newer_schema_refused(tmp_path, monkeypatch, spec):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    new_store(url, spec)
    calls = []

    def m2(conn):
        calls.append(1)
        q.alembic_ops(conn).add_column("bp_requests", sa.Column("note2", sa.Text, nullable=True))

    nxt = q_schema.schema_version() + 1
    monkeypatch.setattr(q_schema, "MIGRATIONS", q_schema.MIGRATIONS + [(nxt, "add note2", m2)])
    s = q.Store(url)
    q.Store(url)
    assert calls == [1]
    with s.read() as conn:
        cols = {c["name"] for c in sa.inspect(conn).get_columns("bp_requests")}
        assert "note2" in cols
        assert [r.version for r in conn.execute(sa.select(q.T_SCHEMA)).all()] == [v for v, _, _ in q_schema.MIGRATIONS]
    monkeypatch.setattr(q_schema, "MIGRATIONS", q_schema.MIGRATIONS[:1])
    with pytest.raises(q.StoreError, match="newer than this BandPilot"):
        q.Store(url)


# ------------------------------------------------------------------------------------------
# Requests: parsing and validation
# ------------------------------------------------------------------------------------------
def test_parse_jsonl_reports_bad_lines(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(
        "\n".join(
            [
                '{"id": "a", "k": 2, "tenant": "t1", "priority": 3, "utility": 0.7, "submitted": "2025-01-01T00:00:00Z"}',
                "# a comment",
                '{"id": "b", "k": 2',  # malformed
                '{"id": "c", "k": 0}',
                '{"id": "a", "k": 1}',  # duplicate in file
                '{"id": "d", "k": 1, "single_host": true}',  # misplaced constraint
                '{"id": "e", "k": 4, "constraints": {"single_host": true, "allowed_hosts": ["h100-0"]}}',
                "",
                '{"id": "f", "k": 1, "constraints": {"min_gbps": -1}}',
                '["not", "an", "object"]',
            ]
        )
    )
    p = q.parse_jsonl(f)
    assert [r.id for r in p.requests] == ["a", "e"]
    assert p.lines == [1, 7]
    msgs = "\n".join(p.errors)
    assert len(p.errors) == 6
    assert f"{f}:3: invalid JSON" in msgs
    assert f"{f}:4" in msgs and "'k' must be >= 1" in msgs
    assert f"{f}:5: duplicate request id 'a' (first on line 1)" in msgs
    assert "constraints go under 'constraints'" in msgs
    assert "min_gbps" in msgs and f"{f}:10" in msgs
    a = p.requests[0]
    assert a.tenant == "t1" and a.priority == 3 and a.utility == 0.7
    assert a.submitted_at == pytest.approx(1735689600.0)
    assert all("\n" not in e for e in p.errors)


def test_submit_validation_all_or_nothing_and_partial(store):
    bad = [
        {"id": "ok1", "k": 2},
        {"id": "big", "k": 33},
        {"id": "zero", "k": 0},
        {"id": "host", "k": 1, "constraints": {"allowed_hosts": ["nope"]}},
        {"id": "gpu", "k": 1, "constraints": {"allowed_gpus": ["h100-0:9"]}},
        {"id": "gpu2", "k": 1, "constraints": {"allowed_hosts": ["h100-0:1"]}},
        {"id": "fit", "k": 9, "constraints": {"single_host": True}},
        {"id": "few", "k": 3, "constraints": {"allowed_gpus": ["h100-0:1", "h100-0:2"]}},
        {"id": "ok2", "k": 1},
    ]
    with pytest.raises(q.SubmitError) as ei:
        q.submit(store, bad)
    errs = "\n".join(ei.value.errors)
    assert len(ei.value.errors) == 7
    for needle in ("exceeds the cluster size", "'k' must be >= 1", "unknown host 'nope'",
                   "GPU ids go in allowed_gpus", "unknown GPU index '9'", "single host", "allow only 2 GPUs"):
        assert needle in errs
    assert "nothing submitted" in str(ei.value) and "\n" not in str(ei.value)
    assert q.list_requests(store) == []
    rep = q.submit(store, bad, partial=True)
    assert rep.submitted == ["ok1", "ok2"] and len(rep.errors) == 7
    # duplicates against the store
    with pytest.raises(RequestError, match="'ok1' already exists"):
        q.submit(store, [{"id": "ok1", "k": 1}, {"id": "new", "k": 1}])
    assert [r["id"] for r in q.list_requests(store)] == ["ok1", "ok2"]
    with pytest.raises(RequestError, match="duplicate request id 'z'"):
        q.submit(store, [{"id": "z", "k": 1}, {"id": "z", "k": 2}])


# ------------------------------------------------------------------------------------------
# Batch runs
# ------------------------------------------------------------------------------------------
def test_batch_fifo_contention_and_release(store, disp):
    scenario_basic(store, disp)


def test_later_requests_see_earlier_assignments_as_contention(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, reqs(3, k=4))
    sched.run_batch(store, g)
    states = [s for _, s, _ in g.calls]
    assert [len(s.jobs) for s in states] == [0, 1, 2]
    assert states[2].jobs[0].demand_gbps > 0
    assert states[2].n_free == 24


def test_batch_output_fields(store, disp):
    q.submit(store, [{"id": "a", "k": 8, "tenant": "t"}])
    rep = sched.run_batch(store, disp, model_uri="models:/bandpilot-h100@champion")
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
    rep = sched.run_batch(store, g, policy="priority")
    assert [o.request_id for o in rep.assigned] == ["high", "mid"]
    with pytest.raises(RequestError, match="unknown policy"):
        sched.run_batch(store, g, policy="lifo")


def test_utility_quotas_proportional_when_competing(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, reqs(8, k=4, prefix="a", tenant="A", utility=0.9) + reqs(8, k=4, prefix="b", tenant="B", utility=0.3))
    rep = sched.run_batch(store, g, policy="utility")
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
    rep = sched.run_batch(store, g, policy="utility")
    assert rep.quotas is None and rep.counts()["assigned"] == 4
    q.submit(store, reqs(2, k=4, prefix="c", tenant="C", utility=0.1) + reqs(2, k=2, prefix="d", tenant="D", utility=0.9))
    for j in ("a0", "a1"):
        q.release(store, j)
    rep = sched.run_batch(store, g, policy="utility")  # 12 wanted, 16 free: no competition
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
    rep = sched.run_batch(store, disp)
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
    rep = sched.run_batch(s, d)
    b = next(o for o in rep.outcomes if o.request_id == "b")
    assert b.status == "assigned"
    doms = {spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain for g in b.gpus}
    assert len(doms) == 1
    f = q.fragmentation(s)
    assert {d_["domain"] for d_ in f["domains"]} == {"h100-d0", "h100-d1"}
    assert f["largest_placeable"]["single_domain"] == max(d_["free"] for d_ in f["domains"])
    q.submit(s, [{"id": "c", "k": 8, "constraints": {"single_domain": True}}])
    rep = sched.run_batch(s, d)
    assert rep.outcomes[0].status == "deferred" and rep.outcomes[0].reason == "constraint_unmet"
    assert_consistent(s)


def test_limit_and_deferral_reason_retried(store, disp):
    q.submit(store, reqs(5, k=8))
    rep = sched.run_batch(store, disp, limit=2)
    assert [o.request_id for o in rep.outcomes] == ["r0", "r1"]
    rep = sched.run_batch(store, disp)
    assert rep.counts() == {"assigned": 2, "deferred": 1, "rejected": 0, "skipped": 0}
    row = q.list_requests(store, status="pending")[0]
    assert row["reason"] == "insufficient_gpus" and row["attempts"] == 1
    assert q.status(store)["deferral_reasons"] == {"insufficient_gpus": 1}
    q.release(store, "r0")
    assert sched.run_batch(store, disp).assigned[0].request_id == "r4"


def test_invalid_request_in_store_is_rejected(store, disp):
    q.submit(store, [{"id": "a", "k": 4}])
    with store.write() as conn:  # e.g. left over from an earlier, larger cluster
        conn.execute(sa.update(q.T_REQ).where(q.T_REQ.c.id == "a").values(k=64))
    rep = sched.run_batch(store, disp)
    assert rep.outcomes[0].status == "rejected" and rep.outcomes[0].reason == "invalid_request"
    assert q.list_requests(store)[0]["status"] == "rejected"


def test_model_for_another_cluster_assigns_nothing(store):
    other = Dispatcher(make_fabric(domain_spec()))
    q.submit(store, reqs(2))
    with pytest.raises(ModelError, match="built for cluster 'h100dom'"):
        sched.run_batch(store, other)
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
    rep = sched.run_batch(store, _EvilDispatcher(spec))
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
        sched.run_batch(store, Boom(spec))
    assert assigned_rows(store) == [] and q.status(store)["requests"]["pending"] == 3
    with pytest.raises(RuntimeError):
        sched.run_batch(store, Boom(spec), commit="request")
    assert len(assigned_rows(store)) == 1  # per-request commits: the first one stuck, fully
    assert_consistent(store)


def test_commit_per_request_mode(store, disp):
    q.submit(store, reqs(6, k=8))
    rep = sched.run_batch(store, disp, commit="request")
    assert rep.counts()["assigned"] == 4 and rep.counts()["deferred"] == 2
    assert_consistent(store)


def test_cancel(store):
    q.submit(store, reqs(2))
    q.cancel(store, "r0")
    with pytest.raises(RequestError, match="is cancelled, not pending"):
        q.cancel(store, "r0")
    with pytest.raises(RequestError, match="no request"):
        q.cancel(store, "zz")
    sched.run_batch(store, GreedyDispatcher(store.spec))
    with pytest.raises(RequestError, match="release the job instead"):
        q.cancel(store, "r1")


# ------------------------------------------------------------------------------------------
# Lifecycle: release, drain, fragmentation
# ------------------------------------------------------------------------------------------
def test_release_errors(store, disp):
    q.submit(store, reqs(1))
    with pytest.raises(StateError, match="no active job 'r0' \\(request 'r0' is pending\\)"):
        q.release(store, "r0")
    sched.run_batch(store, disp)
    assert len(q.release(store, "r0")["freed"]) == 2
    with pytest.raises(StateError, match="already released"):
        q.release(store, "r0")
    with pytest.raises(StateError, match="no active job 'nope'"):
        q.release(store, "nope")


def test_drain_undrain_host_gpu_and_busy(store, spec):
    g = GreedyDispatcher(spec)
    r = q.drain(store, "h100-0", reason="nvlink degraded")
    assert len(r["drained"]) == 8
    q.submit(store, [{"id": "a", "k": 8}])
    rep = sched.run_batch(store, g)
    assert all(not x.startswith("h100-0:") for x in rep.assigned[0].gpus)  # drained GPUs never handed out
    busy = rep.assigned[0].gpus
    r = q.drain(store, busy[0].rpartition(":")[0])
    assert r["pending"] == busy and r["drained"] == []
    doc = q.export_state(store)
    assert set(doc["jobs"][0]["gpus"]) == set(busy)  # the running job keeps its GPUs
    assert q.status(store)["gpus"]["drain_pending"] == 8
    rel = q.release(store, "a")
    assert rel["unavailable"] == busy and rel["freed"] == []
    assert q.status(store)["gpus"] == {"total": 32, "free": 16, "busy": 0, "unavailable": 16, "drain_pending": 0}
    assert q.undrain(store, "h100-0:3")["undrained"] == ["h100-0:3"]
    assert q.drain(store, "h100-0:3")["drained"] == ["h100-0:3"]
    assert q.drain(store, "h100-0:3")["already"] == ["h100-0:3"]
    q.undrain(store, "h100-0")
    # a pending drain can be cancelled
    q.submit(store, [{"id": "b", "k": 2}])
    b = sched.run_batch(store, g).assigned[0].gpus
    q.drain(store, b[0])
    assert q.undrain(store, b[0])["cancelled"] == [b[0]]
    assert q.release(store, "b")["unavailable"] == []
    with pytest.raises(StateError, match="unknown GPU, host or domain"):
        q.drain(store, "rack-9")
    with pytest.raises(StateError, match="unknown GPU index"):
        q.drain(store, "h100-0:8")
    assert_consistent(store)


def test_fragmentation_report(store, spec):
    g = GreedyDispatcher(spec)
    q.submit(store, [
        {"id": "a", "k": 3, "constraints": {"allowed_hosts": ["h100-0"]}},
        {"id": "b", "k": 8, "constraints": {"allowed_hosts": ["h100-1"]}},
        {"id": "c", "k": 2, "constraints": {"allowed_hosts": ["h100-2"]}},
    ])
    sched.run_batch(store, g)
    q.drain(store, "h100-3:0")
    f = q.fragmentation(store)
    hosts = {h["host"]: h for h in f["hosts"]}
    assert hosts["h100-0"] == {"host": "h100-0", "domain": None, "gpus": 8, "free": 5, "busy": 3, "unavailable": 0,
                               "drain_pending": 0, "stranded": 5}
    assert hosts["h100-1"]["free"] == 0 and hosts["h100-1"]["stranded"] == 0
    assert hosts["h100-3"]["stranded"] == 7
    assert f["free"] == 5 + 6 + 7 and f["stranded"] == 18 and f["whole_free_hosts"] == 0
    assert f["largest_placeable"] == {"any": 18, "single_host": 7}
    assert f["fragmentation"] == 1.0  # every free GPU sits on a partly used host
    q.release(store, "b")
    f = q.fragmentation(store)
    assert f["whole_free_hosts"] == 1 and f["fragmentation"] == pytest.approx(18 / 26, abs=1e-4)
    assert f["largest_placeable"] == {"any": 26, "single_host": 8}
    assert "domains" not in f


def test_export_state_is_dispatcher_format(store, disp):
    q.submit(store, reqs(3, k=4))
    sched.run_batch(store, disp)
    q.drain(store, "h100-3")
    doc = q.export_state(store)
    assert set(doc) == {"free", "jobs"}
    st_ = State.from_dict(store.spec, doc)
    assert st_.n_free == 32 - 12 - 8 + sum(1 for j in doc["jobs"] for g in j["gpus"] if g.startswith("h100-3:"))
    sel = disp.select(4, doc)  # the export feeds the dispatcher directly
    assert len(sel.gpus) == 4


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
@pytest.fixture
def cli(monkeypatch, tmp_path, spec):
    from bandpilot.cli import main as climain

    home = tmp_path / "proj"
    home.mkdir()
    monkeypatch.setenv("BANDPILOT_HOME", str(home))
    monkeypatch.delenv("BANDPILOT_STORE", raising=False)
    climain._load_commands()
    import bandpilot.cli.queue as cq

    loaded = []

    def fake_load(uri):
        loaded.append(uri)
        if "missing" in uri:
            raise ModelError(f"model not found: {uri}")
        return Dispatcher(make_fabric(spec))

    monkeypatch.setattr(cq, "load_dispatcher", fake_load)
    return SimpleNamespace(run=lambda *a: climain.main([str(x) for x in a]), home=home, loaded=loaded)


@pytest.mark.slow
def test_cli_end_to_end(cli, capsys, tmp_path):
    assert cli.run("cluster", "init", "--cluster", H100) == 0
    assert (cli.home / ".bandpilot" / "queue.db").is_file()
    assert cli.run("cluster", "init", "--cluster", "h100") == 0  # by name, idempotent
    jl = tmp_path / "r.jsonl"
    jl.write_text("\n".join(json.dumps({"id": f"j{i}", "k": 4, "tenant": "t", "utility": i / 10}) for i in range(10)))
    assert cli.run("queue", "submit", jl) == 0
    assert "submitted 10 request(s)" in capsys.readouterr().out
    assert cli.run("queue", "submit", "--k", 2, "--id", "flag1", "--tenant", "u", "--single-host", "--min-gbps", 1) == 0
    assert cli.run("dispatch", "--batch", "--policy", "utility") == 0
    out = capsys.readouterr().out
    assert cli.loaded == ["models:/bandpilot-h100@champion"]
    assert "batch #1 (utility" in out and "8 assigned" in out and "3 deferred" in out
    assert "insufficient_gpus" in out and "bandpilot" in out
    assert cli.run("queue", "status", "--json") == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests"]["assigned"] == 8 and s["gpus"]["free"] == 2  # quotas t 29, u 3: 7x4 + 2
    assert cli.run("cluster", "state", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    State.from_dict(h100(), doc)
    victim = doc["jobs"][0]["id"]
    assert cli.run("queue", "release", victim) == 0
    assert f"released {victim}: 4 GPU(s) free" in capsys.readouterr().out
    assert cli.run("cluster", "drain", "h100-0", "--reason", "ecc") == 0
    assert cli.run("cluster", "undrain", "h100-0:0") == 0
    assert cli.run("cluster", "fragmentation") == 0
    out = capsys.readouterr().out
    assert "largest placeable" in out and "stranded" in out
    # Nothing pending fits the free GPUs: no batch, no model load (the every-minute schedule's no-op).
    assert cli.run("dispatch", "--batch", "--json", "--model", "models:/x@challenger", "--commit", "request") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["batch_id"] is None and "the smallest needs 4 GPUs" in rep["skipped"]
    assert "models:/x@challenger" not in cli.loaded
    assert cli.run("cluster", "undrain", "h100-0") == 0  # now a 4-GPU request fits again
    capsys.readouterr()
    assert cli.run("dispatch", "--batch", "--json", "--model", "models:/x@challenger", "--commit", "request") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["model_uri"] == "models:/x@challenger" and rep["commit"] == "request"
    assert cli.run("queue", "list", "--status", "pending") == 0
    assert "gpus / reason" in capsys.readouterr().out
    assert cli.run("queue", "status") == 0
    assert "last batch #2" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_errors(cli, capsys, tmp_path):
    assert cli.run("queue", "status") == 2
    assert "cluster init" in capsys.readouterr().err
    assert cli.run("cluster", "init", "--cluster", "nope-cluster") == 2
    assert cli.run("cluster", "init", "--cluster", H100) == 0
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"id": "a", "k": 1}\n{"id": "b", "k": \n{"id": "c", "k": 99}\n{"id": "d", "k": 2}\n')
    capsys.readouterr()
    assert cli.run("queue", "submit", jl) == 2
    err = capsys.readouterr().err
    assert f"invalid: {jl}:2: invalid JSON" in err and f"{jl}:3: request 'c': k=99 exceeds" in err
    assert "error: 2 invalid request(s)" in err and "--partial" in err
    assert cli.run("queue", "list", "--json") == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli.run("queue", "submit", jl, "--partial") == 0
    cap = capsys.readouterr()
    assert "submitted 2 request(s), 2 skipped" in cap.out and f"skipped: {jl}:2" in cap.err
    assert cli.run("queue", "submit", jl, "--partial") == 0  # re-import: all duplicates now
    assert "already exists" in capsys.readouterr().err
    assert cli.run("dispatch", "--model", "models:/missing@champion") == 2  # batch is the default mode
    assert "error: model not found" in capsys.readouterr().err
    assert cli.run("queue", "status", "--json") == 0
    assert json.loads(capsys.readouterr().out)["requests"]["pending"] == 2  # nothing assigned
    assert cli.run("dispatch", "--batch", "--policy", "random") == 2
    assert cli.run("queue", "release", "zzz") == 2
    assert cli.run("cluster", "drain", "rack-7") == 2
    assert cli.run("queue", "submit", "--k", 0) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 4 and all(len(line) < 400 for line in err.splitlines())


def test_non_promoted_model_is_a_clear_error(request):
    pytest.importorskip("bandpilot.model.registry", reason="the model registry module is not in the tree yet")
    request.getfixturevalue("mlflow_uri")  # an empty registry: nothing promoted
    with pytest.raises(ModelError):
        Dispatcher.load("models:/bandpilot-h100@champion")


# ------------------------------------------------------------------------------------------
# Crashes and concurrency (subprocesses)
# ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("commit", ["batch", "request"])
def test_kill9_mid_batch_then_rerun(store, url, commit):
    scenario_kill9(store, url, commit)


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["batch", "request"])
def test_two_concurrent_batch_processes(store, url, commit):
    scenario_concurrent(store, url, commit)


# ------------------------------------------------------------------------------------------
# Property test: random submit / dispatch / release / drain sequences keep every invariant
# ------------------------------------------------------------------------------------------
_SPEC = None


def _spec() -> ClusterSpec:
    global _SPEC
    if _SPEC is None:
        _SPEC = h100()
    return _SPEC


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="bpq-")
        self.spec = _spec()
        self.store = new_store(f"sqlite:///{self.dir}/q.db", self.spec)
        self.disp = GreedyDispatcher(self.spec)
        self.n = 0
        self.submitted: set[str] = set()
        self.ever_assigned: set[str] = set()
        self.drained: set[str] = set()

    @rule(
        k=st.integers(1, 12),
        tenant=st.sampled_from(["a", "b", "c"]),
        prio=st.integers(0, 3),
        util=st.none() | st.floats(0, 1),
        single=st.booleans(),
        hosts=st.none() | st.lists(st.sampled_from(["h100-0", "h100-1", "h100-2", "h100-3"]), min_size=1, max_size=3, unique=True),
    )
    def submit(self, k, tenant, prio, util, single, hosts):
        self.n += 1
        cons = {}
        if single:
            cons["single_host"] = True
        if hosts:
            cons["allowed_hosts"] = hosts
        doc = {"id": f"q{self.n}", "k": k, "tenant": tenant, "priority": prio, "utility": util, "constraints": cons}
        try:
            q.submit(self.store, [doc])
            self.submitted.add(doc["id"])
        except RequestError:
            pass  # statically impossible (e.g. k=12 single_host)

    @precondition(lambda self: self.submitted)
    @rule()
    def submit_duplicate(self):
        rid = sorted(self.submitted)[0]
        with pytest.raises(RequestError):
            q.submit(self.store, [{"id": rid, "k": 1}])

    @rule(policy=st.sampled_from(sched.POLICIES), commit=st.sampled_from(sched.COMMIT_MODES), limit=st.none() | st.integers(1, 4))
    def dispatch(self, policy, commit, limit):
        rep = sched.run_batch(self.store, self.disp, policy=policy, commit=commit, limit=limit)
        new = {o.request_id for o in rep.assigned}
        assert not (new & self.ever_assigned), "a request was assigned twice"
        self.ever_assigned |= new
        for o in rep.assigned:
            assert not (set(o.gpus) & self.drained), "a drained GPU was handed out"

    @rule(data=st.data())
    def release(self, data):
        active = [j["id"] for j in q.export_state(self.store)["jobs"]]
        if active:
            q.release(self.store, data.draw(st.sampled_from(active)))

    @rule(target_=st.sampled_from(["h100-0", "h100-1:3", "h100-2:0", "h100-3", "h100-2:7"]))
    def drain(self, target_):
        q.drain(self.store, target_)
        self.drained |= set(q.resolve_targets(self.spec, target_))

    @rule(target_=st.sampled_from(["h100-0", "h100-1:3", "h100-2", "h100-3"]))
    def undrain(self, target_):
        q.undrain(self.store, target_)
        self.drained -= set(q.resolve_targets(self.spec, target_))

    @invariant()
    def consistent(self):
        assert_consistent(self.store)
        rows = q.list_requests(self.store)
        assert {r["id"] for r in rows} == self.submitted  # nothing lost, nothing invented
        assigned = {r["id"] for r in rows if r["status"] in ("assigned", "released")}
        assert assigned == self.ever_assigned
        doc = q.export_state(self.store)
        busy = [g for j in doc["jobs"] for g in j["gpus"]]
        assert len(busy) == len(set(busy))
        assert not set(doc["free"]) & self.drained

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


QueueMachine.TestCase.settings = settings(
    max_examples=15, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_queue_state_machine = QueueMachine.TestCase
