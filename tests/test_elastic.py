"""Elastic jobs (issue 22): the elastic range of a request, resize generations, per-epoch quotas,
the simulator's epoch-time model and ``simulate --elastic``."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot.errors import RequestError, StateError
from bandpilot.queue.generations import Resize, generation_history, resize
from bandpilot.queue.schema import T_GEN
from bandpilot.scheduling.batch import run_batch
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "params" / "clusters" / "h100.yaml"


def new_store(tmp_path, name: str = "q.db") -> q.Store:
    s = q.Store(f"sqlite:///{tmp_path / name}")
    s.init_cluster(load_cluster(H100))
    return s


# -- 1. the elastic range ---------------------------------------------------------------------
def test_request_elastic_range_parses_and_round_trips():
    r = q.Request.from_dict({"id": "e1", "k": 8, "min_k": 4, "max_k": 16, "k_step": 4})
    assert (r.lo, r.hi, r.step, r.elastic) == (4, 16, 4, True)
    assert r.sizes() == [4, 8, 12, 16]
    assert q.Request.from_dict(r.to_dict()) == r
    fixed = q.Request.from_dict({"id": "f1", "k": 8})
    assert (fixed.lo, fixed.hi, fixed.elastic) == (8, 8, False)


@pytest.mark.parametrize("doc, msg", [
    ({"min_k": 9}, "'min_k' 9 is above k=8"),
    ({"max_k": 4}, "'max_k' 4 is below k=8"),
    ({"min_k": 0}, "'min_k' must be an integer >= 1"),
    ({"max_k": "16"}, "'max_k' must be an integer >= 1"),
    ({"min_k": 2, "max_k": 16, "k_step": 4}, "must be min_k=2 plus a multiple of k_step=4"),
    ({"k_step": True}, "'k_step' must be an integer >= 1"),
])
def test_bad_elastic_range_is_one_line_error(doc, msg):
    with pytest.raises(RequestError) as ei:
        q.Request.from_dict({"id": "e1", "k": 8, **doc}, "f.jsonl:3")
    text = str(ei.value)
    assert msg in text and text.startswith("f.jsonl:3") and "\n" not in text


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["k", "min_k", "max_k", "k_step"]),
                       st.one_of(st.integers(-3, 40), st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.booleans())))
def test_fuzz_elastic_fields_never_crash(doc):
    try:
        r = q.Request.from_dict({"id": "z", **doc})
    except RequestError as exc:
        assert "\n" not in str(exc)
        return
    assert r.lo <= r.k <= r.hi and (r.k - r.lo) % r.step == 0 and (r.hi - r.lo) % r.step == 0


def test_store_keeps_the_range_and_rejects_max_k_over_cluster(tmp_path):
    s = new_store(tmp_path)
    try:
        q.submit(s, [{"id": "e1", "k": 8, "min_k": 4, "max_k": 16, "k_step": 4}, {"id": "f1", "k": 2}])
        rows = {r["id"]: r for r in q.list_requests(s)}
        assert (rows["e1"]["min_k"], rows["e1"]["max_k"], rows["e1"]["k_step"]) == (4, 16, 4)
        assert "min_k" not in rows["f1"]
        with pytest.raises(q.SubmitError, match="max_k=64 exceeds the cluster size"):
            q.submit(s, [{"id": "big", "k": 8, "max_k": 64}])
        with s.read() as conn:
            assert q.schema_version() >= 9 and 9 in set(conn.execute(sa.select(q.T_SCHEMA.c.version)).scalars())
    finally:
        s.close()


def test_migration_9_upgrades_a_v7_store(tmp_path):
    """A store written before v9 (no elastic columns, no generations table) opens and gains them."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = new_store(tmp_path, "old.db")
    q.submit(s, [{"id": "a", "k": 2}])
    s.close()
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        for col in ("min_k", "max_k", "k_step"):
            conn.execute(sa.text(f"ALTER TABLE bp_requests DROP COLUMN {col}"))
        conn.execute(sa.text("DROP TABLE bp_generations"))
        conn.execute(sa.text("DELETE FROM bp_schema WHERE version = 9"))
    eng.dispose()
    s = q.Store(url)
    try:
        assert s.migrate() >= 9
        q.submit(s, [{"id": "b", "k": 4, "min_k": 2, "max_k": 8, "k_step": 2}])
        rows = {r["id"]: r for r in q.list_requests(s)}
        assert rows["a"]["k"] == 2 and rows["b"]["max_k"] == 8
    finally:
        s.close()


