"""Dispatching evaluation (paper Sec. V-C/D/E): scenarios, GBE / loss / latency, reports, figures.

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

Ground truth
------------
Every dispatcher returns a GPU set ``S``; its value is the TRUE contention-degraded bandwidth
``B(S, τ)``: the contention formula of :mod:`bandpilot.dispatch.contention` evaluated with the truth fabric as
the (perfect) model. ``B*(A, k, τ)`` is the optimum of the same objective, computed ONCE per
scenario and profile with the dispatcher's ``exact`` algorithm on the truth fabric and shared by all
algorithms. Where ``exact`` is not tractable the reference falls back to the best allocation found
by any evaluated algorithm (the paper's *best-found* ``B̃*``) and the report says how often.

Metrics (per algorithm, profile, cluster and ``k``)
--------------------------------------------------
* ``GBE = B(S_sol, τ) / B*`` (Eq. 7). ``k = 1`` has ``B* = 0`` (a single GPU has no collective
  bandwidth): GBE is defined as 1 for every algorithm, and k = 1 is included in the means (as in
  the paper, whose means run over k = 1..32).
* ``L(S, τ) = B(S) − B(S, τ)`` in GB/s (Eq. 8).
* search latency (ms) and model evaluations per request, as reported by the dispatcher.

Algorithms: BandPilot (hybrid EHA + PTS on the evaluated model), EHA and PTS alone (ablation,
Fig. 9), Ideal-BP (the same hybrid search on the TRUE bandwidth: the gap to BandPilot is the cost
of model error), and the baselines Topo, Default and Random (which ignore ``τ``, so their choice is
computed once per scenario and re-scored under each profile). The baselines never consult the
model to choose, so they run on a dispatcher over the truth fabric: their latency is the selection
logic plus a cheap numpy prediction, not a surrogate call.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, load_cluster, resolve_spec
from bandpilot.errors import BandPilotError, ModelError, SpecError
from bandpilot.dispatch.state import Job, State

PROFILES = ("idle", "moderate", "heavy")
#: Every algorithm an evaluation can run, in report order.
ALGORITHMS = ("bandpilot", "eha", "pts", "ideal", "topo", "default", "random")
LABELS = {
    "bandpilot": "BandPilot",
    "eha": "EHA",
    "pts": "PTS",
    "ideal": "Ideal-BP",
    "topo": "Topo",
    "default": "Default",
    "random": "Random",
    "exact": "Exact",
}
#: Algorithms that ignore the traffic profile: one selection per scenario, scored under each profile.
PROFILE_BLIND = frozenset({"topo", "default", "random"})
#: Algorithms that search with the TRUE bandwidth (the truth fabric) instead of the evaluated model.
ORACLE = frozenset({"ideal", "exact"})
RHO_RANGE = (0.25, 0.75)
MAX_JOB_GPUS = 8
SPAN_PROBABILITY = 0.5
SCENARIOS_FILE = "scenarios.jsonl"
RESULTS_FILE = "results.csv"
REPORT_FILE = "report.md"
META_FILE = "evaluation.json"
#: Relative slack before "an algorithm beat the exact optimum" counts as an exact-search failure.
EXACT_SLACK = 1e-9


class EvaluationError(BandPilotError):
    """An evaluation cannot run as asked (no scenarios, unknown profile, cluster mismatch)."""


# ------------------------------------------------------------------------------------------
# configuration
def _params_dirs() -> list[Path]:
    from bandpilot.config import SOURCE_ROOT, project_root

    out = [project_root() / "params", SOURCE_ROOT / "params"]
    return [p for i, p in enumerate(out) if p not in out[:i]]


def load_params(name: str = "evaluate.yaml", path: str | Path | None = None) -> dict[str, Any]:
    """A YAML params file (``params/evaluate.yaml`` by default); a missing default file is ``{}``."""
    import yaml

    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"params file not found: {p}")
        cands = [p]
    else:
        cands = [d / name for d in _params_dirs() if (d / name).is_file()]
        if not cands:
            return {}
    try:
        doc = yaml.safe_load(cands[0].read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{cands[0]}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{cands[0]}: expected a mapping")
    return doc


def evaluate_defaults() -> dict[str, Any]:
    """``profiles``, ``repeats``, ``seed``, ``workers`` from ``params/evaluate.yaml`` over built-ins."""
    base = {"profiles": list(PROFILES), "repeats": 50, "seed": 0, "workers": 0, "algorithms": list(ALGORITHMS)}
    doc = load_params("evaluate.yaml")
    unknown = set(doc) - set(base)
    if unknown:
        raise SpecError(f"params/evaluate.yaml: unknown keys {sorted(unknown)}")
    base.update({k: v for k, v in doc.items() if v is not None})
    return base


def resolve_cluster(value: str | Path | ClusterSpec) -> ClusterSpec:
    """A spec file, a measurement directory, or the name of an embedded default (``h100``)."""
    if isinstance(value, ClusterSpec):
        return value
    return load_cluster(resolve_spec(value))


def check_same_cluster(model_spec: ClusterSpec, other: ClusterSpec, what: str = "truth cluster") -> None:
    """The model's cluster and ``other`` must have the same hosts (names, order, GPU types and counts, topology)."""
    a = [(h.name, h.gpu, h.n_gpus, h.topology.links, h.topology.nvlinks) for h in model_spec.hosts]
    b = [(h.name, h.gpu, h.n_gpus, h.topology.links, h.topology.nvlinks) for h in other.hosts]
    if a == b:
        return
    src = f" ({other.path})" if other.path else ""
    diff = ""
    if [x[0] for x in a] != [x[0] for x in b]:
        diff = f"hosts {_brief([x[0] for x in b])} vs the model's {_brief([x[0] for x in a])}"
    else:
        i = next(i for i in range(len(a)) if a[i] != b[i])
        if a[i][1:3] != b[i][1:3]:
            diff = f"host {a[i][0]!r} is {b[i][1]} x{b[i][2]} there but {a[i][1]} x{a[i][2]} in the model"
        else:
            diff = f"host {a[i][0]!r} has a different intra-host topology (nvidia-smi topo -m) than in the model"
    raise ModelError(
        f"{what} {other.name!r}{src} does not match the model's cluster {model_spec.name!r}: {diff}"
    )


