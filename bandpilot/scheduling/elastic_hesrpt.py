"""heSRPT quotas with suspension: every job (running at a boundary or pending) gets the share of the
GPUs that minimises mean completion time when speed grows as ``k^p`` (Berg, Vesilo, Harchol-Balter,
"heSRPT", 2020), by its rank in remaining work - the ``hesrpt-suspend`` admission rule of
:mod:`bandpilot.scheduling.elastic_admission` (a flag, not the entropy-guided scheduling paper's rule).

Why: ``srpt-suspend`` gives each job a fixed claim (2 x ``min_k``) in order of remaining work; the
mean-JCT optimum for a concave speedup instead shares the GPUs among *all* jobs, the shortest getting
the most. With the jobs in order of remaining work, largest first (``i = 1 .. N``), job ``i`` gets

    θ_i = (i / N)^c - ((i - 1) / N)^c,   c = 1 / (1 - p)

of the GPUs (the shortest ``1 - ((N-1)/N)^c``). ``p`` is the speedup exponent (:data:`SPEEDUP_P`): the
runtime model's curve on one host (compute at η = 0.9 per doubling plus a ring collective) grows
about as ``k^0.5 .. k^0.75`` for the entropy-guided scheduling paper's job types, so the shares are far flatter than the
compute-only ``k^0.85`` would make them.

*Integer quotas*: in order of remaining work (shortest first), each job takes its share plus what the
shorter jobs could not use (``carry``), snapped into its range and capped at one host (beyond it the
collective crosses the NICs); a share below ``min_k`` is 0 - a running job is then suspended at its
epoch boundary - and its share carries on to the next job. GPUs left by the snapping grow the shortest
jobs up to their cap, then start waiting ones at ``min_k``.
"""

from __future__ import annotations

from typing import Sequence

#: The speedup exponent ``p`` of ``k^p`` the shares assume (module docstring; tuned on ten seeds
#: of benchmarks/bench_elastic.py).
SPEEDUP_P = 0.6

#: A running job keeps its size while its new quota stays within this factor of it: every resize is a
#: checkpoint-restart (``resize_s``), and heSRPT shares move at every arrival and completion (measured,
#: measured: without it ~720 resizes per 50 jobs).
KEEP_FACTOR = 3.0


def _snap_down(lo: int, hi: int, step: int, x: float) -> int:
    """The largest size of ``lo + n·step`` (<= hi) that is <= x; 0 if x < lo."""
    if x < lo:
        return 0
    return lo + ((min(int(x + 1e-9), hi) - lo) // step) * step


def hesrpt_shares(n: int, p: float) -> list[float]:
    """heSRPT's shares of ``n`` jobs, shortest first (they add up to 1)."""
    c = 1.0 / (1.0 - p)
    return [((n - j) / n) ** c - ((n - j - 1) / n) ** c for j in range(n)]


def hesrpt_quotas(cands: Sequence, n_gpus: int, host: int, p: float = SPEEDUP_P) -> dict[str, int]:
    """Quotas by heSRPT shares (module docstring): every running candidate gets a quota (0:
    suspended); a pending one absent from the result waits."""
    order = sorted(cands, key=lambda c: (c.remaining, not c.running))  # a running job first on ties
    if not order:
        return {}
    cap = {c.id: max(c.lo, min(c.hi, host)) for c in order}
    out: dict[str, int] = {}
    budget, carry = n_gpus, 0.0
    for c, share in zip(order, hesrpt_shares(len(order), p)):
        want = share * n_gpus + carry
        q = _snap_down(c.lo, cap[c.id], c.step, min(want + 0.5, budget))  # nearest size, within budget
        if c.running and q and c.k / KEEP_FACTOR <= q <= c.k * KEEP_FACTOR and c.lo <= c.k <= min(budget, cap[c.id]):
            q = c.k  # close enough: no resize
        out[c.id] = q
        budget -= q
        carry = max(0.0, want - q)
    for c in order:  # rounding leftovers: grow the shortest up to their cap, then start waiting ones
        if budget <= 0:
            break
        if out[c.id]:
            q = _snap_down(c.lo, cap[c.id], c.step, out[c.id] + budget)
            budget -= q - out[c.id]
            out[c.id] = q
    for c in order:
        if not out[c.id] and c.lo <= budget:
            out[c.id] = _snap_down(c.lo, cap[c.id], c.step, min(budget, c.lo))
            budget -= out[c.id]
    return {c.id: q for c in order for q in [out[c.id]] if q or c.running}
