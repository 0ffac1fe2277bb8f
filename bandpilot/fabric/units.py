"""Per-unit sums of per-host rows without a dense host x unit one-hot matrix.

On NVLink-domain clusters every search step and the emulator reduce ``(n, n_hosts)`` rows to
``(n, n_units)``. A dense one-hot matmul costs ``n * n_hosts * n_units`` (25,002 trays x 1,389
domains at 100,000 GPUs: a 278 MB matrix and seconds per call); a segmented sum over the hosts
grouped by unit (``np.add.reduceat``) costs ``n * n_hosts``. Indices are built once per spec.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

_CACHE: dict[int, "UnitIndex"] = {}


class UnitIndex:
    """Hosts grouped by scale-out unit: ``unit`` per host, unit ``members``, segmented reductions."""

    def __init__(self, unit: np.ndarray, is_nvl: np.ndarray) -> None:
        self.unit = np.asarray(unit, dtype=np.int64)
        self.is_nvl = np.asarray(is_nvl, dtype=bool)
        self.U = int(self.is_nvl.size)
        self.order = np.argsort(self.unit, kind="stable")
        self.sorted = bool(np.all(np.diff(self.unit) >= 0))
        sizes = np.bincount(self.unit, minlength=self.U)
        if np.any(sizes == 0):
            raise ValueError("every unit needs at least one host")
        bounds = np.cumsum(sizes)
        self.starts = np.r_[0, bounds[:-1]].astype(np.int64)
        #: hosts of each unit, in host order
        self.members = np.split(self.order, bounds[:-1])
        self.n_members = sizes

    def _cols(self, x: np.ndarray) -> np.ndarray:
        return x if self.sorted else x[:, self.order]

    def sum(self, x: np.ndarray) -> np.ndarray:
        """``(n, H) -> (n, U)`` per-unit sums (exact for integers)."""
        x = np.atleast_2d(x)
        if x.dtype == bool:
            x = x.astype(np.int64)
        return np.add.reduceat(self._cols(x), self.starts, axis=1)

    def any(self, x: np.ndarray) -> np.ndarray:
        """``(n, H) -> (n, U)``: does any host of the unit have a nonzero entry."""
        x = np.atleast_2d(x)
        return np.logical_or.reduceat(self._cols(x != 0), self.starts, axis=1)

    def min(self, x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(x)
        return np.minimum.reduceat(self._cols(x), self.starts, axis=1)


def unit_index(spec: Any) -> UnitIndex:
    """The (cached) :class:`UnitIndex` of ``spec.units``; dropped with the spec."""
    got = _CACHE.get(id(spec))
    if got is None:
        got = UnitIndex(*spec.units)
        _CACHE[id(spec)] = got
        weakref.finalize(spec, _CACHE.pop, id(spec), None)
    return got
