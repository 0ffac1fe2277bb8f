"""Which GPUs does an elastic job gain or give up? Candidate grown sets and the least costly shrink,
by the predicted bandwidth under contention (:mod:`bandpilot.scheduling.elastic` prices and applies
them; split out to keep each module small)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.state import State
from bandpilot.topology.cluster import popcount


def _bits(spec: Any, mask: np.ndarray) -> list[tuple[int, int]]:
    out = []
    for h in np.flatnonzero(mask):
        m = int(mask[h])
        while m:
            b = m & -m
            out.append((int(h), b))
            m ^= b
    return out


def grow_steps(model: Any, mask: np.ndarray, free: np.ndarray, n_left: int) -> list[tuple[int, int]]:
    """One greedy step's candidates ``(host, bits to add)``: while more GPUs are needed than a host
    holds, a host's free GPUs as one chunk (a 1,024-GPU cluster offers 1,000 single GPUs per step);
    then single GPUs, of which a host's free GPUs giving the same stage-1 (in-host) value count
    once (every GPU of an NVSwitch host is alike)."""
    per_host = int(popcount(free | mask).max()) if free.size else 0
    stage1 = getattr(model, "stage1", None)
    out: list[tuple[int, int]] = []
    for h in np.flatnonzero(free):
        m = int(free[h])
        if n_left > per_host:
            bits = 0
            for _ in range(n_left):
                if not m:
                    break
                b = m & -m
                bits |= b
                m ^= b
            out.append((int(h), bits))
            continue
        bits = np.array([1 << i for i in range(m.bit_length()) if m >> i & 1], dtype=np.int64)
        if stage1 is not None:
            _, first = np.unique(np.asarray(stage1[h, int(mask[h]) | bits]), return_index=True)
            bits = bits[np.sort(first)]
        out.extend((int(h), int(b)) for b in bits)
    return out


def _greedy_add(pred: ContentionPredictor, spec: Any, mask: np.ndarray, free: np.ndarray, n_add: int) -> np.ndarray:
    mask, free = mask.copy(), free.copy()
    left = n_add
    while left > 0:
        cand = grow_steps(pred.model, mask, free, left)
        if not cand:
            break
        rows = np.repeat(mask[None, :], len(cand), axis=0)
        for i, (h, b) in enumerate(cand):
            rows[i, h] |= b
        p = pred.predict(rows)
        # ties (e.g. every GPU of an NVSwitch host): fewer hosts, then lowest id
        n_hosts = (rows != 0).sum(axis=1)
        best = int(np.lexsort((np.arange(len(cand)), n_hosts, -np.round(p.value, 6)))[0])
        h, b = cand[best]
        mask[h] |= b
        free[h] &= ~b
        left -= bin(b).count("1")
    return mask


#: Hosts with the most free GPUs tried as "fill this host first" growth seeds (besides the job's own).
SEED_HOSTS = 3


def _seed_hosts(mask: np.ndarray, free: np.ndarray) -> list[int]:
    """The job's own hosts with free GPUs and the :data:`SEED_HOSTS` hosts with the most free GPUs:
    on a 128-host cluster every host as a seed costs 129 greedy growths per resize."""
    cnt = np.array([bin(int(x)).count("1") for x in free])
    own = [int(h) for h in np.flatnonzero((mask != 0) & (cnt > 0))]
    top = [int(h) for h in np.argsort(-cnt, kind="stable")[:SEED_HOSTS] if cnt[h] > 0]
    return list(dict.fromkeys(own + top))


def grow_rows(model: Any, state: State, mask: np.ndarray, n_add: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidate grown sets ``mask`` + ``n_add`` free GPUs of ``state`` (which must not hold the
    job itself) and their predicted bandwidth ``B(S ∪ new)`` under contention.

    One GPU at a time is myopic where bandwidth follows the smallest per-host count (2+2 beats
    3+1 on the H100 fabric, but the first step prefers 3): so the candidates are the per-GPU
    greedy growth and, for the job's own hosts and the hosts with the most free GPUs, "as many as
    possible from that host first, then greedy"."""
    free = state.free & ~mask
    pred = ContentionPredictor(model, state)
    cands = [_greedy_add(pred, state.spec, mask, free, n_add)]
    for h in _seed_hosts(mask, free):
        m, f = mask.copy(), free.copy()
        bits = _bits(state.spec, np.where(np.arange(free.size) == h, free, 0))[:n_add]
        for hh, b in bits:
            m[hh] |= b
            f[hh] &= ~b
        cands.append(_greedy_add(pred, state.spec, m, f, n_add - len(bits)))
    rows = np.unique(np.array(cands), axis=0)
    return rows, pred.predict(rows).value


def grow_gpus(model: Any, state: State, mask: np.ndarray, n_add: int, *, blind: bool = False) -> tuple[np.ndarray, float | None]:
    """``mask`` plus ``n_add`` free GPUs of ``state`` (which must not hold the job itself), and the
    grown set's predicted bandwidth under contention (None when blind): of :func:`grow_rows`, the
    one with the highest predicted ``B(S ∪ new)`` (ties: fewer hosts)."""
    mask = mask.copy()
    if blind:
        for h, b in _bits(state.spec, state.free & ~mask)[:n_add]:
            mask[h] |= b
        return mask, None
    if n_add <= 0:
        return mask, None
    rows, value = grow_rows(model, state, mask, n_add)
    n_hosts = (rows != 0).sum(axis=1)
    best = int(np.lexsort((np.arange(len(rows)), n_hosts, -np.round(value, 6)))[0])
    return rows[best].copy(), float(value[best])


def shrink_gpus(model: Any, state: State, mask: np.ndarray, n_remove: int, *, blind: bool = False) -> tuple[np.ndarray, float | None]:
    """``mask`` without the ``n_remove`` GPUs whose removal costs least predicted bandwidth."""
    mask = mask.copy()
    if blind:
        for h, b in _bits(state.spec, mask)[::-1][:n_remove]:
            mask[h] &= ~b
        return mask, None
    pred = ContentionPredictor(model, state)
    value = None
    for _ in range(n_remove):
        cand = _bits(state.spec, mask)
        rows = np.repeat(mask[None, :], len(cand), axis=0)
        for i, (h, b) in enumerate(cand):
            rows[i, h] &= ~b
        p = pred.predict(rows)
        n_hosts = (rows != 0).sum(axis=1)
        best = int(np.lexsort((np.arange(len(cand)), n_hosts, -np.round(p.value, 6)))[0])
        mask = rows[best]
        value = float(p.value[best])
    return mask, value


_BEST: dict[tuple[str, int], float] = {}


def idle_best_gbps(dispatcher: Any, k: int) -> float:
    """Predicted bandwidth of the best ``k``-GPU placement on the idle cluster (cached): the
    reference the job's declared collective share refers to."""
    spec = dispatcher.model.spec
    key = (spec.fingerprint(), k)
    if key not in _BEST:
        _BEST[key] = float(dispatcher.select(k, State.idle(spec), "bandpilot").predicted_gbps or 0.0)
    return _BEST[key]
