"""Bearer-token authentication: 401 without a valid token, 403 for a tenant on an admin call."""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bandpilot.queue.audit import record
from bandpilot.queue.store import Store
from bandpilot.queue.tokens import Principal, authenticate

_bearer = HTTPBearer(auto_error=False, description="`bandpilot tokens create --tenant T` prints one.")


def store_of(request: Request) -> Store:
    return request.app.state.store


def principal(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    p = authenticate(store_of(request), cred.credentials if cred and cred.scheme.lower() == "bearer" else None)
    if p is None:
        raise HTTPException(401, "missing, malformed, unknown or revoked bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.principal = p
    return p


def admin(request: Request, p: Principal = Depends(principal)) -> Principal:
    if not p.admin:
        if request.method not in ("GET", "HEAD"):  # a refused change attempt is audited too
            record(store_of(request), p.actor, f"{request.method} {request.url.path}"[:64], outcome="denied")
        raise HTTPException(403, f"tenant {p.tenant!r}: this call needs an admin token")
    return p
