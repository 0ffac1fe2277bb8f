"""``bandpilot api``: uvicorn serving the app; SIGTERM/SIGINT finish requests in flight and exit."""

from __future__ import annotations

from typing import Any


def serve(store_url: str | None, host: str = "127.0.0.1", port: int = 8000, *, workers_timeout: float = 8.0,
          sample_s: float | None = 60.0, log_level: str = "warning", **uvicorn_kw: Any) -> None:
    import uvicorn

    from bandpilot.api.app import create_app
    from bandpilot.queue.store import Store

    store = Store(store_url)
    app = create_app(store, sample_s=sample_s)
    # uvicorn's own handlers: stop accepting, let requests in flight finish (each is one transaction),
    # give up on stragglers after the timeout - well inside a service manager's 10 s stop window.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=workers_timeout, **uvicorn_kw)
    try:
        uvicorn.Server(config).run()
    finally:
        store.close()
