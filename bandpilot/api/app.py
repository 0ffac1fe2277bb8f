"""The FastAPI application: routers, JSON errors, a request-body cap, the dashboard page and a
fragmentation sampler. ``create_app(store)`` works on any :class:`Store` (SQLite or PostgreSQL)."""

from __future__ import annotations

import json
import os
import threading
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from bandpilot.api import admin, cluster, problems, requests
from bandpilot.api.auth import TokenCache
from bandpilot.api.batches import BatchLoop
from bandpilot.queue.clock import now
from bandpilot.queue.store import Store
from bandpilot.queue.views import sample_fragmentation

MAX_BODY = 64 * 1024  # a request is a few hundred bytes; anything near this is abuse or a mistake


class BodyLimit:
    """Refuse bodies over ``max_bytes`` with 413 before the app parses them, chunked ones included."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max = app, int(max_bytes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max):
            return await self._too_large(send)
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.max:
                return await self._too_large(send)
            more = msg.get("more_body", False)
        done = False

        async def replay() -> dict[str, Any]:
            nonlocal done
            if not done:
                done = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        data = json.dumps({"error": f"request body over {self.max} bytes", "status": 413}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


class _Sampler:
    """A fragmentation sample every ``every`` seconds (batches add their own), for the dashboard's chart."""

    def __init__(self, store: Store, every: float | None) -> None:
        self.store, self.every = store, every
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every:
            self.thread = threading.Thread(target=self._run, name="bandpilot-fragmentation", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                if self.store.initialized:
                    with self.store.write() as conn:
                        sample_fragmentation(conn, self.store.spec, now())
            except Exception:  # noqa: BLE001 - a busy store skips one sample; the API keeps serving
                continue

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)


def dashboard_html() -> str:
    return resources.files("bandpilot.api").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def create_app(store: Store | str, *, sample_s: float | None = 60.0, max_body: int = MAX_BODY,
               token_ttl: float = 5.0, threads: int | None = None, dispatch_s: float | None = None,
               model_uri: str | None = None, policy: str = "utility") -> Any:
    """The API (and dashboard at ``/``) over ``store`` (a Store or a URL). ``token_ttl``: how long a
    valid token is trusted without a lookup (0: every request looks it up). ``dispatch_s``: run a
    batch that often with ``model_uri`` (default the cluster's champion) and ``policy`` (None: off)."""
    st = store if isinstance(store, Store) else Store(store)
    sampler = _Sampler(st, sample_s)
    batches = BatchLoop(st, dispatch_s, model_uri=model_uri, policy=policy)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        # Request threads: each holds a store connection for one short transaction; more threads than
        # that only fight over the GIL (anyio's default is 40).
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads or int(
            os.environ.get("BANDPILOT_API_THREADS", "12"))
        sampler.start()
        batches.start()
        try:
            yield
        finally:
            batches.close()
            sampler.close()

    app = FastAPI(
        title="BandPilot", version="0.2", lifespan=lifespan,
        description="Bandwidth-aware GPU dispatcher: submit gang requests, read assignments, operate the cluster. "
                    "Authenticate with `Authorization: Bearer <token>` (`bandpilot tokens create --tenant T`).",
    )
    app.state.store = st
    app.state.tokens = TokenCache(token_ttl)
    app.state.batches = batches
    problems.install(app)
    for r in (requests.router, cluster.router, admin.router):
        app.include_router(r)

    @app.get("/healthz", tags=["service"], summary="Liveness and store reachability (no token)")
    def healthz() -> dict[str, Any]:
        st.refresh()  # one small query: the store answers (and a replaced cluster is noticed)
        return {"ok": True, "cluster": st.spec.name, "batches": batches.status}

    page = dashboard_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return page

    return BodyLimit(app, max_body) if max_body else app
