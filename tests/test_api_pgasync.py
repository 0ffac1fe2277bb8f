"""Issue 25: the API's asyncpg path on PostgreSQL (bandpilot.queue.pgasync) keeps every guarantee of the
synchronous path: the same documents and errors, the per-tenant lock (concurrent submits never
overshoot a limit or duplicate an id), a request and its audit row committed together, an error row
for a refusal, revoked tokens refused; and the API serves through it when the lifespan opened it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.api import create_app
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.pgasync import PgAsync, connect_args
from bandpilot.queue.quotas import DuplicateId, QuotaExceeded, TenantLimits
from bandpilot.queue.schema import T_AUDIT, T_REQ

from test_queue import h100, new_store
from bandpilot.scheduling.profile import SchedulerProfile

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # ~1 s each with a fresh schema at load 10


@pytest.fixture
def store():
    from test_queue_pg import _pg_url

    url = _pg_url()
    if url is None:
        pytest.skip("no PostgreSQL server on 127.0.0.1:5432 (database 'test')")
    schema = f"bpasync_{uuid.uuid4().hex[:10]}"
    s = new_store(url, h100(), schema=schema)
    try:
        yield s
    finally:
        s.close()
        eng = sa.create_engine(url)
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        eng.dispose()


def _run(store, fn):
    """``fn(pg)`` on a fresh event loop with a pool on ``store``."""
    async def main():
        pg = await PgAsync.open(store)
        try:
            return await fn(pg)
        finally:
            await pg.close()
    return asyncio.run(main())


def _doc(tenant: str, rid: str, k: int = 1, **kw):
    return {"id": f"{tenant}:{rid}", "tenant": tenant, "k": k, **kw}


async def _submit(pg, tenant, rid, k=1, limits=TenantLimits(), **kw):
    return await pg.submit(_doc(tenant, rid, k, **kw), actor=f"{tenant} (token t)", own_ids=[f"{tenant}:{rid}", rid],
                           shown=rid, limits=limits, detail={"k": k, "tenant": tenant})


def test_connect_args_take_the_schema_from_the_url_or_the_store(store):
    args = connect_args(store)
    assert args["dsn"].startswith("postgresql://") and args["server_settings"] == {"search_path": store.schema}
    other = q.Store(f"{store.url}?options=-csearch_path%3D{store.schema}")
    try:
        a = connect_args(other)
        assert a["server_settings"] == {"search_path": store.schema} and "options" not in a["dsn"]
    finally:
        other.close()


def test_concurrent_submits_never_overshoot_a_limit_and_every_refusal_is_audited(store):
    limits = TenantLimits(max_pending=5, max_pending_gpus=None, retry_after_s=7)

    async def go(pg):
        return await asyncio.gather(*(_submit(pg, "alice", f"r{i}", 1, limits) for i in range(20)),
                                    return_exceptions=True)

    out = _run(store, go)
    ok = [o for o in out if isinstance(o, dict)]
    refused = [o for o in out if isinstance(o, QuotaExceeded)]
    assert len(ok) == 5 and len(refused) == 15 and all(e.retry_after_s == 7 for e in refused)
    with store.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(T_REQ)).scalar() == 5
        rows = conn.execute(sa.select(T_AUDIT.c.outcome, T_AUDIT.c.target, T_AUDIT.c.detail)
                            .where(T_AUDIT.c.action == "submit")).all()
    assert sorted(r.target for r in rows if r.outcome == "ok") == sorted(o["id"] for o in ok)  # stored ids
    assert sum(r.outcome == "error" and "QuotaExceeded" in r.detail for r in rows) == 15


def test_the_gpu_limit_and_duplicate_ids_across_both_paths(store):
    q.submit(store, [{"id": "alice:x", "tenant": "alice", "k": 4}])  # the synchronous path's row
    limits = TenantLimits(max_pending=None, max_pending_gpus=10)

    async def go(pg):
        dup = await asyncio.gather(_submit(pg, "alice", "x", 1, limits), return_exceptions=True)
        race = await asyncio.gather(*(_submit(pg, "alice", "y", 1, limits) for _ in range(4)), return_exceptions=True)
        big = await asyncio.gather(_submit(pg, "alice", "z", 6, limits), _submit(pg, "bob", "x", 6, limits),
                                   return_exceptions=True)
        return dup, race, big

    dup, race, big = _run(store, go)
    assert isinstance(dup[0], DuplicateId) and "'x'" in str(dup[0])
    assert sum(isinstance(r, dict) for r in race) == 1 and sum(isinstance(r, DuplicateId) for r in race) == 3
    assert isinstance(big[0], QuotaExceeded) and "5 pending GPUs" in str(big[0])  # 4 + 1 + 6 > 10
    assert isinstance(big[1], dict) and big[1]["tenant"] == "bob"  # another tenant's x is no conflict


def test_an_invalid_request_is_refused_like_the_synchronous_path_and_audited(store):
    async def go(pg):
        return await asyncio.gather(_submit(pg, "alice", "big", 999), return_exceptions=True)

    (err,) = _run(store, go)
    with pytest.raises(RequestError) as sync_err:
        q.submit(store, [_doc("alice", "big", 999)], labels=["body"])
    assert isinstance(err, RequestError) and str(err) == str(sync_err.value) and err.code == sync_err.value.code
    log = q.audit_log(store, limit=5)
    assert log[0]["outcome"] == "error" and log[0]["target"] == "alice:big"


def test_submit_and_list_give_the_synchronous_documents(store):
    q.submit(store, [{"id": "alice:run", "k": 4, "tenant": "alice"}, {"id": "b", "k": 2, "tenant": "bob"}])
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", queue_sort="fifo"))

    async def go(pg):
        new = await _submit(pg, "alice", "new", 2, constraints={"single_host": True}, min_k=2, max_k=4, time_limit_s=60.0)
        lists = {}
        for kw in ({}, {"tenant": "alice"}, {"status": "pending"}, {"status": "assigned", "limit": 1},
                   {"request_id": "alice:new"}, {"tenant": "nobody"}):
            lists[repr(kw)] = (kw, await pg.list(**kw))
        return new, lists

    new, lists = _run(store, go)
    assert new == q.list_requests(store, request_id="alice:new")[0]
    assert new["constraints"] == {"single_host": True} and new["min_k"] == 2 and new["status"] == "pending"
    for kw, got in lists.values():
        assert got == q.list_requests(store, **kw), kw
    assert any(d["gpus"] and "generation" in d for d in lists["{}"][1])
    with pytest.raises(RequestError, match="unknown status"):
        _run(store, lambda pg: pg.list(status="nope"))


def test_tokens_are_checked_like_the_synchronous_path(store):
    tok, rec = q.create_token(store, "alice")
    adm, _ = q.create_token(store, "ops", admin=True)
    q.revoke(store, token_id=q.create_token(store, "carol")[1]["id"])

    async def go(pg):
        return [await pg.authenticate(t) for t in (tok, adm, tok[:-1] + "x", "bp_nope", None, "")]

    got = _run(store, go)
    assert got == [q.authenticate(store, t) for t in (tok, adm, tok[:-1] + "x", "bp_nope", None, "")]
    assert got[0].tenant == "alice" and not got[0].admin and got[1].admin and got[2:] == [None] * 4


def test_the_api_serves_tenants_through_it_and_admins_through_threads(store):
    alice, _ = q.create_token(store, "alice")
    ops, _ = q.create_token(store, "ops", admin=True)
    for async_db in (True, False):
        with TestClient(create_app(store, sample_s=None, max_pending=2, async_db=async_db)) as c:
            assert (c.app.app.state.pg is not None) == async_db  # the Guard wraps the FastAPI app
            h = {"Authorization": f"Bearer {alice}"}
            tag = "a" if async_db else "s"
            r = c.post("/v1/requests", json={"id": f"{tag}1", "k": 2}, headers=h)
            assert r.status_code == 201 and r.json()["id"] == f"{tag}1" and r.json()["tenant"] == "alice", r.text
            assert c.post("/v1/requests", json={"id": f"{tag}1", "k": 2}, headers=h).status_code == 409
            assert c.post("/v1/requests", json={"id": f"{tag}2", "k": 2}, headers=h).status_code == 201
            over = c.post("/v1/requests", json={"id": f"{tag}3", "k": 2}, headers=h)
            assert over.status_code == 429 and over.headers["Retry-After"] == "30"
            listed = c.get("/v1/requests?status=pending", headers=h).json()
            assert [d["id"] for d in listed["requests"]] == [f"{tag}1", f"{tag}2"]
            r = c.post("/v1/requests", json={"id": f"ops-{tag}", "k": 1, "tenant": "bob"},
                       headers={"Authorization": f"Bearer {ops}"})
            assert r.status_code == 201 and r.json()["id"] == f"ops-{tag}"
            for d in listed["requests"]:
                assert c.post(f"/v1/requests/{d['id']}/cancel", headers=h).status_code == 200
            assert c.get("/v1/requests", headers={"Authorization": "Bearer bp_bad"}).status_code == 401


def test_the_pool_bounds_connections_and_never_reuses_a_broken_or_failed_one(store):
    async def go(pg):
        async with pg.pool.acquire() as conn:
            first_pid = conn.get_server_pid()
        async with pg.pool.acquire() as conn:  # the idle one again
            assert conn.get_server_pid() == first_pid
            async with pg.pool.acquire() as other:
                await other.execute(f"SELECT pg_terminate_backend({first_pid})")  # the server drops it
        await asyncio.sleep(0.2)
        tok, _ = q.create_token(store, "alice")
        assert (await pg.authenticate(tok)).tenant == "alice"  # a fresh connection served it
        with pytest.raises(ZeroDivisionError):
            async with pg.pool.acquire() as conn:
                failed = conn
                raise ZeroDivisionError  # an error mid-block
        assert failed.is_closed()
        busy, peak = 0, 0

        async def hold():
            nonlocal busy, peak
            async with pg.pool.acquire():
                busy += 1
                peak = max(peak, busy)
                await asyncio.sleep(0.05)
                busy -= 1

        await asyncio.gather(*(hold() for _ in range(25)))
        return peak

    assert _run(store, go) == 10  # PgAsync.open's default size


def test_an_unreachable_server_is_a_store_error_naming_the_store(tmp_path):
    class Gone:  # what PgAsync reads of a Store
        url = safe_url = "postgresql://postgres@127.0.0.1:1/test"
        schema = None

    with pytest.raises(q.StoreError, match=r"cannot open store postgresql://postgres@127.0.0.1:1/test: "):
        asyncio.run(PgAsync.open(Gone()))
