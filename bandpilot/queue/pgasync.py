"""The API's hot calls on PostgreSQL without threads: authenticate, submit and list over asyncpg,
on the server's event loop.

Why: on the synchronous path every call hops to a request thread (handing work over took 13 % of
the API's CPU) and a tenant's submit took 8 round trips through SQLAlchemy and psycopg2 plus 2 to
read the request back. Here a submit is 3 round trips: ``BEGIN`` with the tenant's lock, one
statement that checks the id and the limits, inserts the request and its audit row and returns the
row, and ``COMMIT``.

The semantics are the synchronous path's (:func:`~bandpilot.queue.intake.submit` with
:func:`~bandpilot.queue.quotas.tenant_guard` inside :func:`~bandpilot.queue.audit.audited`): the
same validation, one transaction holding the per-tenant advisory lock (so concurrent submits cannot
overshoot a limit), the request and its ``ok`` audit row committed together, an ``error`` audit
row for a refused or invalid submit, the same errors. The tests run both paths on one store.
SQLite stores (and any store when asyncpg is missing) keep the synchronous path."""

from __future__ import annotations

import asyncio
import functools
import zlib
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from bandpilot.errors import RequestError
from bandpilot.queue.api_tokens import Principal, principal_of, token_id
from bandpilot.queue.audit import audit_row
from bandpilot.queue.clock import now
from bandpilot.queue.intake import SubmitError, check_requests
from bandpilot.queue.quotas import DuplicateId, QuotaExceeded, TenantLimits
from bandpilot.queue.rows import REQUEST_COLUMNS, request_row
from bandpilot.queue.schema import REQUEST_STATUSES, T_GEN, T_REQ
from bandpilot.queue.store import Store, StoreError
from bandpilot.queue.views import request_doc, reservation_doc

_PG = postgresql.dialect()
#: The columns a submit writes (the row mapper's), each with its PostgreSQL type (asyncpg needs a
#: typed parameter where a NULL could be anything) without a length: a cast to VARCHAR(n) would
#: truncate silently where the insert itself refuses.
_COLS = [(c, T_REQ.c[c].type.compile(dialect=_PG).split("(")[0]) for c in REQUEST_COLUMNS]
_FIRST = 8  # parameters $1..$7 are the check's and the audit row's; the row's start at $8
_K = _FIRST + REQUEST_COLUMNS.index("k")  # the request's GPUs, checked against the tenant's cap

# One statement after the lock: a tenant's pending requests and GPUs and whether one of its ids is
# taken; the insert only when all is well (ON CONFLICT: an id taken by someone else, e.g. an admin's
# plain id); the audit row only when the insert happened; the counts and the new row come back.
SUBMIT_SQL = f"""
WITH usage AS (
  SELECT coalesce(sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), 0) AS n,
         coalesce(sum(CASE WHEN status = 'pending' THEN k ELSE 0 END), 0) AS gpus,
         coalesce(max(CASE WHEN id = ANY($2::text[]) THEN 1 ELSE 0 END), 0) AS dup
  FROM bp_requests WHERE tenant = $1::text AND (status = 'pending' OR id = ANY($2::text[]))
), ins AS (
  INSERT INTO bp_requests ({", ".join(c for c, _ in _COLS)})
  SELECT {", ".join(f"${_FIRST + i}::{t}" for i, (_, t) in enumerate(_COLS))} FROM usage
  WHERE usage.dup = 0 AND ($3::bigint IS NULL OR usage.n + 1 <= $3::bigint)
    AND usage.gpus + ${_K}::bigint <= $4::bigint
  ON CONFLICT (id) DO NOTHING
  RETURNING *
), audit AS (
  INSERT INTO bp_audit (at, actor, action, target, outcome, detail)
  SELECT $5::float8, $6::text, 'submit', ins.id, 'ok', $7::text FROM ins
)
SELECT usage.n, usage.gpus, usage.dup, ins.* FROM usage LEFT JOIN ins ON true
"""

AUDIT_SQL = "INSERT INTO bp_audit (at, actor, action, target, outcome, detail) VALUES ($1, $2, $3, $4, $5, $6)"
TOKEN_SQL = "SELECT tenant, admin, secret_sha256, revoked_at FROM bp_tokens WHERE id = $1"
GEN_SQL = "SELECT request_id, max(generation) FROM bp_generations WHERE request_id = ANY($1::text[]) GROUP BY request_id"
assert T_GEN.name == "bp_generations"  # the hand-written statements name the tables of schema.py


