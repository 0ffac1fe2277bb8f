"""What bandwidth does an allocation get? The :class:`Fabric` interface: the ground-truth ``B(S)``
of GPU allocations on one cluster, vectorised over many allocations given as per-host mask rows.

Every fabric shares the hierarchy the dispatcher exploits: a cross-host allocation's bandwidth
depends on per-host counts and, through ``min``, on each host's stage-1 (intra) bandwidth - so
within a host only the chosen subset's stage-1 value matters, and ``B`` is monotone in every
stage-1 value.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, popcount


class Fabric:
    """Ground-truth bandwidth of allocations on one cluster (subclasses fill in the tables)."""

    spec: ClusterSpec

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._stage1: np.ndarray | None = None

    # -- stage 1 -------------------------------------------------------------------------
    def stage1_table(self, h: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def stage1(self) -> np.ndarray:
        """``(n_hosts, 2**max_gpus)`` stage-1 bandwidth of every subset of every host."""
        if self._stage1 is None:
            width = 1 << int(self.spec.gpus_per_host.max())
            tab = np.zeros((self.spec.n_hosts, width))
            for h in range(self.spec.n_hosts):
                t = self.stage1_table(h)
                tab[h, : t.size] = t
            self._stage1 = tab
        return self._stage1

    # -- cross-host network ----------------------------------------------------------------
    def network(self, counts: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """Inter-host bandwidth of count patterns ``(n, H)`` (only rows with >= 2 hosts matter)."""
        raise NotImplementedError

    combine = "min_intra"

    def bandwidth_masks(self, masks: np.ndarray) -> np.ndarray:
        """``B(S)`` for each row of per-host masks; 0 for allocations of <= 1 GPU."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        counts = popcount(masks)
        used = counts > 0
        n_used = used.sum(axis=1)
        intra = self.stage1[np.arange(self.spec.n_hosts)[None, :], masks]
        out = np.zeros(masks.shape[0])
        single = n_used == 1
        out[single] = intra[single].sum(axis=1)
        cross = n_used >= 2
        if cross.any():
            net = self.network(counts[cross])
            if self.combine == "min_intra":
                big = np.where(counts[cross] >= 2, intra[cross], np.inf)
                net = np.minimum(net, big.min(axis=1))
            out[cross] = net
        return out

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        """Same as :meth:`bandwidth_masks`: a fabric is a perfect predictor (Ideal-BP, Exact)."""
        return self.bandwidth_masks(masks)

    def predict_columns(self, masks: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """:meth:`predict_masks` of rows given only on the host columns ``cols`` (every other host
        empty). A fabric's ``B`` depends only on the hosts an allocation uses, so on big clusters
        candidates are evaluated on the few columns they touch; this default widens the rows."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        full = np.zeros((masks.shape[0], self.spec.n_hosts), dtype=np.int64)
        full[:, np.asarray(cols, dtype=np.int64)] = masks
        return self.predict_masks(full)

    def bandwidth(self, allocations: Sequence[Iterable[str]]) -> np.ndarray:
        """``B(S)`` for allocations given as GPU-id lists."""
        return self.bandwidth_masks(self.spec.to_masks([list(a) for a in allocations]))

    def measure(self, masks: np.ndarray, seed: int | None = 0, repeat: int = 0) -> np.ndarray:
        """A measurement: the truth, plus noise where the fabric models it (emulator)."""
        return self.bandwidth_masks(masks)

    def cap_masks(self, masks: np.ndarray) -> np.ndarray:
        """A physical upper bound per allocation (for sanity checks and property tests)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        counts = popcount(masks)
        intra_max = self.stage1.max(axis=1)
        used = counts > 0
        single = used.sum(axis=1) == 1
        cap = np.where(single, (intra_max[None, :] * used).max(axis=1), 0.0)
        return np.where(single, cap, self._network_cap(counts))

    def _network_cap(self, counts: np.ndarray) -> np.ndarray:
        return np.full(counts.shape[0], np.inf)

    # -- which links an allocation uses (fault injection) ---------------------------------------
    def scale_out(self, counts: np.ndarray) -> np.ndarray:
        """Rows of per-host counts whose traffic rides NIC rails (here: any cross-host row)."""
        return (np.atleast_2d(counts) > 0).sum(axis=1) >= 2

    def nvlink_spanning(self, counts: np.ndarray) -> np.ndarray:
        """Rows whose cross-host traffic rides NVLink (multi-node NVLink domains; none here)."""
        return np.zeros(np.atleast_2d(counts).shape[0], dtype=bool)
