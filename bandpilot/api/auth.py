"""Bearer-token authentication: 401 without a valid token, 403 for a tenant on an admin call, 429
for a client that keeps presenting bad tokens (:class:`FailedAuth`)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from bandpilot.queue.audit import record
from bandpilot.queue.store import Store
from bandpilot.queue.api_tokens import Principal, authenticate

_bearer = HTTPBearer(auto_error=False, description="`bandpilot tokens create --tenant T` prints one.")


def store_of(request: Request) -> Store:
    return request.app.state.store


def stored_id(p: Principal, rid: str) -> str:
    """The store's id of a request ``p`` submits as ``rid``."""
    return rid if p.admin else f"{p.tenant}:{rid}"


def shown_id(p: Principal, key: str) -> str:
    """The id ``p`` knows a stored request by."""
    return key[len(p.tenant) + 1:] if not p.admin and key.startswith(f"{p.tenant}:") else key


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
        hit = self.cached(token)
        if hit is not None:
            return hit
        return self.remember(token, authenticate(store, token))

    def remember(self, token: str | None, p: Principal | None) -> Principal | None:
        """Record the lookup of ``token`` (a valid one for ``ttl``; an invalid one is forgotten); returns ``p``."""
        if not token or self.ttl <= 0:
            return p
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
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


class FailedAuth:
    """Failed authentications per client address in a fixed window: ``limit`` of them within
    ``window_s`` and the client's next failures answer 429 with ``Retry-After`` after a short delay
    (a valid token still works: clients behind one address are not locked out by a neighbour).
    At most ``max_clients`` addresses are remembered, least recently failed dropped first."""

    def __init__(self, limit: int = 20, window_s: float = 60.0, max_clients: int = 10_000, delay_s: float = 0.5) -> None:
        self.limit, self.window, self.max_clients, self.delay = int(limit), float(window_s), int(max_clients), delay_s
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def failed(self, client: str) -> int:
        """Count one failure; returns seconds until the client is trusted again (0: not slowed down)."""
        now = time.monotonic()
        with self._lock:
            start, n = self._seen.pop(client, (now, 0))
            if now - start > self.window:
                start, n = now, 0
            self._seen[client] = (start, n + 1)
            while len(self._seen) > self.max_clients:
                self._seen.popitem(last=False)
        return max(1, int(start + self.window - now + 1)) if n + 1 > self.limit else 0


async def principal(request: Request, cred: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    # async: a cached token costs no trip through the thread pool (the endpoint itself takes one)
    token = cred.credentials if cred and cred.scheme.lower() == "bearer" else None
    cache: TokenCache = request.app.state.tokens
    p = cache.cached(token)
    if p is None:
        pg = request.app.state.pg  # PostgreSQL: looked up on the event loop (bandpilot.queue.pgasync)
        if pg is not None:
            p = cache.remember(token, await pg.authenticate(token))
        else:
            p = await run_in_threadpool(cache.lookup, store_of(request), token)
    if p is None:
        failures: FailedAuth = request.app.state.auth_failures
        wait = failures.failed(request.client.host if request.client else "?")
        if wait:
            await asyncio.sleep(failures.delay)  # the slow-down: a guessing client waits, no thread does
            raise HTTPException(429, "too many failed authentications from this address; retry later",
                                headers={"Retry-After": str(wait), "WWW-Authenticate": "Bearer"})
        raise HTTPException(401, "missing, malformed, unknown or revoked bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.principal = p
    return p


async def admin(request: Request, p: Principal = Depends(principal)) -> Principal:
    if not p.admin:
        if request.method not in ("GET", "HEAD"):  # a refused change attempt is audited too
            # the route, not the path: repeated attempts at any id coalesce into one row per minute
            route = getattr(request.scope.get("route"), "path", request.url.path)
            await run_in_threadpool(record, store_of(request), p.actor, f"{request.method} {route}"[:64],
                                    outcome="denied", coalesce_s=60)
        raise HTTPException(403, f"tenant {p.tenant!r}: this call needs an admin token")
    return p
