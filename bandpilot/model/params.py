"""Training hyper-parameters (``params/train.yaml``), validated, overridable from the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from bandpilot.errors import SpecError

SPLITS = ("random", "stratified", "pattern", "explicit")


@dataclass
class TrainParams:
    """Hyper-parameters (``params/train.yaml``); every field can be overridden from the CLI."""

    model: str = "hierarchical"  # "domain" (NVLink-domain clusters: domain tokens) or "naive" (Table III ablation)
    layers: int = 1  # paper: 6; on the real H100 data 1 layer generalises best (less overfitting) and is 4x faster
    hidden: int = 32
    heads: int = 4
    head_layers: int = 3
    members: int = 1  # hierarchical: > 1 = an ensemble of independently initialised nets, averaged in log space
    dropout: float = 0.0
    prior_imbalance: bool = False  # hierarchical: learnable count-imbalance term in the prior's switch cap
    min_intra: str = "auto"  # auto | true | false: final min with stage-1 bandwidth of hosts with >= 2 GPUs
    lr: float = 3e-3
    prior_lr_mult: float = 0.3
    prior_steps: int = 0  # > 0: full-batch steps fitting the physics prior alone first (far-off clusters)
    prior_fit: str = "data"  # data: fit the prior's network scale to the measurements first; declared: trust the spec
    host_speed: bool = True  # a per-host speed token: a uniformly slow host stands out from its kind
    resid_bound: float = 4.0  # |log-space residual| the network may add to the prior (e^4 = 55x either way)
    weight_decay: float = 0.1
    epochs: int = 150
    batch_size: int = 256
    loss: str = "l1"  # l1 | huber | mse | cauchy | trimmed, all on log bandwidth
    huber_delta: float = 0.05
    swa: float = 0.0  # > 0: average the weights over this final fraction of epochs (no validation split)
    trim: float = 0.1  # loss=trimmed: fraction of each batch's largest residuals left out (outlier runs)
    warmup: float = 0.05
    n_train: int = 250
    split: str = "pattern"
    test_size: int = 0  # 0: every remaining pool row, at most 5 x n_train (paper)
    val_fraction: float = 0.0  # > 0: hold out part of train for early stopping / sweeps
    patience: int = 0  # epochs without val improvement before stopping (0: never)
    seed: int = 0
    threads: int = 1  # tiny batches gain nothing from intra-op threads; 2 threads on shared cores can be 5x slower
    replay_size: int = 512  # training rows stored in the artifact for fine-tuning replay
    finetune_epochs: int = 150
    finetune_lr: float = 1e-3
    finetune_replay_weight: float = 1.0
    pattern_memory: bool = True  # fit(): correct measured count patterns by the model's median residual there
    folds: int = 5  # fit(): pattern-grouped cross-validation folds for the metrics of a model fit on everything
    holdout: float = 0.0  # fit(): fraction of count patterns kept out as a test set (0: none)
    train_data: str = ""  # split=explicit: dataset directory whose cross-host rows are the training set

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None, source: str = "params") -> "TrainParams":
        doc = dict(doc or {})
        if "train" in doc and isinstance(doc["train"], dict):
            doc = doc["train"]
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(doc) - set(names))
        if unknown:
            raise SpecError(f"{source}: unknown training parameters {unknown}")
        out = cls()
        for k, v in doc.items():
            if v is None:
                continue
            default = getattr(out, k)
            try:
                if isinstance(default, bool):
                    v = v.strip().lower() in ("1", "true", "yes", "on") if isinstance(v, str) else bool(v)
                elif isinstance(default, int):
                    if isinstance(v, float) and not v.is_integer():
                        raise ValueError
                    v = int(v)
                elif isinstance(default, float):
                    v = float(v)
                else:
                    v = str(v).lower() if k == "min_intra" else str(v)
            except (TypeError, ValueError):
                raise SpecError(f"{source}: parameter {k}={v!r} has the wrong type") from None
            setattr(out, k, v)
        out.validate(source)
        return out

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> "TrainParams":
        import yaml

        doc: dict[str, Any] = {}
        src = "params"
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise SpecError(f"params file not found: {p}")
            try:
                doc = yaml.safe_load(p.read_text()) or {}
            except yaml.YAMLError as exc:
                raise SpecError(f"{p}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
            if "train" in doc:
                doc = doc["train"] or {}
            src = str(p)
        doc.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_dict(doc, src)

    def validate(self, source: str = "params") -> None:
        if self.model not in ("hierarchical", "domain", "naive"):
            raise SpecError(f"{source}: model must be 'hierarchical', 'domain' or 'naive', got {self.model!r}")
        if self.split not in SPLITS:
            raise SpecError(f"{source}: split must be one of {SPLITS}, got {self.split!r}")
        if self.loss not in ("huber", "mse", "l1", "cauchy", "trimmed"):
            raise SpecError(f"{source}: loss must be huber, mse, l1, cauchy or trimmed, got {self.loss!r}")
        if not 0.0 <= self.trim < 0.5:
            raise SpecError(f"{source}: trim must be in [0, 0.5)")
        if self.min_intra not in ("auto", "true", "false"):
            raise SpecError(f"{source}: min_intra must be auto, true or false")
        if self.hidden % max(self.heads, 1) or self.heads < 1:
            raise SpecError(f"{source}: hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        for k in ("n_train", "epochs", "batch_size", "hidden", "head_layers", "threads", "members"):
            if getattr(self, k) < 1:
                raise SpecError(f"{source}: {k} must be >= 1")
        if self.layers < 0 or self.replay_size < 0 or self.test_size < 0:
            raise SpecError(f"{source}: layers, replay_size and test_size must be >= 0")
        if not 0.0 <= self.val_fraction < 0.9:
            raise SpecError(f"{source}: val_fraction must be in [0, 0.9)")
        if self.prior_fit not in ("data", "declared"):
            raise SpecError(f"{source}: prior_fit must be 'data' or 'declared', got {self.prior_fit!r}")
        if not self.resid_bound > 0:
            raise SpecError(f"{source}: resid_bound must be positive")
        if self.folds < 2:
            raise SpecError(f"{source}: folds must be >= 2")
        if not 0.0 <= self.holdout < 0.9:
            raise SpecError(f"{source}: holdout must be in [0, 0.9)")
        if self.lr <= 0 or self.finetune_lr <= 0:
            raise SpecError(f"{source}: learning rates must be positive")

    def net_config(self) -> dict[str, Any]:
        cfg = dict(hidden=self.hidden, layers=self.layers, heads=self.heads, head_layers=self.head_layers,
                   dropout=self.dropout)
        if self.model in ("hierarchical", "domain"):  # domain: the hierarchical net over domain tokens
            cfg["resid_bound"] = self.resid_bound
            if self.host_speed:
                cfg["host_speed"] = True
        if self.model in ("hierarchical", "domain") and self.prior_imbalance:
            cfg["imbalance"] = True
        if self.model == "hierarchical" and self.members > 1:
            cfg["members"] = self.members
        return cfg

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
