"""Training the surrogate: sampling and splits, a Lightning loop, metrics and plots, Optuna sweeps,
fine-tuning with replay.

Paper Sec. V-B: train on a sparse sample of cross-host measurements (250 by default), test on
cross-host allocations only, disjoint from training. Splits over the cross-host pool:

* ``random``     - uniform sample of allocations;
* ``stratified`` - round-robin over strata (sorted per-host count pattern, hence #hosts);
* ``pattern``    - whole count patterns go to train or test, never both (the honest split on a
  homogeneous cluster, where the pattern decides the bandwidth);
* ``explicit``   - train on every cross-host row of a given dataset, test on the rest of the pool.

Lightning and MLflow are imported inside functions so ``import bandpilot.model.training`` stays light.
"""

from __future__ import annotations

import copy
import hashlib
import math
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from bandpilot.errors import DataError, ModelError, SpecError
from bandpilot.model.params import TrainParams
from bandpilot.model.result import TrainResult
from bandpilot.model.surrogate import Surrogate, build_net, to_torch

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset

MIN_POOL = 10
TRIM_FLOOR = 0.1  # loss=trimmed never leaves out a row whose log residual is below this


# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
@dataclass
class Pool:
    """Cross-host measurements, one row per distinct allocation (mean of repeats)."""

    masks: np.ndarray
    busbw: np.ndarray
    pattern: np.ndarray  # "4+2" style sorted count pattern
    n_hosts: np.ndarray
    gpus: np.ndarray  # allocation key (comma-joined GPU ids)

    def __len__(self) -> int:
        return int(self.busbw.shape[0])

    def take(self, idx: np.ndarray) -> "Pool":
        return Pool(self.masks[idx], self.busbw[idx], self.pattern[idx], self.n_hosts[idx], self.gpus[idx])


def pattern_keys(masks: np.ndarray) -> np.ndarray:
    counts = -np.sort(-np.bitwise_count(np.asarray(masks, dtype=np.int64)).astype(np.int64), axis=1)
    return np.array(["+".join(str(int(c)) for c in row if c) for row in counts])


def check_dataset(ds: "Dataset") -> None:
    """Bad input -> one-line :class:`DataError` (empty, foreign rows, NaN/negative bandwidth)."""
    if ds is None or len(ds) == 0:
        raise DataError("dataset is empty")
    f = ds.frame
    for col in ("masks", "busbw", "n_hosts", "gpus"):
        if col not in f.columns:
            raise DataError(f"dataset lacks column {col!r}")
    if "cluster" in f.columns:
        others = sorted(set(map(str, f["cluster"])) - {ds.spec.name})
        if others:
            raise DataError(f"dataset has rows of cluster(s) {others} but its spec is {ds.spec.name!r}")
    bw = f["busbw"].to_numpy(dtype=float)
    bad = ~np.isfinite(bw) | (bw < 0)
    if bad.any():
        raise DataError(f"dataset row {int(np.flatnonzero(bad)[0])} has a NaN or negative bandwidth ({bw[bad][0]})")
    m = ds.masks()
    if m.shape[1] != ds.spec.n_hosts or ((m & ~ds.spec.full_masks[None, :]) != 0).any() or (m < 0).any():
        raise DataError(f"dataset masks do not fit cluster {ds.spec.name!r} ({ds.spec.n_hosts} hosts)")


def cross_pool(ds: "Dataset") -> Pool:
    check_dataset(ds)
    agg = ds.cross_host().aggregated()
    if len(agg) == 0:
        return Pool(np.zeros((0, ds.spec.n_hosts), np.int64), np.zeros(0), np.array([], str), np.zeros(0, np.int64), np.array([], str))
    f = agg.frame
    keep = f["busbw"].to_numpy(dtype=float) > 0  # zero cross-host bandwidth = failed run; log-space model
    f = f[keep].reset_index(drop=True)
    masks = np.array(f["masks"].tolist(), dtype=np.int64).reshape(len(f), ds.spec.n_hosts)
    return Pool(masks, f["busbw"].to_numpy(dtype=float), pattern_keys(masks),
                f["n_hosts"].to_numpy(dtype=np.int64), f["gpus"].astype(str).to_numpy())