@functools.lru_cache(maxsize=None)
def list_sql(status: bool, tenant: bool, request_id: bool) -> str:
    """:func:`bandpilot.queue.views.list_requests` as one statement (its reservations joined in)
    for one combination of filters; the limit is always the last parameter."""
    where, n = [], 0
    for on, col in ((status, "status"), (tenant, "tenant"), (request_id, "id")):
        if on:
            n += 1
            where.append(f"r.{col} = ${n}::text")
    return (
        "SELECT r.*, a.gpus, a.predicted_gbps, a.standalone_gbps, a.algorithm, a.model_version, a.assigned_at, "
        "v.request_id AS v_request_id, v.rank AS v_rank, v.start_at AS v_start_at, v.gpus AS v_gpus, "
        "v.predicted_gbps AS v_predicted_gbps, v.mode AS v_mode, v.computed_at AS v_computed_at, v.batch_id AS v_batch_id "
        "FROM bp_requests r LEFT JOIN bp_assignments a ON a.request_id = r.id "
        "LEFT JOIN bp_reservations v ON v.request_id = r.id AND r.status = 'pending'"
        + (" WHERE " + " AND ".join(where) if where else "") + f" ORDER BY r.seq LIMIT ${n + 1}::bigint"
    )


def _reservation(r: Mapping[str, Any]) -> dict[str, Any] | None:
    if r["v_request_id"] is None:
        return None
    return reservation_doc({"request_id": r["v_request_id"], "tenant": r["tenant"], "rank": r["v_rank"],
                            "start_at": r["v_start_at"], "gpus": r["v_gpus"], "predicted_gbps": r["v_predicted_gbps"],
                            "mode": r["v_mode"], "computed_at": r["v_computed_at"], "batch_id": r["v_batch_id"]})


def connect_args(store: Store) -> dict[str, Any]:
    """asyncpg's connection arguments for a PostgreSQL store: its URL without the SQLAlchemy driver
    name, and its schema (``Store(schema=)`` or ``?options=-csearch_path=S``) as the search path."""
    u = sa.engine.make_url(store.url)
    query = dict(u.query)
    settings: dict[str, str] = {}
    opts = query.pop("options", None)
    if opts:
        for part in str(opts).split():
            key, _, value = part.removeprefix("-c").partition("=")
            if not value:
                raise StoreError(f"store URL option {part!r} is not -cNAME=VALUE")
            settings[key] = value
    if store.schema:
        settings["search_path"] = store.schema
    dsn = u.set(drivername="postgresql", query=query).render_as_string(hide_password=False)
    return {"dsn": dsn, "server_settings": settings, "timeout": 5}


