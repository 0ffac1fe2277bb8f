"""How does one fit update the surrogate net? The LightningModule (weighted loss on log bandwidth,
per-epoch validation MAPE, AdamW with warm-up and a cosine schedule) and the callbacks that act on
its epochs: best-state keeping, Lightning's early stopping, Optuna pruning, weight averaging."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback, EarlyStopping
import torch
from torch import nn

from bandpilot.model.params import TrainParams

TRIM_FLOOR = 0.1  # loss=trimmed never leaves out a row whose log residual is below this
PRIOR_NAMES = {"log_eff", "sw_base", "sw_peer", "cnt_gain", "sharp", "log_xdom", "imb"}


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



class SurrogateModule(L.LightningModule):
    """Trains ``net`` in place on the rows of a :class:`~bandpilot.model.datamodule.SurrogateDataModule`;
    ``history`` (per epoch: train loss, val MAPE) is read back after the fit. Validation is
    Lightning's loop (one full batch per epoch); what follows from it - best state, early stopping,
    pruning, weight averaging - are the callbacks of :func:`callbacks`."""

    def __init__(self, net: nn.Module, p: TrainParams, *, lr: float, total_steps: int) -> None:
        super().__init__()
        self.net = net
        self.p = p
        self.lr = lr
        self.total_steps = total_steps
        self.loss_fn = _loss_fn(p)
        self.history: list[dict[str, float]] = []
        self.val_mape: float | None = None  # this epoch's, for the callbacks and the history
        self._losses: list[float] = []

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        tb, y, w = batch
        # An ensemble trains every member on its own loss (mean over members), not the average's.
        pred = self.net.member_outputs(tb) if hasattr(self.net, "member_outputs") else self.net(tb)
        per_row = self.loss_fn(pred, y)
        if per_row.ndim == 2:
            per_row = per_row.sum(dim=0)  # sum over members: each member's own loss, unscaled
        loss = (per_row * w).sum() / w.sum()
        self._losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: Any, _: int) -> None:
        pv = torch.exp(self.net(batch["val_tokens"])).double()
        mape = ((pv - batch["val_y"]).abs() / batch["val_y"]).mean() * 100.0
        self.val_mape = float(mape)
        # float64 and batch_size 1: the monitored value is the MAPE itself, not a float32 rounding of it
        self.log("val_mape", mape, batch_size=1)

    def on_train_epoch_end(self) -> None:
        row = {"epoch": float(self.current_epoch), "train_loss": float(np.mean(self._losses)) if self._losses else float("nan")}
        self._losses = []
        if self.val_mape is not None:
            row["val_mape"] = self.val_mape
            self.val_mape = None
        self.history.append(row)

    def configure_optimizers(self) -> Any:
        p, lr, total_steps = self.p, self.lr, self.total_steps
        named = [(k.rsplit(".", 1)[-1], v) for k, v in self.net.named_parameters()]  # ensemble: members.i.*
        prior = [v for k, v in named if k in PRIOR_NAMES]
        decay = [v for k, v in named if k not in PRIOR_NAMES and v.ndim >= 2]
        other = [v for k, v in named if k not in PRIOR_NAMES and v.ndim < 2]
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


class KeepBest(Callback):
    """The net's state at its best validation MAPE, kept in memory (ModelCheckpoint's job without
    the files: a fit is seconds long and its state a few hundred kB)."""

    def __init__(self) -> None:
        self.mape = float("inf")
        self.state: dict[str, torch.Tensor] | None = None
        self.epoch = -1

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        mape = module.val_mape
        if mape is not None and mape < self.mape:
            self.mape, self.state, self.epoch = mape, copy.deepcopy(module.net.state_dict()), trainer.current_epoch


class OptunaPruning(Callback):
    """Reports each epoch's validation MAPE to an Optuna trial and stops the fit when it says prune."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.pruned = False

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if module.val_mape is None:
            return
        self.trial.report(module.val_mape, trainer.current_epoch)
        if self.trial.should_prune():
            self.pruned = True
            trainer.should_stop = True


class AverageWeights(Callback):
    """Weight averaging over the epochs from ``start`` on (SWA/Polyak): an ensemble's variance cut at
    no predict cost. Lightning's StochasticWeightAveraging also swaps the learning-rate schedule."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.avg: dict[str, torch.Tensor] | None = None
        self.n = 0

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.current_epoch < self.start:
            return
        sd = {k: v.detach().clone() for k, v in module.net.state_dict().items() if v.is_floating_point()}
        self.n += 1
        if self.avg is None:
            self.avg = sd
        else:
            for k, v in sd.items():
                self.avg[k] += (v - self.avg[k]) / self.n


def callbacks(p: TrainParams, *, has_val: bool, swa_start: int | None, trial: Any = None) -> list[Callback]:
    """What a fit does after each epoch: keep the best state, stop early (``patience`` epochs without
    a better validation MAPE), prune an Optuna trial, average weights (only without validation)."""
    out: list[Callback] = []
    if has_val:
        out.append(KeepBest())
        if trial is not None:
            out.append(OptunaPruning(trial))
        if p.patience:
            out.append(EarlyStopping("val_mape", patience=p.patience, mode="min", check_finite=False))
    if swa_start is not None:
        out.append(AverageWeights(swa_start))
    return out
