"""How good is a model fit on every measurement? Fit the production surrogate on all cross-host
rows and take its metrics from k-fold cross-validation whose folds are grouped by count pattern.

On a homogeneous cluster the per-host count pattern decides the bandwidth, so a fold that shared
a pattern with its training rows would score a lookup, not a prediction. ``holdout > 0`` also
keeps whole patterns out of everything (CV and final fit) as a test set.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from bandpilot.data.dataset import repeat_noise
from bandpilot.errors import DataError
from bandpilot.model.datamodule import MIN_POOL, cross_pool, val_split
from bandpilot.model.metrics import evaluate_predictions, make_plots
from bandpilot.model.params import TrainParams
from bandpilot.model.result import TrainResult
from bandpilot.model.train import fit_pool, record_provenance, set_threads
from bandpilot.progress import stage

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset

CV_KEYS = ("r2", "mape", "max_err", "max_rel_err", "spearman")


def pattern_folds(pattern: np.ndarray, k: int, seed: int = 0) -> list[np.ndarray]:
    """Row indices of ``k`` folds, each count pattern in exactly one; folds balanced by rows
    (patterns shuffled, then each goes to the fold with the fewest rows so far)."""
    uniq, inverse, counts = np.unique(pattern, return_inverse=True, return_counts=True)
    if uniq.size < k:
        raise DataError(f"cannot form {k} cross-validation folds: the cross-host pool has only {uniq.size} "
                        f"distinct count patterns (use fewer folds or measure more patterns)")
    order = np.random.default_rng(seed).permutation(uniq.size)
    order = order[np.argsort(-counts[order], kind="stable")]  # big patterns first, ties in random order
    load = np.zeros(k, dtype=np.int64)
    fold_of = np.empty(uniq.size, dtype=np.int64)
    for j in order:
        f = int(np.argmin(load))
        fold_of[j] = f
        load[f] += counts[j]
    rows = fold_of[inverse.ravel()]
    return [np.flatnonzero(rows == f) for f in range(k)]


def holdout_patterns(pattern: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Row indices of whole count patterns drawn at random until ``fraction`` of the rows is held out."""
    uniq, inverse, counts = np.unique(pattern, return_inverse=True, return_counts=True)
    if uniq.size < 3:
        raise DataError(f"holdout needs at least 3 distinct count patterns, the pool has {uniq.size}")
    order = np.random.default_rng(seed + 7919).permutation(uniq.size)
    take = order[np.cumsum(counts[order]) <= max(1, round(fraction * pattern.size))]
    if take.size == 0:
        take = order[:1]
    return np.flatnonzero(np.isin(inverse.ravel(), take))


def _out_of_fold(spec: Any, stage1: np.ndarray, pool: Any, rest: np.ndarray, folds: list[np.ndarray], p: TrainParams,
                 say: Callable[[str], None], advance: Callable[[], Any]) -> tuple[np.ndarray, list[dict[str, float]]]:
    """Each fold's predictions by a surrogate fit on the other folds, and each fold's figures."""
    oof = np.full(rest.size, np.nan)
    per_fold: list[dict[str, float]] = []
    for i, f in enumerate(folds):
        say(f"fold {i + 1}/{len(folds)}: train {rest.size - f.size}, test {f.size} allocations")
        tr_idx = rest[np.setdiff1d(np.arange(rest.size), f)]
        fit_idx, val_idx = val_split(pool, tr_idx, p)
        sur_i, *_ = fit_pool(spec, stage1, pool.take(fit_idx), pool.take(val_idx), p)
        te = pool.take(rest[f])
        oof[f] = sur_i.predict_masks(te.masks)
        ev = evaluate_predictions(te.busbw, oof[f])
        per_fold.append({k: float(ev[k]) for k in ("r2", "mape", "max_err", "spearman")} | {"n": float(f.size)})
        advance()
    return oof, per_fold


