"""Admin endpoints: tokens (create, list, revoke; delete a tenant) and the audit log."""

from __future__ import annotations

from typing import Optional

from bandpilot.api.fastjson import JSONResponse
from fastapi import APIRouter, Depends, Query, Request

from bandpilot.api.auth import admin, principal, store_of
from bandpilot.api.schemas import TokenBody
from bandpilot.queue.audit import audit_log, audited
from bandpilot.queue.api_tokens import Principal, create_token, list_tokens, revoke

router = APIRouter(prefix="/v1", tags=["admin"])


@router.get("/whoami", summary="The tenant and role of the calling token")
def whoami(p: Principal = Depends(principal)) -> JSONResponse:
    return JSONResponse({"tenant": p.tenant, "admin": p.admin, "token": p.token_id})


@router.get("/tokens", summary="Active tokens (admin)")
def tokens(request: Request, p: Principal = Depends(admin), tenant: Optional[str] = None,
           include_revoked: bool = False) -> JSONResponse:
    return JSONResponse({"tokens": list_tokens(store_of(request), tenant, include_revoked=include_revoked)})


@router.post("/tokens", status_code=201, summary="Create a token; the secret is shown once (admin)")
def new_token(body: TokenBody, request: Request, p: Principal = Depends(admin)) -> JSONResponse:
    store = store_of(request)
    with audited(store, p.actor, "token.create", body.tenant, {"admin": body.admin, "name": body.name}):
        token, rec = create_token(store, body.tenant, admin=body.admin, name=body.name)
    return JSONResponse({**rec, "token": token}, status_code=201)


@router.delete("/tokens/{token_id}", summary="Revoke one token (admin)")
def revoke_token(token_id: str, request: Request, p: Principal = Depends(admin)) -> JSONResponse:
    return _revoke(request, p, "token.revoke", token_id, token_id=token_id)


@router.delete("/tenants/{tenant}", summary="Delete a tenant: revoke all its tokens (admin)")
def delete_tenant(tenant: str, request: Request, p: Principal = Depends(admin)) -> JSONResponse:
    return _revoke(request, p, "tenant.delete", tenant, tenant=tenant)


def _revoke(request: Request, p: Principal, action: str, target: str, **which: str) -> JSONResponse:
    store = store_of(request)
    with audited(store, p.actor, action, target):
        out = {"revoked": revoke(store, **which)}
    request.app.state.tokens.clear()  # this process stops trusting them at once
    return JSONResponse(out)


@router.get("/audit", summary="Who changed what, when: newest first (admin)")
def audit(request: Request, p: Principal = Depends(admin), actor: Optional[str] = None, action: Optional[str] = None,
          limit: int = Query(200, ge=1, le=10_000)) -> JSONResponse:
    return JSONResponse({"audit": audit_log(store_of(request), limit=limit, actor=actor, action=action)})