def test_cli_submit_min_max_k(tmp_path, capsys):
    from bandpilot.cli.main import main

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    new_store(tmp_path, "cli.db").close()
    assert main(["queue", "submit", "--id", "e1", "--k", "4", "--min-k", "2", "--max-k", "8", "--store", url]) == 0
    capsys.readouterr()
    assert main(["queue", "submit", "--id", "e2", "--k", "4", "--max-k", "2", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "'max_k' 2 is below k=4" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    s = q.Store(url)
    try:
        r = q.list_requests(s, request_id="e1")[0]
        assert (r["min_k"], r["max_k"]) == (2, 8)
    finally:
        s.close()


# -- 4. generations ---------------------------------------------------------------------------
class _Lowest:
    """Lowest free GPUs first, the emulator as predictor (fast and deterministic)."""

    def __init__(self, spec):
        from types import SimpleNamespace

        from bandpilot.fabric.emulator import make_fabric

        self.fabric = make_fabric(spec)
        self.model = SimpleNamespace(spec=spec, model_version="lowest-1", uri="test:lowest")
        self.spec = spec

    def select(self, k, state, algorithm="bandpilot", *, constraints=None):
        from types import SimpleNamespace

        gpus = state.free_gpus[:k]
        if len(gpus) < k:
            from bandpilot.dispatch.dispatcher import PlacementError

            raise PlacementError("insufficient_gpus", f"{k} > {state.n_free} free")
        return SimpleNamespace(gpus=gpus, predicted_gbps=100.0, standalone_gbps=100.0, algorithm="lowest",
                               search_ms=0.0, evaluations=1)


def _running(tmp_path, reqs):
    s = new_store(tmp_path)
    q.submit(s, reqs)
    run_batch(s, _Lowest(s.spec), SchedulerProfile("test"))
    return s


def test_resize_is_a_new_generation_shown_and_audited(tmp_path):
    s = _running(tmp_path, [{"id": "e1", "k": 4, "min_k": 2, "max_k": 8, "k_step": 2}, {"id": "f1", "k": 2}])
    try:
        a0 = q.assignment(s, "e1")
        assert a0["generation"] == 0 and a0["k"] == 4 and (a0["min_k"], a0["max_k"]) == (2, 8)
        free = q.current_state(s).free_gpus
        grown = a0["gpus"] + free[:4]
        out = resize(s, Resize("e1", tuple(grown), epoch=3))
        assert out[0]["generation"] == 1 and out[0]["k"] == 8
        a1 = q.assignment(s, "e1")
        assert a1["generation"] == 1 and sorted(a1["gpus"]) == sorted(grown) and a1["k"] == 8
        assert q.list_requests(s, request_id="e1")[0]["generation"] == 1
        assert q.check_invariants(s) == []
        resize(s, Resize("e1", tuple(grown[:2]), epoch=4))
        hist = generation_history(s, "e1")
        assert [(h["generation"], h["k"], h["reason"]) for h in hist] == [(1, 8, "grow"), (2, 2, "shrink")]
        assert q.check_invariants(s) == []
        assert len(q.current_state(s).free_gpus) == 32 - 2 - 2
        assert [r["action"] for r in q.audit_log(s, action="resize")] == ["resize", "resize"]
    finally:
        s.close()


def test_bad_resize_changes_nothing(tmp_path):
    s = _running(tmp_path, [{"id": "e1", "k": 4, "min_k": 2, "max_k": 8, "k_step": 2}, {"id": "f1", "k": 2}])
    try:
        before = q.export_state(s)
        mine = q.assignment(s, "e1")["gpus"]
        theirs = q.assignment(s, "f1")["gpus"]
        with pytest.raises(StateError, match="are free"):  # taking another job's GPU
            resize(s, [Resize("e1", tuple(mine + theirs))])
        with pytest.raises(RequestError, match="outside its elastic range 2..8"):
            resize(s, Resize("e1", tuple(mine[:3])))
        with pytest.raises(RequestError, match="outside its elastic range 2..2"):
            resize(s, Resize("f1", tuple(theirs[:1])))
        # two resizes in one transaction: the second fails, the first is rolled back too
        free = q.current_state(s).free_gpus
        with pytest.raises(RequestError, match="'f1'"):
            resize(s, [Resize("e1", tuple(mine + free[:2])), Resize("f1", tuple(theirs + free[2:3]))])
        assert q.export_state(s) == before and q.assignment(s, "e1")["generation"] == 0
        with s.read() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(T_GEN)).scalar_one() == 0
        assert q.check_invariants(s) == []
    finally:
        s.close()


# -- 3. quotas and GPU choice -----------------------------------------------------------------
from bandpilot.scheduling.elastic import Candidate, elastic_quotas, grow_gpus, shrink_gpus  # noqa: E402


def test_quotas_follow_utility_within_ranges():
    c = [Candidate("a", 8, 2, 16, 2, 0.9, True), Candidate("b", 4, 1, 8, 1, 0.3, True),
         Candidate("p", 4, 2, 8, 2, 0.6, False), Candidate("q", 16, 16, 16, 1, 1.0, False)]
    qt = elastic_quotas(c, 20)
    assert set(qt) == {"a", "b", "p"}  # q's 16 GPUs do not fit next to the others' minimum
    assert sum(qt.values()) <= 20 and qt["a"] > qt["p"] > qt["b"]
    assert all(x.lo <= qt[x.id] <= x.hi and (qt[x.id] - x.lo) % x.step == 0 for x in c if x.id in qt)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8), st.sampled_from([1, 2]), st.floats(0, 1), st.booleans()),
                min_size=1, max_size=12), st.integers(0, 64))
