"""How does one fit update the surrogate net? The LightningModule: weighted loss on log bandwidth,
per-epoch validation with best-state keeping, early stopping and Optuna pruning, weight
averaging, AdamW with warm-up and a cosine schedule."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import lightning as L
import numpy as np
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
    ``history``, ``best`` (val MAPE, state, epoch) and ``pruned`` are read back after the fit."""

    def __init__(self, net: nn.Module, p: TrainParams, *, lr: float, total_steps: int, swa_start: int | None,
                 trial: Any = None) -> None:
        super().__init__()
        self.net = net
        self.p = p
        self.lr = lr
        self.total_steps = total_steps
        self.swa_start = swa_start
        self.trial = trial
        self.loss_fn = _loss_fn(p)
        self.history: list[dict[str, float]] = []
        self.best = (float("inf"), None, -1)
        self.pruned = False
        self._losses: list[float] = []
        self.avg: dict[str, torch.Tensor] | None = None
        self.n_avg = 0

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

    def on_train_epoch_end(self) -> None:
        row = {"epoch": float(self.current_epoch), "train_loss": float(np.mean(self._losses)) if self._losses else float("nan")}
        self._losses = []
        if self.swa_start is not None and self.current_epoch >= self.swa_start:
            # Weight averaging over the last epochs (SWA/Polyak): an ensemble's variance cut at no predict cost.
            sd = {k: v.detach().clone() for k, v in self.net.state_dict().items() if v.is_floating_point()}
            self.n_avg += 1
            if self.avg is None:
                self.avg = sd
            else:
                for k, v in sd.items():
                    self.avg[k] += (v - self.avg[k]) / self.n_avg
        dm = self.trainer.datamodule
        if dm.has_val:
            with torch.no_grad():
                was = self.net.training
                self.net.eval()
                pv = torch.exp(self.net(dm.val_tokens)).double()
                self.net.train(was)
            mape = float(((pv - dm.val_y).abs() / dm.val_y).mean() * 100.0)
            row["val_mape"] = mape
            if mape < self.best[0]:
                self.best = (mape, copy.deepcopy(self.net.state_dict()), self.current_epoch)
            if self.trial is not None:
                self.trial.report(mape, self.current_epoch)
                if self.trial.should_prune():
                    self.pruned = True
                    self.trainer.should_stop = True
            if self.p.patience and self.current_epoch - self.best[2] >= self.p.patience:
                self.trainer.should_stop = True
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
