"""Issue 25: the API against a hostile tenant, on SQLite and PostgreSQL. Control characters and NUL
anywhere (ids, path ids, query filters, names, drain targets) are a 422 at the boundary, never a 500;
integers are range-checked before the database; types are strict; another tenant's request id answers
exactly like a fresh one; every id a tenant can submit can be read and cancelled; per-tenant limits
(429 + Retry-After, admins exempt); repeated bad tokens are slowed down; denied calls are coalesced
in the audit log; the store URL is for admins; security headers; a fuzz over every endpoint."""

from __future__ import annotations

import json
import urllib.parse
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot.api import create_app
from bandpilot.queue.schema import T_AUDIT

from test_api import World, snapshot  # pytest puts tests/ on sys.path
from test_queue import h100, new_store


def _pg_or_skip() -> str:
    from test_queue_pg import _pg_url

    url = _pg_url()
    if url is None:
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432 (database 'test')")
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def world(request, tmp_path):
    schema = None
    if request.param == "sqlite":
        store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    else:
        url = _pg_or_skip()
        schema = f"bpapi_{uuid.uuid4().hex[:10]}"
        store = new_store(url, h100(), schema=schema)
    w = World(store)
    w.backend = request.param
    try:
        with w.client:
            yield w
    finally:
        store.close()
        if schema:
            eng = sa.create_engine(url)
            with eng.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            eng.dispose()


