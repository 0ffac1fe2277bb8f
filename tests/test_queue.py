"""The GPU request queue: store, migrations, request parsing and validation; and the helpers and
fixtures its other test modules share (batch runs: ``test_queue_batch.py``; lifecycle, CLI, kill -9,
concurrency, stateful property: ``test_queue_ops.py``; PostgreSQL variants: ``test_queue_pg.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sqlalchemy as sa
import yaml

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.queue import schema as q_schema
from bandpilot.topology.cluster import ClusterSpec, load_cluster, popcount, spec_from_dict
from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.dispatcher import Dispatcher, PlacementError
from bandpilot.errors import RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.state import State
from bandpilot.scheduling.profile import SchedulerProfile

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
    rep = sched.run_batch(store, dispatcher, SchedulerProfile("test", queue_sort="fifo"))
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
    rep2 = sched.run_batch(store, dispatcher, SchedulerProfile("test", queue_sort="fifo"))
    assert [o.request_id for o in rep2.assigned] == ["r8", "r9"]
    assert_consistent(store)
    rows = {r["id"]: r for r in q.list_requests(store)}
    assert rows["r0"]["status"] == "released" and rows["r9"]["status"] == "assigned"
    assert rows["r9"]["attempts"] == 2


# Subprocess batch runner (crash and concurrency tests); argv: url schema spec commit policy sleep
RUNNER = r"""
import sys
from bandpilot.scheduling.profile import SchedulerProfile
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
rep = run_batch(store, d, SchedulerProfile("test", queue_sort=policy), commit=commit, after_each=lambda o: time.sleep(float(sleep)))
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
    rep = sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test"))
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
    sched.run_batch(store, GreedyDispatcher(spec), SchedulerProfile("test"))
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
    assert sched.run_batch(reopened, GreedyDispatcher(spec), SchedulerProfile("test")).counts()["assigned"] == 1


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
