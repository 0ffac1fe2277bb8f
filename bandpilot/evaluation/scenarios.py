"""Which availability scenarios a model is evaluated on: seeded, reproducible, saved and replayed.

What one evaluation is
----------------------
For every request size ``k = 1..N`` (``N`` GPUs in the cluster) and ``R`` repeats, a seeded
*availability scenario*: a random number of GPUs (0..N-k, so at least ``k`` stay free) is busy
with background jobs of mixed sizes (1..8 GPUs; about half of them spread over random hosts, the
others packed on one host). Each job gets an occupancy ``ρ_j ~ U[0.25, 0.75]`` and, per traffic
profile, a demand on the inter-node fabric:

* ``idle``:     ``d_j = 0``
* ``moderate``: ``d_j = ρ_j · B(S_j)``
* ``heavy``:    ``d_j = B(S_j)``

where ``B(S_j)`` is the TRUE standalone bandwidth of the job (the truth fabric), i.e. what
cluster telemetry would report. Scenarios (including the demands) are written to
``scenarios.jsonl`` and can be loaded back (:func:`load_scenarios`) to repeat a run exactly; scenario
``(k, r)`` depends only on ``(seed, k, r)``, so a run with fewer repeats is a prefix of a bigger one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from bandpilot.dispatch.state import Job, State
from bandpilot.errors import BandPilotError
from bandpilot.evaluation.params import PROFILES, EvaluationError
from bandpilot.topology.cluster import ClusterSpec

RHO_RANGE = (0.25, 0.75)
MAX_JOB_GPUS = 8
SPAN_PROBABILITY = 0.5
SCENARIOS_FILE = "scenarios.jsonl"


@dataclass(frozen=True)
class BackgroundJob:
    """One background tenant: its GPUs, occupancy ρ, true standalone bandwidth, demand per profile."""

    id: str
    gpus: tuple[str, ...]
    rho: float
    standalone_gbps: float
    demand_gbps: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "gpus": list(self.gpus),
            "rho": round(self.rho, 6),
            "standalone_gbps": self.standalone_gbps,
            "demand_gbps": dict(self.demand_gbps),
        }


@dataclass(frozen=True)
class Scenario:
    """One availability scenario: request size ``k``, the free GPUs and the background jobs."""

    id: int
    k: int
    repeat: int
    seed: int
    free: tuple[str, ...]
    jobs: tuple[BackgroundJob, ...]

    @property
    def n_free(self) -> int:
        return len(self.free)

    def state(self, spec: ClusterSpec, profile: str) -> State:
        """The cluster snapshot the dispatcher sees under ``profile``."""
        free = spec.to_mask(self.free, f"scenario {self.id} free")
        jobs = tuple(
            Job(j.id, j.gpus, float(j.demand_gbps[profile]), spec.to_mask(j.gpus, f"scenario {self.id} job {j.id}"))
            for j in self.jobs
        )
        return State(spec, free, jobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "k": self.k,
            "repeat": self.repeat,
            "seed": self.seed,
            "free": list(self.free),
            "jobs": [j.to_dict() for j in self.jobs],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], spec: ClusterSpec, source: str = "scenario") -> "Scenario":
        try:
            jobs = tuple(
                BackgroundJob(
                    str(j["id"]),
                    tuple(j["gpus"]),
                    float(j.get("rho", 0.0)),
                    float(j.get("standalone_gbps", 0.0)),
                    {p: float(v) for p, v in dict(j["demand_gbps"]).items()},
                )
                for j in doc.get("jobs", [])
            )
            sc = cls(int(doc["id"]), int(doc["k"]), int(doc.get("repeat", 0)), int(doc.get("seed", 0)),
                     tuple(doc["free"]), jobs)
        except (KeyError, TypeError, ValueError) as exc:
            raise EvaluationError(f"{source}: malformed scenario ({exc.__class__.__name__}: {exc})") from None
        # validates GPU ids, overlaps and demands against the cluster
        for p in PROFILES:
            if all(p in j.demand_gbps for j in jobs):
                try:
                    st = sc.state(spec, p)
                    State.from_dict(spec, st.to_dict(), source)
                except BandPilotError as exc:
                    raise EvaluationError(f"{source}: {exc}") from None
        if sc.k < 1 or sc.k > sc.n_free:
            raise EvaluationError(f"{source}: request size k={sc.k} but {sc.n_free} GPUs are free")
        return sc


def scenario_seed(seed: int, k: int, r: int) -> int:
    """Seed of scenario ``(k, r)``: independent of how many scenarios a run has."""
    return int(np.random.SeedSequence([int(seed), int(k), int(r)]).generate_state(1, np.uint32)[0])


def make_scenario(spec: ClusterSpec, truth: Any, k: int, r: int, seed: int, sid: int) -> Scenario:
    """Scenario ``(k, r)``: ``b ~ U{0..N-k}`` busy GPUs carved into background jobs of mixed sizes."""
    n = spec.n_gpus
    if not 1 <= k <= n:
        raise EvaluationError(f"request size k={k} is outside 1..{n} for cluster {spec.name!r}")
    s = scenario_seed(seed, k, r)
    rng = np.random.default_rng(s)
    n_busy = int(rng.integers(0, n - k + 1))
    host_of = np.repeat(np.arange(spec.n_hosts), spec.gpus_per_host)
    busy = list(rng.permutation(n)[:n_busy])
    jobs_idx: list[list[int]] = []
    while busy:
        size = int(rng.integers(1, min(MAX_JOB_GPUS, len(busy)) + 1))
        if size >= 2 and rng.random() < SPAN_PROBABILITY:
            pick = [busy[i] for i in rng.permutation(len(busy))[:size]]  # random: usually spans hosts
        else:
            hosts = host_of[busy]
            cnt = np.bincount(hosts, minlength=spec.n_hosts)
            h = int(rng.choice(np.flatnonzero(cnt == cnt.max())))
            on = [g for g in busy if host_of[g] == h]
            pick = [on[i] for i in rng.permutation(len(on))[:size]]
        jobs_idx.append(sorted(pick))
        chosen = set(pick)
        busy = [g for g in busy if g not in chosen]
    ids = spec.gpu_ids
    taken = {g for j in jobs_idx for g in j}
    free = tuple(ids[g] for g in range(n) if g not in taken)
    rhos = rng.uniform(*RHO_RANGE, size=len(jobs_idx))
    jobs = []
    if jobs_idx:
        masks = spec.to_masks([[ids[g] for g in j] for j in jobs_idx])
        alone = np.asarray(truth.bandwidth_masks(masks) if hasattr(truth, "bandwidth_masks") else truth.predict_masks(masks), dtype=float)
        for i, j in enumerate(jobs_idx):
            b = float(alone[i])
            jobs.append(
                BackgroundJob(
                    f"bg{i}",
                    tuple(ids[g] for g in j),
                    float(rhos[i]),
                    b,
                    {"idle": 0.0, "moderate": float(rhos[i]) * b, "heavy": b},
                )
            )
    return Scenario(sid, k, r, s, free, tuple(jobs))


def make_scenarios(
    spec: ClusterSpec,
    truth: Any,
    *,
    repeats: int,
    seed: int = 0,
    ks: Iterable[int] | None = None,
) -> list[Scenario]:
    """``repeats`` scenarios for every ``k`` in ``ks`` (default ``1..N``), ids in (k, repeat) order."""
    if repeats is None or int(repeats) < 1:
        raise EvaluationError(f"zero scenarios: repeats must be >= 1 (got {repeats})")
    ks = list(range(1, spec.n_gpus + 1)) if ks is None else sorted(set(int(k) for k in ks))
    if not ks:
        raise EvaluationError("zero scenarios: no request sizes given")
    out: list[Scenario] = []
    for k in ks:
        for r in range(int(repeats)):
            out.append(make_scenario(spec, truth, k, r, seed, len(out)))
    return out


def save_scenarios(scenarios: Sequence[Scenario], path: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
    """One JSON object per line; the first line is ``{"meta": {...}}`` (cluster, seed, repeats)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        fh.write(json.dumps({"meta": dict(meta or {})}) + "\n")
        for s in scenarios:
            fh.write(json.dumps(s.to_dict()) + "\n")
    os.replace(tmp, path)
    return path


def load_scenarios(path: str | Path, spec: ClusterSpec) -> list[Scenario]:
    """Scenarios written by :func:`save_scenarios` (or a report directory containing them)."""
    p = Path(path)
    if p.is_dir():
        p = p / SCENARIOS_FILE
    if not p.is_file():
        raise EvaluationError(f"scenario file not found: {p}")
    out = []
    for ln, raw in enumerate(p.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise EvaluationError(f"{p}:{ln}: invalid JSON ({exc.msg})") from None
        if "meta" in doc and len(doc) == 1:
            cl = (doc["meta"] or {}).get("cluster")
            if cl and cl != spec.name and (doc["meta"] or {}).get("fingerprint") not in (None, spec.fingerprint()):
                raise EvaluationError(f"{p}: scenarios are for cluster {cl!r}, not {spec.name!r}")
            continue
        out.append(Scenario.from_dict(doc, spec, f"{p}:{ln}"))
    if not out:
        raise EvaluationError(f"zero scenarios in {p}")
    return out
