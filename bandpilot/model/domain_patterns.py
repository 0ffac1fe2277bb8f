"""What does an allocation inside one NVLink domain get? Stage 1.5 of the hierarchical model: the
in-domain value by *count pattern* (the multiset of per-tray GPU counts), learned from the
in-domain measurements of the profiling plan (:mod:`bandpilot.data.domain_planning`) and shared by
identical domains (same GPU type, tray topology and tray count).

Inside a domain trays talk over non-blocking NVLink switches, so a row's value depends on its
pattern and, through ``min``, on each tray's stage-1 value - not on which domain or trays. Hence:

* a measured pattern predicts the median of its measurements (log space), never above the smallest
  stage-1 value of its trays with >= 2 GPUs;
* an unmeasured one takes the NVLink path of its GPU count ``k`` - the median over measured
  patterns of that class with the same ``k`` whose stage-1 bound was not binding (nearest ``k``
  when none) - and the same stage-1 cap.

:class:`DomainAwareModel` composes it with any cross-domain model (a trained
:class:`~bandpilot.model.surrogate.Surrogate`, a fabric): rows inside one domain spanning >= 2 trays
go to the patterns, every other row to the cross-domain model. It has the dispatcher's model
interface (``spec``, ``stage1``, ``predict_masks``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.errors import ModelError
from bandpilot.topology.cluster import ClusterSpec

#: A pattern whose measured value is within this log margin of its stage-1 cap is stage-1-bound
#: (it says nothing about the NVLink path).
_BOUND_MARGIN = 0.05


def _classes(spec: ClusterSpec) -> np.ndarray:
    """Class id per unit (-1: not an NVLink domain): GPU type, tray topology and tray count."""
    unit, is_nvl = spec.units
    keys: dict[tuple, int] = {}
    out = np.full(is_nvl.size, -1, dtype=np.int64)
    for u in np.flatnonzero(is_nvl):
        hs = np.flatnonzero(unit == u)
        h0 = spec.hosts[int(hs[0])]
        out[u] = keys.setdefault((h0.gpu, h0.topology, hs.size), len(keys))
    return out


class DomainPatterns:
    """Stage 1.5 table: ``(class, pattern) -> busbw`` plus the per-(class, k) NVLink path."""

    def __init__(self, spec: ClusterSpec, stage1: np.ndarray, table: dict[tuple, float], path: dict[tuple[int, int], float]) -> None:
        self.spec = spec
        self.stage1 = np.asarray(stage1, dtype=np.float64)
        self.table = dict(table)
        self.path = dict(path)
        self._unit, _ = spec.units
        self._cls = _classes(spec)
        #: domain class per unit (-1: not an NVLink domain)
        self.classes = self._cls

    def __len__(self) -> int:
        return len(self.table)

    def in_domain(self, masks: np.ndarray) -> np.ndarray:
        """Rows inside one NVLink domain that span >= 2 trays (what this table predicts)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        used = masks != 0
        units = np.where(used, self._unit[None, :], -1)
        lo = np.where(used, units, np.iinfo(np.int64).max).min(axis=1)
        hi = units.max(axis=1)
        one = (lo == hi) & (used.sum(axis=1) >= 2)
        return one & (self._cls[np.clip(hi, 0, None)] >= 0)

    def _key(self, row: np.ndarray) -> tuple[int, tuple[int, ...]]:
        used = np.flatnonzero(row)
        c = int(self._cls[self._unit[used[0]]])
        return c, tuple(sorted((int(np.bitwise_count(row[h])) for h in used), reverse=True))

    def _cap(self, row: np.ndarray) -> float:
        used = np.flatnonzero(np.bitwise_count(row) >= 2)
        return float(self.stage1[used, row[used]].min()) if used.size else np.inf

    @classmethod
    def fit(cls, spec: ClusterSpec, stage1: np.ndarray, masks: np.ndarray, busbw: np.ndarray) -> "DomainPatterns":
        """From measured rows (only in-domain multi-tray rows are used; others are ignored)."""
        if not spec.nvlink_domains:
            raise ModelError(f"cluster {spec.name!r} has no NVLink domains: no stage 1.5 to fit")
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        busbw = np.asarray(busbw, dtype=np.float64).reshape(-1)
        if masks.shape[0] != busbw.size:
            raise ModelError(f"{masks.shape[0]} rows but {busbw.size} measurements")
        empty = cls(spec, stage1, {}, {})
        rows = np.flatnonzero(empty.in_domain(masks) & (busbw > 0))
        groups: dict[tuple, list[float]] = {}
        caps: dict[tuple, float] = {}
        for i in rows:
            key = empty._key(masks[i])
            groups.setdefault(key, []).append(float(np.log(busbw[i])))
            caps[key] = min(caps.get(key, np.inf), empty._cap(masks[i]))
        table = {key: float(np.exp(np.median(v))) for key, v in groups.items()}
        by_k: dict[tuple[int, int], list[float]] = {}
        for (c, pat), v in table.items():
            if np.log(caps[(c, pat)]) - np.log(v) > _BOUND_MARGIN:  # the NVLink path, not stage 1, bound it
                by_k.setdefault((c, sum(pat)), []).append(np.log(v))
        path = {key: float(np.exp(np.median(v))) for key, v in by_k.items()}
        return cls(spec, stage1, table, path)

    def predict(self, masks: np.ndarray) -> np.ndarray:
        """Values of in-domain multi-tray rows (call :meth:`in_domain` first; others are not valid)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        out = np.empty(masks.shape[0])
        cache: dict[tuple, float] = {}
        for i, row in enumerate(masks):
            key = self._key(row)
            v = cache.get(key)
            if v is None:
                v = self.table.get(key)
                if v is None:
                    v = self._path(*key)
                cache[key] = v
            out[i] = min(v, self._cap(row))
        return out

    def part_values(self, cls_ids: np.ndarray, hist: np.ndarray) -> np.ndarray:
        """Uncapped values of in-domain parts given as (domain class, tray histogram): ``hist[:, c - 1]``
        trays hold ``c`` GPUs of the part (vectorised :meth:`predict` for the domain tokens; the
        distinct patterns of a batch are few, so the Python loop runs over those only)."""
        hist = np.asarray(hist, dtype=np.int64)
        if hist.shape[0] == 0:
            return np.zeros(0)
        # one integer per (class, histogram): a 1-D unique is ~10x faster than a row-wise one
        base = int(hist.max()) + 1
        code = np.asarray(cls_ids, dtype=np.int64)
        for c in range(hist.shape[1]):
            code = code * base + hist[:, c]
        uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
        vals = np.empty(uniq.size)
        for i, r in enumerate(first.tolist()):
            row, c0 = hist[r].tolist(), int(cls_ids[r])
            pat = tuple(c for c in range(len(row), 0, -1) for _ in range(row[c - 1]))
            v = self.table.get((c0, pat))
            vals[i] = v if v is not None else self._path(c0, pat)
        return vals[inv.ravel()]

    def to_dict(self) -> dict[str, Any]:
        return {"table": [[c, list(pat), v] for (c, pat), v in sorted(self.table.items())],
                "path": [[c, k, v] for (c, k), v in sorted(self.path.items())]}

    @classmethod
    def from_dict(cls, spec: ClusterSpec, stage1: np.ndarray, doc: dict[str, Any]) -> "DomainPatterns":
        table = {(int(c), tuple(int(x) for x in pat)): float(v) for c, pat, v in doc["table"]}
        path = {(int(c), int(k)): float(v) for c, k, v in doc["path"]}
        return cls(spec, stage1, table, path)

    def _path(self, c: int, pat: tuple[int, ...]) -> float:
        k = sum(pat)
        ks = [kk for (cc, kk) in self.path if cc == c]
        if not ks:
            raise ModelError(f"no in-domain measurements for domain class {c} of {self.spec.name!r}")
        near = min(ks, key=lambda kk: (abs(kk - k), kk))
        return self.path[(c, near)]


class DomainAwareModel:
    """Stage 1.5 patterns inside NVLink domains, ``cross`` everywhere else (the dispatcher's model interface)."""

    def __init__(self, cross: Any, patterns: DomainPatterns) -> None:
        if cross.spec.fingerprint() != patterns.spec.fingerprint():
            raise ModelError("the cross-domain model and the domain patterns describe different clusters")
        self.cross = cross
        self.patterns = patterns
        self.spec = cross.spec
        self.stage1 = cross.stage1

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        inside = self.patterns.in_domain(masks)
        out = np.empty(masks.shape[0])
        if (~inside).any():
            out[~inside] = self.cross.predict_masks(masks[~inside])
        if inside.any():
            out[inside] = self.patterns.predict(masks[inside])
        return out