def _brief(names: Sequence[str], n: int = 4) -> str:
    s = ",".join(names[:n])
    return f"[{s}{',...' if len(names) > n else ''}] ({len(names)})"


def resolve_truth(model_spec: Any, *, truth: Any = None, cluster: Any = None) -> Any:
    """The ground-truth fabric: ``truth`` (a measurement directory / spec / fabric), else the
    ``cluster`` spec's fabric, else the embedded default of the model's cluster name, else the
    emulator of the spec embedded in the model. Every one must match the model's hosts."""
    from bandpilot.fabric.base import Fabric
    from bandpilot.fabric.emulator import make_fabric

    if cluster is not None:
        cspec = resolve_cluster(cluster)
        check_same_cluster(model_spec, cspec, "--cluster spec")
    else:
        cspec = None
    if truth is not None:
        if isinstance(truth, Fabric):
            fab = truth
        else:
            tspec = resolve_cluster(truth)
            check_same_cluster(model_spec, tspec, "truth cluster")
            fab = make_fabric(tspec)
        check_same_cluster(model_spec, fab.spec, "truth cluster")
        return fab
    if cspec is not None:
        return make_fabric(cspec)
    try:
        spec = resolve_cluster(model_spec.name)
        check_same_cluster(model_spec, spec, "embedded cluster")
    except BandPilotError:
        spec = model_spec
    return make_fabric(spec)


