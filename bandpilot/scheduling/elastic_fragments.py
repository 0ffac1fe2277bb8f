"""GPUs an elastic round leaves idle while requests wait: fill them with a waiting job's smaller legal
size. The ``srpt-fill`` admission rule of :mod:`bandpilot.scheduling.elastic_admission` (a flag).

Why, measured (the entropy-guided scheduling paper's 50 jobs, ``srpt-suspend --current-share``, three seeds): the quotas count
GPUs for every claim, but a counted growth the pricer then refuses (2 -> 4 that could only cross a
NIC once another job took the one-host room) or an admission that finds no placement leaves them
free, and nothing else is admitted until the next round - which the simulator skips while nothing
changes (455 s for 2 GPUs once on one seed; 0.2-0.7 GPU-h a seed while jobs wait). After the round's
resizes and admissions, the requests still waiting are offered what is free, shortest remaining work
first (the order the ``srpt`` rules admit by), each at the largest size of its range up to its claim
that fits the roomiest host's free GPUs (at least its ``min_k``; one host: beyond it the collective
crosses the NICs), placed and priced as any admission. Suspended jobs resume the same way (the next
round may suspend them again, as any running job of more remaining work).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from bandpilot.dispatch.state import State
from bandpilot.scheduling.elastic_srpt import snap_down, claim
from bandpilot.topology.cluster import popcount


def fragment_size(req: Any, room: int, host: int) -> int:
    """The largest legal size of ``req`` (``lo``, ``hi``, ``step``) up to its ``srpt`` claim that fits
    ``room`` GPUs; 0 if not even its ``min_k`` does."""
    return snap_down(req.lo, req.hi, req.step, min(claim(req, host), room))


def fill_fragments(state: State, waiting: Sequence[str], reqs: Mapping[str, Any], remaining: Mapping[str, float],
                   host: int, place: Callable[[State, Any, int], tuple[State, bool]]) -> tuple[State, list[str]]:
    """Offer the free GPUs to the ``waiting`` requests, shortest ``remaining`` work first (ties: the
    given order), each at :func:`fragment_size` of the roomiest host's free GPUs, through ``place``
    (``(state, request, size) -> (state, placed?)``). Returns the state and the requests still waiting
    (in the given order)."""
    placed: set[str] = set()
    rank = {rid: n for n, rid in enumerate(waiting)}
    for rid in sorted(waiting, key=lambda r: (remaining.get(r, math.inf), rank[r])):
        room = int(popcount(state.free).max()) if state.free.size else 0
        if room == 0:
            break
        k = fragment_size(reqs[rid], room, host)
        if k:
            state, ok = place(state, reqs[rid], k)
            if ok:
                placed.add(rid)
    return state, [rid for rid in waiting if rid not in placed]