def _is_json_error(r, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()
    assert set(err) == {"error", "status"} and err["status"] == status and "\n" not in err["error"]
    return err


# -- control characters and NUL ------------------------------------------------------------------
CONTROL = ["\x00", "\x1b", "\x7f", "\n"]


def _control_calls(c: str):
    e = urllib.parse.quote(f"a{c}b", safe="")
    return [
        ("alice", "POST", "/v1/requests", {"id": f"a{c}b", "k": 1}),
        ("alice", "GET", f"/v1/requests/{e}", None),
        ("alice", "GET", f"/v1/requests/{e}/launch", None),
        ("alice", "POST", f"/v1/requests/{e}/cancel", None),
        ("alice", "POST", f"/v1/requests/{e}/release", None),
        ("alice", "POST", f"/v1/requests/{e}/telemetry", {"measured_gbps": 1.0}),
        ("alice", "POST", f"/v1/requests/{e}/entropy", {"entropy": 0.5}),
        ("alice", "GET", f"/v1/requests?status={e}", None),
        ("admin", "GET", f"/v1/requests?tenant={e}", None),
        ("admin", "GET", f"/v1/audit?actor={e}", None),
        ("admin", "GET", f"/v1/audit?action={e}", None),
        ("admin", "GET", f"/v1/tokens?tenant={e}", None),
        ("admin", "DELETE", f"/v1/tokens/{e}", None),
        ("admin", "DELETE", f"/v1/tenants/{e}", None),
        ("admin", "POST", "/v1/tokens", {"tenant": f"a{c}b"}),
        ("admin", "POST", "/v1/tokens", {"tenant": "dave", "name": f"a{c}b"}),
        ("admin", "POST", "/v1/cluster/drain", {"target": f"h100-0{c}"}),
        ("admin", "POST", "/v1/cluster/drain", {"target": "h100-0", "reason": f"fan{c}"}),
        ("admin", "POST", "/v1/cluster/undrain", {"target": f"h100-0{c}"}),
        ("admin", "POST", "/v1/requests", {"k": 1, "tenant": f"a{c}b"}),
        ("alice", "POST", "/v1/requests", {"k": 1, "constraints": {"allowed_hosts": [f"h100-0{c}"]}}),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("c", CONTROL, ids=["nul", "esc", "del", "newline"])
def test_control_characters_anywhere_are_a_422_and_change_nothing(world, c):
    before = snapshot(world.store)
    for who, method, path, body in _control_calls(c):
        tok = world.admin if who == "admin" else world.alice
        r = world.client.request(method, path, json=body, headers=world.h(tok))
        err = _is_json_error(r, 422)
        assert "control character" in err["error"], (method, path, body, err)
    assert snapshot(world.store) == before


# -- integers and strict types -------------------------------------------------------------------
@pytest.mark.parametrize("path, body", [
    ("/v1/requests/a-wait/entropy", {"entropy": 0.5, "epoch": 10**20}),
    ("/v1/requests/a-wait/entropy", {"entropy": 0.5, "epoch": 2**63}),
    ("/v1/requests/a-wait/entropy", {"entropy": 0.5, "epoch": 2**31}),
    ("/v1/requests/a-wait/entropy", {"entropy": 0.5, "epoch": -1}),
    ("/v1/requests", {"k": 2**63}),
    ("/v1/requests", {"k": 2**31}),
    ("/v1/requests", {"k": 1, "priority": 2**31}),
    ("/v1/requests", {"k": 1, "priority": -(2**63)}),
    ("/v1/requests", {"k": 1, "utility": 1e308 * 10}),
    ("/v1/requests/a-run/telemetry", {"measured_gbps": 1e300}),
])
@pytest.mark.slow
def test_integers_and_numbers_are_range_checked_before_the_database(world, path, body):
    before = snapshot(world.store)
    r = world.client.post(path, content=json.dumps(body), headers={**world.h(world.alice), "content-type": "application/json"})
    _is_json_error(r, 422)
    assert snapshot(world.store) == before


@pytest.mark.parametrize("who, path, body", [
    ("alice", "/v1/requests", {"k": "4"}),
    ("alice", "/v1/requests", {"k": True}),
    ("alice", "/v1/requests", {"k": 4.0}),
    ("alice", "/v1/requests", {"k": 1, "priority": "1"}),
    ("alice", "/v1/requests", {"k": 1, "id": ""}),
    ("alice", "/v1/requests", {"k": 1, "id": 7}),
    ("alice", "/v1/requests", {"k": 1, "utility": "0.5"}),
    ("alice", "/v1/requests", {"k": 1, "constraints": "single_host"}),
    ("alice", "/v1/requests/a-run/telemetry", {"measured_gbps": "1.5"}),
    ("alice", "/v1/requests/a-wait/entropy", {"entropy": "0.5"}),
    ("alice", "/v1/requests/a-wait/entropy", {"entropy": True}),
    ("alice", "/v1/requests/a-wait/entropy", {"entropy": 0.5, "epoch": "3"}),
    ("admin", "/v1/tokens", {"tenant": "dave", "admin": "yes"}),
    ("admin", "/v1/tokens", {"tenant": "dave", "admin": 1}),
    ("admin", "/v1/tokens", {"tenant": 5}),
    ("admin", "/v1/cluster/drain", {"target": 5}),
])
@pytest.mark.slow
def test_types_are_strict(world, who, path, body):
    before = snapshot(world.store)
    tok = world.admin if who == "admin" else world.alice
    r = world.client.post(path, json=body, headers=world.h(tok))
    _is_json_error(r, 422)
    assert snapshot(world.store) == before


@pytest.mark.slow
def test_floats_still_accept_json_integers(world):
    r = world.client.post("/v1/requests/a-run/telemetry", json={"measured_gbps": 150}, headers=world.h(world.alice))
    assert r.status_code == 200, r.text


# -- the existence oracle, and ids a tenant can reach ----------------------------------------------
@pytest.mark.slow
def test_another_tenants_id_answers_exactly_like_a_fresh_one(world):
    c, h = world.client, world.h
    taken = c.post("/v1/requests", json={"id": "a-wait", "k": 2}, headers=h(world.bob))
    fresh = c.post("/v1/requests", json={"id": "b-fresh", "k": 2}, headers=h(world.bob))
    assert taken.status_code == fresh.status_code == 201
    strip = lambda d: {k: v for k, v in d.items() if k not in ("id", "submitted")}  # noqa: E731
    assert taken.json()["id"] == "a-wait" and fresh.json()["id"] == "b-fresh"
    assert strip(taken.json()) == strip(fresh.json()) and taken.json()["tenant"] == "bob"
    # each tenant sees and acts on its own request of that name
    assert c.get("/v1/requests/a-wait", headers=h(world.bob)).json()["k"] == 2
    assert c.get("/v1/requests/a-wait", headers=h(world.alice)).json()["k"] == 30
    assert c.post("/v1/requests/a-wait/cancel", headers=h(world.bob)).json()["status"] == "cancelled"
    assert c.get("/v1/requests/a-wait", headers=h(world.alice)).json()["status"] == "pending"
    assert {r["id"] for r in c.get("/v1/requests", headers=h(world.bob)).json()["requests"]} == {"b-run", "a-wait", "b-fresh"}
    # a tenant's own id, old or new, is still a conflict
    _is_json_error(c.post("/v1/requests", json={"id": "b-fresh", "k": 1}, headers=h(world.bob)), 409)
    _is_json_error(c.post("/v1/requests", json={"id": "a-run", "k": 1}, headers=h(world.alice)), 409)
    _is_json_error(c.post("/v1/requests", json={"id": "a-wait", "k": 1}, headers=h(world.bob)), 409)


@pytest.mark.slow
def test_ids_with_a_slash_are_refused_at_submit(world):
    before = snapshot(world.store)
    err = _is_json_error(world.client.post("/v1/requests", json={"id": "x/y", "k": 1}, headers=world.h(world.alice)), 422)
    assert "id" in err["error"]
    assert snapshot(world.store) == before


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rid=st.text(min_size=1, max_size=40))
@example(rid="x/y")
@example(rid="a:b@c+d.e-f_g")
@example(rid="%2F")
def test_every_id_a_tenant_can_submit_it_can_read_and_cancel(world, rid):
    if world.backend != "sqlite":
        pytest.skip("SQLite covers the routing; PostgreSQL the storage in the tests above")
    h = world.h(world.alice)
    r = world.client.post("/v1/requests", json={"id": rid, "k": 1}, headers=h)
    assert r.status_code in (201, 409, 422), r.text
    if r.status_code == 201:
        path = "/v1/requests/" + urllib.parse.quote(rid, safe="")
        got = world.client.get(path, headers=h)
        assert got.status_code == 200 and got.json()["id"] == rid, got.text
        assert world.client.post(path + "/cancel", headers=h).json()["status"] == "cancelled"


# -- limits ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_per_tenant_limits_are_429_with_retry_after_and_admins_are_exempt(world):
    with TestClient(create_app(world.store, sample_s=None, max_pending=3, max_pending_gpus=10)) as c:
        h = world.h
        # alice already has one pending request (a-wait, 30 GPUs): over the GPU limit at once
        r = c.post("/v1/requests", json={"k": 1}, headers=h(world.alice))
        err = _is_json_error(r, 429)
        assert int(r.headers["retry-after"]) > 0 and "pending GPUs" in err["error"]
        before = snapshot(world.store)
        for i in range(3):
            assert c.post("/v1/requests", json={"id": f"b{i}", "k": 2}, headers=h(world.bob)).status_code == 201
        r = c.post("/v1/requests", json={"id": "b3", "k": 1}, headers=h(world.bob))
        assert "pending requests" in _is_json_error(r, 429)["error"] and "retry-after" in r.headers
        assert c.post("/v1/requests", json={"id": "b4", "k": 5}, headers=h(world.bob)).status_code == 429
        # a cancelled request frees the slot
        assert c.post("/v1/requests/b0/cancel", headers=h(world.bob)).status_code == 200
        assert c.post("/v1/requests", json={"id": "b5", "k": 1}, headers=h(world.bob)).status_code == 201
        # admins are exempt, also when they submit for a tenant at its limit
        assert c.post("/v1/requests", json={"id": "ops1", "k": 20, "tenant": "bob"}, headers=h(world.admin)).status_code == 201
        with world.store.read() as conn:
            n = conn.execute(sa.select(sa.func.count()).select_from(q.T_REQ)).scalar()
        assert n == len(before["bp_requests"]) + 5


@pytest.mark.slow
def test_repeated_bad_tokens_are_slowed_down_per_client_and_memory_is_bounded(world):
    from bandpilot.api.auth import FailedAuth

    with TestClient(create_app(world.store, sample_s=None, auth_failures=5, auth_window_s=60)) as c:
        bad = {"Authorization": "Bearer bp_aaaaaaaaaa_" + "A" * 43}
        codes = [c.get("/v1/whoami", headers=bad).status_code for _ in range(12)]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
        r = c.get("/v1/whoami", headers=bad)
        assert int(r.headers["retry-after"]) >= 1 and r.json()["status"] == 429
        # a valid token from the same client is not locked out
        assert c.get("/v1/whoami", headers=world.h(world.alice)).status_code == 200
    limiter = FailedAuth(limit=3, window_s=60, max_clients=100)
    for i in range(5000):
        limiter.failed(f"10.0.{i // 250}.{i % 250}")
    assert len(limiter) <= 100


@pytest.mark.slow
def test_denied_calls_are_coalesced_in_the_audit_log(world):
    with world.store.read() as conn:
        n0 = conn.execute(sa.select(sa.func.count()).select_from(T_AUDIT)).scalar()
    for _ in range(100):
        assert world.client.post("/v1/cluster/drain", json={"target": "h100-0"}, headers=world.h(world.alice)).status_code == 403
    with world.store.read() as conn:
        rows = conn.execute(sa.select(T_AUDIT).order_by(T_AUDIT.c.id)).mappings().all()
    assert len(rows) - n0 <= 2
    last = rows[-1]
    assert last["outcome"] == "denied" and json.loads(last["detail"])["count"] == 100


# -- leaks and headers ----------------------------------------------------------------------------
@pytest.mark.slow
def test_the_store_url_is_shown_to_admins_only(world):
    mine = world.client.get("/v1/cluster", headers=world.h(world.alice)).json()
    assert "store" not in mine["status"] and world.store.safe_url not in json.dumps(mine)
    ops = world.client.get("/v1/cluster", headers=world.h(world.admin)).json()
    assert ops["status"]["store"] == world.store.safe_url


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/", "/v1/whoami", "/v1/requests/nope", "/healthz"])
def test_security_headers_on_dashboard_and_api(world, path):
    r = world.client.get(path, headers=world.h(world.alice))
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    csp = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    if path == "/":
        assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]


