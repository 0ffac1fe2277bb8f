"""The API's own batch loop: requests submitted through the API get assigned without a separate
``bandpilot serve`` or ``bandpilot dispatch`` beside it.

Every ``every`` seconds: if something pending could fit (:func:`nothing_to_place`, two cheap
queries), load the model named by ``model_uri`` (default ``models:/bandpilot-<cluster>@champion``;
reloaded when the alias moves to another version) and run one batch, exactly as ``bandpilot
dispatch`` does. Without a usable model the loop says why in :attr:`BatchLoop.status` (shown by
``/healthz`` and the dashboard) and tries again next tick: the API keeps serving. Batches from the
API and from ``bandpilot serve`` on the same store are safe together (each is one transaction).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from bandpilot import config
from bandpilot.errors import BandPilotError
from bandpilot.queue.store import Store
from bandpilot.queue.views import nothing_to_place

if TYPE_CHECKING:
    from bandpilot.scheduling.profile import SchedulerProfile

log = logging.getLogger("bandpilot.api")


class BatchLoop:
    """A daemon thread running one batch every ``every`` seconds (None or 0: off)."""

    def __init__(self, store: Store, every: float | None, *, model_uri: str | None = None,
                 profile: "SchedulerProfile | str" = "recommended") -> None:
        from bandpilot.scheduling.profile import get_profile

        self.profile = get_profile(profile)
        self.store, self.every, self.model_uri = store, every or None, model_uri
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._loaded: tuple[str, Any] | None = None  # (model version, dispatcher)
        self.status: dict[str, Any] = {"interval_s": self.every, "profile": self.profile.name,
                                       "policy": self.profile.queue_sort, "model": model_uri,
                                       "model_version": None, "last_batch": None, "waiting": None, "error": None}

    def start(self) -> None:
        if self.every:
            self.thread = threading.Thread(target=self._run, name="bandpilot-batches", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.tick()

    def uri(self) -> str:
        return self.model_uri or config.model_uri(self.store.spec.name)

    def _dispatcher(self, uri: str) -> Any:
        from bandpilot.dispatch.dispatcher import Dispatcher
        from bandpilot.model.artifacts import resolve

        version = resolve(uri)[1] if uri.startswith("models:/") else uri
        if self._loaded is None or self._loaded[0] != version:
            self._loaded = (str(version), Dispatcher.load(uri))
            self.status["model_version"] = version
        return self._loaded[1]

    def tick(self) -> dict[str, Any] | None:
        """One step: a batch when something could be placed; returns its report (None: no batch)."""
        from bandpilot.scheduling.batch import run_batch

        try:
            if not self.store.initialized:
                self.status["waiting"] = "the store has no cluster yet"
                return None
            idle = nothing_to_place(self.store)
            self.status["waiting"] = idle
            if idle is not None:
                return None
            uri = self.uri()
            self.status["model"] = uri
            rep = run_batch(self.store, self._dispatcher(uri), self.profile, model_uri=uri).to_dict()
        except BandPilotError as exc:  # no champion yet, a busy store: say so, try again next tick
            if self.status["error"] != str(exc):
                log.warning("batch loop: %s", exc)
            self.status["error"] = str(exc)
            return None
        except Exception as exc:  # the API keeps serving whatever one batch hit
            log.exception("batch loop failed")
            self.status["error"] = f"{exc.__class__.__name__}: {exc}"
            return None
        self.status["error"] = None
        self.status["last_batch"] = {"batch_id": rep.get("batch_id"),
                                     "assigned": sum(o.get("status") == "assigned" for o in rep.get("outcomes", []))}
        return rep

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)  # a batch in flight is one transaction: let it finish
