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


@dataclass
class BatchReport:
    batch_id: int | None
    policy: str
    commit: str
    model_uri: str | None
    model_version: str | None
    started_at: float
    finished_at: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    quotas: dict[str, int] | None = None
    pending_before: int = 0
    backfill: str = "greedy"
    reservations: list[dict[str, Any]] = field(default_factory=list)
    preempted: list[dict[str, Any]] = field(default_factory=list)  # plans carried out: gang, victims, detail

    def by_status(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def assigned(self) -> list[Outcome]:
        return self.by_status("assigned")

    @property
    def deferred(self) -> list[Outcome]:
        return self.by_status("deferred")

    @property
    def rejected(self) -> list[Outcome]:
        return self.by_status("rejected")

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("assigned", "deferred", "rejected", "skipped")}
        for o in self.outcomes:
            out[o.status] = out.get(o.status, 0) + 1
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
