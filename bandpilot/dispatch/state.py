"""Cluster state: free GPUs and active jobs, in the JSON shape used by files, the API and the queue.

    {"free": ["h100-26:0", ...],
     "jobs": [{"id": "j7", "gpus": ["h100-27:3", "h100-28:1"], "demand_gbps": 41.2}]}

GPUs in neither list are unavailable (down, drained). Internally free GPUs and each job are
per-host mask vectors so the contention predictor and the search stay vectorised.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, popcount
from bandpilot.errors import SpecError, StateError


@dataclass(frozen=True)
class Job:
    id: str
    gpus: tuple[str, ...]
    demand_gbps: float
    mask: np.ndarray = field(repr=False, compare=False)

    @property
    def hosts(self) -> np.ndarray:
        return np.flatnonzero(self.mask)

    @property
    def cross_host(self) -> bool:
        return int((self.mask != 0).sum()) >= 2


@dataclass(frozen=True)
class State:
    """A validated snapshot of one cluster: ``free`` mask vector and active jobs."""

    spec: ClusterSpec
    free: np.ndarray
    jobs: tuple[Job, ...] = ()
    #: what the queue expects of the future (:class:`bandpilot.dispatch.lifetime.Outlook`: run-time
    #: estimates, the arrival mix) for lifetime pricing; None: price against the jobs running now
    outlook: Any = field(default=None, compare=False, repr=False)

    @property
    def n_free(self) -> int:
        return int(popcount(self.free).sum())

    @property
    def free_gpus(self) -> list[str]:
        return self.spec.from_mask(self.free)

    def busy_mask(self) -> np.ndarray:
        out = np.zeros(self.spec.n_hosts, dtype=np.int64)
        for j in self.jobs:
            out |= j.mask
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "free": self.free_gpus,
            "jobs": [{"id": j.id, "gpus": list(j.gpus), "demand_gbps": j.demand_gbps} for j in self.jobs],
        }

    def with_job(self, job_id: str, gpus: list[str], demand_gbps: float) -> "State":
        """The state after assigning ``gpus`` to a new job (they leave the free pool)."""
        mask = self.spec.to_mask(gpus, f"job {job_id!r}")
        if np.any(mask & ~self.free):
            raise StateError(f"job {job_id!r} takes GPUs that are not free")
        job = Job(job_id, tuple(gpus), float(demand_gbps), mask)
        return State(self.spec, self.free & ~mask, self.jobs + (job,))

    def without_job(self, job_id: str) -> "State":
        """The state after a job ends (its GPUs return to the free pool)."""
        keep = [j for j in self.jobs if j.id != job_id]
        if len(keep) == len(self.jobs):
            raise StateError(f"no active job {job_id!r}", code="not_found")
        gone = next(j for j in self.jobs if j.id == job_id)
        return State(self.spec, self.free | gone.mask, tuple(keep))

    @classmethod
    def idle(cls, spec: ClusterSpec) -> "State":
        """Every GPU free, no jobs."""
        return cls(spec, spec.full_masks.copy(), ())

    @classmethod
    def from_dict(cls, spec: ClusterSpec, doc: Mapping[str, Any], source: str = "state") -> "State":
        """Validate a state document: unknown ids, a GPU both free and busy, a GPU in two jobs,
        negative or non-finite demand, duplicate job ids -> :class:`StateError` naming it."""
        if not isinstance(doc, Mapping):
            raise StateError(f"{source}: a state must be an object with 'free' and 'jobs'")
        unknown = set(doc) - {"free", "jobs"}
        if unknown:
            raise StateError(f"{source}: unknown keys {sorted(unknown)}")
        free_list = doc.get("free", [])
        if not isinstance(free_list, list):
            raise StateError(f"{source}: 'free' must be a list of GPU ids")
        try:
            free = spec.to_mask(free_list, f"{source} free")
        except SpecError as exc:
            raise StateError(str(exc)) from None
        jobs_doc = doc.get("jobs", [])
        if not isinstance(jobs_doc, list):
            raise StateError(f"{source}: 'jobs' must be a list")
        owner: dict[str, str] = {}
        jobs: list[Job] = []
        seen: set[str] = set()
        for i, jd in enumerate(jobs_doc):
            where = f"{source} jobs[{i}]"
            if not isinstance(jd, Mapping) or "id" not in jd or "gpus" not in jd:
                raise StateError(f"{where}: a job needs 'id' and 'gpus'")
            jid = str(jd["id"])
            if jid in seen:
                raise StateError(f"{where}: duplicate job id {jid!r}")
            seen.add(jid)
            gpus = jd["gpus"]
            if not isinstance(gpus, list) or not gpus:
                raise StateError(f"{where}: 'gpus' must be a non-empty list")
            demand = jd.get("demand_gbps", 0.0)
            if isinstance(demand, bool) or not isinstance(demand, (int, float)) or not math.isfinite(demand) or demand < 0:
                raise StateError(f"{where}: demand_gbps {demand!r} must be a finite number >= 0")
            try:
                mask = spec.to_mask(gpus, where)
            except SpecError as exc:
                raise StateError(str(exc)) from None
            for g in gpus:
                if g in owner:
                    raise StateError(f"{where}: GPU {g!r} is already in job {owner[g]!r}")
                owner[g] = jid
            if np.any(mask & free):
                g = spec.from_mask(mask & free)[0]
                raise StateError(f"{where}: GPU {g!r} is listed both free and in job {jid!r}")
            jobs.append(Job(jid, tuple(gpus), float(demand), mask))
        return cls(spec, free, tuple(jobs))

    @classmethod
    def load(cls, spec: ClusterSpec, path: str | Path) -> "State":
        return cls.from_dict(spec, read_state_file(path), str(path))


def read_state_file(path: str | Path) -> Any:
    """A state file's JSON document, unchecked: read before a model is loaded, so a missing or
    malformed file is reported at once (:meth:`State.from_dict` checks it against the cluster)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise StateError(f"state file not found: {p}") from None
    except IsADirectoryError:
        raise StateError(f"state file {p} is a directory") from None
    except json.JSONDecodeError as exc:
        raise StateError(f"{p}:{exc.lineno}: invalid JSON ({exc.msg})") from None
