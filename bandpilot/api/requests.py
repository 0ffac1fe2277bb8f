"""Tenant endpoints: submit, list, show, launcher input, cancel, release, telemetry.

A tenant token sees and changes only its own requests: another tenant's request answers 404, as if it
did not exist (its id reveals nothing). Admin tokens see every request.

Request ids are per tenant: what tenant ``T`` submits as ``x`` is stored as ``T:x`` (tenant names
have no ``:``), so another tenant's ``x`` is no conflict and submitting it answers exactly like a
fresh id. The tenant sees and uses ``x``; admins, the CLI and the audit log see ``T:x``. Requests
stored before (or by the CLI and admins) keep their plain id and are found by it too."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from bandpilot.api.auth import principal, shown_id, store_of, stored_id
from bandpilot.api.fastjson import JSONResponse
from bandpilot.errors import BandPilotError
from bandpilot.api.schemas import EntropyBody, ReleaseBody, SubmitBody, TelemetryBody
from bandpilot.queue.audit import audited, record
from bandpilot.queue.clock import now
from bandpilot.queue.intake import cancel, submit
from bandpilot.queue.launch import FORMATS, assignment, render
from bandpilot.queue.learning import report_entropy
from bandpilot.queue.lifecycle import release
from bandpilot.queue.requests import new_request_id
from bandpilot.queue.schema import REQUEST_STATUSES, T_REQ
from bandpilot.queue.telemetry import observe_jobs
from bandpilot.queue.api_tokens import Principal, check_tenant
from bandpilot.queue.quotas import DuplicateId, QuotaExceeded, tenant_guard
from bandpilot.queue.views import list_requests

router = APIRouter(prefix="/v1/requests", tags=["requests"])


# built once (building a select costs more than running it)
_ANY = sa.select(T_REQ.c.id).where(T_REQ.c.id.in_(sa.bindparam("ids", expanding=True)))
_TENANTS = _ANY.where(T_REQ.c.tenant == sa.bindparam("tenant"))


def _own(request: Request, p: Principal, rid: str) -> str:
    """The stored id of ``p``'s request ``rid``; 404 if unknown or another tenant's."""
    with store_of(request).read(snapshot=False) as conn:
        if p.admin:
            keys = list(conn.execute(_ANY, {"ids": [rid]}).scalars())
        else:
            keys = list(conn.execute(_TENANTS, {"ids": [stored_id(p, rid), rid], "tenant": p.tenant}).scalars())
    if not keys:
        raise HTTPException(404, f"no request {rid!r}")
    return stored_id(p, rid) if stored_id(p, rid) in keys else keys[0]


@contextmanager
def _as_seen(p: Principal, key: str) -> Iterator[None]:
    """Library errors name the request as its tenant knows it."""
    try:
        yield
    except BandPilotError as exc:
        shown = shown_id(p, key)
        if shown != key:
            exc.args = (str(exc).replace(repr(key), repr(shown)),)
        raise


def _one(request: Request, p: Principal, key: str) -> dict[str, Any]:
    rows = list_requests(store_of(request), request_id=key)
    if not rows:
        raise HTTPException(404, f"no request {shown_id(p, key)!r}")
    return {**rows[0], "id": shown_id(p, key)}


RequestId = Path(..., max_length=200, description="The request's id as submitted.")


@router.post("", status_code=201, summary="Submit a gang request",
             responses={409: {"description": "The tenant already has a request with this id"},
                        429: {"description": "The tenant is at its pending-request or GPU limit (Retry-After)"}})
async def submit_request(body: SubmitBody, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    pg = request.app.state.pg
    if pg is None or p.admin or (body.tenant is not None and body.tenant != p.tenant):
        return await run_in_threadpool(_submit, body, request, p)
    # a tenant's own submit on PostgreSQL: the same checks on the event loop (bandpilot.queue.pgasync)
    rid = body.id or new_request_id()
    key = _key(p, rid)
    doc = body.model_dump(exclude_none=True, exclude={"tenant"})
    doc["id"], doc["tenant"] = key, p.tenant
    with _refusals():
        out = await pg.submit(doc, actor=p.actor, own_ids=[key, rid], shown=rid, limits=request.app.state.limits,
                              detail={"k": body.k, "tenant": p.tenant})
    return JSONResponse({**out, "id": rid}, status_code=201)


def _key(p: Principal, rid: str) -> str:
    key = stored_id(p, rid)
    if len(key) > 200:
        raise HTTPException(422, f"id: at most {199 - len(p.tenant)} characters for tenant {p.tenant!r}")
    return key


@contextmanager
def _refusals() -> Iterator[None]:
    """A tenant over its limits: 429 with Retry-After; an id it already has: 409."""
    try:
        yield
    except QuotaExceeded as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    except DuplicateId as exc:
        raise HTTPException(409, str(exc)) from None


def _submit(body: SubmitBody, request: Request, p: Principal) -> JSONResponse:
    store = store_of(request)
    tenant, guard = p.tenant, None
    if body.tenant is not None and body.tenant != p.tenant:
        if not p.admin:
            record(store, p.actor, "submit", None, outcome="denied", detail={"tenant": body.tenant}, coalesce_s=60)
            raise HTTPException(403, f"tenant {p.tenant!r} cannot submit for tenant {body.tenant!r}")
        tenant = check_tenant(body.tenant)
    rid = body.id or new_request_id()
    key = _key(p, rid)
    if not p.admin:
        guard = tenant_guard(store, tenant, body.k, [key, rid], rid, request.app.state.limits)
    doc = body.model_dump(exclude_none=True, exclude={"tenant"})
    doc["id"], doc["tenant"] = key, tenant
    with _refusals(), audited(store, p.actor, "submit", key, {"k": body.k, "tenant": tenant}):
        submit(store, [doc], labels=["body"], guard=guard)
    return JSONResponse(_one(request, p, key), status_code=201)


@router.get("", summary="List requests (a tenant's own; all for admins)")
async def list_(request: Request, p: Principal = Depends(principal),
                status: Optional[str] = Query(None, description=" | ".join(REQUEST_STATUSES)),
                tenant: Optional[str] = Query(None, description="Admins: only this tenant."),
                limit: int = Query(500, ge=1, le=10_000)) -> JSONResponse:
    if not p.admin:
        if tenant is not None and tenant != p.tenant:
            raise HTTPException(403, f"tenant {p.tenant!r} cannot list tenant {tenant!r}")
        tenant = p.tenant
    pg = request.app.state.pg
    if pg is not None:
        rows = await pg.list(status=status, tenant=tenant, limit=limit)
    else:
        rows = await run_in_threadpool(list_requests, store_of(request), status=status, tenant=tenant, limit=limit)
    if not p.admin:
        for r in rows:
            r["id"] = shown_id(p, r["id"])
    return JSONResponse({"requests": rows, "count": len(rows)})


@router.get("/{rid}", summary="One request with its assignment")
def show(request: Request, rid: str = RequestId, p: Principal = Depends(principal)) -> JSONResponse:
    return JSONResponse(_one(request, p, _own(request, p, rid)))


@router.get("/{rid}/launch", summary="Launcher input: json | slurm | hostfile | env | k8s")
def launch(request: Request, rid: str = RequestId, p: Principal = Depends(principal),
           format: str = Query("json", description=" | ".join(FORMATS))) -> Any:
    key = _own(request, p, rid)
    with _as_seen(p, key):
        a = assignment(store_of(request), key)
    a["id"] = shown_id(p, key)
    if format == "json":
        return JSONResponse(a)
    return PlainTextResponse(render(a, format))


@router.post("/{rid}/cancel", summary="Withdraw a pending request")
def cancel_(request: Request, rid: str = RequestId, p: Principal = Depends(principal)) -> JSONResponse:
    key = _own(request, p, rid)
    store = store_of(request)
    with _as_seen(p, key), audited(store, p.actor, "cancel", key):
        cancel(store, key)
    return JSONResponse(_one(request, p, key))


@router.post("/{rid}/release", summary="End a job: its GPUs return to the pool")
def release_(request: Request, rid: str = RequestId, body: Optional[ReleaseBody] = None,
             p: Principal = Depends(principal)) -> JSONResponse:
    key = _own(request, p, rid)
    store = store_of(request)
    measured = body.measured_gbps if body else None
    with _as_seen(p, key), audited(store, p.actor, "release", key, {"measured_gbps": measured}):
        out = release(store, key, measured)
    return JSONResponse({**out, "job": shown_id(p, key), "request": _one(request, p, key)})


@router.post("/{rid}/telemetry", summary="Report the bandwidth a running job measures")
def telemetry(body: TelemetryBody, request: Request, rid: str = RequestId,
              p: Principal = Depends(principal)) -> JSONResponse:
    key = _own(request, p, rid)
    store = store_of(request)
    with _as_seen(p, key), audited(store, p.actor, "telemetry", key, {"measured_gbps": body.measured_gbps}):
        with store.write() as conn:
            n = observe_jobs(conn, {key: body.measured_gbps}, now())
    return JSONResponse({"job": shown_id(p, key), "recorded": n})


@router.post("/{rid}/entropy", summary="Report normalized entropy at an epoch boundary (updates the job's utility)")
def entropy(body: EntropyBody, request: Request, rid: str = RequestId, p: Principal = Depends(principal)) -> JSONResponse:
    key = _own(request, p, rid)
    store = store_of(request)
    report = {"job": key, "entropy": body.entropy, **({"epoch": body.epoch} if body.epoch is not None else {})}
    with _as_seen(p, key), audited(store, p.actor, "entropy", key, {"entropy": body.entropy, "epoch": body.epoch}):
        out = report_entropy(store, report)
    return JSONResponse({**out[0], "job": shown_id(p, key)})