# -- a fuzz over every endpoint -------------------------------------------------------------------
_ENDPOINTS = [
    ("POST", "/v1/requests"), ("GET", "/v1/requests"), ("GET", "/v1/requests/{x}"), ("GET", "/v1/requests/{x}/launch"),
    ("POST", "/v1/requests/{x}/cancel"), ("POST", "/v1/requests/{x}/release"), ("POST", "/v1/requests/{x}/telemetry"),
    ("POST", "/v1/requests/{x}/entropy"), ("GET", "/v1/cluster"), ("GET", "/v1/cluster/fragmentation"),
    ("GET", "/v1/cluster/batches"), ("POST", "/v1/cluster/drain"), ("POST", "/v1/cluster/undrain"),
    ("GET", "/v1/whoami"), ("GET", "/v1/tokens"), ("POST", "/v1/tokens"), ("DELETE", "/v1/tokens/{x}"),
    ("DELETE", "/v1/tenants/{x}"), ("GET", "/v1/audit"), ("GET", "/healthz"), ("GET", "/{x}"),
]
_KEYS = ["id", "k", "priority", "utility", "constraints", "tenant", "measured_gbps", "entropy", "epoch", "target",
         "reason", "admin", "name", "time_limit_s", "comm_fraction", "preemptible", "checkpoint_s",
         "checkpoint_every_s", "x"]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
                    st.lists(st.text(max_size=6), max_size=3),
                    st.dictionaries(st.sampled_from(["single_host", "allowed_hosts", "segment", "min_gbps", "q"]),
                                    st.one_of(st.booleans(), st.integers(), st.text(max_size=8),
                                              st.lists(st.text(max_size=8), max_size=2)), max_size=3))
