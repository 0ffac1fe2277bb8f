"""Where an allocation's pattern was measured, how far off was the model? The pattern memory.

Stage 1 is exact inside a host because every subset was measured. Across hosts only a sample is
measured; for an allocation whose pattern - the multiset of (GPU type, GPU count) over the hosts it
uses - was measured, the model's error there is known: the memory stores the median log residual
per measured pattern and corrects predictions of that pattern by it. Unmeasured patterns get the
model alone. It is built from the final fit's own rows (never from a CV fold's test rows), so the
cross-validated metrics stay honest; it sharpens dispatching on the patterns a cluster measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MEMORY_FILE = "memory.npz"


def pattern_keys(masks: np.ndarray, gtype: np.ndarray, max_gpus: int) -> np.ndarray:
    """(n,) void keys: per used host ``(gtype + 1) * (max_gpus + 1) + count``, sorted, 0-padded."""
    counts = np.bitwise_count(np.asarray(masks, dtype=np.int64)).astype(np.int64)
    codes = np.where(counts > 0, (gtype[None, :].astype(np.int64) + 1) * (max_gpus + 1) + counts, 0)
    codes = np.ascontiguousarray(-np.sort(-codes, axis=1))
    return codes.view(np.dtype((np.void, codes.dtype.itemsize * codes.shape[1]))).ravel()


class PatternMemory:
    """Sorted measured pattern keys and their median log corrections."""

    def __init__(self, keys: np.ndarray, corr: np.ndarray) -> None:
        self.keys = np.asarray(keys)
        self.corr = np.asarray(corr, dtype=np.float64)

    def __len__(self) -> int:
        return int(self.keys.size)

    @classmethod
    def build(cls, keys: np.ndarray, log_resid: np.ndarray) -> "PatternMemory":
        uniq, inverse = np.unique(keys, return_inverse=True)
        inverse = inverse.ravel()
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(uniq.size + 1))
        med = np.array([np.median(log_resid[order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:])])
        return cls(uniq, med)

    def correction(self, keys: np.ndarray) -> np.ndarray:
        """Log correction per query key (0 where the pattern was never measured)."""
        out = np.zeros(keys.size)
        if not self.keys.size or not keys.size:
            return out
        idx = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        hit = self.keys[idx] == keys
        out[hit] = self.corr[idx[hit]]
        return out

    def save(self, path: Path) -> None:
        width = self.keys.dtype.itemsize // 8
        codes = self.keys.view(np.int64).reshape(-1, width) if self.keys.size else np.zeros((0, width), np.int64)
        np.savez_compressed(path / MEMORY_FILE, codes=codes, corr=self.corr)

    @classmethod
    def load(cls, path: Path) -> "PatternMemory | None":
        f = path / MEMORY_FILE
        if not f.is_file():
            return None
        with np.load(f) as z:
            codes = np.ascontiguousarray(z["codes"].astype(np.int64))
            corr = z["corr"].astype(np.float64)
        keys = codes.view(np.dtype((np.void, 8 * codes.shape[1]))).ravel()
        return cls(keys, corr)