def check_profiles(profiles: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(profiles, str):
        profiles = [p.strip() for p in profiles.split(",") if p.strip()]
    out = tuple(dict.fromkeys(profiles))
    if not out:
        raise EvaluationError("no traffic profiles to evaluate (choose from idle, moderate, heavy)")
    bad = [p for p in out if p not in PROFILES]
    if bad:
        raise EvaluationError(f"unknown traffic profile(s) {bad}; choose from {list(PROFILES)}")
    return out


def check_algorithms(algorithms: Iterable[str] | str | None) -> tuple[str, ...]:
    if algorithms is None:
        return ALGORITHMS
    if isinstance(algorithms, str):
        algorithms = [a.strip() for a in algorithms.split(",") if a.strip()]
    out = tuple(dict.fromkeys(a.lower() for a in algorithms))
    bad = [a for a in out if a not in ALGORITHMS]
    if bad or not out:
        raise EvaluationError(f"unknown algorithm(s) {bad}; choose from {list(ALGORITHMS)}")
    return out


# ------------------------------------------------------------------------------------------
# scenarios
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
    out = []
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


# ------------------------------------------------------------------------------------------
# per-process context and the per-scenario kernel
@dataclass
class _Ctx:
    model: Any
    truth: Any
    spec: ClusterSpec
    profiles: tuple[str, ...]
    algorithms: tuple[str, ...]
    seed: int
    exact: bool
    dispatcher: Any = None
    references: dict[tuple[int, str], tuple[float, str]] | None = None
    oracle: Any = None  # a Dispatcher on the truth fabric: Ideal-BP, Exact and the model-free baselines

    def __post_init__(self) -> None:
        if self.dispatcher is None:
            self.dispatcher = _make_dispatcher(self.model, self.seed)
        if self.oracle is None:
            from bandpilot.dispatch.dispatcher import Dispatcher

            self.oracle = Dispatcher(self.truth, seed=self.seed)


_CTX: _Ctx | None = None


def load_model(model: Any) -> Any:
    """A model object (spec / stage1 / predict_masks), a Dispatcher (its model), or a URI / path."""
    if isinstance(model, (str, Path)):
        from bandpilot.model.surrogate import Surrogate

        return Surrogate.load(str(model))
    if hasattr(model, "select") and hasattr(model, "model"):
        return model.model
    for attr in ("spec", "stage1", "predict_masks"):
        if not hasattr(model, attr):
            raise ModelError(f"{type(model).__name__} is not a bandwidth model (missing {attr!r})")
    return model


def _make_dispatcher(model: Any, seed: int) -> Any:
    from bandpilot.dispatch.dispatcher import Dispatcher

    return Dispatcher(TimedModel(model), seed=seed)


def _init_worker(model: Any, truth: Any, profiles: tuple[str, ...], algorithms: tuple[str, ...], seed: int,
                 exact: bool, references: dict | None, threads: int) -> None:
    """Process-pool initializer: load the model ONCE per worker."""
    global _CTX
    os.environ["OMP_NUM_THREADS"] = str(threads)
    m = load_model(model)
    if "torch" in sys.modules:  # only a torch model pays for torch; set its threads after loading
        sys.modules["torch"].set_num_threads(threads)
    _CTX = _Ctx(m, truth, truth.spec, profiles, algorithms, seed, exact, references=references)


def _run_chunk(scenarios: list[Scenario]) -> tuple[list[dict[str, Any]], float]:
    """One chunk in a worker: its rows and the CPU seconds the worker spent on it."""
    assert _CTX is not None, "worker not initialised"
    c0 = time.process_time()
    rows: list[dict[str, Any]] = []
    for sc in scenarios:
        rows.extend(evaluate_scenario(_CTX, sc))
    return rows, time.process_time() - c0


def _select(ctx: _Ctx, k: int, state: State, algorithm: str, seed: int = 0) -> Any:
    if algorithm in ORACLE:
        return ctx.oracle.select(k, state, algorithm=algorithm, fabric=ctx.truth)
    if algorithm in PROFILE_BLIND:
        # Topo / Default / Random never consult the model to choose; the dispatcher only predicts
        # the chosen set for its report, so run them on the truth fabric (a cheap numpy predictor).
        # Random is seeded by the scenario, so a replayed scenarios.jsonl gives the same draw.
        from bandpilot.dispatch.dispatcher import Dispatcher

        d = Dispatcher(ctx.truth, seed=seed) if algorithm == "random" else ctx.oracle
        return d.select(k, state, algorithm=algorithm)
    if ctx.dispatcher.spec is not state.spec:  # same hosts (checked), possibly another name: the model's view
        state = State(ctx.dispatcher.spec, state.free, state.jobs)
    timed = ctx.dispatcher.model
    if isinstance(timed, TimedModel):
        timed.reset()
    sel = ctx.dispatcher.select(k, state, algorithm=algorithm)
    if isinstance(timed, TimedModel):
        sel.predict_ms = timed.elapsed_ms  # type: ignore[attr-defined]
    return sel


class TimedModel:
    """A model proxy that accumulates the wall time spent in ``predict_masks`` (Fig. 8 breakdown)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.spec = model.spec
        self.stage1 = model.stage1
        self.elapsed_ms = 0.0

    def reset(self) -> None:
        self.elapsed_ms = 0.0

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return self._model.predict_masks(masks)
        finally:
            self.elapsed_ms += (time.perf_counter() - t0) * 1e3

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _sel_fields(sel: Any) -> dict[str, Any]:
    return {
        "predicted_gbps": float(sel.predicted_gbps),
        "search_ms": float(sel.search_ms),
        "predict_ms": float(getattr(sel, "predict_ms", math.nan)),
        "evaluations": int(sel.evaluations),
    }


def evaluate_scenario(ctx: _Ctx, sc: Scenario) -> list[dict[str, Any]]:
    """Every algorithm (and the exact reference) on one scenario under every profile -> rows."""
    from bandpilot.dispatch.contention import ContentionPredictor
    from bandpilot.dispatch.dispatcher import IntractableError

    spec = ctx.spec
    k = sc.k
    rows: list[dict[str, Any]] = []
    blind: dict[str, tuple[np.ndarray, dict[str, Any]]] = {}
    n_cross = 0
    for p_i, profile in enumerate(ctx.profiles):
        state = sc.state(spec, profile)
        if p_i == 0:
            n_cross = sum(1 for j in state.jobs if j.cross_host)
        names: list[str] = []
        masks: list[np.ndarray] = []
        info: list[dict[str, Any]] = []
        exact_ok = False
        need_exact = ctx.exact and not (ctx.references and (sc.id, profile) in ctx.references)
        if need_exact and k >= 2:
            try:
                sel = _select(ctx, k, state, "exact")
            except IntractableError:
                sel = None
            if sel is not None:
                names.append("exact")
                masks.append(np.asarray(sel.mask, dtype=np.int64))
                info.append(_sel_fields(sel))
                exact_ok = True
        for alg in ctx.algorithms:
            if alg in PROFILE_BLIND and alg in blind:
                m, f = blind[alg]
            else:
                sel = _select(ctx, k, state, alg, sc.seed)
                m, f = np.asarray(sel.mask, dtype=np.int64), _sel_fields(sel)
                if alg in PROFILE_BLIND:
                    blind[alg] = (m, f)
            names.append(alg)
            masks.append(m)
            info.append(f)
        arr = np.array(masks, dtype=np.int64).reshape(len(masks), spec.n_hosts)
        truth_pred = ContentionPredictor(ctx.truth, state).predict(arr)
        b_tau, b_alone = truth_pred.value, truth_pred.standalone
        ref_kind = "exact"
        if k == 1:
            best = 0.0
            ref_kind = "k=1"
        elif ctx.references and (sc.id, profile) in ctx.references:
            best, ref_kind = ctx.references[(sc.id, profile)]
            best = float(best)
        elif exact_ok:
            best = float(b_tau[0])
        else:
            best = float(b_tau.max()) if b_tau.size else 0.0
            ref_kind = "best-found"
        top = float(b_tau.max()) if b_tau.size else 0.0
        violation = ref_kind == "exact" and top > best * (1 + EXACT_SLACK) + 1e-9
        if violation:
            best = top  # an algorithm beat "exact": keep GBE <= 1 and report it
        for i, alg in enumerate(names):
            gbe = 1.0 if (k == 1 or best <= 0) else float(b_tau[i]) / best
            rows.append(
                {
                    "scenario": sc.id,
                    "k": k,
                    "repeat": sc.repeat,
                    "n_free": sc.n_free,
                    "n_jobs": len(sc.jobs),
                    "n_cross_jobs": n_cross,
                    "profile": profile,
                    "algorithm": alg,
                    "gpus": ",".join(spec.from_mask(arr[i])),
                    "n_hosts": int((arr[i] != 0).sum()),
                    "b_tau": float(b_tau[i]),
                    "b_alone": float(b_alone[i]),
                    "loss": float(b_alone[i] - b_tau[i]),
                    "best_gbps": best,
                    "reference": ref_kind,
                    "exact_violation": bool(violation),
                    "gbe": gbe,
                    **info[i],
                }
            )
    return rows


# ------------------------------------------------------------------------------------------
# result
@dataclass
class EvaluationResult:
    """Rows (one per scenario x profile x algorithm, plus ``exact`` reference rows) and summaries."""

    cluster: str
    fingerprint: str
    model_uri: str | None
    model_name: str | None
    model_version: str | None
    truth: str
    profiles: tuple[str, ...]
    algorithms: tuple[str, ...]
    repeats: int
    seed: int
    scenarios: list[Scenario]
    rows: Any  # pandas.DataFrame
    elapsed_s: float
    workers: int
    out_dir: Path | None = None
    notes: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU seconds of the scenario kernels summed over workers (load-independent cost)

    # -- summaries ---------------------------------------------------------------------------
    @property
    def frame(self) -> Any:
        """Rows of the evaluated algorithms (without the ``exact`` reference rows)."""
        return self.rows[self.rows["algorithm"] != "exact"]

    @property
    def n_scenarios(self) -> int:
        return len(self.scenarios)

    def reference_counts(self) -> dict[str, int]:
        """How many (scenario, profile) references are exact / best-found / k=1."""
        ref = self.rows.drop_duplicates(["scenario", "profile"])["reference"]
        return {str(k): int(v) for k, v in ref.value_counts().items()}

    @property
    def exact_everywhere(self) -> bool:
        return "best-found" not in self.reference_counts()

    def gbe_table(self) -> Any:
        """Mean GBE (%) with algorithms as rows and profiles as columns (paper Table II)."""
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="gbe", aggfunc="mean") * 100.0
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def gbe(self, profile: str, algorithm: str = "bandpilot") -> float:
        f = self.frame
        sel = f[(f["profile"] == profile) & (f["algorithm"] == algorithm)]["gbe"]
        return float(sel.mean()) if len(sel) else math.nan

    def gbe_by_k(self) -> Any:
        """Mean GBE (%) per (profile, k) with algorithms as columns (data behind Fig. 6 / Fig. 9)."""
        f = self.frame
        t = f.pivot_table(index=["profile", "k"], columns="algorithm", values="gbe", aggfunc="mean") * 100.0
        t = t.reindex(columns=[a for a in self.algorithms if a in t.columns])
        return t.reindex(index=[(p, k) for p in self.profiles for k in sorted(f["k"].unique())])

    def by_k(self) -> Any:
        """Long table: mean GBE, loss, latency and model evaluations per (profile, k, algorithm)."""
        f = self.rows
        g = f.groupby(["profile", "k", "algorithm"], sort=False).agg(
            requests=("gbe", "size"), gbe=("gbe", "mean"), gbe_min=("gbe", "min"), b_tau=("b_tau", "mean"),
            loss=("loss", "mean"), search_ms=("search_ms", "mean"), evaluations=("evaluations", "mean"),
        ).reset_index()
        order = {a: i for i, a in enumerate([*self.algorithms, "exact"])}
        porder = {p: i for i, p in enumerate(self.profiles)}
        g = g.sort_values(["profile", "k", "algorithm"], key=lambda c: c.map(porder) if c.name == "profile" else (
            c.map(order) if c.name == "algorithm" else c)).reset_index(drop=True)
        return g

    def min_gbe_table(self) -> Any:
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="gbe", aggfunc="min") * 100.0
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def loss_table(self) -> Any:
        """Mean bandwidth loss L(S, τ) in GB/s (paper Fig. 7)."""
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="loss", aggfunc="mean")
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def latency_table(self) -> Any:
        """Search latency (ms: mean, p50, p95, max) and model evaluations per request, per algorithm."""
        import pandas as pd

        f = self.rows
        out = []
        for alg in [*self.algorithms, "exact"]:
            s = f[f["algorithm"] == alg]
            if alg in PROFILE_BLIND:
                s = s.drop_duplicates("scenario")
            if not len(s):
                continue
            ms = s["search_ms"].to_numpy(dtype=float)
            out.append(
                {
                    "algorithm": alg,
                    "requests": int(len(s)),
                    "mean_ms": float(np.nanmean(ms)),
                    "predict_ms": float(np.nanmean(s["predict_ms"])) if s["predict_ms"].notna().any() else math.nan,
                    "p50_ms": float(np.nanpercentile(ms, 50)),
                    "p95_ms": float(np.nanpercentile(ms, 95)),
                    "max_ms": float(np.nanmax(ms)),
                    "mean_evaluations": float(s["evaluations"].mean()),
                    "max_evaluations": int(s["evaluations"].max()),
                }
            )
        return pd.DataFrame(out).set_index("algorithm")

    def metrics(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``gbe_<profile>`` is BandPilot's mean GBE (fraction)."""
        out: dict[str, float] = {}
        g = self.gbe_table() / 100.0
        lo = self.loss_table()
        for p in self.profiles:
            for a in g.index:
                v = g.loc[a, p]
                if not math.isnan(v):
                    out[f"gbe_{p}" if a == "bandpilot" else f"gbe_{p}_{a}"] = float(v)
                lv = lo.loc[a, p]
                if not math.isnan(lv):
                    out[f"loss_{p}" if a == "bandpilot" else f"loss_{p}_{a}"] = float(lv)
            if "bandpilot" in g.index and "ideal" in g.index:
                out[f"gbe_gap_ideal_{p}"] = float(g.loc["ideal", p] - g.loc["bandpilot", p])
        lat = self.latency_table()
        for a in lat.index:
            suffix = "" if a == "bandpilot" else f"_{a}"
            out[f"search_ms_mean{suffix}"] = float(lat.loc[a, "mean_ms"])
            out[f"search_ms_p95{suffix}"] = float(lat.loc[a, "p95_ms"])
            out[f"evaluations_mean{suffix}"] = float(lat.loc[a, "mean_evaluations"])
        if "bandpilot" in self.algorithms:
            out["gbe_mean"] = float(np.nanmean([g.loc["bandpilot", p] for p in self.profiles]))
        refs = self.reference_counts()
        total = max(sum(refs.values()), 1)
        out["reference_exact_fraction"] = (refs.get("exact", 0) + refs.get("k=1", 0)) / total
        out["n_scenarios"] = float(self.n_scenarios)
        out["evaluation_seconds"] = float(self.elapsed_s)
        out["evaluation_cpu_seconds"] = float(self.cpu_s)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "fingerprint": self.fingerprint,
            "model_uri": self.model_uri,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "truth": self.truth,
            "profiles": list(self.profiles),
            "algorithms": list(self.algorithms),
            "repeats": self.repeats,
            "seed": self.seed,
            "scenarios": self.n_scenarios,
            "ks": sorted({s.k for s in self.scenarios}),
            "references": self.reference_counts(),
            "elapsed_s": round(self.elapsed_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "workers": self.workers,
            "notes": self.notes,
            "gbe": {p: self.gbe(p) for p in self.profiles} if "bandpilot" in self.algorithms else {},
        }

    # -- outputs -----------------------------------------------------------------------------
    def write(self, out_dir: str | Path, *, figures: bool = True) -> Path:
        """Report directory: Markdown, CSV tables, scenarios.jsonl, figures, evaluation.json."""
        return write_report(self, out_dir, figures=figures)

    def log_to_mlflow(self, run_id: str | None = None, *, artifact_path: str | None = None,
                      experiment: str = "bandpilot-evaluation") -> str:
        return log_to_mlflow(self, run_id, artifact_path=artifact_path, experiment=experiment)


# ------------------------------------------------------------------------------------------
def evaluate(
    model: Any,
    truth_fabric: Any = None,
    *,
    profiles: Iterable[str] | str = PROFILES,
    repeats: int = 50,
    seed: int = 0,
    workers: int = 0,
    out_dir: str | Path | None = None,
    progress: bool = False,
    algorithms: Iterable[str] | str | None = None,
    scenarios: Sequence[Scenario] | str | Path | None = None,
    ks: Iterable[int] | None = None,
    exact: bool = True,
    reference: "EvaluationResult | None" = None,
    figures: bool = True,
    progress_callback: Callable[[int, int], None] | None = None,
    start_method: str | None = None,
) -> EvaluationResult:
    """Evaluate ``model`` against ``truth_fabric`` on seeded availability scenarios.

    ``model``: an object with ``spec``/``stage1``/``predict_masks`` (a Surrogate, or a fabric =
    perfect model), a Dispatcher, or a URI/path for :meth:`Surrogate.load`. ``truth_fabric``: any
    fabric of the same cluster (default: ``make_fabric(model.spec)``, the emulator of the model's
    embedded spec). ``workers`` > 1 runs scenario chunks in a process pool whose initializer loads
    the model once per worker (0 = ``min(2, cpu_count)``; start method: :func:`_start_method`). ``scenarios`` (list or a
    ``scenarios.jsonl``) replays an earlier run exactly; ``reference`` reuses another result's
    exact optima on the same scenarios (promotion: champion vs candidate). ``out_dir`` writes the
    report there. Nothing here talks to MLflow: see :func:`log_to_mlflow`.
    """
    import pandas as pd

    from bandpilot.fabric.emulator import make_fabric

    t0 = time.perf_counter()
    uri = str(model) if isinstance(model, (str, Path)) else getattr(model, "uri", None)
    m = load_model(model)
    if truth_fabric is None:
        truth_fabric = make_fabric(m.spec)
    elif isinstance(truth_fabric, (str, Path, ClusterSpec)):
        truth_fabric = make_fabric(resolve_cluster(truth_fabric))
    spec = truth_fabric.spec
    check_same_cluster(m.spec, spec, "truth cluster")
    profiles = check_profiles(profiles)
    algorithms = check_algorithms(algorithms)
    notes: list[str] = []
    if reference is not None:
        scenarios = reference.scenarios
        if reference.fingerprint != spec.fingerprint() and reference.cluster != spec.name:
            raise EvaluationError(f"reference evaluation is for cluster {reference.cluster!r}, not {spec.name!r}")
        missing = set(profiles) - set(reference.profiles)
        if missing:
            raise EvaluationError(f"reference evaluation lacks profile(s) {sorted(missing)}")
    if scenarios is None:
        scen = make_scenarios(spec, truth_fabric, repeats=repeats, seed=seed, ks=ks)
    elif isinstance(scenarios, (str, Path)):
        scen = load_scenarios(scenarios, spec)
        notes.append(f"scenarios replayed from {scenarios}")
    else:
        scen = list(scenarios)
    if not scen:
        raise EvaluationError("zero scenarios to evaluate")
    reps = max(s.repeat for s in scen) + 1
    refs = None
    if reference is not None:
        r = reference.rows.drop_duplicates(["scenario", "profile"])
        refs = {(int(a), str(b)): (float(c), str(d))
                for a, b, c, d in zip(r["scenario"], r["profile"], r["best_gbps"], r["reference"])}
    n_workers = int(workers) if workers else min(2, os.cpu_count() or 1)
    n_workers = max(1, min(n_workers, len(scen)))
    threads = 1 if n_workers > 1 else int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    init = (m, truth_fabric, profiles, algorithms, int(seed), bool(exact), refs, threads)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(scen), desc=f"evaluate {spec.name}", unit="scenario", dynamic_ncols=True)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if bar is not None:
            bar.update(n)
        if progress_callback is not None:
            progress_callback(done, len(scen))

    rows: list[dict[str, Any]] = []
    cpu_s = 0.0
    try:
        if n_workers == 1:
            ctx = _Ctx(m, truth_fabric, spec, profiles, algorithms, int(seed), bool(exact), references=refs)
            c0 = time.process_time()
            for sc in scen:
                rows.extend(evaluate_scenario(ctx, sc))
                tick(1)
            cpu_s = time.process_time() - c0
        else:
            import multiprocessing as mp

            import bandpilot.dispatch.contention  # noqa: F401 - imported before forking: workers import nothing
            import bandpilot.dispatch.dispatcher  # noqa: F401

            n_chunks = min(len(scen), max(n_workers * 16, math.ceil(len(scen) / 32)))  # <= 32 scenarios a chunk
            order = sorted(scen, key=lambda s: (-s.k, s.id))  # big k first: better load balance
            chunks = [order[i::n_chunks] for i in range(n_chunks)]
            with ProcessPoolExecutor(n_workers, mp_context=mp.get_context(_start_method(start_method)), initializer=_init_worker,
                                     initargs=init) as pool:
                futs = {pool.submit(_run_chunk, c): len(c) for c in chunks}
                try:
                    for fut in as_completed(futs):
                        got, cpu = fut.result()
                        rows.extend(got)
                        cpu_s += cpu
                        tick(futs[fut])
                except BaseException:  # a failed chunk (or Ctrl-C): do not wait for the others
                    for fut in futs:
                        fut.cancel()
                    raise
    finally:
        if bar is not None:
            bar.close()
    frame = pd.DataFrame(rows).sort_values(["scenario", "profile", "algorithm"], kind="stable").reset_index(drop=True)
    name = getattr(m, "name", None)
    version = getattr(m, "model_version", None)
    res = EvaluationResult(
        cluster=spec.name,
        fingerprint=spec.fingerprint(),
        model_uri=uri,
        model_name=name,
        model_version=str(version) if version is not None else None,
        truth=_describe_truth(truth_fabric),
        profiles=profiles,
        algorithms=algorithms,
        repeats=reps,
        seed=int(seed),
        scenarios=sorted(scen, key=lambda s: s.id),
        rows=frame,
        elapsed_s=time.perf_counter() - t0,
        workers=n_workers,
        notes=notes,
        cpu_s=cpu_s,
    )
    refc = res.reference_counts()
    if refc.get("best-found"):
        res.notes.append(
            f"exact optimum intractable for {refc['best-found']} of {sum(refc.values())} scenario/profile pairs: "
            "GBE there is relative to the best allocation found by any evaluated algorithm (conservative)"
        )
    viol = int(frame.drop_duplicates(["scenario", "profile"])["exact_violation"].sum()) if len(frame) else 0
    if viol:
        res.notes.append(f"an algorithm beat the 'exact' reference in {viol} scenario/profile pairs (reference raised)")
    if out_dir is not None:
        res.write(out_dir, figures=figures)
    return res


