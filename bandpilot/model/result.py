"""What one training run hands to the registry: the surrogate, its metrics, history and plots."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bandpilot.model.params import TrainParams
from bandpilot.model.surrogate import Surrogate


@dataclass
class TrainResult:
    surrogate: Surrogate
    metrics: dict[str, float]
    details: dict[str, Any]
    history: list[dict[str, float]]
    plots: dict[str, Path]
    params: TrainParams
    data: dict[str, Any]
    train_seconds: float
    notes: list[str] = field(default_factory=list)
    test: dict[str, np.ndarray] = field(default_factory=dict)
    pruned: bool = False
    best_val_mape: float = float("nan")
