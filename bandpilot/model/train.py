"""How is a surrogate trained from a dataset? Split the cross-host pool, fit the physics prior,
run the Lightning Trainer over :class:`~bandpilot.model.module.SurrogateModule` and
:class:`~bandpilot.model.datamodule.SurrogateDataModule`, test on the held-out rows and record
the provenance (dataset hash, git commit) that goes into the model."""

from __future__ import annotations

import hashlib
import logging
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.plugins.environments import LightningEnvironment
import numpy as np
import torch

from bandpilot.errors import DataError
from bandpilot.model.datamodule import MIN_POOL, SurrogateDataModule, cross_pool, split_pool, val_split
from bandpilot.model.domain_patterns import DomainPatterns
from bandpilot.model.domain_tokens import DomainView
from bandpilot.model.tokens import host_arrays
from bandpilot.model.metrics import evaluate_predictions, make_plots
from bandpilot.model.module import AverageWeights, KeepBest, OptunaPruning, SurrogateModule, callbacks
from bandpilot.model.net_kinds import build_net
from bandpilot.model.params import TrainParams
from bandpilot.model.result import TrainResult
from bandpilot.model.surrogate import Surrogate

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset


# ------------------------------------------------------------------------------------------
def dataset_fingerprint(ds: "Dataset") -> str:
    """Dataset hash: ``bandpilot.data.dataset.dataset_hash`` when available, else sha256 of the Parquet file."""
    from bandpilot.errors import BandPilotError

    if ds.path is not None:
        try:
            from bandpilot.data.dataset import dataset_hash

            return str(dataset_hash(ds.path))
        except (ImportError, BandPilotError, TypeError, ValueError, OSError):
            pass
    if ds.path is not None:
        pq = Path(ds.path) / "measurements.parquet"
        if pq.is_file():
            h = hashlib.sha256()
            with open(pq, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            return h.hexdigest()
    import pandas as pd

    cols = [c for c in ("gpus", "collective", "bytes", "busbw") if c in ds.frame.columns]
    return hashlib.sha256(pd.util.hash_pandas_object(ds.frame[cols], index=False).to_numpy().tobytes()).hexdigest()


def record_provenance(sur: Surrogate, ds: "Dataset", p: TrainParams, cfg: dict[str, Any], metrics: dict[str, float],
                      **data: Any) -> dict[str, Any]:
    """Store what the model was trained on, how and how well in ``sur.meta``; returns its ``data`` part."""
    spec = ds.spec
    out = {"cluster": spec.name, "fingerprint": spec.fingerprint(), "dataset_hash": dataset_fingerprint(ds),
           "dataset_path": str(ds.path) if ds.path else None, "dataset_rows": int(len(ds)), **data}
    if p.model in ("hierarchical", "domain"):
        out["prior"] = sur.net.prior_params()  # type: ignore[operator]
        out["min_intra"] = bool(cfg["min_intra"])
    sur.meta = {"trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "params": p.as_dict(),
                "metrics": metrics, "data": out, "git_commit": git_commit()}
    return out


def git_commit(root: Path | None = None) -> str | None:
    import subprocess

    from bandpilot.config import SOURCE_ROOT

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root or SOURCE_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def fit_net(sur: Surrogate, train_masks: np.ndarray, train_y: np.ndarray, weights: np.ndarray | None,
         val_masks: np.ndarray | None, val_y: np.ndarray | None, p: TrainParams, *, epochs: int, lr: float,
         fit_scaling: bool, trial: Any = None) -> tuple[list[dict[str, float]], bool, float]:
    """Lightning training of ``sur.net`` in place; returns (history, pruned, best val MAPE)."""
    # Lightning 2.6 under torch 2.13 emits a pytree deprecation notice on every fit; it is not ours.
    warnings.filterwarnings("ignore", message=".*treespec.*")
    # Lightning probes for Slurm at every Trainer and fit and warns that `srun` is installed but not
    # used (18 times in `make run` on a Slurm machine): this is one CPU process, not a job step. The
    # explicit environment below keeps the Trainer from taking a Slurm job's variables as its own;
    # the fit's checkpoint lookup still probes, hence the filter.
    warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)

    net = sur.net
    dm = SurrogateDataModule(sur, train_masks, train_y, weights, val_masks, val_y, batch_size=p.batch_size, seed=p.seed)
    if fit_scaling:
        if sur.kind == "naive":
            net.fit_scaling(dm.tokens, dm.y)
        else:
            if p.prior_fit == "data":
                net.calibrate_prior(dm.tokens, dm.y, dm.w)
            fit_prior(net, dm.tokens, dm.y, dm.w, steps=p.prior_steps)
            net.fit_scaling(dm.tokens)
    steps_per_epoch = math.ceil(dm.n / dm.batch_size)
    total_steps = max(1, epochs * steps_per_epoch)
    swa_start = int(round(epochs * (1.0 - p.swa))) if p.swa > 0 and not dm.has_val else None
    lit = SurrogateModule(net, p, lr=lr, total_steps=total_steps)
    cbs = callbacks(p, has_val=dm.has_val, swa_start=swa_start, trial=trial)
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, deterministic=False,
        log_every_n_steps=max(1, steps_per_epoch), default_root_dir=tempfile.gettempdir(), callbacks=cbs,
        limit_val_batches=1 if dm.has_val else 0, plugins=[LightningEnvironment()],
    )
    net.train()
    trainer.fit(lit, datamodule=dm)
    net.eval()
    best = next((c for c in cbs if isinstance(c, KeepBest)), None)
    avg = next((c for c in cbs if isinstance(c, AverageWeights)), None)
    if best is not None and best.state is not None:
        net.load_state_dict(best.state)
    elif avg is not None and avg.avg is not None and avg.n > 1:
        net.load_state_dict({**net.state_dict(), **avg.avg})
    pruned = any(isinstance(c, OptunaPruning) and c.pruned for c in cbs)
    return lit.history, pruned, best.mape if best is not None else float("inf")