def _start_method(requested: str | None = None) -> str:
    """``fork`` where available (no re-import of ``__main__``, so scripts without a main guard and
    notebooks work, and workers start instantly), else ``spawn``; ``$BANDPILOT_MP_START`` overrides.
    Workers pin torch to one thread, so a forked torch model never enters an OpenMP region."""
    import multiprocessing as mp

    method = requested or os.environ.get("BANDPILOT_MP_START") or ""
    avail = mp.get_all_start_methods()
    if method:
        if method not in avail:
            raise EvaluationError(f"start method {method!r} is not available here ({avail})")
        return method
    return "fork" if "fork" in avail else "spawn"


def _describe_truth(fabric: Any) -> str:
    spec = fabric.spec
    kind = type(fabric).__name__
    where = f" {spec.path}" if spec.path else ""
    return f"{kind}({spec.name}){where}"


def rebase(results: Sequence[EvaluationResult]) -> None:
    """Share one reference across results on the SAME scenarios (in place).

    Exact references are identical already; best-found references become the max over every
    result's allocations, so no side is scored against a weaker reference than the other.
    """
    import pandas as pd

    if len(results) < 2:
        return
    keys = ["scenario", "profile"]
    allrows = pd.concat([r.rows[keys + ["b_tau", "best_gbps"]] for r in results])
    best = allrows.groupby(keys).agg(top=("b_tau", "max"), ref=("best_gbps", "max")).reset_index()
    best["best"] = np.maximum(best["top"], best["ref"])
    for r in results:
        f = r.rows.drop(columns=["best_gbps"]).merge(best[keys + ["best"]], on=keys, how="left")
        f = f.rename(columns={"best": "best_gbps"})
        bf = f["reference"] == "best-found"
        f.loc[bf, "gbe"] = np.where(f.loc[bf, "best_gbps"] > 0, f.loc[bf, "b_tau"] / f.loc[bf, "best_gbps"], 1.0)
        keep = ~bf
        f.loc[keep, "best_gbps"] = r.rows.loc[keep.values, "best_gbps"].values
        r.rows = f


