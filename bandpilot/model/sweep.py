"""Which hyper-parameters train the best surrogate? An Optuna TPE sweep with median pruning on
validation MAPE, persisted in an Optuna storage and tracked as nested MLflow runs."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from bandpilot.errors import DataError, ModelError, SpecError
from bandpilot.model.datamodule import MIN_POOL, cross_pool
from bandpilot.model.metrics import make_plots
from bandpilot.model.params import TrainParams
from bandpilot.model.result import TrainResult
from bandpilot.model.train import train
from bandpilot.progress import stage

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset


@dataclass
class SweepResult:
    best_params: TrainParams
    best_value: float
    study_name: str
    storage: str
    n_trials: int
    n_pruned: int
    result: TrainResult
    parent_run_id: str | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)


DEFAULT_SPACE: dict[str, Any] = {  # same as params/sweep.yaml
    "lr": {"type": "float", "low": 3e-4, "high": 1e-2, "log": True},
    "layers": {"type": "int", "low": 1, "high": 6},
    "hidden": {"type": "categorical", "choices": [16, 32, 64]},
    "weight_decay": {"type": "float", "low": 1e-6, "high": 0.1, "log": True},
    "dropout": {"type": "float", "low": 0.0, "high": 0.2},
    "epochs": {"type": "int", "low": 100, "high": 400, "step": 50},
}


def _suggest(trial: Any, space: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, s in space.items():
        kind = s.get("type", "float")
        if kind == "float":
            out[name] = trial.suggest_float(name, float(s["low"]), float(s["high"]), log=bool(s.get("log", False)))
        elif kind == "int":
            out[name] = trial.suggest_int(name, int(s["low"]), int(s["high"]), step=int(s.get("step", 1)))
        elif kind == "categorical":
            out[name] = trial.suggest_categorical(name, list(s["choices"]))
        else:
            raise SpecError(f"sweep space: parameter {name!r} has unknown type {kind!r}")
    return out


def resolve_storage(storage: str | None, root: Path | None = None) -> str:
    from bandpilot.config import project_root

    if not storage:
        root = root or project_root()
        (root / ".bandpilot").mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{root / '.bandpilot' / 'optuna.db'}"
    if storage.startswith("sqlite:///"):
        Path(storage.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return storage


def sweep(ds: "Dataset", base: TrainParams | dict[str, Any] | None = None, *, n_trials: int = 20,
          timeout: float | None = None, storage: str | None = None, study_name: str | None = None,
          space: dict[str, Any] | None = None, val_fraction: float = 0.2, log_mlflow: bool = True,
          out_dir: str | Path | None = None, tracking_uri: str | None = None) -> SweepResult:
    """Optuna TPE + MedianPruner on validation MAPE; parent MLflow run with nested child runs."""
    base_p = base if isinstance(base, TrainParams) else TrainParams.from_dict(base)
    space = space or DEFAULT_SPACE
    for k in space:
        if k not in {f.name for f in fields(TrainParams)}:
            raise SpecError(f"sweep space: {k!r} is not a training parameter")
    if n_trials < 1:
        raise SpecError("n_trials must be >= 1")
    storage_url = resolve_storage(storage)
    study_name = study_name or f"bandpilot-{ds.spec.name}"
    study = _open_study(study_name, storage_url, base_p.seed)
    # Validate the data once before trials start (trials must not swallow data errors).
    pool = cross_pool(ds)
    if len(pool) < MIN_POOL:
        raise DataError(f"dataset has {len(pool)} cross-host measurements; training needs at least {MIN_POOL}")
    ds.stage1_tables()

    mlf = None
    if log_mlflow:
        import mlflow

        from bandpilot.model import registry

        mlf = mlflow
        registry.tracking_setup(tracking_uri)
    results: dict[int, TrainResult] = {}
    trials_log: list[dict[str, Any]] = []
    vf = val_fraction if val_fraction > 0 else 0.2
    objective = _objective(ds, base_p, space, vf, study_name, out_dir, mlf, results, trials_log)
    parent_ctx = None
    parent_id = None
    if mlf:
        parent_ctx = mlf.start_run(run_name=f"sweep-{study_name}")
        run = parent_ctx.__enter__()
        parent_id = run.info.run_id
        mlf.set_tags({"bandpilot.kind": "sweep", "optuna.study": study_name, "optuna.storage": _redact(storage_url)})
        mlf.log_params({"n_trials": n_trials, "timeout": timeout, "val_fraction": vf,
                        **{f"base.{k}": v for k, v in base_p.as_dict().items()}})
    try:
        with stage(f"sweep {ds.spec.name}", total=n_trials, unit="trials") as st:
            study.optimize(objective, n_trials=n_trials, timeout=timeout, catch=(), callbacks=[lambda *_: st.advance()])
        best_p, res = _best(study, ds, base_p, vf, results, out_dir, mlf)
        n_pruned = sum(1 for t in study.trials if t.state.name == "PRUNED")
        return SweepResult(best_p, float(study.best_trial.value), study_name, storage_url, len(study.trials), n_pruned, res,
                           parent_id, trials_log)
    finally:
        if parent_ctx:
            parent_ctx.__exit__(None, None, None)


def _open_study(study_name: str, storage_url: str, seed: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(
            study_name=study_name, storage=storage_url, direction="minimize", load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=20),
        )
    except Exception as exc:  # sqlalchemy/driver errors: one line for the operator
        raise DataError(f"cannot open Optuna storage {storage_url!r}: {exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}") from None


def _objective(ds: "Dataset", base_p: TrainParams, space: dict[str, Any], vf: float, study_name: str,
               out_dir: str | Path | None, mlf: Any, results: dict[int, TrainResult],
               trials_log: list[dict[str, Any]]) -> Callable[[Any], float]:
    """One trial: train with the suggested parameters (a nested MLflow run), report, prune or score."""
    import optuna

    def objective(trial: "optuna.trial.Trial") -> float:
        sugg = _suggest(trial, space)
        p = TrainParams.from_dict({**base_p.as_dict(), **sugg, "val_fraction": vf})
        ctx = mlf.start_run(run_name=f"trial-{trial.number}", nested=True) if mlf else None
        try:
            if ctx:
                ctx.__enter__()
                mlf.log_params({f"p.{k}": v for k, v in sugg.items()})
                mlf.set_tags({"bandpilot.kind": "sweep-trial", "optuna.trial": str(trial.number), "optuna.study": study_name})
            res = train(ds, p, trial=trial, plots=False, out_dir=out_dir)
            trial.set_user_attr("test_mape", res.metrics["test_mape"])
            trial.set_user_attr("test_r2", res.metrics["test_r2"])
            if ctx:
                from bandpilot.model.registry import log_history

                log_history(res.history)
                mlf.log_metrics({k: v for k, v in res.metrics.items() if math.isfinite(v)})
                mlf.set_tag("optuna.state", "pruned" if res.pruned else "complete")
            trials_log.append({"number": trial.number, "val_mape": res.best_val_mape, "pruned": res.pruned, **sugg})
            if res.pruned:
                raise optuna.TrialPruned()
            results[trial.number] = res
            return float(res.best_val_mape)
        finally:
            if ctx:
                ctx.__exit__(None, None, None)

    return objective


def _best(study: Any, ds: "Dataset", base_p: TrainParams, vf: float, results: dict[int, TrainResult],
          out_dir: str | Path | None, mlf: Any) -> tuple[TrainParams, TrainResult]:
    """The best trial's parameters and result (retrained when it ran in an earlier session), with plots."""
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not complete:
        raise ModelError(f"sweep {study.study_name!r}: no trial completed (all pruned or failed)")
    best = study.best_trial
    best_p = TrainParams.from_dict({**base_p.as_dict(), **best.params})
    res = results.get(best.number)
    if res is None:  # best trial from an earlier session of a persistent study: retrain it
        res = train(ds, TrainParams.from_dict({**best_p.as_dict(), "val_fraction": vf}), plots=False)
    res.plots = make_plots(res.test["y"], res.test["yhat"], pool_hosts(res.test["masks"]),
                           Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-sweep-")),
                           f"{ds.spec.name} sweep best (trial {best.number}): MAPE={res.metrics['test_mape']:.2f}%")
    res.surrogate.meta["sweep"] = {"study": study.study_name, "best_trial": best.number, "best_val_mape": best.value,
                                   "n_trials": len(study.trials)}
    if mlf:
        mlf.log_metrics({"best_val_mape": float(best.value), **{f"best_{k}": v for k, v in res.metrics.items() if math.isfinite(v)}})
        mlf.log_params({f"best.{k}": v for k, v in best.params.items()})
    return best_p, res


def pool_hosts(masks: np.ndarray) -> np.ndarray:
    return (np.bitwise_count(np.asarray(masks, dtype=np.int64)) > 0).sum(axis=1)


def _redact(url: str) -> str:
    """Drop a password from an RDB URL before it goes into a tag."""
    import re

    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
