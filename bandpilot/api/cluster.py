"""Cluster endpoints: state (the GPU grid and queue summary), fragmentation over time, recent
batches, health verdicts; drain and undrain for admins.

Tenants see where every GPU is and whether it is busy, but only their own jobs' ids."""

from __future__ import annotations

from typing import Optional

from bandpilot.api.fastjson import JSONResponse
from fastapi import APIRouter, Depends, Query, Request

from bandpilot.api.auth import admin, principal, shown_id, store_of
from bandpilot.api.schemas import DrainBody, UndrainBody
from bandpilot.queue.audit import audited
from bandpilot.queue.gpu_health import health
from bandpilot.queue.lifecycle import drain, undrain
from bandpilot.queue.api_tokens import Principal
from bandpilot.queue.views import fragmentation, fragmentation_history, gpu_grid, recent_batches, status

router = APIRouter(prefix="/v1/cluster", tags=["cluster"])


@router.get("", summary="Cluster summary, GPU grid and host health")
def cluster(request: Request, p: Principal = Depends(principal)) -> JSONResponse:
    store = store_of(request)
    grid = gpu_grid(store)
    if not p.admin:
        for g in grid:
            if g["tenant"] != p.tenant:
                g["job"] = g["tenant"] = None  # busy, but not yours
            elif g["job"] is not None:
                g["job"] = shown_id(p, g["job"])
    st = status(store)
    if not p.admin:
        st["tenants"] = {t: v for t, v in st["tenants"].items() if t == p.tenant}
        for r in st.get("reservations", []):
            if r["tenant"] != p.tenant:
                r["request_id"] = r["tenant"] = None  # reserved, but not yours
            else:
                r["request_id"] = shown_id(p, r["request_id"])
        st.pop("store", None)  # the database's user, host and path are the operators' business
    return JSONResponse({"status": st, "gpus": grid, "health": health(store), "viewer": {"tenant": p.tenant, "admin": p.admin}})


@router.get("/fragmentation", summary="Where the free GPUs are, and samples over time")
def frag(request: Request, p: Principal = Depends(principal),
         since: Optional[float] = Query(None, description="epoch seconds"),
         limit: int = Query(2000, ge=1, le=100_000)) -> JSONResponse:
    store = store_of(request)
    return JSONResponse({"now": fragmentation(store), "history": fragmentation_history(store, since=since, limit=limit)})


@router.get("/batches", summary="Recent batch runs and the predicted bandwidth of what they assigned")
def batches(request: Request, p: Principal = Depends(principal), limit: int = Query(20, ge=1, le=500)) -> JSONResponse:
    out = recent_batches(store_of(request), limit)
    if not p.admin:
        for b in out:
            for a in b["assignments"]:
                if a["tenant"] != p.tenant:
                    a["id"] = a["tenant"] = None
                else:
                    a["id"] = shown_id(p, a["id"])
    return JSONResponse({"batches": out})


@router.post("/drain", summary="Take a GPU, host or domain out of the pool (admin)")
def drain_(body: DrainBody, request: Request, p: Principal = Depends(admin)) -> JSONResponse:
    store = store_of(request)
    with audited(store, p.actor, "drain", body.target, {"reason": body.reason}):
        return JSONResponse(drain(store, body.target, body.reason))


@router.post("/undrain", summary="Return drained hardware to the pool (admin)")
def undrain_(body: UndrainBody, request: Request, p: Principal = Depends(admin)) -> JSONResponse:
    store = store_of(request)
    with audited(store, p.actor, "undrain", body.target):
        return JSONResponse(undrain(store, body.target))