_QUERY = st.dictionaries(st.sampled_from(["status", "tenant", "limit", "actor", "action", "format", "since",
                                          "include_revoked"]), st.text(max_size=12), max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ep=st.sampled_from(_ENDPOINTS), x=st.text(min_size=1, max_size=30), who=st.sampled_from(["alice", "admin"]),
       body=st.one_of(st.none(), st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5)), query=_QUERY)
@pytest.mark.slow
def test_fuzzed_calls_on_every_endpoint_never_get_a_5xx(world, ep, x, who, body, query):
    method, path = ep
    if world.backend != "sqlite" and x and ord(x[0]) % 3:  # PostgreSQL: a third of the examples (speed)
        return
    url = path.format(x=urllib.parse.quote(x, safe=""))
    if body is not None and "tenant" in (body or {}) and method == "DELETE":
        body = None
    r = world.client.request(method, url, params=query, content=None if body is None else json.dumps(body, allow_nan=True),
                             headers={**world.h(world.admin if who == "admin" else world.alice),
                                      "content-type": "application/json"})
    assert r.status_code < 500, (method, url, query, body, r.status_code, r.text)
    if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
        assert r.json()["status"] == r.status_code


def test_a_store_from_before_per_tenant_ids_opens_and_its_requests_stay_reachable(tmp_path, monkeypatch):
    from bandpilot.queue import schema as q_schema

    url = f"sqlite:///{tmp_path / 'old.db'}"
    monkeypatch.setattr(q_schema, "MIGRATIONS", [m for m in q_schema.MIGRATIONS if m[0] != 7])
    old = new_store(url, h100())
    q.submit(old, [{"id": "legacy-1", "k": 2, "tenant": "alice"}])  # as the API stored ids before
    tok, _ = q.create_token(old, "alice")
    old.close()
    monkeypatch.undo()
    store = q.Store(url)
    with store.read() as conn:
        assert "ix_bp_requests_tenant_status" in {ix["name"] for ix in sa.inspect(conn).get_indexes("bp_requests")}
        assert store.current_version(conn) == q_schema.schema_version()
    with TestClient(create_app(store, sample_s=None)) as c:
        h = {"Authorization": f"Bearer {tok}"}
        assert c.get("/v1/requests/legacy-1", headers=h).json()["id"] == "legacy-1"
        _is_json_error(c.post("/v1/requests", json={"id": "legacy-1", "k": 1}, headers=h), 409)
        assert c.post("/v1/requests/legacy-1/cancel", headers=h).json()["status"] == "cancelled"
    store.close()


@pytest.mark.parametrize("raw, status", [
    (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /v1/whoami?" + b"q=" * 60_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
    (b"GET /" + b"a" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
])
def test_what_the_http_parser_refuses_still_gets_the_json_error_shape(tmp_path, raw, status):
    import socket
    import threading
    import time

    import uvicorn

    from bandpilot.api.server import PROTOCOL

    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(store, sample_s=None), host="127.0.0.1", port=port,
                                           log_level="error", http=PROTOCOL))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(raw)
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        assert b"content-type: application/json" in head.lower() and b"nosniff" in head
        assert json.loads(body)["status"] == status
    finally:
        server.should_exit = True
        t.join(10)
        store.close()