def merge_results(results: Sequence[EvaluationResult]) -> EvaluationResult:
    """One result from evaluations of disjoint scenario subsets (e.g. k-chunks run as separate
    Prefect/Dask tasks) of the same model, truth, profiles and seed."""
    import pandas as pd

    if not results:
        raise EvaluationError("nothing to merge: no evaluation results")
    first = results[0]
    for r in results[1:]:
        same = (r.cluster, r.fingerprint, r.profiles, r.algorithms, r.seed, r.repeats, r.truth)
        if same != (first.cluster, first.fingerprint, first.profiles, first.algorithms, first.seed, first.repeats, first.truth):
            raise EvaluationError("cannot merge evaluations of different models, truths or settings")
    # Scenario ids are per-run counters; (k, repeat) is the identity (the seed derives from it).
    keys = [(sc.k, sc.repeat) for r in results for sc in r.scenarios]
    if len(keys) != len(set(keys)):
        raise EvaluationError("cannot merge evaluations that share scenarios")
    new_id = {key: i for i, key in enumerate(sorted(keys))}
    frames, scen = [], []
    for r in results:
        remap = {sc.id: new_id[(sc.k, sc.repeat)] for sc in r.scenarios}
        f = r.rows.copy()
        f["scenario"] = f["scenario"].map(remap)
        frames.append(f)
        scen.extend(dataclasses.replace(sc, id=remap[sc.id]) for sc in r.scenarios)
    scen.sort(key=lambda sc: sc.id)
    return EvaluationResult(
        cluster=first.cluster, fingerprint=first.fingerprint, model_uri=first.model_uri,
        model_name=first.model_name, model_version=first.model_version, truth=first.truth,
        profiles=first.profiles, algorithms=first.algorithms, repeats=first.repeats, seed=first.seed,
        scenarios=scen, rows=pd.concat(frames, ignore_index=True),
        elapsed_s=max(r.elapsed_s for r in results), workers=sum(r.workers for r in results),
        notes=sorted({n for r in results for n in r.notes}), cpu_s=sum(r.cpu_s for r in results),
    )


