"""What did the cluster measure? :class:`TraceFabric`, the oracle on measured data: intra tables
per host, an inter table keyed by the per-host count pattern, combined as the spec says.
"""

from __future__ import annotations

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, popcount
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.base import Fabric


class TraceFabric(Fabric):
    """Measured tables as the oracle. Repeated measurements are averaged."""

    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__(spec)
        from bandpilot.fabric.tables import intra_lookup, read_inter_table, read_intra_table

        if spec.source != "trace":
            raise SpecError(f"cluster {spec.name!r} has no measured tables (intra per host + inter)")
        self._tables = []
        for h in spec.hosts:
            assert h.intra is not None
            rows = read_intra_table(h.intra, h.n_gpus)
            self._tables.append(intra_lookup(rows, h.n_gpus, str(h.intra)))
        assert spec.inter is not None
        self.combine = spec.inter.combine
        n = int(spec.gpus_per_host.max())
        rows = read_inter_table(spec.inter.table, spec.n_hosts, n)
        self._base = n + 1
        sums: dict[int, list[float]] = {}
        self._rows = rows
        for r in rows:
            cnt = popcount(np.array(r.masks, dtype=np.int64))
            if (cnt > 0).sum() < 2:
                continue  # single-host rows of the inter table: intra tables are authoritative
            sums.setdefault(self._key(cnt[None, :])[0], []).append(r.busbw)
        if not sums:
            raise DataError(f"{spec.inter.table}: no cross-host rows")
        keys = np.array(sorted(sums), dtype=np.int64)
        self._keys = keys
        self._vals = np.array([np.mean(sums[k]) for k in keys]) * spec.inter.scale

    def _key(self, counts: np.ndarray) -> np.ndarray:
        srt = -np.sort(-counts, axis=1)
        key = np.zeros(counts.shape[0], dtype=np.int64)
        for j in range(srt.shape[1]):
            key = key * self._base + srt[:, j]
        return key

    def stage1_table(self, h: int) -> np.ndarray:
        return self._tables[h]

    def network(self, counts: np.ndarray) -> np.ndarray:
        keys = self._key(counts)
        pos = np.searchsorted(self._keys, keys)
        pos = np.clip(pos, 0, len(self._keys) - 1)
        hit = self._keys[pos] == keys
        if not hit.all():
            bad = counts[np.flatnonzero(~hit)[0]]
            pattern = "+".join(str(int(c)) for c in sorted(bad[bad > 0], reverse=True))
            raise DataError(f"inter table of {self.spec.name!r} has no measurement for count pattern {pattern}")
        return self._vals[pos]

    def measured_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """Every measured cross-host allocation as masks with its value (for round-trip checks)."""
        rows = [r for r in self._rows if sum(1 for m in r.masks if m) >= 2]
        return np.array([r.masks for r in rows], dtype=np.int64), np.array([r.busbw for r in rows])