def test_fuzz_quotas_respect_budget_and_ranges(rows, g):
    cands = [Candidate(f"j{i}", lo, lo, lo + span * step, step, u, run) for i, (lo, span, step, u, run) in enumerate(rows)]
    if sum(c.lo for c in cands if c.running) > g:
        with pytest.raises(RequestError):
            elastic_quotas(cands, g)
        return
    qt = elastic_quotas(cands, g)
    assert sum(qt.values()) <= g
    assert all(c.id in qt for c in cands if c.running)
    for c in cands:
        if c.id in qt:
            assert c.lo <= qt[c.id] <= c.hi and (qt[c.id] - c.lo) % c.step == 0


def test_growth_prices_the_grown_set_and_blind_does_not():
    from bandpilot.dispatch.state import State
    from bandpilot.fabric.emulator import make_fabric

    spec = load_cluster(H100)
    fab = make_fabric(spec)
    st_ = State.idle(spec)
    # a 2-GPU job on host 0 while host 0's other GPUs are taken by a 1-GPU job each except GPU 7
    host0 = spec.hosts[0].name
    mine = spec.to_mask([f"{host0}:0", f"{host0}:1"])
    st_ = State(spec, st_.free & ~mine, ())
    for i in range(2, 7):
        st_ = st_.with_job(f"o{i}", [f"{host0}:{i}"], 0.0)
    grown, value = grow_gpus(fab, st_, mine, 2)
    got = spec.from_mask(grown)
    # bandwidth-aware: 2+2 across hosts beats the greedy 3+1 (cross-host bandwidth follows the smaller side)
    hosts = {g.rpartition(":")[0] for g in got}
    assert len(got) == 4 and all(sum(g.startswith(h + ":") for g in got) == 2 for h in hosts) and value is not None
    blind, _ = grow_gpus(fab, st_, mine, 2, blind=True)
    assert spec.from_mask(blind) == [f"{host0}:0", f"{host0}:1", f"{host0}:7", f"{spec.hosts[1].name}:0"]
    # shrinking a 4+1 spread job drops the lone GPU on the other host
    spread = spec.to_mask([f"{host0}:0", f"{host0}:1", f"{host0}:7", f"{spec.hosts[1].name}:0"])
    small, _ = shrink_gpus(fab, st_, spread, 1)
    assert spec.from_mask(small) == [f"{host0}:0", f"{host0}:1", f"{host0}:7"]


# -- 2. the runtime model ---------------------------------------------------------------------


