"""Claims by marginal gain: how many GPUs should each job ask for, given the jobs waiting behind it?
The ``srpt-marginal`` admission rule of :mod:`bandpilot.scheduling.elastic_admission` (a flag,
not the entropy-guided scheduling paper's rule).

Why: ``srpt-suspend`` gives every job a fixed claim of 2 x ``min_k``. For the sum of completion
times on a pool of ``G`` GPUs, a job that runs at ``k`` GPUs for ``t(k)`` finishes ``t(k)`` after it
starts and holds ``k · t(k)`` GPU-seconds that every job behind it waits for (Smith's ratio rule for
moldable jobs; the marginal-gain allocation of Optimus/Pollux with the objective being mean JCT, not
throughput). So job ``i`` of ``n`` candidates in order of remaining work, with ``m = n - i`` jobs (itself
included) waiting on its GPU-hours, claims the size

    k* = argmin_k  t(k) · (1 + m · k / G)

- a growth step is taken while the time it saves the job exceeds the GPU-time it costs the ``m``
jobs behind. ``t(k)`` is the job's *priced* speedup curve, not an assumed power law: the runtime model
the pricers use (:func:`~bandpilot.scheduling.elastic_pricing.grow_ratio`: compute at the declared
scaling ``η``, the ring collective at the best idle bandwidth of each size relative to its declared
share at its requested ``k``), over the sizes of its range up to one host (beyond it the collective
crosses the NICs; the leftovers' growth when nothing waits may still go further). Only the ratio
``t(k) / t(k0)`` matters, so the estimate of remaining work orders the jobs but does not size them.
The shortest job with many behind it takes a small, cheap gang; the last jobs take their fastest size.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from bandpilot.scheduling.elastic_pricing import DEFAULT_COMM, GROW_GAIN, grow_ratio


def speed_curve(k0: int, f: float | None, eta: float | None, sizes: Sequence[int],
                best: Callable[[int], float]) -> tuple[tuple[int, float], ...]:
    """``(k, t(k) / t(k0))`` over ``sizes`` for a job requesting ``k0`` GPUs with collective share
    ``f`` (undeclared: :data:`DEFAULT_COMM`) and scaling ``eta`` (undeclared: perfect); ``best(k)``: the
    best idle bandwidth of ``k`` GPUs (the reference of the declared share)."""
    f = DEFAULT_COMM if f is None else float(f)
    eta = 1.0 if eta is None else float(eta)
    ref = max(k0, 2)
    b_ref = best(ref)
    scale = k0 / ref  # a 1-GPU job's share is read at 2 GPUs (as the admission pricing does)
    return tuple((k, grow_ratio(f, ref, b_ref, k, best(k) if k > 1 else 0.0, eta) * scale) for k in sizes)


def with_curves(cands: Sequence, info: Mapping[str, tuple[int, float | None, float | None]], host: int,
                best: Callable[[int], float], declared: bool = True) -> list:
    """The candidates with their speed curves over the sizes of their range that tile a host (divide
    ``host``: a 3- or 6-GPU gang strands GPUs no other gang of the workload fits; only ``min_k`` when
    none does) (``info``: job id -> requested k, collective share, declared scaling; ``declared=False``
    prices every job as perfect)."""
    out = []
    for c in cands:
        k0, f, eta = info[c.id]
        sizes = [k for k in range(c.lo, min(c.hi, max(c.lo, host)) + 1, c.step) if host % k == 0] or [c.lo]
        out.append(replace(c, curve=speed_curve(k0, f, eta if declared else None, sizes, best)))
    return out


def curves_of(cands: Sequence, running: Iterable[Any], pending: Iterable[Any], host: int,
              best: Callable[[int], float], declared: bool = True, remaining: Mapping[str, float] | None = None) -> list:
    """:func:`with_curves` from the store's rows: ``running`` (id, k, comm_fraction, scaling) and the
    ``pending`` requests; ``remaining``: every job's remaining work, so that each candidate also counts
    the running jobs *not* at a boundary with more remaining work as waiting on it (``behind``): who is
    at a boundary changes every round, and a claim must not change with it."""
    info = {r.id: (r.k, r.comm_fraction, r.scaling) for r in running}
    info.update({q.id: (q.k, q.comm_fraction, q.scaling) for q in pending})
    ids = {c.id for c in cands}
    rest = sorted(w for j, w in (remaining or {}).items() if j not in ids)  # sorted: one bisection a candidate
    return [replace(c, behind=len(rest) - bisect_right(rest, c.remaining))
            for c in with_curves(cands, info, host, best, declared)]


def marginal_claims(cands: Sequence, n_cluster: int) -> dict[str, int]:
    """Each candidate's claim (module docstring), in the order of remaining work the ``srpt`` rules use
    (a running job before a pending one of equal work); candidates without a curve are left out."""
    order = sorted(cands, key=lambda c: (c.remaining, not c.running))
    n, g = len(order), max(1, n_cluster)
    out: dict[str, int] = {}
    for i, c in enumerate(order):
        if not c.curve:
            continue
        m = n - i + c.behind  # itself and every job after it wait on its GPU-hours
        cost = {k: r * (1.0 + m * k / g) for k, r in c.curve}
        best = min(cost, key=lambda k: (cost[k], k))
        # a running job keeps its size unless the best claim gains what a restart must (the pricers' 2 %)
        keep = c.running and c.k in cost and cost[c.k] <= cost[best] * (1.0 + GROW_GAIN)
        out[c.id] = c.k if keep else best
    return out