class _Pool:
    """At most ``size`` connections, idle ones reused last-in first-out. asyncpg's own pool spends
    ~70 us of CPU per acquire and release (a task per release, a reset, timers), measured; this one
    a few. A connection comes back only from a block that finished cleanly and outside a
    transaction; any other (an error, a cancellation mid-query, a dropped server) is closed, and a
    fresh one is opened when needed."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], size: int) -> None:
        self._connect, self._slots = connect, asyncio.Semaphore(size)
        self._idle: list[Any] = []
        self._in_use: set[Any] = set()

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        async with self._slots:
            conn = None
            while self._idle and conn is None:
                conn = self._idle.pop()
                if conn.is_closed():  # the server dropped it while idle
                    conn = None
            conn = conn or await self._connect()
            self._in_use.add(conn)
            clean = False
            try:
                yield conn
                clean = True
            finally:
                self._in_use.discard(conn)
                if clean and not conn.is_closed() and not conn.is_in_transaction():
                    self._idle.append(conn)
                else:
                    conn.terminate()

    async def close(self) -> None:
        for conn in [*self._idle, *self._in_use]:
            conn.terminate()
        self._idle.clear()


class PgAsync:
    """A connection pool on the store's database, opened on the event loop that serves the API."""

    def __init__(self, store: Store, pool: _Pool) -> None:
        self.store, self.pool = store, pool

    @classmethod
    async def open(cls, store: Store, size: int = 10) -> "PgAsync":
        import asyncpg

        args = connect_args(store)
        # a server that cannot be reached is a StoreError (a JSON 500 naming the store), as on the
        # synchronous path
        pool = _Pool(lambda: _db(store, asyncpg.connect(**args)), size)
        try:
            async with pool.acquire():  # reachable now: a wrong URL fails the start-up, not a request
                pass
        except StoreError as exc:
            raise StoreError(f"cannot open store {store.safe_url}: {str(exc).split(': ', 1)[-1]}") from None
        return cls(store, pool)

    async def close(self) -> None:
        await self.pool.close()

    async def _spec(self) -> Any:
        spec = self.store.loaded_spec
        if spec is None:  # first use, or the cluster was replaced: one read off the event loop
            from starlette.concurrency import run_in_threadpool  # anyio via starlette

            spec = await run_in_threadpool(lambda: self.store.spec)
        return spec

    async def authenticate(self, token: str | None) -> Principal | None:
        """:func:`bandpilot.queue.api_tokens.authenticate`, one query."""
        tid = token_id(token)
        if tid is None:
            return None
        async with self.pool.acquire() as conn:
            row = await _db(self.store, conn.fetchrow(TOKEN_SQL, tid))
        return principal_of(row, token)  # type: ignore[arg-type]

    async def list(self, *, status: str | None = None, tenant: str | None = None, limit: int | None = None,
                   request_id: str | None = None) -> list[dict[str, Any]]:
        """:func:`bandpilot.queue.views.list_requests`: the same documents, one statement (one more
        when some listed requests hold GPUs: their resize generations)."""
        if status is not None and status not in REQUEST_STATUSES:
            raise RequestError(f"unknown status {status!r}: use one of {', '.join(REQUEST_STATUSES)}")
        args = [v for v in (status or None, tenant or None, request_id) if v is not None]
        sql = list_sql(bool(status), bool(tenant), request_id is not None)
        async with self.pool.acquire() as conn:
            rows = await _db(self.store, conn.fetch(sql, *args, limit or None))
            out = [request_doc(r, _reservation(r)) for r in rows]
            running = [d["id"] for d in out if d["gpus"]]
            if running:
                gens = {rid: int(g) for rid, g in await _db(self.store, conn.fetch(GEN_SQL, running))}
                for d in out:
                    if d["gpus"]:
                        d["generation"] = gens.get(d["id"], 0)
        return out

    async def submit(self, doc: Mapping[str, Any], *, actor: str, own_ids: Sequence[str], shown: str,
                     limits: TenantLimits, detail: Mapping[str, Any]) -> dict[str, Any]:
        """Queue one tenant's request ``doc`` (its ``id`` as stored, its ``tenant``) within
        ``limits``; returns the request as listed. ``own_ids``: the ids it could be known by
        (a duplicate among them is :class:`DuplicateId`, naming ``shown``). Audited as ``submit``
        by ``actor`` with ``detail``; a refusal leaves an ``error`` row, as :func:`audited` does."""
        key = doc["id"]
        try:
            return await self._submit(doc, actor, own_ids, shown, limits, detail)
        except (RequestError, StoreError) as exc:
            row = audit_row(actor, "submit", key, f"{type(exc).__name__}: {exc}"[:4000])
            async with self.pool.acquire() as conn:
                await _db(self.store, conn.execute(AUDIT_SQL, now(), row["actor"], row["action"], row["target"],
                                                   "error", row["detail"]))
            raise

    async def _submit(self, doc: Mapping[str, Any], actor: str, own_ids: Sequence[str], shown: str,
                      limits: TenantLimits, detail: Mapping[str, Any]) -> dict[str, Any]:
        spec = await self._spec()
        good, errs, _ = check_requests([doc], spec, labels=["body"])
        if errs:
            raise SubmitError(errs, 0)
        req, tenant, ts = good[0], doc["tenant"], now()
        row = request_row(req, ts)
        cap = limits.max_pending_gpus if limits.max_pending_gpus is not None else 2 * spec.n_gpus
        aud = audit_row(actor, "submit", req.id, detail)
        # crc32 of the tenant: the same lock key as the synchronous path; an int, safe to inline, so
        # BEGIN and the lock travel in one simple-protocol round trip
        lock = zlib.crc32(f"bandpilot-tenant:{tenant}".encode()) & 0x7FFFFFFF
        async with self.pool.acquire() as conn:
            # an error or a cancellation before COMMIT: the pool closes the connection, and the server
            # rolls the transaction back (and drops the lock) with it
            await _db(self.store, conn.execute(f"BEGIN; SELECT pg_advisory_xact_lock({int(lock)})"))
            # the statement's snapshot is taken after the lock: it sees every submit that held it before
            got = await _db(self.store, conn.fetchrow(
                SUBMIT_SQL, tenant, list(own_ids), limits.max_pending, cap, ts, aud["actor"], aud["detail"],
                *(row[c] for c, _ in _COLS)))
            await _db(self.store, conn.execute("COMMIT"))
        if got["dup"]:
            raise DuplicateId(f"request id {shown!r} already exists")
        n, gpus = int(got["n"]), int(got["gpus"])
        if limits.max_pending is not None and n + 1 > limits.max_pending:
            raise QuotaExceeded(f"tenant {tenant!r} has {n} pending requests, the limit is {limits.max_pending}; "
                                "retry when some are placed or cancelled", limits.retry_after_s)
        if gpus + req.k > cap:
            raise QuotaExceeded(f"tenant {tenant!r} has {gpus} pending GPUs requested, {req.k} more would exceed the "
                                f"limit of {cap}; retry when some are placed or cancelled", limits.retry_after_s)
        if got["id"] is None:
            raise SubmitError([f"body: request id {req.id!r} already exists in the store"], 0, "duplicate_id")
        fresh = dict(got)  # a new request: no assignment, no reservation
        fresh.update(gpus=None, predicted_gbps=None, standalone_gbps=None, algorithm=None, model_version=None,
                     assigned_at=None)
        return request_doc(fresh, None)


async def _db(store: Store, aw: Any) -> Any:
    """Await a database call; a database failure is a :class:`StoreError` as on the synchronous path."""
    import asyncpg

    try:
        return await aw
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreError(f"store {store.safe_url}: {' '.join(str(exc).split())}") from None