def _resize_child(url: str, gpus: list[str], marker: str) -> None:
    def marked() -> None:  # inside the transaction, the old GPUs freed, the new ones not yet taken
        Path(marker).write_text("in")
        time.sleep(60)

    resize(q.Store(url), Resize("e1", tuple(gpus)), between=marked)


@pytest.mark.slow
def test_kill_9_mid_resize_leaves_the_old_generation(tmp_path):
    s = _running(tmp_path, [{"id": "e1", "k": 4, "min_k": 2, "max_k": 8, "k_step": 2}])
    old = q.assignment(s, "e1")["gpus"]
    new = old[:2] + q.current_state(s).free_gpus[:4]  # shrink two away, grow four on: both halves in flight
    s.close()
    ctx = mp.get_context("spawn")
    marker = tmp_path / "in-resize"
    p = ctx.Process(target=_resize_child, args=(f"sqlite:///{tmp_path / 'q.db'}", new, str(marker)))
    p.start()
    deadline = time.time() + 90
    while not marker.exists() and time.time() < deadline and p.is_alive():
        time.sleep(0.1)
    assert marker.exists() and p.is_alive()
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    s = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        a = q.assignment(s, "e1")
        assert a["generation"] == 0 and a["gpus"] == old
        assert q.check_invariants(s) == []
        resize(s, Resize("e1", tuple(new)))  # and the store is usable: the resize goes through now
        assert q.assignment(s, "e1")["generation"] == 1 and q.check_invariants(s) == []
    finally:
        s.close()


def test_growth_that_slows_the_job_is_refused():
    from bandpilot.dispatch.state import State
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling.elastic import _grow_priced, _Round, grow_ratio
    from bandpilot.scheduling.elastic_pricing import PRICERS

    spec = load_cluster(H100)
    fab = make_fabric(spec)
    h0 = spec.hosts[0].name
    mine = spec.to_mask([f"{h0}:{i}" for i in range(8)])
    st_ = State.idle(spec)  # the cluster without the job

    def rnd(f, pricing):
        return _Round(fab, False, "full", {}, {"x": Candidate("x", 8, 1, 16, 1, 1.0, True)}, {"x": f}, PRICERS[pricing], "fit-k")

    for pricing in PRICERS:  # no co-tenants: both pricers agree
        # 8 on one NVSwitch host -> 9 across two hosts (8+1 runs at the 1+1 NIC rate): slower, refused
        assert _grow_priced(rnd(0.5, pricing), st_, "x", mine, 8, 9)[2] == 8
    # a compute-bound job (f = 0.05) gains from 8 -> 16 across two hosts
    grown, value, k = _grow_priced(rnd(0.05, "welfare"), st_, "x", mine, 8, 16)
    assert k == 16 and value is not None and len(spec.from_mask(grown)) == 16
    assert grow_ratio(0.05, 8, 240.0, 16, value) < 0.98 and grow_ratio(0.5, 8, 240.0, 9, 38.0) > 1


def test_api_submits_an_elastic_request_and_shows_its_generation(tmp_path):
    from fastapi.testclient import TestClient

    from bandpilot.api import create_app
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling.elastic import rebalance

    s = new_store(tmp_path)
    try:
        tok, _ = q.create_token(s, "alice")
        h = {"Authorization": f"Bearer {tok}"}
        with TestClient(create_app(s, sample_s=None)) as c:
            r = c.post("/v1/requests", json={"id": "e1", "k": 4, "min_k": 2, "max_k": 16, "k_step": 2}, headers=h)
            assert r.status_code == 201, r.text
            bad = c.post("/v1/requests", json={"id": "e2", "k": 4, "max_k": 2}, headers=h)
            assert bad.status_code == 422 and "'max_k' 2 is below k=4" in bad.json()["error"]
            d = Dispatcher(make_fabric(s.spec))
            rep = rebalance(s, d)  # admitted at its quota: alone in the queue, the whole range is in play
            assert len(rep.admitted) == 1
            shown = c.get("/v1/requests/e1", headers=h).json()
            assert shown["generation"] == 0 and (shown["min_k"], shown["max_k"], shown["k_step"]) == (2, 16, 2)
            sid = next(iter(rep.admitted))
            q.submit(s, [{"id": "p1", "k": 28, "tenant": "bob", "utility": 5.0}])
            rep2 = rebalance(s, d)  # the newcomer's 28-GPU gang fits only if the running job shrinks
            assert rep2.resized and rep2.resized[0]["job"] == sid and "p1" in rep2.admitted
            shown = c.get("/v1/requests/e1", headers=h).json()
            launch = c.get("/v1/requests/e1/launch", headers=h).json()
            assert shown["generation"] == 1 == launch["generation"] and launch["k"] == len(launch["gpus"]) == 4
            assert q.check_invariants(s) == []
    finally:
        s.close()


