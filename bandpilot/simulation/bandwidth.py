"""What bandwidth does each running job really get? The TRUE fabric (measured tables or the
emulator) under the contention formula of :mod:`bandpilot.dispatch.contention`, applied to every
running job against all the others, and the best standalone bandwidth of a size on an idle cluster.

For running job ``i`` with GPUs ``S_i`` and true standalone demand ``d_i = B(S_i)``: contenders are
the other cross-host jobs with ``d_j > 0`` sharing a host with a cross-host ``S_i``; capacity
``C_i = min_j B(S_i ∪ S_j)``; ``B_i = d_i`` if ``d_i + Σ d_j <= C_i`` else ``d_i / (d_i + Σ d_j) · C_i``
(the evaluation's ground truth, :func:`bandpilot.evaluation.scoring.evaluate_scenario`, is the same
formula with the job as a candidate). Under the ``comm`` demand model (:mod:`bandpilot.dispatch.demand`)
each contender's ``d_j`` in the sum is its pressure ``f_j · d_j``; the job's own ``d_i`` is not scaled. Fabric values are cached per mask row: the running set
changes one job at a time, so most rows repeat.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.dispatch.state import State


class TrueBandwidth:
    """Cached ground truth over one fabric."""

    def __init__(self, fabric: Any) -> None:
        self.fabric = fabric
        self.spec = fabric.spec
        self._cache: dict[bytes, float] = {}
        self._ref: dict[int, float] = {}

    def standalone(self, masks: np.ndarray) -> np.ndarray:
        """``B(S)`` of mask rows, from the cache where possible (one fabric call for the rest)."""
        masks = np.ascontiguousarray(np.atleast_2d(masks), dtype=np.int64)
        if masks.shape[0] == 0:
            return np.zeros(0)
        # row keys as bytes in one call (a void view's tolist), looked up in one pass: per-row
        # tobytes() and index loops were most of the truth's time with hundreds of running jobs
        keys = masks.view(np.dtype((np.void, masks.dtype.itemsize * masks.shape[1]))).ravel().tolist()
        cache = self._cache
        got = [cache.get(k) for k in keys]
        todo = [i for i, v in enumerate(got) if v is None]
        if todo:
            uniq: dict[bytes, int] = {}
            rows = []
            for i in todo:
                if keys[i] not in uniq:
                    uniq[keys[i]] = len(rows)
                    rows.append(i)
            vals = np.asarray(self.fabric.predict_masks(masks[rows]), dtype=float).reshape(-1)
            for key, j in uniq.items():
                cache[key] = float(vals[j])
            for i in todo:
                got[i] = cache[keys[i]]
        return np.array(got, dtype=float)

    def reference(self, k: int) -> float:
        """``B_ref``: the best standalone bandwidth of ``k`` GPUs on the idle cluster (Ideal-BP
        search on the true fabric; 0 for ``k = 1``, which has no collective)."""
        if k not in self._ref:
            if k < 2:
                self._ref[k] = 0.0
            else:
                from bandpilot.dispatch.dispatcher import Dispatcher

                sel = Dispatcher(self.fabric).select(k, State.idle(self.spec), algorithm="ideal", fabric=self.fabric)
                self._ref[k] = float(sel.standalone_gbps)
        return self._ref[k]

    def achieved(self, masks: np.ndarray, pressure_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(B_i under the others, B_i standalone)`` for the running jobs' mask rows ``(n, H)``;
        ``pressure_factors`` (default 1) scale what each job charges the others."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        if n == 0:
            return np.zeros(0), np.zeros(0)
        solo = self.standalone(masks)
        used = masks != 0
        # only cross-host jobs with demand contend: pairs among them alone (most running jobs are
        # single-host; an n x n product of all of them per event was most of this function)
        act = np.flatnonzero((used.sum(axis=1) >= 2) & (solo > 0))
        if act.size < 2:
            return solo.copy(), solo
        ai, aj = _sharing_pairs(used[act])
        if ai.size == 0:
            return solo.copy(), solo
        ci, cj = act[ai], act[aj]
        # (i, j) and (j, i) are one super allocation: each unordered pair is looked up once
        pair, inv = np.unique(np.minimum(ci, cj) * n + np.maximum(ci, cj), return_inverse=True)
        caps_pair = self.standalone(masks[pair // n] | masks[pair % n])[inv.ravel()]
        cap = np.full(n, np.inf)
        np.minimum.at(cap, ci, caps_pair)
        press = solo if pressure_factors is None else solo * np.asarray(pressure_factors, dtype=float)
        demand = solo.copy()
        np.add.at(demand, ci, press[cj])
        with np.errstate(divide="ignore", invalid="ignore"):
            shared = np.where(demand > 0, solo / demand * cap, 0.0)
        return np.where(demand <= cap, solo, shared), solo


def _sharing_pairs(used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordered pairs ``(i, j)``, ``i != j``, of rows of ``used`` (jobs x hosts) that share a host,
    sorted by ``(i, j)``: from the host -> job incidence (no BLAS product of the whole matrix,
    which on a busy 2-core machine spun its threads for a few hundred rows)."""
    m = used.shape[0]
    host, jobs = np.nonzero(used.T)  # incidences grouped by host
    if host.size == 0:
        return host, host
    starts = np.flatnonzero(np.r_[True, host[1:] != host[:-1]])
    sizes = np.diff(np.r_[starts, host.size])
    grp = np.repeat(np.arange(starts.size), sizes)
    gs = sizes[grp]  # each incidence pairs with every member of its host's group
    ai = np.repeat(jobs, gs)
    first = np.repeat(starts[grp], gs)
    within = np.arange(int(gs.sum())) - np.repeat(np.cumsum(gs) - gs, gs)
    aj = jobs[first + within]
    code = np.unique(ai[ai != aj] * m + aj[ai != aj])
    return code // m, code % m
