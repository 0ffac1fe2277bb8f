"""How an evaluation runs: the model loaded once per worker, scenario chunks fanned out over a
process pool (or run in-process), their rows gathered into an ``EvaluationResult``."""

from __future__ import annotations

import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from bandpilot.config import portable, settings
from bandpilot.errors import ModelError
from bandpilot.evaluation.params import PROFILES, EvaluationError, check_algorithms, check_profiles
from bandpilot.evaluation.result import EvaluationResult
from bandpilot.evaluation.scenarios import Scenario, load_scenarios, make_scenarios
from bandpilot.evaluation.scoring import ScoringContext, evaluate_scenario
from bandpilot.evaluation.truth import check_same_cluster, resolve_cluster
from bandpilot.progress import stage
from bandpilot.topology.cluster import ClusterSpec


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


_CTX: ScoringContext | None = None


def _init_worker(model: Any, truth: Any, profiles: tuple[str, ...], algorithms: tuple[str, ...], seed: int,
                 exact: bool, references: dict | None, threads: int) -> None:
    """Process-pool initializer: load the model ONCE per worker."""
    global _CTX
    os.environ["OMP_NUM_THREADS"] = str(threads)
    m = load_model(model)
    if "torch" in sys.modules:  # only a torch model pays for torch; set its threads after loading
        sys.modules["torch"].set_num_threads(threads)
    _CTX = ScoringContext(m, truth, truth.spec, profiles, algorithms, seed, exact, references=references)


def _run_chunk(scenarios: list[Scenario]) -> tuple[list[dict[str, Any]], float]:
    """One chunk in a worker: its rows and the CPU seconds the worker spent on it."""
    assert _CTX is not None, "worker not initialised"
    c0 = time.process_time()
    rows: list[dict[str, Any]] = []
    for sc in scenarios:
        rows.extend(evaluate_scenario(_CTX, sc))
    return rows, time.process_time() - c0


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
    t0 = time.perf_counter()
    uri = str(model) if isinstance(model, (str, Path)) else getattr(model, "uri", None)
    m, truth_fabric = _model_and_truth(model, truth_fabric)
    spec = truth_fabric.spec
    profiles = check_profiles(profiles)
    algorithms = check_algorithms(algorithms)
    scen, refs, notes = _scenarios(spec, truth_fabric, profiles, reference, scenarios, repeats, seed, ks)
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
        st.advance(n)
        if bar is not None:
            bar.update(n)
        if progress_callback is not None:
            progress_callback(done, len(scen))

    try:
        with stage(f"evaluate {spec.name}", total=len(scen), unit="scenarios") as st:
            rows, cpu_s = _run(scen, init, n_workers, tick, start_method)
    finally:
        if bar is not None:
            bar.close()
    res = _result(m, uri, truth_fabric, profiles, algorithms, seed, scen, rows, notes, n_workers, cpu_s, t0)
    if out_dir is not None:
        res.write(out_dir, figures=figures)
    return res


def _model_and_truth(model: Any, truth_fabric: Any) -> tuple[Any, Any]:
    """The loaded model and the truth fabric (default: the model's own cluster, emulated or measured)."""
    from bandpilot.fabric.emulator import make_fabric

    m = load_model(model)
    if truth_fabric is None:
        truth_fabric = make_fabric(m.spec)
    elif isinstance(truth_fabric, (str, Path, ClusterSpec)):
        truth_fabric = make_fabric(resolve_cluster(truth_fabric))
    check_same_cluster(m.spec, truth_fabric.spec, "truth cluster")
    return m, truth_fabric


def _scenarios(spec: ClusterSpec, truth_fabric: Any, profiles: tuple[str, ...], reference: "EvaluationResult | None",
               scenarios: Sequence[Scenario] | str | Path | None, repeats: int, seed: int,
               ks: Iterable[int] | None) -> tuple[list[Scenario], dict | None, list[str]]:
    """The scenarios to run (seeded, replayed from a file, or a reference's), the reference's
    optima per (scenario, profile), and notes for the report."""
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
    refs = None
    if reference is not None:
        r = reference.rows.drop_duplicates(["scenario", "profile"])
        refs = {(int(a), str(b)): (float(c), str(d))
                for a, b, c, d in zip(r["scenario"], r["profile"], r["best_gbps"], r["reference"])}
    return scen, refs, notes


def _run(scen: list[Scenario], init: tuple, n_workers: int, tick: Callable[[int], None],
         start_method: str | None) -> tuple[list[dict[str, Any]], float]:
    """Every scenario's rows and the CPU seconds spent: in-process, or in chunks over a process pool."""
    rows: list[dict[str, Any]] = []
    cpu_s = 0.0
    if n_workers == 1:
        m, truth_fabric, profiles, algorithms, seed, exact, refs, _ = init
        ctx = ScoringContext(m, truth_fabric, truth_fabric.spec, profiles, algorithms, seed, exact, references=refs)
        c0 = time.process_time()
        for sc in scen:
            rows.extend(evaluate_scenario(ctx, sc))
            tick(1)
        return rows, time.process_time() - c0
    import multiprocessing as mp

    import bandpilot.dispatch.contention  # imported before forking: workers import nothing
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
    return rows, cpu_s


def _result(m: Any, uri: str | None, truth_fabric: Any, profiles: tuple[str, ...], algorithms: tuple[str, ...],
            seed: int, scen: list[Scenario], rows: list[dict[str, Any]], notes: list[str], n_workers: int,
            cpu_s: float, t0: float) -> EvaluationResult:
    """The rows as an :class:`EvaluationResult`, with notes on where the reference was not exact."""
    import pandas as pd

    spec = truth_fabric.spec
    frame = pd.DataFrame(rows).sort_values(["scenario", "profile", "algorithm"], kind="stable").reset_index(drop=True)
    version = getattr(m, "model_version", None)
    res = EvaluationResult(
        cluster=spec.name,
        fingerprint=spec.fingerprint(),
        model_uri=uri,
        model_name=getattr(m, "name", None),
        model_version=str(version) if version is not None else None,
        truth=_describe_truth(truth_fabric),
        profiles=profiles,
        algorithms=algorithms,
        repeats=max(s.repeat for s in scen) + 1,
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
    return res


def _start_method(requested: str | None = None) -> str:
    """``fork`` where available (no re-import of ``__main__``, so scripts without a main guard and
    notebooks work, and workers start instantly), else ``spawn``; ``$BANDPILOT_MP_START`` overrides.
    Workers pin torch to one thread, so a forked torch model never enters an OpenMP region."""
    import multiprocessing as mp

    method = requested or settings().mp_start or ""
    avail = mp.get_all_start_methods()
    if method:
        if method not in avail:
            raise EvaluationError(f"start method {method!r} is not available here ({avail})")
        return method
    return "fork" if "fork" in avail else "spawn"


def _describe_truth(fabric: Any) -> str:
    spec = fabric.spec
    kind = type(fabric).__name__
    where = f" {portable(spec.path)}" if spec.path else ""
    # Say it in words: an emulator's score is not a measurement (truth comes from measured tables).
    what = "measured tables" if spec.source == "trace" else "EMULATED, not measurements"
    return f"{kind}({spec.name}){where} [{what}]"