# ------------------------------------------------------------------------------------------
# reports
def _fmt(v: Any, digits: int = 1) -> str:
    if isinstance(v, (float, np.floating)):
        return "–" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def markdown_table(df: Any, digits: int = 1, index_label: str | None = None, labels: bool = True) -> str:
    """A DataFrame (or a flat mapping: key | value) as a GitHub Markdown table (no tabulate dependency)."""
    if isinstance(df, Mapping):
        lines = [f"| {index_label or 'key'} | value |", "|---|---|"]
        for key, val in df.items():
            text = json.dumps(val, default=str) if isinstance(val, (dict, list, tuple)) else _fmt(val, digits + 2)
            lines.append(f"| {key} | {text.replace('|', '/')} |")
        return "\n".join(lines)
    idx_name = index_label or (df.index.name or "")
    cols = [str(c) for c in df.columns]
    head = "| " + " | ".join([idx_name, *cols]) + " |"
    sep = "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"
    lines = [head, sep]
    for idx, row in df.iterrows():
        name = LABELS.get(idx, idx) if labels and isinstance(idx, str) else (" / ".join(map(str, idx)) if isinstance(idx, tuple) else str(idx))
        lines.append("| " + " | ".join([str(name), *[_fmt(v, digits) for v in row.tolist()]]) + " |")
    return "\n".join(lines)


def write_report(res: EvaluationResult, out_dir: str | Path, *, figures: bool = True) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cluster": res.cluster,
        "fingerprint": res.fingerprint,
        "seed": res.seed,
        "repeats": res.repeats,
        "profiles": list(res.profiles),
        "rho_range": list(RHO_RANGE),
        "max_job_gpus": MAX_JOB_GPUS,
        "span_probability": SPAN_PROBABILITY,
    }
    save_scenarios(res.scenarios, out / SCENARIOS_FILE, meta)
    res.rows.to_csv(out / RESULTS_FILE, index=False)
    gbe = res.gbe_table()
    gbe_k = res.gbe_by_k()
    loss = res.loss_table()
    lat = res.latency_table()
    mins = res.min_gbe_table()
    gbe.rename(index=LABELS).to_csv(out / "gbe_table.csv", float_format="%.3f")
    gbe_k.rename(columns=LABELS).to_csv(out / "gbe_by_k.csv", float_format="%.3f")
    res.by_k().to_csv(out / "by_k.csv", index=False, float_format="%.4f")
    loss.rename(index=LABELS).to_csv(out / "loss_table.csv", float_format="%.3f")
    lat.rename(index=LABELS).to_csv(out / "latency_table.csv", float_format="%.3f")
    figs: dict[str, Path] = {}
    if figures:
        figs = make_figures(res, out / "figures")
    summary = res.summary()
    summary["metrics"] = res.metrics()
    summary["figures"] = {k: str(v.relative_to(out)) for k, v in figs.items()}
    (out / META_FILE).write_text(json.dumps(summary, indent=1, default=str))
    (out / REPORT_FILE).write_text(_markdown(res, gbe, gbe_k, loss, lat, mins, figs, out))
    res.out_dir = out
    return out