def fit_prior(net: Any, t: dict[str, torch.Tensor], log_y: torch.Tensor, w: torch.Tensor | None = None,
              steps: int = 300, lr: float = 0.05) -> float:
    """Fit the physics prior's few constants alone (full batch, L1 in log space) before stage 2."""
    if steps <= 0:
        return float("nan")
    params = net.prior_parameters()
    opt = torch.optim.Adam(params, lr=lr)
    w = w if w is not None else torch.ones_like(log_y)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        loss = ((net.prior_log(t) - log_y).abs() * w).sum() / w.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.zero_grad(set_to_none=True)
    return float(loss.detach())


def set_threads(n: int) -> None:
    try:
        torch.set_num_threads(n)
    except RuntimeError:
        pass


def _auto_min_intra(sur_stage1: np.ndarray, masks: np.ndarray, y: np.ndarray) -> bool:
    counts = np.bitwise_count(masks)
    intra = sur_stage1[np.arange(masks.shape[1])[None, :], masks]
    lim = np.where(counts >= 2, intra, np.inf).min(axis=1)
    has = np.isfinite(lim)
    if not has.any():
        return True
    over = (y[has] > 1.05 * lim[has]).mean()
    return bool(over < 0.05)


def _cross_domain(spec: Any, stage1: np.ndarray, patterns: DomainPatterns, pool: Any) -> Any:
    view = DomainView(spec, stage1, host_arrays(spec), patterns)
    return pool.take(np.flatnonzero(~view.inside(pool.masks))) if len(pool) else pool


def _auto_min_intra_units(spec: Any, stage1: np.ndarray, patterns: DomainPatterns, masks: np.ndarray, y: np.ndarray) -> bool:
    """``_auto_min_intra`` with domains for hosts: does the data obey min(in-domain values of the domains)?"""
    t = DomainView(spec, stage1, host_arrays(spec), patterns).tokens(masks)
    lim = np.where(~t["pad"] & (t["cnt"] >= 2), t["intra"], np.inf).min(axis=1)
    has = np.isfinite(lim)
    return bool(not has.any() or (y[has] > 1.05 * lim[has]).mean() < 0.05)


def fit_pool(spec: Any, stage1: np.ndarray, tr: Any, va: Any, p: TrainParams, *,
             trial: Any = None) -> tuple[Surrogate, dict[str, Any], list[dict[str, float]], bool, float]:
    """A new surrogate fit on the cross-host rows ``tr`` (``va``: validation rows, may be empty);
    returns (surrogate, net config, history, pruned, best val MAPE)."""
    cfg = p.net_config()
    patterns = None
    if p.model == "domain":  # stage 1.5 from this fit's in-domain rows; the net learns the cross-domain rest
        patterns = DomainPatterns.fit(spec, stage1, tr.masks, tr.busbw)
        tr, va = _cross_domain(spec, stage1, patterns, tr), _cross_domain(spec, stage1, patterns, va)
        if len(tr) < 2:
            raise DataError(f"{len(tr)} cross-domain measurements in the training rows; model 'domain' needs at least 2")
    if p.model in ("hierarchical", "domain"):
        auto = p.min_intra == "auto" and (_auto_min_intra(stage1, tr.masks, tr.busbw) if patterns is None
                                          else _auto_min_intra_units(spec, stage1, patterns, tr.masks, tr.busbw))
        cfg["min_intra"] = p.min_intra == "true" or auto
    torch.manual_seed(p.seed)
    net = build_net(p.model, spec, **cfg)
    sur = Surrogate(spec, stage1, net, kind=p.model, patterns=patterns)
    history, pruned, best_val = fit_net(sur, tr.masks, tr.busbw, None, va.masks, va.busbw, p, epochs=p.epochs, lr=p.lr,
                                     fit_scaling=True, trial=trial)
    return sur, cfg, history, pruned, best_val


