"""Which rows does a model train, validate and test on? Cross-host pools, splits, and the
Lightning data module that serves the training rows.

Paper Sec. V-B: train on a sparse sample of cross-host measurements (250 by default), test on
cross-host allocations only, disjoint from training. Splits over the cross-host pool:

* ``random``     - uniform sample of allocations;
* ``stratified`` - round-robin over strata (sorted per-host count pattern, hence #hosts);
* ``pattern``    - whole count patterns go to train or test, never both (the honest split on a
  homogeneous cluster, where the pattern decides the bandwidth);
* ``explicit``   - train on every cross-host row of a given dataset, test on the rest of the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch

from bandpilot.errors import DataError
from bandpilot.model.params import TrainParams
from bandpilot.model.tokens import to_torch

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset
    from bandpilot.model.surrogate import Surrogate

MIN_POOL = 10


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
    for col in ("hosts", "host_masks", "busbw", "n_hosts", "gpus"):
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
    try:
        problem = ds.sparse().problem(ds.spec.full_masks)  # sparse: no rows x hosts matrix at scale
    except ValueError:
        problem = (-1, "hosts and host_masks differ in length")
    if problem is not None:
        raise DataError(f"dataset masks do not fit cluster {ds.spec.name!r} ({ds.spec.n_hosts} hosts): "
                        f"row {problem[0]} {problem[1]}")


def cross_pool(ds: "Dataset") -> Pool:
    check_dataset(ds)
    agg = ds.cross_host().aggregated()
    if len(agg) == 0:
        return Pool(np.zeros((0, ds.spec.n_hosts), np.int64), np.zeros(0), np.array([], str), np.zeros(0, np.int64), np.array([], str))
    f = agg.frame
    keep = f["busbw"].to_numpy(dtype=float) > 0  # zero cross-host bandwidth = failed run; log-space model
    f = f[keep].reset_index(drop=True)
    masks = agg.sparse().dense(np.flatnonzero(keep))  # dense for the cross-host rows only (885 at 10,008 GPUs)
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


def val_split(pool: Pool, idx: np.ndarray, p: TrainParams) -> tuple[np.ndarray, np.ndarray]:
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
def _target(busbw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.log(busbw).astype(np.float32))


def _index_tokens(t: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in t.items()}


class OneBatch:
    """An iterable of one batch (or none): Lightning takes any sized iterable as a loader, and
    would read a plain list as a list of loaders."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> Any:
        return iter([] if self.batch is None else [self.batch])

    def __len__(self) -> int:
        return 0 if self.batch is None else 1


class SurrogateDataModule(L.LightningDataModule):
    """Training rows of one fit as token tensors (built once), log-bandwidth targets and row weights,
    plus the validation rows checked whole at each epoch end. The loader shuffles row indices
    (seeded); :meth:`on_after_batch_transfer` turns an index batch into ``(tokens, log_y, w)``."""

    def __init__(self, sur: "Surrogate", masks: np.ndarray, busbw: np.ndarray, weights: np.ndarray | None = None,
                 val_masks: np.ndarray | None = None, val_busbw: np.ndarray | None = None, *, batch_size: int,
                 seed: int) -> None:
        super().__init__()
        self.tokens = to_torch(sur.tokens(masks))
        self.y = _target(busbw)
        self.w = torch.from_numpy((weights if weights is not None else np.ones(len(busbw))).astype(np.float32))
        self.has_val = val_masks is not None and len(val_masks) > 0
        self.val_tokens = to_torch(sur.tokens(val_masks)) if self.has_val and val_masks is not None else None
        self.val_y = torch.from_numpy(np.asarray(val_busbw, dtype=np.float64)) if self.has_val else None
        self.n = len(busbw)
        self.batch_size = min(batch_size, self.n)
        self.seed = seed

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(self.n)), batch_size=self.batch_size,
                                           shuffle=True, generator=gen, drop_last=False)

    def val_dataloader(self) -> "OneBatch":
        """The validation rows as ONE batch (not a DataLoader: no worker seed drawn from torch's
        global generator, so dropout sees the same random stream with or without validation)."""
        return OneBatch({"val_tokens": self.val_tokens, "val_y": self.val_y} if self.has_val else None)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict):  # the validation batch is whole already
            return batch
        (ix,) = batch
        return _index_tokens(self.tokens, ix), self.y[ix], self.w[ix]
