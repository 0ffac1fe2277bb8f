"""How does a simulated job's uncertainty fall as it trains? Synthetic learning curves of normalized
entropy, ``H(p) = h_inf + (h0 - h_inf) · exp(-r · p)`` over training progress ``p ∈ [0, 1]``, plus a
little per-epoch noise - the shape the entropy-guided scheduling paper describes (high at initialisation, falling fast, then
levelling off at a task-dependent floor; more classes, higher floor).

Curve parameters are drawn per job from a seeded generator keyed by the job id, independent of the
job's size or length: nothing in the trace says how a job learns, so the simulator does not invent
a correlation that would favour one policy.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Curve:
    h0: float
    h_inf: float
    rate: float
    noise: float
    key: int

    def at(self, epoch: int, epochs: int) -> float:
        """Normalized entropy reported at the end of ``epoch`` (0 = before training) of ``epochs``."""
        p = min(1.0, max(0.0, epoch / max(1, epochs)))
        h = self.h_inf + (self.h0 - self.h_inf) * math.exp(-self.rate * p)
        if epoch > 0 and self.noise > 0:
            eps = np.random.default_rng((self.key, epoch)).normal(0.0, self.noise)
            h += float(eps)
        return float(min(1.0, max(0.0, h)))


def curve_for(job_id: str, seed: int = 0, noise: float = 0.01) -> Curve:
    """The job's curve: ``h0 ~ U(0.90, 1.00)``, ``h_inf ~ U(0.05, 0.45)``, ``r ~ U(2, 6)``."""
    key = zlib.crc32(f"{seed}:{job_id}".encode())
    rng = np.random.default_rng(key)
    h0 = float(rng.uniform(0.90, 1.00))
    h_inf = float(rng.uniform(0.05, 0.45))
    rate = float(rng.uniform(2.0, 6.0))
    return Curve(h0, h_inf, rate, noise, key)
