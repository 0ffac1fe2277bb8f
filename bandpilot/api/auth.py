"""Bearer-token authentication: 401 without a valid token, 403 for a tenant on an admin call."""

from __future__ import annotations

import hashlib
import threading
import time

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from bandpilot.queue.audit import record
from bandpilot.queue.store import Store
from bandpilot.queue.api_tokens import Principal, authenticate

_bearer = HTTPBearer(auto_error=False, description="`bandpilot tokens create --tenant T` prints one.")


def store_of(request: Request) -> Store:
    return request.app.state.store


class TokenCache:
    """Valid tokens remembered for ``ttl`` seconds: one indexed lookup per token per ttl instead of per
    request. Revoking through this process's API clears it at once; a revocation made elsewhere (the
    CLI, another worker) takes effect within ``ttl``. Unknown tokens are never cached."""

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = float(ttl)
        self._hits: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def cached(self, token: str | None) -> Principal | None:
        """The principal of a token looked up less than ``ttl`` ago, without touching the store."""
        if not token or self.ttl <= 0:
            return None
        hit = self._hits.get(hashlib.sha256(token.encode()).hexdigest())
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def lookup(self, store: Store, token: str | None) -> Principal | None:
        if not token or self.ttl <= 0:
            return authenticate(store, token)
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._hits.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        p = authenticate(store, token)
        with self._lock:
            if p is None:
                self._hits.pop(key, None)
            else:
                if len(self._hits) > 10_000:  # bounded: drop everything expired
                    self._hits = {k: v for k, v in self._hits.items() if v[1] > now}
                self._hits[key] = (p, now + self.ttl)
        return p

    def clear(self) -> None:
        with self._lock:
            self._hits.clear()


async def principal(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    # async: a cached token costs no trip through the thread pool (the endpoint itself takes one)
    token = cred.credentials if cred and cred.scheme.lower() == "bearer" else None
    cache: TokenCache = request.app.state.tokens
    p = cache.cached(token)
    if p is None:
        p = await run_in_threadpool(cache.lookup, store_of(request), token)
    if p is None:
        raise HTTPException(401, "missing, malformed, unknown or revoked bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.principal = p
    return p


async def admin(request: Request, p: Principal = Depends(principal)) -> Principal:
    if not p.admin:
        if request.method not in ("GET", "HEAD"):  # a refused change attempt is audited too
            await run_in_threadpool(record, store_of(request), p.actor, f"{request.method} {request.url.path}"[:64],
                                    outcome="denied")
        raise HTTPException(403, f"tenant {p.tenant!r}: this call needs an admin token")
    return p
