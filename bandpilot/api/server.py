"""``bandpilot api``: uvicorn serving the app; SIGTERM/SIGINT finish requests in flight and exit 0.

``workers > 1`` runs that many processes on one port (uvicorn's supervisor); each opens its own
store connection pool, so this is for PostgreSQL stores (SQLite serialises writers anyway)."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from bandpilot.config import ENV_NAMES

_ENV = ENV_NAMES["api_config"]  # how worker processes get the store and options
#: uvicorn's httptools protocol with JSON errors for what it cannot parse (bandpilot.api.protocol)
PROTOCOL = "bandpilot.api.protocol:JSONErrorsProtocol"
POOL = 20  # PostgreSQL connections per process: about half of uvicorn's 40 request threads


def app_from_env() -> Any:
    """uvicorn factory for worker processes."""
    from bandpilot.api.app import create_app
    from bandpilot.queue.store import Store

    cfg = json.loads(os.environ[_ENV])
    first = cfg["first"]  # one sampler and one batch loop, not one per process
    return create_app(Store(cfg["store"], pool_size=POOL), sample_s=cfg["sample_s"] if first else None, token_ttl=cfg["token_ttl"],
                      dispatch_s=cfg["dispatch_s"] if first else None, model_uri=cfg["model_uri"], profile=cfg["profile"])


def serve(store_url: str | None, host: str = "127.0.0.1", port: int = 8000, *, workers: int = 1,
          graceful_s: float = 8.0, sample_s: float | None = 60.0, token_ttl: float = 5.0,
          log_level: str = "warning", dispatch_s: float | None = None, model_uri: str | None = None,
          profile: str = "recommended", store: Any = None) -> None:
    """Serve until stopped. ``store``: an open :class:`Store` on ``store_url`` to serve from (one
    process; opening a second costs start-up time), closed at the end."""
    import uvicorn

    from bandpilot.api.app import create_app
    from bandpilot.queue.store import Store

    # ws="none": the API has no websockets, and uvicorn's default imports a websockets stack at start-up
    common: dict[str, Any] = dict(host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=graceful_s,
                  http=PROTOCOL, ws="none")
    if workers > 1:
        os.environ[_ENV] = json.dumps({"store": Store(store_url).url, "sample_s": sample_s, "token_ttl": token_ttl,
                                       "first": True, "dispatch_s": dispatch_s, "model_uri": model_uri, "profile": profile})
        uvicorn.run("bandpilot.api.server:app_from_env", factory=True, workers=workers, **common)
        return
    store = store if store is not None and workers == 1 else Store(store_url, pool_size=POOL)
    # uvicorn's own handlers: stop accepting, let requests in flight finish (each is one transaction),
    # give up on stragglers after graceful_s - well inside a service manager's 10 s stop window.
    server = _server(uvicorn.Config(create_app(store, sample_s=sample_s, token_ttl=token_ttl,
                                                 dispatch_s=dispatch_s, model_uri=model_uri, profile=profile), **common))
    try:
        server.run()
    finally:
        store.close()
    if server.stopped_by:
        print(f"stopped on {signal.Signals(server.stopped_by).name}", file=sys.stderr, flush=True)


def _server(config: Any) -> Any:
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
