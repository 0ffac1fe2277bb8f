"""How does a registered surrogate learn from new measurements without forgetting? Fine-tuning
on the new rows plus a replayed sample of the original training rows stored in the artifact."""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bandpilot.errors import DataError
from bandpilot.model.datamodule import check_dataset, cross_pool
from bandpilot.model.metrics import evaluate_predictions, make_plots
from bandpilot.model.params import TrainParams
from bandpilot.model.result import TrainResult
from bandpilot.model.surrogate import Surrogate
from bandpilot.model.train import dataset_fingerprint, fit_net, git_commit, set_threads

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset


def finetune(sur: Surrogate, new: "Dataset", params: TrainParams | dict[str, Any] | None = None, *,
             out_dir: str | Path | None = None, plots: bool = True) -> TrainResult:
    """Continue training ``sur`` on new measurements, replaying the stored original sample."""
    p = params if isinstance(params, TrainParams) else TrainParams.from_dict(params)
    set_threads(p.threads)
    torch.manual_seed(p.seed)
    t0 = time.perf_counter()
    if new.spec.fingerprint() != sur.spec.fingerprint():
        raise DataError(
            f"new data is for cluster {new.spec.name!r} ({new.spec.n_hosts} hosts), the model for {sur.spec.name!r}"
        )
    check_dataset(new)
    pool = cross_pool(new)
    if len(pool) < 2:
        raise DataError(f"new data has {len(pool)} cross-host measurements; fine-tuning needs at least 2")
    stage1 = sur.stage1
    notes: list[str] = []
    try:
        stage1 = new.stage1_tables()
        notes.append("stage-1 tables refreshed from the new data")
    except DataError:
        pass  # new data need not re-profile every host; keep the model's tables
    rng = np.random.default_rng(p.seed)
    perm = rng.permutation(len(pool))
    n_test = max(1, len(pool) // 5) if len(pool) >= 5 else 0
    te, tr = pool.take(np.sort(perm[:n_test])), pool.take(np.sort(perm[n_test:]))
    net = copy.deepcopy(sur.net)
    tuned = Surrogate(sur.spec, stage1, net, kind=sur.kind, meta=dict(sur.meta), replay=sur.replay, name=sur.name,
                      patterns=sur.patterns)
    replay_m, replay_y = _replay_rows(sur, tr.masks)
    before_replay = evaluate_predictions(replay_y, sur.predict_masks(replay_m)) if len(replay_y) else {}
    before_new = evaluate_predictions(te.busbw, sur.predict_masks(te.masks)) if len(te) else {}
    masks = np.concatenate([tr.masks, replay_m])
    y = np.concatenate([tr.busbw, replay_y])
    w = np.concatenate([np.ones(len(tr)), np.full(len(replay_y), p.finetune_replay_weight)])
    net_rows = tuned.net_rows(masks)  # a 'domain' model: in-domain rows are stage 1.5, not the net's
    masks, y, w = masks[net_rows], y[net_rows], w[net_rows]
    history, _, _ = fit_net(tuned, masks, y, w, None, None, p, epochs=p.finetune_epochs, lr=p.finetune_lr, fit_scaling=False)
    train_seconds = time.perf_counter() - t0
    # The replay store now mixes old and new so the next fine-tune remembers both.
    k_new = min(len(tr), p.replay_size // 2) if p.replay_size else 0
    k_old = max(0, p.replay_size - k_new)
    pick_new = rng.permutation(len(tr))[:k_new]
    pick_old = rng.permutation(len(replay_y))[:k_old]
    tuned.replay = (np.concatenate([tr.masks[pick_new], replay_m[pick_old]]), np.concatenate([tr.busbw[pick_new], replay_y[pick_old]]))
    eval_set = te if len(te) else tr
    yhat = tuned.predict_masks(eval_set.masks)
    ev = evaluate_predictions(eval_set.busbw, yhat, eval_set.pattern, eval_set.n_hosts)
    metrics = _metrics(ev, before_new, before_replay, tuned, replay_m, replay_y)
    metrics.update({"n_train": float(len(tr)), "n_replay": float(len(replay_y)), "n_test": float(len(eval_set)),
                    "train_seconds": train_seconds, "epochs_run": float(len(history))})
    if not len(te):
        notes.append("new data too small for a held-out test; metrics are on the fine-tuning rows")
    data = _provenance(sur, tuned, new, len(pool))
    tuned.meta = {
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "params": p.as_dict(),
        "metrics": metrics,
        "data": data,
        "git_commit": git_commit(),
        "finetuned_from": {"uri": sur.uri, "version": sur.model_version, "metrics": sur.meta.get("metrics")},
    }
    plot_paths: dict[str, Path] = {}
    if plots:
        out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-finetune-"))
        plot_paths = make_plots(eval_set.busbw, yhat, eval_set.n_hosts, out,
                                f"{sur.spec.name} fine-tuned: MAPE={ev['mape']:.2f}%")
    return TrainResult(tuned, metrics, {"test": ev}, history, plot_paths, p, data, train_seconds, notes,
                       {"masks": eval_set.masks, "y": eval_set.busbw, "yhat": yhat, "pattern": eval_set.pattern})


def _replay_rows(sur: Surrogate, new_masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The model's stored cross-host sample, minus allocations the new data re-measured (the new
    value wins)."""
    replay_m, replay_y = sur.replay if sur.replay is not None else (np.zeros((0, sur.spec.n_hosts), np.int64), np.zeros(0))
    rkeep = (replay_y > 0) & (np.bitwise_count(replay_m).astype(bool).sum(axis=1) >= 2) if len(replay_y) else np.zeros(0, bool)
    replay_m, replay_y = replay_m[rkeep], replay_y[rkeep]
    new_keys = {r.tobytes() for r in new_masks}
    fresh = np.array([r.tobytes() not in new_keys for r in replay_m], dtype=bool) if len(replay_y) else np.zeros(0, bool)
    return replay_m[fresh], replay_y[fresh]


def _metrics(ev: dict[str, Any], before_new: dict[str, Any], before_replay: dict[str, Any], tuned: Surrogate,
             replay_m: np.ndarray, replay_y: np.ndarray) -> dict[str, float]:
    """Test figures after fine-tuning, and the forgetting check on the replayed rows."""
    metrics = {f"test_{k}": float(ev[k]) for k in ("r2", "mape", "max_err", "max_rel_err", "spearman") if k in ev}
    if before_new:
        metrics["test_mape_before"] = float(before_new["mape"])
    if before_replay:
        after_replay = evaluate_predictions(replay_y, tuned.predict_masks(replay_m))
        metrics["replay_mape_before"] = float(before_replay["mape"])
        metrics["replay_mape_after"] = float(after_replay["mape"])
    return metrics


def _provenance(sur: Surrogate, tuned: Surrogate, new: "Dataset", pool_size: int) -> dict[str, Any]:
    data = {
        "cluster": sur.spec.name,
        "fingerprint": sur.spec.fingerprint(),
        "dataset_hash": dataset_fingerprint(new),
        "dataset_path": str(new.path) if new.path else None,
        "dataset_rows": int(len(new)),
        "pool": int(pool_size),
        "split": "finetune",
        "base_model": sur.uri,
        "base_version": sur.model_version,
    }
    if sur.kind in ("hierarchical", "domain"):
        data["prior"] = tuned.net.prior_params()  # type: ignore[operator]
    return data