def _markdown(res: EvaluationResult, gbe: Any, gbe_k: Any, loss: Any, lat: Any, mins: Any, figs: dict[str, Path], out: Path) -> str:
    refs = res.reference_counts()
    ref_line = ", ".join(f"{k}: {v}" for k, v in sorted(refs.items()))
    ks = sorted({s.k for s in res.scenarios})
    k_range = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) else ",".join(map(str, ks))
    lines = [
        f"# Dispatching evaluation: {res.cluster}",
        "",
        f"- model: `{res.model_uri or '(in-memory)'}`"
        + (f" ({res.model_name} v{res.model_version})" if res.model_version else ""),
        f"- ground truth: {res.truth}",
        f"- scenarios: {res.n_scenarios} (k = {k_range}, {res.repeats} per k, seed {res.seed}) - `{SCENARIOS_FILE}`",
        f"- profiles: {', '.join(res.profiles)}; algorithms: {', '.join(LABELS[a] for a in res.algorithms)}",
        f"- reference B*: {ref_line}"
        + ("" if res.exact_everywhere else "  **(best-found fallback used: GBE there is conservative)**"),
        f"- wall time: {res.elapsed_s:.1f} s on {res.workers} worker(s) ({res.cpu_s:.0f} CPU-s in the scenario kernels)",
        "",
        "GBE = B(S, τ) / B*(A, k, τ) with the TRUE contention-degraded bandwidth (contention formula on the "
        "truth fabric); B* is the exact optimum of the same objective (dispatcher `exact` on the truth fabric), "
        "computed once per scenario and profile. k = 1 has B* = 0 (no collective bandwidth on one GPU): "
        "GBE := 1 for every algorithm, and k = 1 is included in the means. "
        "Demands: idle d=0, moderate d=ρ·B(S_j) with ρ~U[0.25,0.75], heavy d=B(S_j).",
        "",
    ]
    for n in res.notes:
        lines.append(f"> note: {n}")
    if res.notes:
        lines.append("")
    lines += ["## Mean GBE (%) (Table II)", "", markdown_table(gbe), "", "## Worst-case GBE (%)", "", markdown_table(mins), ""]
    lines += ["## Mean bandwidth loss L(S, τ) = B(S) − B(S, τ) (GB/s) (Fig. 7)", "", markdown_table(loss, 2), ""]
    lines += ["## Search latency and model evaluations per request (Fig. 8)", "",
              markdown_table(lat.drop(columns=["requests"]), 2), ""]
    if figs:
        lines += ["## Figures", ""]
        for key, p in figs.items():
            lines.append(f"![{key}]({p.relative_to(out)})")
            lines.append("")
    lines += ["## Mean GBE (%) per request size k (Fig. 6 / Fig. 9)", ""]
    for p in res.profiles:
        sub = gbe_k.loc[p].rename(columns=LABELS)
        sub.index.name = "k"
        lines += [f"### {p}", "", markdown_table(sub, labels=False), ""]
    lines += ["## Files", "", f"- `{RESULTS_FILE}`: one row per scenario x profile x algorithm (+ `exact` reference rows)",
              "- `gbe_table.csv`, `gbe_by_k.csv`, `loss_table.csv`, `latency_table.csv`; `by_k.csv`: GBE, loss, "
              "latency and model evaluations per profile, k and algorithm",
              f"- `{SCENARIOS_FILE}`: the scenarios (first line: generator settings) - replay with "
              "`bandpilot evaluate --scenarios`", f"- `{META_FILE}`: settings and flat metrics", ""]
    return "\n".join(lines)


_COLORS = {"bandpilot": "#d62728", "ideal": "#2ca02c", "eha": "#ff7f0e", "pts": "#9467bd", "topo": "#1f77b4",
           "default": "#8c564b", "random": "#7f7f7f", "exact": "#000000"}
_MARKERS = {"bandpilot": "o", "ideal": "s", "eha": "^", "pts": "v", "topo": "D", "default": "x", "random": "+"}


