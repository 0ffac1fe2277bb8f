"""What did a batch run do? One :class:`Outcome` per request tried, one :class:`BatchReport` per run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bandpilot.queue.clock import iso


@dataclass(slots=True)
class Outcome:
    """What a batch did with one request (slots: a long queue makes one per pending request per
    batch - ~3,000 per batch in a 10,000-job simulation - and slots halve their construction)."""

    request_id: str
    tenant: str
    k: int
    status: str  # assigned | deferred | rejected | skipped (taken by a concurrent run)
    reason: str | None = None
    detail: str | None = None
    gpus: list[str] = field(default_factory=list)
    predicted_gbps: float | None = None
    standalone_gbps: float | None = None
    algorithm: str | None = None
    model_version: str | None = None
    search_ms: float | None = None
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "tenant": self.tenant, "k": self.k, "status": self.status,
            "reason": self.reason, "detail": self.detail, "gpus": self.gpus,
            "predicted_gbps": self.predicted_gbps, "standalone_gbps": self.standalone_gbps,
            "algorithm": self.algorithm, "model_version": self.model_version, "search_ms": self.search_ms,
            "time": iso(self.at),
        }


def short_detail(k: int) -> str:
    """The stored detail of a request deferred because fewer than ``k`` GPUs are free."""
    return f"needs {k} GPUs, fewer are free"


@dataclass
class BatchReport:
    """What a batch did, one :class:`Outcome` per request tried (:attr:`outcomes`, in the order tried).

    A long queue defers most of its requests every batch without trying them (fewer GPUs are free
    than they ask for): ~3,000 per batch in a 10,000-job simulation, where building an Outcome for
    each was the batch's largest single cost. Those are recorded in bulk (:meth:`add_quick`: the
    request and the time its stretch of quick deferrals began) and become Outcomes - the same ones,
    in the same place - only when :attr:`outcomes` is read; :meth:`tried` and :meth:`counts` do not
    need them built."""

    batch_id: int | None
    policy: str
    commit: str
    model_uri: str | None
    model_version: str | None
    started_at: float
    finished_at: float = 0.0
    quotas: dict[str, int] | None = None
    pending_before: int = 0
    backfill: str = "greedy"
    reservations: list[dict[str, Any]] = field(default_factory=list)
    preempted: list[dict[str, Any]] = field(default_factory=list)  # plans carried out: gang, victims, detail
    _entries: list[Any] = field(default_factory=list, repr=False)  # Outcome, or the Request of a quick deferral
    _stamps: list[tuple[int, float]] = field(default_factory=list, repr=False)  # (entry index, time) of quick stretches
    _n_quick: int = field(default=0, repr=False)  # quick deferrals not built yet
    _n_quick_all: int = field(default=0, repr=False)  # quick deferrals, built or not
    _tried: list[Outcome] = field(default_factory=list, repr=False)  # the outcomes added with add()

    def add(self, o: Outcome) -> None:
        """Record the outcome of a request tried (the only way in: :attr:`outcomes` is for reading)."""
        self._entries.append(o)
        self._tried.append(o)

    def stamp(self, at: float) -> None:
        """Quick deferrals added from here on happened at ``at``."""
        self._stamps.append((len(self._entries), at))

    def add_quick(self, req: Any) -> None:
        """``req`` (a Request) deferred as ``insufficient_gpus`` without being tried, at the last :meth:`stamp`."""
        self._entries.append(req)
        self._n_quick += 1
        self._n_quick_all += 1

    @property
    def outcomes(self) -> list[Outcome]:
        """Every outcome in the order tried (quick deferrals built here, once)."""
        if self._n_quick:
            self._build_quick()
        return self._entries

    def _build_quick(self) -> None:
        entries, stamps, version = self._entries, self._stamps, self.model_version
        details: dict[int, str] = {}
        si, at = 0, self.started_at
        for i, e in enumerate(entries):
            while si < len(stamps) and stamps[si][0] <= i:
                at = stamps[si][1]
                si += 1
            if type(e) is not Outcome:
                k = e.k
                detail = details.get(k) or details.setdefault(k, short_detail(k))
                entries[i] = Outcome(e.id, e.tenant, k, "deferred", "insufficient_gpus", detail, [], None, None, None,
                                     version, None, at)
        self._n_quick = 0

    def tried(self) -> list[Outcome]:
        """The outcomes of the requests actually tried (every one but the quick deferrals), in order."""
        return list(self._tried)

    @property
    def n_outcomes(self) -> int:
        return len(self._entries)

    def by_status(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def assigned(self) -> list[Outcome]:
        return [o for o in self.tried() if o.status == "assigned"]

    @property
    def deferred(self) -> list[Outcome]:
        return self.by_status("deferred")

    @property
    def rejected(self) -> list[Outcome]:
        return [o for o in self.tried() if o.status == "rejected"]

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("assigned", "deferred", "rejected", "skipped")}
        for o in self._tried:
            out[o.status] = out.get(o.status, 0) + 1
        out["deferred"] += self._n_quick_all
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id, "policy": self.policy, "commit": self.commit,
            "model_uri": self.model_uri, "model_version": self.model_version,
            "started": iso(self.started_at), "duration_s": round(self.duration_s, 4),
            "pending_before": self.pending_before, "counts": self.counts(), "quotas": self.quotas,
            "backfill": self.backfill, "reservations": self.reservations, "preempted": self.preempted,
            "outcomes": [o.to_dict() for o in self.outcomes],
        }