def train(ds: "Dataset", params: TrainParams | dict[str, Any] | None = None, *, out_dir: str | Path | None = None,
          explicit: "Dataset | None" = None, trial: Any = None, plots: bool = True) -> TrainResult:
    """Train a surrogate on ``ds`` (stage-1 tables from its single-host rows) and test it."""
    p = params if isinstance(params, TrainParams) else TrainParams.from_dict(params)
    p.validate()
    set_threads(p.threads)
    torch.manual_seed(p.seed)
    np.random.seed(p.seed % (2**32))
    t0 = time.perf_counter()
    spec = ds.spec
    pool = cross_pool(ds)
    stage1 = ds.stage1_tables()
    notes: list[str] = []
    exp_pool = None
    if p.split == "explicit":
        if explicit is None and p.train_data:
            from bandpilot.data.dataset import load_dataset

            explicit = load_dataset(p.train_data)
        if explicit is None:
            raise DataError("split=explicit needs a training dataset (train_data)")
        if explicit.spec.fingerprint() != spec.fingerprint():
            raise DataError(f"training dataset is for cluster {explicit.spec.name!r}, not {spec.name!r}")
        exp_pool = cross_pool(explicit)
        if len(exp_pool) < 2:
            raise DataError(f"training dataset has {len(exp_pool)} cross-host measurements; need at least 2")
    elif len(pool) < MIN_POOL:
        raise DataError(f"dataset has {len(pool)} cross-host measurements; training needs at least {MIN_POOL}")
    tr_idx, te_idx = split_pool(pool, p, exp_pool, notes)
    src = exp_pool if exp_pool is not None else pool
    fit_idx, val_idx = val_split(src, tr_idx, p)
    tr = src.take(fit_idx)
    va = src.take(val_idx)
    te = pool.take(te_idx)
    if len(te) == 0:
        raise DataError("no cross-host allocations left for testing")

    sur, cfg, history, pruned, best_val = fit_pool(spec, stage1, tr, va, p, trial=trial)
    train_seconds = time.perf_counter() - t0

    # Replay sample for fine-tuning without forgetting, stored inside the artifact.
    all_tr = src.take(tr_idx)
    rng = np.random.default_rng(p.seed + 1)
    keep = rng.permutation(len(all_tr))[: p.replay_size]
    sur.replay = (all_tr.masks[keep], all_tr.busbw[keep]) if p.replay_size else None

    yhat = sur.predict_masks(te.masks)
    ev = evaluate_predictions(te.busbw, yhat, te.pattern, te.n_hosts)
    tr_ev = evaluate_predictions(tr.busbw, sur.predict_masks(tr.masks))
    metrics = {f"test_{k}": float(ev[k]) for k in ("r2", "mape", "max_err", "max_rel_err", "spearman")}
    metrics.update({f"train_{k}": float(tr_ev[k]) for k in ("r2", "mape")})
    metrics.update({"n_train": float(len(tr_idx)), "n_test": float(len(te)), "n_val": float(len(va)),
                    "train_seconds": train_seconds, "epochs_run": float(len(history))})
    if len(va):
        metrics["val_mape"] = float(best_val)
    data = record_provenance(sur, ds, p, cfg, metrics, pool=int(len(pool)), split=p.split,
                             train_patterns=int(np.unique(src.pattern[tr_idx]).size),
                             test_patterns=int(np.unique(te.pattern).size))
    if explicit is not None:
        data["train_dataset_hash"] = dataset_fingerprint(explicit)
    plot_paths: dict[str, Path] = {}
    if plots:
        out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-train-"))
        title = f"{spec.name} {p.model} n={len(tr_idx)} {p.split}: R²={ev['r2']:.3f} MAPE={ev['mape']:.2f}%"
        plot_paths = make_plots(te.busbw, yhat, te.n_hosts, out, title)
    return TrainResult(sur, metrics, {"test": ev}, history, plot_paths, p, data, train_seconds, notes,
                       {"masks": te.masks, "y": te.busbw, "yhat": yhat, "pattern": te.pattern}, pruned, best_val)