def split_pool(pool: Pool, p: TrainParams, explicit: Pool | None = None, notes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) into ``pool`` (for ``explicit``: train indexes ``explicit``)."""
    notes = notes if notes is not None else []
    rng = np.random.default_rng(p.seed)
    n = len(pool)
    if p.split == "explicit":
        if explicit is None or len(explicit) == 0:
            raise DataError("split=explicit needs a training dataset with cross-host rows (train_data)")
        seen = set(explicit.gpus.tolist())
        test = np.array([i for i in range(n) if pool.gpus[i] not in seen], dtype=np.int64)
        if test.size == 0:
            raise DataError("split=explicit: every pool allocation is in the training dataset; nothing left to test")
        rng.shuffle(test)
        cap = p.test_size or 5 * len(explicit)
        return np.arange(len(explicit)), np.sort(test[:cap])
    if n < MIN_POOL:
        raise DataError(f"dataset has {n} cross-host measurements; training needs at least {MIN_POOL}")
    n_train = p.n_train
    if n_train > n - max(2, n // 5):
        n_train = n - max(2, n // 5)
        notes.append(f"n_train reduced from {p.n_train} to {n_train} (pool has {n} cross-host allocations)")
    if p.split == "random":
        perm = rng.permutation(n)
        train, rest = perm[:n_train], perm[n_train:]
    elif p.split == "stratified":
        strata: dict[str, list[int]] = {}
        for i in rng.permutation(n):
            strata.setdefault(pool.pattern[i], []).append(int(i))
        order = list(strata)
        rng.shuffle(order)
        train_l: list[int] = []
        depth = 0
        while len(train_l) < n_train:
            for key in order:
                if depth < len(strata[key]) and len(train_l) < n_train:
                    train_l.append(strata[key][depth])
            depth += 1
        train = np.array(train_l, dtype=np.int64)
        rest = rng.permutation(np.setdiff1d(np.arange(n), train))
    else:  # pattern
        pats = np.unique(pool.pattern)
        if pats.size < 2:
            raise DataError("split=pattern needs at least two distinct count patterns in the cross-host pool")
        rng.shuffle(pats)
        train_l = []
        train_pats: set[str] = set()
        by_pat: dict[str, list[int]] = {}
        for i in range(n):
            by_pat.setdefault(pool.pattern[i], []).append(i)
        for pat in pats:
            if len(train_l) >= n_train or len(train_pats) == pats.size - 1:
                break
            train_l.extend(by_pat[pat])
            train_pats.add(pat)
        train = np.array(train_l[:n_train], dtype=np.int64)
        rest = np.array([i for i in rng.permutation(n) if pool.pattern[i] not in train_pats], dtype=np.int64)
    cap = p.test_size or 5 * len(train)
    return np.sort(train), np.sort(rest[:cap])


def _val_split(pool: Pool, idx: np.ndarray, p: TrainParams) -> tuple[np.ndarray, np.ndarray]:
    if p.val_fraction <= 0 or idx.size < 10:
        return idx, idx[:0]
    rng = np.random.default_rng(p.seed + 7919)
    n_val = max(2, int(round(idx.size * p.val_fraction)))
    if p.split == "pattern":
        pats = np.unique(pool.pattern[idx])
        rng.shuffle(pats)
        val_l: list[int] = []
        for pat in pats[:-1]:
            if len(val_l) >= n_val:
                break
            val_l.extend(idx[pool.pattern[idx] == pat].tolist())
        val = np.array(sorted(val_l), dtype=np.int64)
    else:
        val = np.sort(rng.choice(idx, size=n_val, replace=False))
    return np.setdiff1d(idx, val), val


# ------------------------------------------------------------------------------------------
def evaluate_predictions(y_true: np.ndarray, y_pred: np.ndarray, patterns: np.ndarray | None = None,
                         n_hosts: np.ndarray | None = None) -> dict[str, Any]:
    """R², MAPE (%), max abs error (GB/s), max relative error (%), Spearman; by #hosts and pattern."""
    from scipy.stats import spearmanr

    y = np.asarray(y_true, dtype=float)
    yh = np.asarray(y_pred, dtype=float)
    if y.size == 0:
        return {"n": 0}
    err = yh - y
    rel = np.abs(err) / np.maximum(np.abs(y), 1e-9)
    ss_res = float((err**2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out: dict[str, Any] = {
        "n": int(y.size),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "mape": 100.0 * float(rel.mean()),
        "max_err": float(np.abs(err).max()),
        "max_rel_err": 100.0 * float(rel.max()),
        "spearman": float(spearmanr(y, yh).statistic) if y.size > 2 and np.ptp(y) > 0 else float("nan"),
    }
    if n_hosts is not None:
        out["by_hosts"] = {
            int(h): {"n": int((n_hosts == h).sum()), "mape": 100.0 * float(rel[n_hosts == h].mean()),
                     "max_rel_err": 100.0 * float(rel[n_hosts == h].max())}
            for h in np.unique(n_hosts)
        }
    if patterns is not None:
        out["by_pattern"] = {
            str(k): {"n": int((patterns == k).sum()), "mape": 100.0 * float(rel[patterns == k].mean())}
            for k in np.unique(patterns)
        }
    return out


def make_plots(y: np.ndarray, yhat: np.ndarray, n_hosts: np.ndarray, out_dir: Path, title: str) -> dict[str, Path]:
    """Predicted-vs-measured scatter and residual plot (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    sc = ax.scatter(y, yhat, c=n_hosts, s=12, cmap="viridis", alpha=0.8)
    lo, hi = float(min(y.min(), yhat.min())), float(max(y.max(), yhat.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel("measured busbw (GB/s)")
    ax.set_ylabel("predicted busbw (GB/s)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(sc, ax=ax, label="hosts")
    fig.tight_layout()
    paths["scatter"] = out_dir / "pred_vs_measured.png"
    fig.savefig(paths["scatter"])
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.scatter(y, 100 * (yhat - y) / y, c=n_hosts, s=12, cmap="viridis", alpha=0.8)
    ax.axhline(0, color="k", lw=1)
    ax.set_xlabel("measured busbw (GB/s)")
    ax.set_ylabel("relative error (%)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    paths["residuals"] = out_dir / "residuals.png"
    fig.savefig(paths["residuals"])
    plt.close(fig)
    return paths


# ------------------------------------------------------------------------------------------
def dataset_fingerprint(ds: "Dataset") -> str:
    """Dataset hash: ``bandpilot.data.dataset.dataset_hash`` when available, else sha256 of the Parquet file."""
    from bandpilot.errors import BandPilotError

    if ds.path is not None:
        try:
            from bandpilot.data.dataset import dataset_hash  # type: ignore[attr-defined]

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


def git_commit(root: Path | None = None) -> str | None:
    import subprocess

    from bandpilot.config import SOURCE_ROOT

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root or SOURCE_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _target(busbw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.log(busbw).astype(np.float32))


def _loss_fn(p: TrainParams) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if p.loss == "mse":
        return lambda a, b: torch.nn.functional.mse_loss(a, b, reduction="none")
    if p.loss == "l1":
        return lambda a, b: (a - b).abs()
    if p.loss == "cauchy":  # redescending: a far outlier measurement pulls the fit (almost) not at all
        return lambda a, b: torch.log1p(((a - b) / p.huber_delta) ** 2) * p.huber_delta
    if p.loss == "trimmed":
        # L1, leaving out the worst ``trim`` fraction of each batch (per member) - but only rows off by more
        # than TRIM_FLOOR in log space (~10 %): on clean data (Het-4Mix: most rows fit exactly by the prior)
        # the few large residuals are the informative rows, not outlier runs.
        def trimmed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            r = (a - b).abs()
            if r.shape[-1] < 10 or p.trim <= 0:
                return r
            thr = torch.quantile(r.detach(), 1.0 - p.trim, dim=-1, keepdim=True).clamp_min(TRIM_FLOOR)
            return r * (r <= thr).to(r.dtype)

        return trimmed
    return lambda a, b: torch.nn.functional.huber_loss(a, b, delta=p.huber_delta, reduction="none") / p.huber_delta


def _index_tokens(t: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in t.items()}


def _fit(sur: Surrogate, train_masks: np.ndarray, train_y: np.ndarray, weights: np.ndarray | None,
         val_masks: np.ndarray | None, val_y: np.ndarray | None, p: TrainParams, *, epochs: int, lr: float,
         fit_scaling: bool, trial: Any = None) -> tuple[list[dict[str, float]], bool, float]:
    """Lightning training of ``sur.net`` in place; returns (history, pruned, best val MAPE)."""
    import logging
    import warnings

    # Lightning 2.6 under torch 2.13 emits a pytree deprecation notice on every fit; it is not ours.
    warnings.filterwarnings("ignore", message=".*treespec.*")
    import lightning as L

    for name in ("lightning.pytorch", "lightning.fabric", "lightning", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)

    net = sur.net
    t_train = to_torch(sur.tokens(train_masks))
    y_train = _target(train_y)
    w_train = torch.from_numpy((weights if weights is not None else np.ones(len(train_y))).astype(np.float32))
    has_val = val_masks is not None and len(val_masks) > 0
    t_val = to_torch(sur.tokens(val_masks)) if has_val else None
    y_val = torch.from_numpy(np.asarray(val_y, dtype=np.float64)) if has_val else None
    if fit_scaling:
        if sur.kind == "naive":
            net.fit_scaling(t_train, y_train)
        else:
            fit_prior(net, t_train, y_train, w_train, steps=p.prior_steps)
            net.fit_scaling(t_train)
    loss_fn = _loss_fn(p)
    n = len(train_y)
    bs = min(p.batch_size, n)
    steps_per_epoch = math.ceil(n / bs)
    total_steps = max(1, epochs * steps_per_epoch)
    swa_start = int(round(epochs * (1.0 - p.swa))) if p.swa > 0 and not has_val else None
    prior_names = {"log_eff", "sw_base", "sw_peer", "cnt_gain", "sharp", "log_xdom", "imb"}

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.history: list[dict[str, float]] = []
            self.best = (float("inf"), None, -1)
            self.pruned = False
            self._losses: list[float] = []
            self.avg: dict[str, torch.Tensor] | None = None
            self.n_avg = 0

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            (ix,) = batch
            tb = _index_tokens(t_train, ix)
            # An ensemble trains every member on its own loss (mean over members), not the average's.
            pred = self.net.member_outputs(tb) if hasattr(self.net, "member_outputs") else self.net(tb)
            w = w_train[ix]
            per_row = loss_fn(pred, y_train[ix])
            if per_row.ndim == 2:
                per_row = per_row.sum(dim=0)  # sum over members: each member's own loss, unscaled
            loss = (per_row * w).sum() / w.sum()
            self._losses.append(float(loss.detach()))
            return loss

        def on_train_epoch_end(self) -> None:
            row = {"epoch": float(self.current_epoch), "train_loss": float(np.mean(self._losses)) if self._losses else float("nan")}
            self._losses = []
            if swa_start is not None and self.current_epoch >= swa_start:
                # Weight averaging over the last epochs (SWA/Polyak): an ensemble's variance cut at no predict cost.
                sd = {k: v.detach().clone() for k, v in self.net.state_dict().items() if v.is_floating_point()}
                self.n_avg += 1
                if self.avg is None:
                    self.avg = sd
                else:
                    for k, v in sd.items():
                        self.avg[k] += (v - self.avg[k]) / self.n_avg
            if has_val:
                with torch.no_grad():
                    was = self.net.training
                    self.net.eval()
                    pv = torch.exp(self.net(t_val)).double()
                    self.net.train(was)
                mape = float(((pv - y_val).abs() / y_val).mean() * 100.0)
                row["val_mape"] = mape
                if mape < self.best[0]:
                    self.best = (mape, copy.deepcopy(self.net.state_dict()), self.current_epoch)
                if trial is not None:
                    trial.report(mape, self.current_epoch)
                    if trial.should_prune():
                        self.pruned = True
                        self.trainer.should_stop = True
                if p.patience and self.current_epoch - self.best[2] >= p.patience:
                    self.trainer.should_stop = True
            self.history.append(row)

        def configure_optimizers(self) -> Any:
            named = [(k.rsplit(".", 1)[-1], v) for k, v in self.net.named_parameters()]  # ensemble: members.i.*
            prior = [v for k, v in named if k in prior_names]
            decay = [v for k, v in named if k not in prior_names and v.ndim >= 2]
            other = [v for k, v in named if k not in prior_names and v.ndim < 2]
            groups = [{"params": decay, "weight_decay": p.weight_decay}, {"params": other, "weight_decay": 0.0}]
            if prior:
                groups.append({"params": prior, "weight_decay": 0.0, "lr": lr * p.prior_lr_mult})
            opt = torch.optim.AdamW(groups, lr=lr, foreach=True)
            warm = max(1, int(p.warmup * total_steps))

            def sched(step: int) -> float:
                if step < warm:
                    return (step + 1) / warm
                prog = min(1.0, (step - warm) / max(1, total_steps - warm))
                return 0.02 + 0.98 * 0.5 * (1.0 + math.cos(math.pi * prog))

            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, sched), "interval": "step"}}

    lit = Lit()
    gen = torch.Generator().manual_seed(p.seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(n)), batch_size=bs, shuffle=True,
                                         generator=gen, drop_last=False)
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, deterministic=False,
        log_every_n_steps=max(1, steps_per_epoch), default_root_dir=tempfile.gettempdir(),
    )
    net.train()
    trainer.fit(lit, train_dataloaders=loader)
    net.eval()
    if has_val and lit.best[1] is not None:
        net.load_state_dict(lit.best[1])
    elif lit.avg is not None and lit.n_avg > 1:
        net.load_state_dict({**net.state_dict(), **lit.avg})
    return lit.history, lit.pruned, lit.best[0]


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


def _set_threads(n: int) -> None:
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


def train(ds: "Dataset", params: TrainParams | dict[str, Any] | None = None, *, out_dir: str | Path | None = None,
          explicit: "Dataset | None" = None, trial: Any = None, plots: bool = True) -> TrainResult:
    """Train a surrogate on ``ds`` (stage-1 tables from its single-host rows) and test it."""
    p = params if isinstance(params, TrainParams) else TrainParams.from_dict(params)
    p.validate()
    _set_threads(p.threads)
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
    fit_idx, val_idx = _val_split(src, tr_idx, p)
    tr = src.take(fit_idx)
    va = src.take(val_idx)
    te = pool.take(te_idx)
    if len(te) == 0:
        raise DataError("no cross-host allocations left for testing")

    cfg = p.net_config()
    if p.model == "hierarchical":
        cfg["min_intra"] = p.min_intra == "true" or (p.min_intra == "auto" and _auto_min_intra(stage1, tr.masks, tr.busbw))
    torch.manual_seed(p.seed)
    net = build_net(p.model, spec, **cfg)
    sur = Surrogate(spec, stage1, net, kind=p.model)
    history, pruned, best_val = _fit(sur, tr.masks, tr.busbw, None, va.masks, va.busbw, p, epochs=p.epochs, lr=p.lr,
                                     fit_scaling=True, trial=trial)
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
    data = {
        "cluster": spec.name,
        "fingerprint": spec.fingerprint(),
        "dataset_hash": dataset_fingerprint(ds),
        "dataset_path": str(ds.path) if ds.path else None,
        "dataset_rows": int(len(ds)),
        "pool": int(len(pool)),
        "split": p.split,
        "train_patterns": int(np.unique(src.pattern[tr_idx]).size),
        "test_patterns": int(np.unique(te.pattern).size),
    }
    if explicit is not None:
        data["train_dataset_hash"] = dataset_fingerprint(explicit)
    if p.model == "hierarchical":
        data["prior"] = sur.net.prior_params()  # type: ignore[operator]
        data["min_intra"] = bool(cfg["min_intra"])
    sur.meta = {
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "params": p.as_dict(),
        "metrics": metrics,
        "data": data,
        "git_commit": git_commit(),
    }
    plot_paths: dict[str, Path] = {}
    if plots:
        out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-train-"))
        title = f"{spec.name} {p.model} n={len(tr_idx)} {p.split}: R²={ev['r2']:.3f} MAPE={ev['mape']:.2f}%"
        plot_paths = make_plots(te.busbw, yhat, te.n_hosts, out, title)
    return TrainResult(sur, metrics, {"test": ev}, history, plot_paths, p, data, train_seconds, notes,
                       {"masks": te.masks, "y": te.busbw, "yhat": yhat, "pattern": te.pattern}, pruned, best_val)


# ------------------------------------------------------------------------------------------
def finetune(sur: Surrogate, new: "Dataset", params: TrainParams | dict[str, Any] | None = None, *,
             out_dir: str | Path | None = None, plots: bool = True) -> TrainResult:
    """Continue training ``sur`` on new measurements, replaying the stored original sample."""
    p = params if isinstance(params, TrainParams) else TrainParams.from_dict(params)
    _set_threads(p.threads)
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
    tuned = Surrogate(sur.spec, stage1, net, kind=sur.kind, meta=dict(sur.meta), replay=sur.replay, name=sur.name)
    replay_m, replay_y = sur.replay if sur.replay is not None else (np.zeros((0, sur.spec.n_hosts), np.int64), np.zeros(0))
    rkeep = (replay_y > 0) & (np.bitwise_count(replay_m).astype(bool).sum(axis=1) >= 2) if len(replay_y) else np.zeros(0, bool)
    replay_m, replay_y = replay_m[rkeep], replay_y[rkeep]
    # Replayed rows for allocations re-measured in the new data give way to the new value.
    new_keys = {r.tobytes() for r in tr.masks}
    fresh = np.array([r.tobytes() not in new_keys for r in replay_m], dtype=bool) if len(replay_y) else np.zeros(0, bool)
    replay_m, replay_y = replay_m[fresh], replay_y[fresh]
    before_replay = evaluate_predictions(replay_y, sur.predict_masks(replay_m)) if len(replay_y) else {}
    before_new = evaluate_predictions(te.busbw, sur.predict_masks(te.masks)) if len(te) else {}
    masks = np.concatenate([tr.masks, replay_m])
    y = np.concatenate([tr.busbw, replay_y])
    w = np.concatenate([np.ones(len(tr)), np.full(len(replay_y), p.finetune_replay_weight)])
    history, _, _ = _fit(tuned, masks, y, w, None, None, p, epochs=p.finetune_epochs, lr=p.finetune_lr, fit_scaling=False)
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
    metrics = {f"test_{k}": float(ev[k]) for k in ("r2", "mape", "max_err", "max_rel_err", "spearman") if k in ev}
    if before_new:
        metrics["test_mape_before"] = float(before_new["mape"])
    if before_replay:
        after_replay = evaluate_predictions(replay_y, tuned.predict_masks(replay_m))
        metrics["replay_mape_before"] = float(before_replay["mape"])
        metrics["replay_mape_after"] = float(after_replay["mape"])
    metrics.update({"n_train": float(len(tr)), "n_replay": float(len(replay_y)), "n_test": float(len(eval_set)),
                    "train_seconds": train_seconds, "epochs_run": float(len(history))})
    if not len(te):
        notes.append("new data too small for a held-out test; metrics are on the fine-tuning rows")
    data = {
        "cluster": sur.spec.name,
        "fingerprint": sur.spec.fingerprint(),
        "dataset_hash": dataset_fingerprint(new),
        "dataset_path": str(new.path) if new.path else None,
        "dataset_rows": int(len(new)),
        "pool": int(len(pool)),
        "split": "finetune",
        "base_model": sur.uri,
        "base_version": sur.model_version,
    }
    if sur.kind == "hierarchical":
        data["prior"] = tuned.net.prior_params()  # type: ignore[operator]
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


# ------------------------------------------------------------------------------------------
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
    import optuna

    base_p = base if isinstance(base, TrainParams) else TrainParams.from_dict(base)
    space = space or DEFAULT_SPACE
    for k in space:
        if k not in {f.name for f in fields(TrainParams)}:
            raise SpecError(f"sweep space: {k!r} is not a training parameter")
    if n_trials < 1:
        raise SpecError("n_trials must be >= 1")
    storage_url = resolve_storage(storage)
    study_name = study_name or f"bandpilot-{ds.spec.name}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            study_name=study_name, storage=storage_url, direction="minimize", load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=base_p.seed),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=20),
        )
    except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors: one line for the operator
        raise DataError(f"cannot open Optuna storage {storage_url!r}: {exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}") from None
    # Validate the data once before trials start (trials must not swallow data errors).
    pool = cross_pool(ds)
    if len(pool) < MIN_POOL:
        raise DataError(f"dataset has {len(pool)} cross-host measurements; training needs at least {MIN_POOL}")
    ds.stage1_tables()

    mlf = None
    parent_id = None
    if log_mlflow:
        import mlflow

        from bandpilot.model import registry

        mlf = mlflow
        registry.tracking_setup(tracking_uri)
    results: dict[int, TrainResult] = {}
    trials_log: list[dict[str, Any]] = []
    vf = val_fraction if val_fraction > 0 else 0.2

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

    parent_ctx = None
    if mlf:
        parent_ctx = mlf.start_run(run_name=f"sweep-{study_name}")
        run = parent_ctx.__enter__()
        parent_id = run.info.run_id
        mlf.set_tags({"bandpilot.kind": "sweep", "optuna.study": study_name, "optuna.storage": _redact(storage_url)})
        mlf.log_params({"n_trials": n_trials, "timeout": timeout, "val_fraction": vf,
                        **{f"base.{k}": v for k, v in base_p.as_dict().items()}})
    try:
        study.optimize(objective, n_trials=n_trials, timeout=timeout, catch=())
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            raise ModelError(f"sweep {study_name!r}: no trial completed (all pruned or failed)")
        best = study.best_trial
        best_p = TrainParams.from_dict({**base_p.as_dict(), **best.params})
        res = results.get(best.number)
        if res is None:  # best trial from an earlier session of a persistent study: retrain it
            res = train(ds, TrainParams.from_dict({**best_p.as_dict(), "val_fraction": vf}), plots=False)
        res.plots = make_plots(res.test["y"], res.test["yhat"], pool_hosts(res.test["masks"]),
                               Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="bandpilot-sweep-")),
                               f"{ds.spec.name} sweep best (trial {best.number}): MAPE={res.metrics['test_mape']:.2f}%")
        res.surrogate.meta["sweep"] = {"study": study_name, "best_trial": best.number, "best_val_mape": best.value,
                                       "n_trials": len(study.trials)}
        if mlf:
            mlf.log_metrics({"best_val_mape": float(best.value), **{f"best_{k}": v for k, v in res.metrics.items() if math.isfinite(v)}})
            mlf.log_params({f"best.{k}": v for k, v in best.params.items()})
        n_pruned = sum(1 for t in study.trials if t.state == optuna.trial.TrialState.PRUNED)
        return SweepResult(best_p, float(best.value), study_name, storage_url, len(study.trials), n_pruned, res,
                           parent_id, trials_log)
    finally:
        if parent_ctx:
            parent_ctx.__exit__(None, None, None)


def pool_hosts(masks: np.ndarray) -> np.ndarray:
    return (np.bitwise_count(np.asarray(masks, dtype=np.int64)) > 0).sum(axis=1)


def _redact(url: str) -> str:
    """Drop a password from an RDB URL before it goes into a tag."""
    import re

    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


# ------------------------------------------------------------------------------------------
def random_cross_masks(spec: Any, n: int, seed: int = 0, max_hosts: int | None = None) -> np.ndarray:
    """``n`` distinct random cross-host allocations: 2..max_hosts hosts, a random non-empty subset on each."""
    rng = np.random.default_rng(seed)
    hmax = min(spec.n_hosts, max_hosts or spec.n_hosts)
    if hmax < 2:
        raise DataError(f"cluster {spec.name!r} has one host: no cross-host allocations")
    out: dict[bytes, np.ndarray] = {}
    full = spec.full_masks
    tries = 0
    while len(out) < n and tries < 50 * n + 1000:
        tries += 1
        k = int(rng.integers(2, hmax + 1))
        hosts = rng.choice(spec.n_hosts, size=k, replace=False)
        m = np.zeros(spec.n_hosts, dtype=np.int64)
        m[hosts] = rng.integers(1, full[hosts] + 1)
        out.setdefault(m.tobytes(), m)
    return np.array(list(out.values()), dtype=np.int64).reshape(-1, spec.n_hosts)


def stage1_masks(spec: Any) -> np.ndarray:
    """Every subset of >= 2 GPUs of every host, as mask rows."""
    rows = []
    for h, host in enumerate(spec.hosts):
        sub = np.arange(1, 1 << host.n_gpus, dtype=np.int64)
        sub = sub[np.bitwise_count(sub) >= 2]
        m = np.zeros((sub.size, spec.n_hosts), dtype=np.int64)
        m[:, h] = sub
        rows.append(m)
    return np.concatenate(rows)


def fabric_dataset(fabric: Any, n_cross: int = 400, seed: int = 0, cross_masks: np.ndarray | None = None,
                   noisy: bool = True) -> "Dataset":
    """A dataset from a fabric: exact stage-1 rows for every subset of every host plus ``n_cross``
    random cross-host allocations (``fabric.measure`` when ``noisy``, else the truth)."""
    import pandas as pd

    from bandpilot.data.dataset import Dataset, frame_from_masks

    spec = fabric.spec
    s1 = stage1_masks(spec)
    b1 = fabric.stage1[np.argmax(s1 != 0, axis=1), s1.max(axis=1)]
    cm = random_cross_masks(spec, n_cross, seed) if cross_masks is None else np.asarray(cross_masks, dtype=np.int64)
    bc = fabric.measure(cm, seed=seed) if noisy else fabric.bandwidth_masks(cm)
    kw = dict(collective=spec.collective, bytes_=spec.message_bytes)
    frame = pd.concat([frame_from_masks(spec, s1, b1, source="stage1", **kw),
                       frame_from_masks(spec, cm, bc, source="cross", **kw)], ignore_index=True)
    return Dataset(spec, frame)
