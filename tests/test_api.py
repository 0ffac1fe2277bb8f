"""Issue 15: the REST API. Per-endpoint isolation (another tenant's request is invisible and
unchangeable; 401 without a valid token; 403 for a tenant on admin calls; nothing changes), bad input
(oversized, malformed, unknown fields, SQL-looking strings, double release), the audit log, the
happy path with a real batch, a hypothesis fuzz of the submit body, and the same on PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.api import create_app
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric

from test_queue import h100, new_store  # pytest puts tests/ on sys.path
from bandpilot.scheduling.profile import SchedulerProfile

# Tables a refused call must leave exactly as they were (the audit log records refusals on purpose).
STATE_TABLES = ("bp_requests", "bp_assignments", "bp_jobs", "bp_gpus", "bp_observations", "bp_tokens")


def snapshot(store: q.Store) -> dict[str, list]:
    with store.read() as conn:
        return {t: sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM {t}")).all()), key=repr) for t in STATE_TABLES}


class World:
    """A store with a cluster, three tokens, and alice's requests: one pending, one assigned, one released."""

    def __init__(self, store: q.Store) -> None:
        self.store = store
        self.admin, _ = q.create_token(store, "ops", admin=True)
        self.alice, _ = q.create_token(store, "alice")
        self.bob, _ = q.create_token(store, "bob")
        self.gone, _ = q.create_token(store, "carol")
        q.revoke(store, tenant="carol")  # a deleted tenant
        q.submit(store, [{"id": "a-run", "k": 4, "tenant": "alice"}, {"id": "a-done", "k": 2, "tenant": "alice"},
                         {"id": "b-run", "k": 2, "tenant": "bob"}])
        sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", queue_sort="fifo"))
        q.release(store, "a-done")
        q.submit(store, [{"id": "a-wait", "k": 30, "tenant": "alice"}])  # never fits: stays pending
        self.client = TestClient(create_app(store, sample_s=None))

    def h(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
def world(tmp_path):
    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    w = World(store)
    with w.client:
        yield w
    store.close()


# (method, path, json body) of every endpoint that acts on one request; {rid} is alice's
REQUEST_CALLS = [
    ("GET", "/v1/requests/{rid}", None),
    ("GET", "/v1/requests/{rid}/launch?format=slurm", None),
    ("POST", "/v1/requests/{rid}/cancel", None),
    ("POST", "/v1/requests/{rid}/release", {"measured_gbps": 1.0}),
    ("POST", "/v1/requests/{rid}/telemetry", {"measured_gbps": 1.0}),
    ("POST", "/v1/requests/{rid}/entropy", {"entropy": 0.5}),
]
ADMIN_CALLS = [
    ("POST", "/v1/cluster/drain", {"target": "h100-0"}),
    ("POST", "/v1/cluster/undrain", {"target": "h100-0"}),
    ("GET", "/v1/tokens", None),
    ("POST", "/v1/tokens", {"tenant": "mallory", "admin": True}),
    ("DELETE", "/v1/tokens/{tid}", None),
    ("DELETE", "/v1/tenants/alice", None),
    ("GET", "/v1/audit", None),
]
TENANT_CALLS = [
    ("POST", "/v1/requests", {"k": 1}),
    ("GET", "/v1/requests", None),
    ("GET", "/v1/cluster", None),
    ("GET", "/v1/cluster/fragmentation", None),
    ("GET", "/v1/cluster/batches", None),
    ("GET", "/v1/whoami", None),
]


def _call(w: World, method: str, path: str, body, token):
    tid = q.list_tokens(w.store, "alice")[0]["id"]
    return w.client.request(method, path.format(rid="a-run", tid=tid), json=body, headers=w.h(token))


@pytest.mark.slow
@pytest.mark.parametrize("rid", ["a-run", "a-done", "a-wait"])
@pytest.mark.parametrize("method, path, body", REQUEST_CALLS)
def test_a_tenant_never_reads_or_changes_another_tenants_request(world, method, path, body, rid):
    before = snapshot(world.store)
    r = world.client.request(method, path.format(rid=rid), json=body, headers=world.h(world.bob))
    assert r.status_code == 404 and r.json() == {"error": f"no request {rid!r}", "status": 404}
    assert snapshot(world.store) == before
    # ... and a made-up id looks exactly the same (nothing tells bob alice's ids exist)
    r2 = world.client.request(method, path.format(rid="nope"), json=body, headers=world.h(world.bob))
    assert r2.status_code == 404 and r2.json()["error"] == "no request 'nope'"


def test_lists_and_views_show_only_the_tenants_own_jobs(world):
    c, h = world.client, world.h
    assert {r["id"] for r in c.get("/v1/requests", headers=h(world.bob)).json()["requests"]} == {"b-run"}
    assert c.get("/v1/requests?tenant=alice", headers=h(world.bob)).status_code == 403
    assert {r["id"] for r in c.get("/v1/requests", headers=h(world.admin)).json()["requests"]} == {"a-run", "a-done", "b-run", "a-wait"}
    grid = c.get("/v1/cluster", headers=h(world.bob)).json()
    jobs = {g["job"] for g in grid["gpus"] if g["state"] == "busy"}
    assert jobs == {"b-run", None} and set(grid["status"]["tenants"]) == {"bob"}
    batches = c.get("/v1/cluster/batches", headers=h(world.bob)).json()["batches"]
    seen = {a["id"] for b in batches for a in b["assignments"]}
    assert seen == {"b-run", None}
    assert "a-run" not in json.dumps(grid) + json.dumps(batches)


@pytest.mark.slow
@pytest.mark.parametrize("method, path, body", REQUEST_CALLS + ADMIN_CALLS + TENANT_CALLS)
@pytest.mark.parametrize("who", ["none", "malformed", "wrong-secret", "deleted-tenant", "basic-scheme"])
def test_no_valid_token_is_401_and_changes_nothing(world, method, path, body, who):
    tok = {"none": None, "malformed": "hello", "wrong-secret": world.alice[:-4] + "AAAA", "deleted-tenant": world.gone,
           "basic-scheme": None}[who]
    before = snapshot(world.store)
    headers = world.h(tok) if who != "basic-scheme" else {"Authorization": "Basic YWxpY2U6cHc="}
    tid = q.list_tokens(world.store, "alice")[0]["id"]
    r = world.client.request(method, path.format(rid="a-run", tid=tid), json=body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer" and r.json()["status"] == 401
    assert snapshot(world.store) == before


@pytest.mark.slow
@pytest.mark.parametrize("method, path, body", ADMIN_CALLS)
def test_a_tenant_on_an_admin_call_is_403_and_changes_nothing(world, method, path, body):
    before = snapshot(world.store)
    r = _call(world, method, path, body, world.alice)
    assert r.status_code == 403 and "needs an admin token" in r.json()["error"]
    assert snapshot(world.store) == before
    if method != "GET":  # the refused change is in the audit log
        last = q.audit_log(world.store, limit=1)[0]
        assert last["outcome"] == "denied" and last["actor"].startswith("alice (token ")


def test_admin_calls_work_and_every_change_is_audited(world):
    c, h = world.client, world.h
    r = c.post("/v1/cluster/drain", json={"target": "h100-3", "reason": "fan"}, headers=h(world.admin))
    assert r.status_code == 200 and len(r.json()["drained"]) + len(r.json()["pending"]) == 8
    assert c.post("/v1/cluster/undrain", json={"target": "h100-3"}, headers=h(world.admin)).status_code == 200
    new = c.post("/v1/tokens", json={"tenant": "dave"}, headers=h(world.admin)).json()
    assert c.get("/v1/whoami", headers=h(new["token"])).json() == {"tenant": "dave", "admin": False, "token": new["id"]}
    assert c.delete(f"/v1/tokens/{new['id']}", headers=h(world.admin)).json() == {"revoked": [new["id"]]}
    assert c.get("/v1/whoami", headers=h(new["token"])).status_code == 401  # revoked at once
    assert c.delete("/v1/tenants/bob", headers=h(world.admin)).status_code == 200
    assert c.get("/v1/requests", headers=h(world.bob)).status_code == 401  # deleted tenant
    listed = c.get("/v1/tokens", headers=h(world.admin)).json()["tokens"]
    assert {t["tenant"] for t in listed} == {"ops", "alice"} and all("secret" not in json.dumps(t) for t in listed)
    log = c.get("/v1/audit", headers=h(world.admin)).json()["audit"]
    assert [e["action"] for e in log[:5]] == ["tenant.delete", "token.revoke", "token.create", "undrain", "drain"]
    assert all(e["outcome"] == "ok" for e in log[:5]) and json.loads(log[4]["detail"]) == {"reason": "fan"}
    assert all(e["actor"].startswith("ops (token ") for e in log)
    # a store never holds a token in the clear
    with world.store.read() as conn:
        dump = json.dumps([list(map(str, r)) for r in conn.execute(sa.text("SELECT * FROM bp_tokens")).all()])
    assert world.alice.split("_", 2)[2] not in dump and new["token"] not in dump


def test_tenant_lifecycle_submit_batch_launch_telemetry_release(world):
    c, h, a = world.client, world.h, world.alice
    r = c.post("/v1/requests", json={"id": "a-new", "k": 2, "priority": 3}, headers=h(a))
    assert r.status_code == 201 and r.json()["tenant"] == "alice" and r.json()["status"] == "pending"
    assert c.post("/v1/requests", json={"k": 1, "tenant": "bob"}, headers=h(a)).status_code == 403
    assert c.post("/v1/requests", json={"id": "b-by-ops", "k": 1, "tenant": "bob"}, headers=h(world.admin)).json()["tenant"] == "bob"
    sched.run_batch(world.store, Dispatcher(make_fabric(world.store.spec)), SchedulerProfile("test", queue_sort="priority"))
    shown = c.get("/v1/requests/a-new", headers=h(a)).json()
    assert shown["status"] == "assigned" and len(shown["gpus"]) == 2 and shown["predicted_gbps"] > 0
    slurm = c.get("/v1/requests/a-new/launch?format=slurm", headers=h(a))
    assert slurm.status_code == 200 and slurm.text.startswith("#!/bin/bash\n")
    assert "--nodelist=" in slurm.text and "CUDA_VISIBLE_DEVICES" in slurm.text
    assert c.get("/v1/requests/a-new/launch?format=xml", headers=h(a)).status_code == 422
    assert c.post("/v1/requests/a-new/telemetry", json={"measured_gbps": 150.0}, headers=h(a)).json() == {"job": "a-new", "recorded": 1}
    rel = c.post("/v1/requests/a-new/release", json={"measured_gbps": 151.0}, headers=h(a))
    assert rel.status_code == 200 and rel.json()["request"]["status"] == "released" and len(rel.json()["freed"]) == 2
    before = snapshot(world.store)
    again = c.post("/v1/requests/a-new/release", headers=h(a))
    assert again.status_code == 409 and again.json()["error"] == "job 'a-new' was already released"
    assert c.post("/v1/requests/a-new/telemetry", json={"measured_gbps": 1.0}, headers=h(a)).status_code == 409
    assert snapshot(world.store) == before
    assert c.post("/v1/requests/a-wait/entropy", json={"entropy": 0.8}, headers=h(a)).status_code == 200
    ent = c.post("/v1/requests/a-wait/entropy", json={"entropy": 0.6}, headers=h(a)).json()
    assert ent["job"] == "a-wait" and ent["utility"] == pytest.approx(q.entropy_utility(0.6, 0.8))
    assert c.get("/v1/requests/a-wait", headers=h(a)).json()["utility"] == pytest.approx(ent["utility"])
    assert c.post("/v1/requests/a-wait/entropy", json={"entropy": 1.5}, headers=h(a)).status_code == 422
    assert c.post("/v1/requests/a-new/entropy", json={"entropy": 0.5}, headers=h(a)).status_code == 422  # finished job
    assert c.post("/v1/requests/a-wait/cancel", headers=h(a)).json()["status"] == "cancelled"
    log = q.audit_log(world.store, actor=f"alice (token {q.list_tokens(world.store, 'alice')[0]['id']})")
    # the audit log names requests by their stored id: alice's API ids are hers ("alice:a-new"); a-wait
    # was queued through the library with a plain id
    assert [(e["action"], e["target"], e["outcome"]) for e in reversed(log)] == [
        ("submit", "alice:a-new", "ok"), ("submit", None, "denied"), ("telemetry", "alice:a-new", "ok"),
        ("release", "alice:a-new", "ok"), ("release", "alice:a-new", "error"), ("telemetry", "alice:a-new", "error"),
        ("entropy", "a-wait", "ok"), ("entropy", "a-wait", "ok"), ("entropy", "alice:a-new", "error"),
        ("cancel", "a-wait", "ok")]


@pytest.mark.parametrize("body, status, message", [
    (b"{\"k\": 2", 400, "malformed JSON body"),
    (b"[1, 2]", 422, "body:"),
    (json.dumps({"k": 2, "gpus": 3}).encode(), 422, "unknown field 'gpus'"),
    (json.dumps({"k": 0}).encode(), 422, "k:"),
    (json.dumps({"k": "two"}).encode(), 422, "k:"),
    (json.dumps({"k": 2, "id": "x'; DROP TABLE bp_requests; --"}).encode(), 422, "id: String should match pattern"),
    (json.dumps({"k": 2, "constraints": {"hosts": ["h100-0'; --"]}}).encode(), 422, ""),
    (json.dumps({"k": 999}).encode(), 422, "999"),
    (json.dumps({"k": 2, "id": "a-run"}).encode(), 409, "already exists"),
    (b"x" * 70_000, 413, "request body over 65536 bytes"),
])
@pytest.mark.slow
def test_bad_submit_bodies_get_a_json_4xx_and_store_nothing(world, body, status, message):
    before = snapshot(world.store)
    r = world.client.post("/v1/requests", content=body, headers={**world.h(world.alice), "content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"error", "status"} and err["status"] == status and message in err["error"] and "\n" not in err["error"]
    assert snapshot(world.store) == before


def test_sql_looking_strings_are_data_not_sql(world):
    evil = "h100-0'; DELETE FROM bp_gpus; --"
    r = world.client.post("/v1/cluster/drain", json={"target": evil}, headers=world.h(world.admin))
    assert r.status_code == 404 and "unknown GPU, host or domain" in r.json()["error"]
    r = world.client.post("/v1/tokens", json={"tenant": "x'); DROP TABLE bp_tokens; --"}, headers=world.h(world.admin))
    assert r.status_code == 422 and "invalid tenant name" in r.json()["error"]
    r = world.client.post("/v1/cluster/drain", json={"target": "h100-1", "reason": "'); DROP TABLE bp_gpus; --"},
                          headers=world.h(world.admin))
    assert r.status_code == 200
    grid = world.client.get("/v1/cluster", headers=world.h(world.admin)).json()["gpus"]
    assert len(grid) == 32 and {g["note"] for g in grid if g["host"] == "h100-1"} == {"'); DROP TABLE bp_gpus; --"}


def test_openapi_docs_list_every_endpoint(world):
    paths = world.client.get("/openapi.json").json()["paths"]
    for route in ("/v1/requests", "/v1/requests/{rid}", "/v1/requests/{rid}/release", "/v1/requests/{rid}/telemetry",
                  "/v1/cluster", "/v1/cluster/drain", "/v1/cluster/fragmentation", "/v1/tokens", "/v1/audit"):
        assert route in paths
    assert world.client.get("/docs").status_code == 200 and {"ok": True, "cluster": "h100"}.items() <= world.client.get("/healthz").json().items()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(["id", "k", "priority", "utility", "constraints", "tenant", "extra"]),
                            st.one_of(st.none(), st.integers(-5, 100), st.floats(allow_nan=True), st.text(max_size=30),
                                      st.dictionaries(st.text(max_size=8), st.integers(), max_size=2)), max_size=6))
def test_fuzzed_submit_bodies_never_crash_the_server(world, body):
    before = snapshot(world.store)
    r = world.client.post("/v1/requests", content=json.dumps(body, allow_nan=True), headers={
        **world.h(world.alice), "content-type": "application/json"})
    assert r.status_code in (201, 400, 403, 409, 422), r.text
    if r.status_code == 201:
        assert r.json()["tenant"] == "alice"
        world.client.post(f"/v1/requests/{r.json()['id']}/cancel", headers=world.h(world.alice))
    else:
        assert snapshot(world.store) == before and r.json()["status"] == r.status_code


@pytest.mark.slow
@pytest.mark.postgres
def test_isolation_and_audit_on_postgresql():
    from test_queue_pg import _pg_url

    url = _pg_url()
    if url is None:
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432")
    schema = f"bpapi_{uuid.uuid4().hex[:10]}"
    store = new_store(url, h100(), schema=schema)
    try:
        w = World(store)
        with w.client:
            before = snapshot(store)
            for method, path, body in REQUEST_CALLS:
                assert w.client.request(method, path.format(rid="a-run"), json=body, headers=w.h(w.bob)).status_code == 404
            for method, path, body in ADMIN_CALLS:
                assert _call(w, method, path, body, w.alice).status_code == 403
            assert snapshot(store) == before
            assert w.client.post("/v1/requests/a-run/release", headers=w.h(w.alice)).status_code == 200
            assert q.audit_log(store, limit=1)[0]["action"] == "release"
    finally:
        store.close()
        eng = sa.create_engine(url)
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        eng.dispose()


def test_a_revocation_made_elsewhere_takes_effect_within_the_token_ttl(tmp_path):
    import time

    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    tok, rec = q.create_token(store, "alice")
    with TestClient(create_app(store, sample_s=None, token_ttl=0.5)) as c:
        h = {"Authorization": f"Bearer {tok}"}
        assert c.get("/v1/whoami", headers=h).status_code == 200
        q.revoke(store, token_id=rec["id"])  # e.g. `bandpilot tokens revoke` on another machine
        t0 = time.monotonic()
        while c.get("/v1/whoami", headers=h).status_code == 200:
            assert time.monotonic() - t0 < 0.5 + 1.0, "revoked token still accepted after the ttl"
            time.sleep(0.05)
    with TestClient(create_app(store, sample_s=None, token_ttl=0)) as c:  # ttl 0: every request looks it up
        t2, r2 = q.create_token(store, "bob")
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {t2}"}).status_code == 200
        q.revoke(store, tenant="bob")
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {t2}"}).status_code == 401
    store.close()


def test_submit_with_shape_launch_carries_rank_map(world):
    c, h, a = world.client, world.h, world.alice
    r = c.post("/v1/requests", json={"id": "mp", "k": 8, "shape": "tp=4,dp=2"}, headers=h(a))
    assert r.status_code == 201, r.text
    assert c.post("/v1/requests", json={"id": "mp2", "k": 8, "shape": {"tp": 3}}, headers=h(a)).status_code in (400, 422)
    assert c.post("/v1/requests", json={"id": "mp3", "k": 8, "shape": 5}, headers=h(a)).status_code == 422
    sched.run_batch(world.store, Dispatcher(make_fabric(world.store.spec)), SchedulerProfile("test"))
    doc = c.get("/v1/requests/mp/launch?format=json", headers=h(a)).json()
    assert len(doc["ranks"]) == 8 and doc["shape"]["tp"] == 4 and set(doc["axis_gbps"]) == {"tp", "dp"}
    tr = c.get("/v1/requests/mp/launch?format=torchrun", headers=h(a))
    assert tr.status_code == 200 and "--node-rank=0" in tr.text