def make_figures(res: EvaluationResult, out_dir: str | Path) -> dict[str, Path]:
    """Fig. 6 (GBE vs k, baselines and Ideal-BP), Fig. 7 (loss bars), Fig. 9 (ablation), Fig. 8 (latency)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, Path] = {}
    gk = res.gbe_by_k()
    algs = res.algorithms
    profs = res.profiles

    def curve(ax: Any, p: str, names: Sequence[str], zoom: bool = False) -> None:
        sub = gk.loc[p]
        names = [a for a in names if a in sub.columns]
        for a in names:
            ax.plot(sub.index, sub[a], label=LABELS[a], color=_COLORS[a], marker=_MARKERS.get(a), ms=3, lw=1.2)
        ax.set_xlabel("request size k (GPUs)")
        ax.set_ylabel("mean GBE (%)")
        ax.grid(alpha=0.3)
        lo = float(np.nanmin(sub[names].values)) if names else 0.0
        if zoom:  # BandPilot vs Ideal-BP: the gap is model error, usually a fraction of a point
            ax.set_ylim(bottom=max(0.0, math.floor(lo) - 1.0), top=100.5)
        else:
            ax.set_ylim(bottom=max(0.0, min(40.0, lo - 5)), top=102)

    # Fig. 6: per profile, BandPilot vs baselines and BandPilot vs Ideal-BP
    base = [a for a in ("bandpilot", "topo", "default", "random") if a in algs]
    ideal = [a for a in ("bandpilot", "ideal") if a in algs]
    fig, axes = plt.subplots(len(profs), 2, figsize=(11, 3.2 * len(profs)), squeeze=False)
    for i, p in enumerate(profs):
        curve(axes[i][0], p, base)
        axes[i][0].set_title(f"{res.cluster}, τ = {p}: vs baselines")
        curve(axes[i][1], p, ideal, zoom=True)
        axes[i][1].set_title(f"{res.cluster}, τ = {p}: vs Ideal-BP")
        axes[i][0].legend(fontsize=8, loc="lower left")
        axes[i][1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    figs["gbe_vs_k"] = out / "fig6_gbe_vs_k.png"
    fig.savefig(figs["gbe_vs_k"], dpi=110)
    plt.close(fig)

    # Fig. 7: bandwidth loss bars
    loss = res.loss_table()
    fig, ax = plt.subplots(figsize=(min(10, 2.6 + 2.4 * len(profs)), 3.6))
    w = 0.8 / max(len(loss.index), 1)
    x = np.arange(len(profs))
    for i, a in enumerate(loss.index):
        ax.bar(x + (i - (len(loss.index) - 1) / 2) * w, loss.loc[a].to_numpy(dtype=float), w, label=LABELS[a], color=_COLORS[a])
    ax.set_xticks(x, list(profs))
    ax.set_ylabel("mean loss L(S, τ) (GB/s)")
    ax.set_title(f"{res.cluster}: bandwidth loss to contention")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    figs["loss"] = out / "fig7_loss.png"
    fig.savefig(figs["loss"], dpi=110)
    plt.close(fig)

    # Fig. 9: hybrid-search ablation
    abl = [a for a in ("eha", "pts", "bandpilot") if a in algs]
    if len(abl) >= 2:
        fig, axes = plt.subplots(1, len(profs), figsize=(4.2 * len(profs), 3.4), squeeze=False)
        for i, p in enumerate(profs):
            curve(axes[0][i], p, abl)
            axes[0][i].set_title(f"{res.cluster}, τ = {p}: EHA / PTS / hybrid")
            axes[0][i].legend(fontsize=8, loc="lower left")
        fig.tight_layout()
        figs["ablation"] = out / "fig9_ablation.png"
        fig.savefig(figs["ablation"], dpi=110)
        plt.close(fig)

    # Fig. 8: latency
    f = res.rows
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    for a in [*algs, "exact"]:
        s = f[f["algorithm"] == a]
        if len(s):
            m = s.groupby("k")["search_ms"].mean()
            ax.plot(m.index, m.values, label=LABELS[a], color=_COLORS[a], marker=_MARKERS.get(a), ms=3, lw=1.1)
    ax.set_yscale("log")
    ax.set_xlabel("request size k (GPUs)")
    ax.set_ylabel("mean search time (ms)")
    ax.set_title(f"{res.cluster}: search latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    comp = [a for a in ("eha", "pts", "bandpilot") if a in algs]
    if comp:
        pred = np.array([np.nanmean(f.loc[f["algorithm"] == a, "predict_ms"]) for a in comp])
        tot = np.array([np.nanmean(f.loc[f["algorithm"] == a, "search_ms"]) for a in comp])
        pred = np.nan_to_num(pred)
        xs = np.arange(len(comp))
        ax.bar(xs, pred, 0.6, label="model prediction", color="#d62728")
        ax.bar(xs, np.maximum(tot - pred, 0), 0.6, bottom=pred, label="search logic", color="#1f77b4")
        ax.set_xticks(xs, [LABELS[a] for a in comp])
        ax.set_ylabel("mean time per request (ms)")
        ax.set_title(f"{res.cluster}: search time breakdown")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    figs["latency"] = out / "fig8_latency.png"
    fig.savefig(figs["latency"], dpi=110)
    plt.close(fig)
    return figs


def rich_table(res: EvaluationResult, title: str | None = None) -> Any:
    """The Table II view for the terminal (rich)."""
    from rich.table import Table

    gbe = res.gbe_table()
    loss = res.loss_table()
    t = Table(title=title or f"Mean GBE (%) - {res.cluster} ({res.n_scenarios} scenarios)")
    t.add_column("Algorithm")
    for p in res.profiles:
        t.add_column(f"τ_{p}", justify="right")
    for p in res.profiles:
        t.add_column(f"loss {p} (GB/s)", justify="right")
    for a in gbe.index:
        style = "bold" if a == "bandpilot" else None
        t.add_row(LABELS[a], *[_fmt(gbe.loc[a, p]) for p in res.profiles],
                  *[_fmt(loss.loc[a, p], 2) for p in res.profiles], style=style)
    return t


# ------------------------------------------------------------------------------------------
# MLflow
def log_to_mlflow(res: EvaluationResult, run_id: str | None = None, *, artifact_path: str | None = None,
                  experiment: str = "bandpilot-evaluation") -> str:
    """Metrics, params-as-tags and the report directory on ``run_id`` (the model version's run).

    Without a run id (a model loaded from a path) a new run in ``experiment`` is created.
    Returns the run id used.
    """
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if res.out_dir is None:
        raise EvaluationError("write the report (out_dir) before logging it to MLflow")
    client = MlflowClient()
    if run_id is None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            from bandpilot.model.registry import artifact_root_for

            exp_id = client.create_experiment(experiment, artifact_location=artifact_root_for(mlflow.get_tracking_uri()))
        else:
            exp_id = exp.experiment_id
        run_id = client.create_run(exp_id, run_name=f"evaluate-{res.cluster}").info.run_id
        client.set_terminated(run_id)
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, 0) for k, v in res.metrics().items() if math.isfinite(float(v))]
    for i in range(0, len(metrics), 900):
        client.log_batch(run_id, metrics=metrics[i : i + 900])
    dest = artifact_path or f"evaluation/{res.out_dir.name}"
    client.log_artifacts(run_id, str(res.out_dir), dest)
    tags = {
        "bandpilot.evaluation.core.path": dest,
        "bandpilot.evaluation.core.truth": res.truth[:250],
        "bandpilot.evaluation.core.scenarios": str(res.n_scenarios),
        "bandpilot.evaluation.core.seed": str(res.seed),
        "bandpilot.evaluation.core.reference": "exact" if res.exact_everywhere else "best-found (partial)",
    }
    for k, v in tags.items():
        client.set_tag(run_id, k, v)
    return run_id