def fit(ds: "Dataset", params: TrainParams | dict[str, Any] | None = None, *, out_dir: str | Path | None = None,
        plots: bool = True, progress: Callable[[str], None] | None = None) -> TrainResult:
    """The production fit: a surrogate trained on every cross-host measurement (minus the holdout),
    with ``cv_*`` metrics from ``params.folds`` pattern-grouped folds and per-fold figures.

    ``test_*`` metrics are the holdout's when ``params.holdout > 0``, else the pooled out-of-fold
    (cross-validated) predictions: what the registry, the gate and DVC read.
    """
    p = params if isinstance(params, TrainParams) else TrainParams.from_dict(params)
    p.validate()
    set_threads(p.threads)
    torch.manual_seed(p.seed)
    np.random.seed(p.seed % (2**32))
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    spec = ds.spec
    pool = cross_pool(ds)
    if len(pool) < MIN_POOL:
        raise DataError(f"dataset has {len(pool)} cross-host measurements; training needs at least {MIN_POOL}")
    stage1 = ds.stage1_tables()
    test_idx = holdout_patterns(pool.pattern, p.holdout, p.seed) if p.holdout > 0 else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(pool)), test_idx)
    folds = pattern_folds(pool.pattern[rest], p.folds, p.seed)
    with stage(f"train {spec.name}", total=len(folds) + 1, unit="fits") as st:  # the folds, then the final fit
        oof, per_fold = _out_of_fold(spec, stage1, pool, rest, folds, p, say, st.advance)
        cv_pool = pool.take(rest)
        cv = evaluate_predictions(cv_pool.busbw, oof, cv_pool.pattern, cv_pool.n_hosts)

        say(f"final fit on {rest.size} allocations")
        fit_idx, val_idx = val_split(pool, rest, p)
        sur, cfg, history, pruned, best_val = fit_pool(spec, stage1, pool.take(fit_idx), pool.take(val_idx), p)
        st.advance()
    train_seconds = time.perf_counter() - t0
    all_tr = pool.take(rest)
    if p.pattern_memory:
        sur.remember(all_tr.masks, all_tr.busbw)
    keep = np.random.default_rng(p.seed + 1).permutation(len(all_tr))[: p.replay_size]
    sur.replay = (all_tr.masks[keep], all_tr.busbw[keep]) if p.replay_size else None

    if test_idx.size:
        te = pool.take(test_idx)
        te_y, te_hat = te.busbw, sur.predict_masks(te.masks)
        test = evaluate_predictions(te_y, te_hat, te.pattern, te.n_hosts)
        test_rows = {"masks": te.masks, "y": te_y, "yhat": te_hat, "pattern": te.pattern}
        te_hosts = te.n_hosts
    else:
        test, te_y, te_hat, te_hosts = cv, cv_pool.busbw, oof, cv_pool.n_hosts
        test_rows = {"masks": cv_pool.masks, "y": te_y, "yhat": te_hat, "pattern": cv_pool.pattern}
    tr_ev = evaluate_predictions(all_tr.busbw, sur.predict_masks(all_tr.masks))
    metrics = {f"test_{k}": float(test[k]) for k in CV_KEYS}
    metrics.update({f"cv_{k}": float(cv[k]) for k in CV_KEYS})
    for i, fm in enumerate(per_fold):
        metrics.update({f"cv_fold{i}_{k}": v for k, v in fm.items() if k != "n"})
    metrics.update({f"train_{k}": float(tr_ev[k]) for k in ("r2", "mape")})
    metrics.update({"n_train": float(rest.size), "n_test": float(test_idx.size or rest.size), "n_val": float(len(val_idx)),
                    "cv_folds": float(len(folds)), "train_seconds": train_seconds, "epochs_run": float(len(history))})
    source = f"holdout of {test_idx.size} allocations" if test_idx.size else f"{len(folds)}-fold pattern-grouped cross-validation"
    data = record_provenance(
        sur, ds, p, cfg, metrics, pool=int(len(pool)), split="all", metrics_from=source, cv_folds=per_fold,
        train_patterns=int(np.unique(pool.pattern[rest]).size),
        memory_patterns=len(sur.memory) if sur.memory is not None else 0,
        noise_sigma=repeat_noise(ds),
        test_patterns=int(np.unique(pool.pattern[test_idx if test_idx.size else rest]).size),
    )
    notes = [f"fit on all {rest.size} cross-host allocations; test metrics from the {source}"]
    plot_paths: dict[str, Path] = {}
    if plots:
        out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-train-"))
        what = "holdout" if test_idx.size else f"{len(folds)}-fold CV"
        title = f"{spec.name} {p.model} fit on {rest.size} ({what}): R²={test['r2']:.3f} MAPE={test['mape']:.2f}%"
        plot_paths = make_plots(te_y, te_hat, te_hosts, out, title)
    return TrainResult(sur, metrics, {"test": test, "cv": cv}, history, plot_paths, p, data, train_seconds, notes,
                       test_rows, pruned, best_val)
