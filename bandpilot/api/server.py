"""``bandpilot api``: uvicorn serving the app; SIGTERM/SIGINT finish requests in flight and exit."""

from __future__ import annotations

import signal
import sys
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
    server = _Server(config)
    try:
        server.run()
    finally:
        store.close()
    if server.stopped_by:
        print(f"stopped on {signal.Signals(server.stopped_by).name}", file=sys.stderr, flush=True)


class _Server:  # built lazily: uvicorn is imported only when serving
    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (exit status -15 / 130); a stop
            the service asked for is a clean exit here (status 0)."""

            stopped_by = 0

            def handle_exit(self, sig: int, frame: Any) -> None:
                super().handle_exit(sig, frame)
                self.stopped_by = sig
                self._captured_signals.clear()

        return Server(config)
