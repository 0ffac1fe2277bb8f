"""Tenant endpoints: submit, list, show, launcher input, cancel, release, telemetry.

A tenant token sees and changes only its own requests: another tenant's request answers 404, as if it
did not exist (its id reveals nothing). Admin tokens see every request."""

from __future__ import annotations

from typing import Any, Optional

import sqlalchemy as sa
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from bandpilot.api.auth import principal, store_of
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
from bandpilot.queue.views import list_requests

router = APIRouter(prefix="/v1/requests", tags=["requests"])


def _own(request: Request, p: Principal, rid: str) -> str:
    """The request's tenant if ``p`` may see it; 404 otherwise (unknown or another tenant's)."""
    with store_of(request).read(snapshot=False) as conn:
        tenant = conn.execute(sa.select(T_REQ.c.tenant).where(T_REQ.c.id == rid)).scalar()
    if tenant is None or (not p.admin and tenant != p.tenant):
        raise HTTPException(404, f"no request {rid!r}")
    return tenant


def _one(request: Request, rid: str) -> JSONResponse:
    rows = list_requests(store_of(request), request_id=rid)
    if not rows:
        raise HTTPException(404, f"no request {rid!r}")
    return rows[0]


@router.post("", status_code=201, summary="Submit a gang request")
def submit_request(body: SubmitBody, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    tenant = p.tenant
    if body.tenant is not None and body.tenant != p.tenant:
        if not p.admin:
            record(store_of(request), p.actor, "submit", None, outcome="denied", detail={"tenant": body.tenant})
            raise HTTPException(403, f"tenant {p.tenant!r} cannot submit for tenant {body.tenant!r}")
        tenant = check_tenant(body.tenant)
    doc = body.model_dump(exclude_none=True, exclude={"tenant"})
    doc["id"] = body.id or new_request_id()
    doc["tenant"] = tenant
    store = store_of(request)
    with audited(store, p.actor, "submit", doc["id"], {"k": body.k, "tenant": tenant}):
        submit(store, [doc], labels=["body"])
    return JSONResponse(_one(request, doc["id"]), status_code=201)


@router.get("", summary="List requests (a tenant's own; all for admins)")
def list_(request: Request, p: Principal = Depends(principal),
          status: Optional[str] = Query(None, description=" | ".join(REQUEST_STATUSES)),
          tenant: Optional[str] = Query(None, description="Admins: only this tenant."),
          limit: int = Query(500, ge=1, le=10_000)) -> JSONResponse:
    if not p.admin:
        if tenant is not None and tenant != p.tenant:
            raise HTTPException(403, f"tenant {p.tenant!r} cannot list tenant {tenant!r}")
        tenant = p.tenant
    rows = list_requests(store_of(request), status=status, tenant=tenant, limit=limit)
    return JSONResponse({"requests": rows, "count": len(rows)})


@router.get("/{rid}", summary="One request with its assignment")
def show(rid: str, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    _own(request, p, rid)
    return JSONResponse(_one(request, rid))


@router.get("/{rid}/launch", summary="Launcher input: json | slurm | hostfile | env | k8s")
def launch(rid: str, request: Request, p: Principal = Depends(principal),
           format: str = Query("json", description=" | ".join(FORMATS))) -> Any:
    _own(request, p, rid)
    a = assignment(store_of(request), rid)
    if format == "json":
        return JSONResponse(a)
    return PlainTextResponse(render(a, format))


@router.post("/{rid}/cancel", summary="Withdraw a pending request")
def cancel_(rid: str, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    _own(request, p, rid)
    store = store_of(request)
    with audited(store, p.actor, "cancel", rid):
        cancel(store, rid)
    return JSONResponse(_one(request, rid))


@router.post("/{rid}/release", summary="End a job: its GPUs return to the pool")
def release_(rid: str, request: Request, body: Optional[ReleaseBody] = None,
             p: Principal = Depends(principal)) -> JSONResponse:
    _own(request, p, rid)
    store = store_of(request)
    measured = body.measured_gbps if body else None
    with audited(store, p.actor, "release", rid, {"measured_gbps": measured}):
        out = release(store, rid, measured)
    return JSONResponse({**out, "request": _one(request, rid)})


@router.post("/{rid}/telemetry", summary="Report the bandwidth a running job measures")
def telemetry(rid: str, body: TelemetryBody, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    _own(request, p, rid)
    store = store_of(request)
    with audited(store, p.actor, "telemetry", rid, {"measured_gbps": body.measured_gbps}):
        with store.write() as conn:
            n = observe_jobs(conn, {rid: body.measured_gbps}, now())
    return JSONResponse({"job": rid, "recorded": n})


@router.post("/{rid}/entropy", summary="Report normalized entropy at an epoch boundary (updates the job's utility)")
def entropy(rid: str, body: EntropyBody, request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    _own(request, p, rid)
    store = store_of(request)
    report = {"job": rid, "entropy": body.entropy, **({"epoch": body.epoch} if body.epoch is not None else {})}
    with audited(store, p.actor, "entropy", rid, {"entropy": body.entropy, "epoch": body.epoch}):
        out = report_entropy(store, report)
    return JSONResponse(out[0])
