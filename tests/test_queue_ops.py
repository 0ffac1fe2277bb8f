"""The GPU request queue's lifecycle (release, drain, fragmentation), CLI, crash recovery (kill -9),
concurrent batch runs, and a stateful property test of the invariants."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.topology.cluster import ClusterSpec
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import ModelError, RequestError, StateError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.state import State

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "params" / "clusters" / "h100.yaml"

# Helpers and fixtures live in test_queue.py (pytest puts tests/ on sys.path).
from test_queue import GreedyDispatcher, assert_consistent, h100, new_store, reqs, scenario_concurrent, scenario_kill9  # noqa: E402
from test_queue import disp, spec, store, url  # noqa: E402, F401  (pytest fixtures)
from bandpilot.scheduling.profile import SchedulerProfile  # noqa: E402


# ------------------------------------------------------------------------------------------
# Lifecycle: release, drain, fragmentation
# ------------------------------------------------------------------------------------------
def test_release_errors(store, disp):
    q.submit(store, reqs(1))
    with pytest.raises(StateError, match="no active job 'r0' \\(request 'r0' is pending\\)"):
        q.release(store, "r0")
    sched.run_batch(store, disp, SchedulerProfile("test"))
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
    rep = sched.run_batch(store, g, SchedulerProfile("test"))
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
    b = sched.run_batch(store, g, SchedulerProfile("test")).assigned[0].gpus
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
    sched.run_batch(store, g, SchedulerProfile("test"))
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
    sched.run_batch(store, disp, SchedulerProfile("test"))
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
    (tmp_path / "by-utility.yaml").write_text("base: recommended\nqueue_sort: utility\n")
    assert cli.run("dispatch", "--batch", "--profile", tmp_path / "by-utility.yaml") == 0
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
    assert cli.run("dispatch", "--batch", "--profile", "random") == 2
    assert "unknown profile 'random'" in capsys.readouterr().err
    assert cli.run("queue", "release", "zzz") == 2
    assert cli.run("cluster", "drain", "rack-7") == 2
    assert cli.run("queue", "submit", "--k", 0) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 3 and all(len(line) < 400 for line in err.splitlines())


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
        rep = sched.run_batch(self.store, self.disp, SchedulerProfile("test", queue_sort=policy), commit=commit, limit=limit)
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
