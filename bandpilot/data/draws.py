"""Random subsets for the profiling plan, many per numpy call, drawing exactly what
``Generator.choice(n, size=c, replace=False)`` draws.

Why: the rack-scale plan places ~150 k domain parts and ~1.1 M tray subsets at 100,008 GPUs; one
``choice`` call per subset (~20 us of call overhead for 1-4 draws) was most of a minute. Why the same
draws: a plan is reproducible by seed, and plans written before must stay the same plan.

How ``choice`` draws (numpy's Floyd path, ``n`` <= 10,000): one bounded integer in ``[0, j]`` for
``j = n - c .. n - 1`` (a repeat takes ``j`` instead), then a Fisher-Yates shuffle drawing in
``[0, i]`` for ``i = c - 1 .. 1``. The bounds do not depend on the values drawn, so the draws of
several subsets are one ``Generator.integers`` call over their concatenated bounds (the same
bounded-integer routine, in the same order). ``tests/test_domains.py`` checks the equality
against ``choice`` itself, values and generator state.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

_FLOYD_MAX = 10_000  # numpy switches to a tail shuffle above this population


@functools.lru_cache(maxsize=4096)
def _bounds(n: int, c: int) -> tuple[int, ...]:
    """The exclusive upper bounds of the draws ``choice(n, c)`` makes, in order."""
    if not 0 <= c <= n:
        raise ValueError(f"cannot choose {c} of {n} without replacement")
    return tuple(range(n - c + 1, n + 1)) + tuple(range(c, 1, -1))


def _realise(n: int, c: int, v: Sequence[int]) -> list[int]:
    """The indices ``choice(n, c)`` returns for the draws ``v`` (Floyd, then the shuffle)."""
    seen: set[int] = set()
    out: list[int] = []
    for x, j in zip(v, range(n - c, n)):
        x = j if x in seen else x
        seen.add(x)
        out.append(x)
    for k, i in enumerate(range(c - 1, 0, -1)):
        j = v[c + k]
        out[i], out[j] = out[j], out[i]
    return out


def _floyd_mask(n: int, c: int, v: Sequence[int]) -> int:
    """The bit mask of the set ``choice(n, c)`` returns for the draws ``v`` (the shuffle's draws
    only order it)."""
    mask = 0
    for x, j in zip(v, range(n - c, n)):
        bit = 1 << x
        mask |= (1 << j) if mask & bit else bit
    return mask


def _draw(rng: np.random.Generator, bounds: list[int]) -> list[int]:
    return rng.integers(0, np.array(bounds, dtype=np.int64)).tolist() if bounds else []


def choices(rng: np.random.Generator, pairs: Sequence[tuple[int, int]]) -> list[list[int]]:
    """``[rng.choice(n, size=c, replace=False).tolist() for n, c in pairs]`` in one draw."""
    if any(n > _FLOYD_MAX for n, _ in pairs):  # numpy's other path: call it, in the same order
        return [rng.choice(n, size=c, replace=False).tolist() for n, c in pairs]
    bounds = [_bounds(n, c) for n, c in pairs]
    v = _draw(rng, [b for bs in bounds for b in bs])
    out, at = [], 0
    for (n, c), bs in zip(pairs, bounds):
        out.append(_realise(n, c, v[at : at + len(bs)]))
        at += len(bs)
    return out


def pick_with_subsets(rng: np.random.Generator, n: int, g: int, counts: Sequence[int]) -> tuple[list[int], list[int]]:
    """``choice(n, len(counts))`` (the order kept: it pairs counts with trays), then a subset of
    ``c`` of ``g`` GPUs per count as a bit mask - one draw for all, as the separate calls would."""
    if max(n, g) > _FLOYD_MAX:
        idx = rng.choice(n, size=len(counts), replace=False).tolist()
        return idx, [sum(1 << int(i) for i in rng.choice(g, size=c, replace=False)) for c in counts]
    head = _bounds(n, len(counts))
    flat = list(head)
    for c in counts:
        flat += _bounds(g, c)
    v = _draw(rng, flat)
    idx = _realise(n, len(counts), v[: len(head)])
    masks, at = [], len(head)
    for c in counts:
        masks.append(_floyd_mask(g, c, v[at : at + c]))
        at += len(_bounds(g, c))
    return idx, masks
