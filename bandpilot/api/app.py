"""The FastAPI application: routers, JSON errors, the request guard (body and path caps, control
characters, security headers; :mod:`bandpilot.api.guard`), per-tenant limits, the dashboard page and a
fragmentation sampler. ``create_app(store)`` works on any :class:`Store` (SQLite or PostgreSQL)."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from bandpilot.config import settings
from bandpilot.api import admin, cluster, problems, requests
from bandpilot.api.auth import FailedAuth, TokenCache
from bandpilot.api.fastjson import JSONResponse
from bandpilot.api.batches import BatchLoop
from bandpilot.api.guard import MAX_BODY, Guard, page_csp
from bandpilot.queue.quotas import TenantLimits
from bandpilot.queue.clock import now
from bandpilot.queue.store import Store
from bandpilot.queue.views import sample_fragmentation

FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#24292f"/>'
           '<rect x="3" y="3" width="4" height="4" fill="#2da44e"/><rect x="9" y="3" width="4" height="4" fill="#8250df"/>'
           '<rect x="3" y="9" width="4" height="4" fill="#0969da"/><rect x="9" y="9" width="4" height="4" fill="#2da44e"/></svg>')


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
               model_uri: str | None = None, profile: str = "recommended", max_pending: int | None = None,
               max_pending_gpus: int | None = None, retry_after_s: int = 30, auth_failures: int = 20,
               auth_window_s: float = 60.0, async_db: bool | None = None) -> Any:
    """The API (and dashboard at ``/``) over ``store`` (a Store or a URL). ``token_ttl``: how long a
    valid token is trusted without a lookup (0: every request looks it up). ``dispatch_s``: run a
    batch that often (None: off) with ``model_uri`` (default the cluster's champion) and the scheduler
    ``profile`` (a name or a YAML file).
    Per tenant (admins are
    exempt): at most ``max_pending`` pending requests (``$BANDPILOT_API_MAX_PENDING``, default 100)
    asking for at most ``max_pending_gpus`` GPUs together (``$BANDPILOT_API_MAX_PENDING_GPUS``,
    default twice the cluster); over that, 429 with ``Retry-After: retry_after_s``. A client with
    ``auth_failures`` failed authentications within ``auth_window_s`` is slowed down (429).
    ``async_db``: on PostgreSQL, serve authentication, submit and list over asyncpg on the event
    loop (:mod:`bandpilot.queue.pgasync`; default ``$BANDPILOT_API_ASYNC_DB``, on); the pool opens
    with the app's lifespan, so without it those calls take the request threads as on SQLite."""
    st = store if isinstance(store, Store) else Store(store)
    sampler = _Sampler(st, sample_s)
    batches = BatchLoop(st, dispatch_s, model_uri=model_uri, profile=profile)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import anyio.to_thread

        # Request threads: each holds a store connection for one short transaction; more threads than
        # that only fight over the GIL (anyio's default is 40).
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads or settings().api_threads
        use_async = st.backend == "postgresql" and (settings().api_async_db if async_db is None else async_db)
        if use_async:
            from bandpilot.queue.pgasync import PgAsync

            app.state.pg = await PgAsync.open(st)
        sampler.start()
        batches.start()
        try:
            yield
        finally:
            batches.close()
            sampler.close()
            if app.state.pg is not None:
                await app.state.pg.close()
                app.state.pg = None

    app = FastAPI(
        title="BandPilot", version="0.2", lifespan=lifespan, default_response_class=JSONResponse,
        description="Bandwidth-aware GPU dispatcher: submit gang requests, read assignments, operate the cluster. "
                    "Authenticate with `Authorization: Bearer <token>` (`bandpilot tokens create --tenant T`).",
    )
    app.state.store = st
    app.state.pg = None  # the asyncpg path, opened by the lifespan (PostgreSQL only)
    app.state.tokens = TokenCache(token_ttl)
    app.state.batches = batches
    app.state.auth_failures = FailedAuth(limit=auth_failures, window_s=auth_window_s)
    app.state.limits = TenantLimits(
        max_pending=settings().api_max_pending if max_pending is None else max_pending,
        max_pending_gpus=settings().api_max_pending_gpus if max_pending_gpus is None else max_pending_gpus,
        retry_after_s=retry_after_s)
    problems.install(app)
    for r in (requests.router, cluster.router, admin.router):
        # the routes themselves, not the router: FastAPI's included-router matching walks a wrapper
        # per request (a tenth of the API's CPU under load); these routers carry no own dependencies
        app.router.routes.extend(r.routes)

    @app.get("/healthz", tags=["service"], summary="Liveness and store reachability (no token)")
    def healthz() -> dict[str, Any]:
        st.refresh()  # one small query: the store answers (and a replaced cluster is noticed)
        return {"ok": True, "cluster": st.spec.name, "batches": batches.status}

    page = dashboard_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return page

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:  # browsers ask for it; an SVG answers at any size
        return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    return Guard(app, max_body=max_body, page_policy=page_csp(page))