def test_rebalance_orders_sjf_by_run_time_estimates(tmp_path):
    """The elastic round orders ``sjf`` by the stored run-time estimates, as the batch does (it used to
    pass none, so ``sjf`` admitted first come, first served)."""
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling.elastic import rebalance

    s = new_store(tmp_path)
    try:
        n = s.spec.n_gpus
        q.submit(s, [{"id": "long", "k": n, "min_k": n, "max_k": n, "submitted_at": 1.0},
                     {"id": "short", "k": n, "min_k": n, "max_k": n, "submitted_at": 2.0}])
        q.set_estimates(s, {"long": 36000.0, "short": 600.0})
        rep = rebalance(s, Dispatcher(make_fabric(s.spec)), policy="sjf")
        assert list(rep.admitted) == ["short"] and rep.waiting == ["long"]
    finally:
        s.close()


@pytest.mark.slow
def test_cli_rebalance_resizes_a_live_store(tmp_path, capsys, monkeypatch):
    from bandpilot.cli import queue as cq
    from bandpilot.cli.main import main
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric

    s = new_store(tmp_path, "live.db")
    url = f"sqlite:///{tmp_path / 'live.db'}"
    monkeypatch.setattr(cq, "load_dispatcher", lambda uri: Dispatcher(make_fabric(s.spec)))
    q.submit(s, [{"id": "e1", "k": 4, "min_k": 2, "max_k": 8, "k_step": 2, "utility": 1.0}])
    assert main(["queue", "rebalance", "--store", url]) == 0
    assert "e1: started on" in capsys.readouterr().out
    q.submit(s, [{"id": "g", "k": 28, "utility": 1.0}])
    assert main(["queue", "rebalance", "e1", "--store", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["resized"][0]["job"] == "e1" and doc["resized"][0]["k"] == 4 and "g" in doc["admitted"]
    assert q.assignment(s, "e1")["generation"] == 1 and q.check_invariants(s) == []
    assert main(["queue", "rebalance", "--policy", "nope", "--store", url]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    s.close()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["submit", "rebalance", "release", "report"]), st.integers(0, 10_000)),
                min_size=3, max_size=12))
@pytest.mark.slow
def test_fuzz_rebalance_keeps_invariants(tmp_path_factory, ops):
    """Random submits (fixed and elastic), epoch-boundary rounds, releases and entropy reports:
    the store stays consistent and every job stays within its range."""
    import random

    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling.elastic import rebalance

    s = new_store(tmp_path_factory.mktemp("fz"))
    d = Dispatcher(make_fabric(s.spec))
    n = 0
    try:
        for op, x in ops:
            rnd = random.Random(x)
            running = [r["id"] for r in q.list_requests(s, status="assigned")]
            if op == "submit":
                k = rnd.choice([1, 2, 4, 8, 16])
                lo, hi = max(1, k // rnd.choice([1, 2, 4])), min(32, k * rnd.choice([1, 2]))
                q.submit(s, [{"id": f"j{n}", "k": k, "min_k": lo, "max_k": hi, "utility": rnd.random()}])
                n += 1
            elif op == "rebalance":
                at = [j for j in running if rnd.random() < 0.7]
                rebalance(s, d, at_boundary=at, blind=rnd.random() < 0.3, relocate=rnd.random() < 0.5)
            elif op == "release" and running:
                q.release(s, rnd.choice(running))
            elif op == "report" and running:
                q.report_entropy(s, {"job": rnd.choice(running), "entropy": rnd.random()})
            assert q.check_invariants(s) == []
            for r in q.list_requests(s, status="assigned"):
                assert r.get("min_k", r["k"]) <= len(r["gpus"]) <= r.get("max_k", r["k"])
    finally:
        s.close()
