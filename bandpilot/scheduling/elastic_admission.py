"""Who joins the next epoch's GPU quotas, and with how many GPUs? The entropy-guided scheduling paper's quotas (eq. 31) and the
admission rules of :mod:`bandpilot.scheduling.elastic` as a plug-in registry (:data:`ADMISSIONS`).

*Quotas* (:func:`elastic_quotas`): the GPUs in play ``G`` (free ones plus those of the running jobs
at an epoch boundary) are shared ``G · U_j / Σ U`` over the jobs admitted, clamped to each job's
``[min_k, max_k]`` by water-filling and snapped to its ``k_step``. A running job is always admitted
(at least its ``min_k``: no preemption here); pending ones are admitted in the caller's order
(utility first) while what the rule makes them claim fits:

* ``fit-k`` (default, best measured): the requested ``k`` fits the GPUs in play once the running
  jobs at a boundary are counted at their ``min_k``;
* ``min-k``: the ``min_k`` fits, then every request that fits anything starts (leftovers);
* ``srpt`` (SRTF-like, a flag: not the seed's): pending requests in order of estimated remaining
  work (:mod:`bandpilot.scheduling.elastic_remaining`); a newcomer claims half its ``k``, the jobs
  admitted with less remaining work keep their size against it, those with more yield to ``min_k``;
* ``idle`` (the entropy-guided scheduling paper Sec. 4.5 as written: "the scheduler selects the highest-scoring job that fits
  within the currently idle GPUs"): the requested ``k`` fits the GPUs idle now - running jobs are
  never shrunk to make room for a newcomer, only re-shared among the admitted by utility.

``srpt-host``, ``srpt-suspend`` (:mod:`bandpilot.scheduling.elastic_srpt`), ``hesrpt-suspend``
(:mod:`bandpilot.scheduling.elastic_hesrpt`) and ``srpt-marginal`` (claims sized by marginal gain on each
job's priced speed curve, :mod:`bandpilot.scheduling.elastic_marginal`) replace the quotas themselves;
``srpt-fill`` is ``srpt-suspend`` whose leftover fragments go to waiting requests
(:mod:`bandpilot.scheduling.elastic_fragments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from bandpilot.errors import RequestError
from bandpilot.scheduling.elastic_hesrpt import hesrpt_quotas
from bandpilot.scheduling.elastic_marginal import marginal_claims
from bandpilot.scheduling.elastic_srpt import srpt_quotas


@dataclass(frozen=True)
class Candidate:
    id: str
    k: int  # current size (running) or requested size (pending)
    lo: int
    hi: int
    step: int
    utility: float
    running: bool
    remaining: float = math.inf  # estimated remaining GPU-seconds (``srpt`` admission only; inf: unknown)
    curve: tuple[tuple[int, float], ...] | None = None  # (k, relative run time) per size (``srpt-marginal`` only)
    behind: int = 0  # running jobs not in the round with more remaining work (``srpt-marginal`` only)


def snap_size(c: Candidate, x: float) -> int:
    """The largest allowed size <= x (at least min_k)."""
    if x <= c.lo:
        return c.lo
    return min(c.hi, c.lo + int(math.floor((x - c.lo) / c.step + 1e-9)) * c.step)


@dataclass(frozen=True)
class Admission:
    """When does a pending request join the quotas? ``need``: the GPUs it claims for admission
    (running jobs always claim their ``min_k``); ``fill_leftovers``: after the quotas, requests still
    waiting start on whatever is left free (at the largest size that fits); ``idle_only``: the
    claims of the pending requests must also fit the GPUs idle now (not those running jobs at a
    boundary would give up)."""

    name: str
    need: Callable[[Candidate, int], int]
    fill_leftovers: bool
    doc: str
    idle_only: bool = False
    srpt: bool = False  # pending ones in order of remaining work; only jobs with more remaining yield to min_k
    host_srpt: bool = False  # quotas by remaining work, one host's worth each (bandpilot.scheduling.elastic_srpt)
    suspend: bool = False  # with host_srpt/hesrpt: a running job may get 0 GPUs (suspended at its boundary)
    hesrpt: bool = False  # quotas by heSRPT shares of the rank in remaining work (bandpilot.scheduling.elastic_hesrpt)
    marginal: bool = False  # with host_srpt: claims by marginal gain on each job's speed curve (elastic_marginal)
    fill_fragments: bool = False  # after the round, waiting requests fill what is still free (elastic_fragments)


#: Admission rules by name (``rebalance(admission=...)``, ``simulate --admission``). ``fit-k`` is the
#: default (best measured: benchmarks/bench_elastic.py): admitting the queue at ``min_k`` runs ~2.5x as many jobs at
#: once, every one slowly - processor sharing, which on a burst doubles mean JCT against first come,
#: first served - and crowds the NICs; ``idle`` (the seed's text) lets 16-GPU jobs starve behind
#: smaller ones, as greedy backfill does.
ADMISSIONS = {a.name: a for a in (
    Admission("fit-k", lambda c, n: max(c.lo, min(c.k, n)), False,
              "while the requested k of every admitted request fits; quotas then water-fill into the ranges"),
    Admission("min-k", lambda c, n: c.lo, True,
              "while min_k fits, then the leftovers (every request that fits runs, small)"),
    Admission("idle", lambda c, n: max(c.lo, min(c.k, n)), False,
              "the entropy-guided scheduling paper's text: while the requested k fits the GPUs idle now (running jobs are not shrunk for it)",
              idle_only=True),
    # SRTF-like admission (benchmarks/bench_elastic.py): a newcomer claims half its k; the admitted jobs with less
    # remaining work than it keep their size against it, those with more yield to their min_k
    Admission("srpt", lambda c, n: max(c.lo, min(c.k // 2, n)), False,
              "by remaining work: jobs with less remaining keep their size, the others yield to min_k; "
              "a newcomer claims half its k", srpt=True),
    # fewer jobs at once (flags; benchmarks/bench_elastic.py): shortest remaining work first, one host's worth
    # each; running jobs keep min_k (srpt-host) or are suspended to 0 at their boundary (srpt-suspend)
    Admission("srpt-host", lambda c, n: c.lo, False,
              "by remaining work, each up to one host's GPUs; running jobs keep their min_k", srpt=True, host_srpt=True),
    Admission("srpt-suspend", lambda c, n: c.lo, False,
              "by remaining work, each up to one host's GPUs; a running job that gets none is suspended "
              "at its epoch boundary (0 GPUs) and resumes later", srpt=True, host_srpt=True, suspend=True),
    # the mean-JCT optimum for a concave speedup k^p (heSRPT): every job a share by its rank in
    # remaining work, the shortest the most; a share below min_k suspends a running job
    Admission("hesrpt-suspend", lambda c, n: c.lo, False,
              "heSRPT shares by rank in remaining work, each up to one host's GPUs; a running job whose share "
              "is below its min_k is suspended at its epoch boundary", srpt=True, suspend=True, hesrpt=True),
    # srpt-suspend with each claim sized by marginal gain: the size minimising t(k)·(1 + m·k/G) on the
    # job's priced speed curve, m = the jobs waiting on its GPU-hours (bandpilot.scheduling.elastic_marginal)
    Admission("srpt-marginal", lambda c, n: c.lo, False,
              "by remaining work, each claiming the size whose time saved beats the GPU-time it costs the "
              "jobs behind (up to one host); a running job that gets none is suspended at its epoch boundary",
              srpt=True, host_srpt=True, suspend=True, marginal=True),
    # srpt-suspend whose round, when GPUs it counted stay free (a refused growth, a failed placement) while
    # requests wait, admits them there at a smaller legal size (bandpilot.scheduling.elastic_fragments)
    Admission("srpt-fill", lambda c, n: c.lo, False,
              "srpt-suspend; GPUs still free after the round while requests wait go to them, shortest remaining "
              "work first, each at the largest size up to its claim that fits one host's free GPUs",
              srpt=True, host_srpt=True, suspend=True, fill_fragments=True),
)}
DEFAULT_ADMISSION = "fit-k"


def _admitted_srpt(cands: Sequence[Candidate], n_gpus: int, rule: Admission) -> list[Candidate]:
    """Running jobs first, then pending ones by remaining work (stable: ties keep the caller's
    order); a pending one is admitted if its claim fits beside the admitted, each counted at its
    size (running: held now; admitted: requested k) when it has no more remaining work than the
    newcomer, else at its ``min_k`` (it yields)."""
    admitted = [c for c in cands if c.running]
    for c in sorted((c for c in cands if not c.running), key=lambda c: c.remaining):
        need = sum(a.k if a.remaining <= c.remaining else a.lo for a in admitted)
        if need + rule.need(c, n_gpus) <= n_gpus:
            admitted.append(c)
    return admitted


def _admitted(cands: Sequence[Candidate], n_gpus: int, rule: Admission, n_idle: int) -> list[Candidate]:
    if rule.srpt:
        return _admitted_srpt(cands, n_gpus, rule)
    admitted: list[Candidate] = []
    need = claimed = 0
    for c in sorted(cands, key=lambda c: not c.running):  # running first, then the given order
        if c.running:
            admitted.append(c)
            need += c.lo
            continue
        nk = rule.need(c, n_gpus)
        if need + nk <= n_gpus and (not rule.idle_only or claimed + nk <= n_idle):
            admitted.append(c)
            need += nk
            claimed += nk
    return admitted


def elastic_quotas(cands: Sequence[Candidate], n_gpus: int, admission: str = DEFAULT_ADMISSION,
                   n_idle: int | None = None, host: int = 8, keep: bool = False,
                   n_cluster: int | None = None) -> dict[str, int]:
    """Integer GPU quotas for the admitted candidates (absent = stays pending); they add up to at
    most ``n_gpus``. ``cands`` come in admission order; running ones must fit at their ``min_k``;
    pending ones are admitted while what they claim under ``admission`` (:data:`ADMISSIONS`) fits
    (``n_idle``: the GPUs idle now, for the rules that admit into idle GPUs only; default all).
    The ``srpt-host``/``srpt-suspend`` rules share by remaining work, up to ``host`` GPUs each,
    and ``srpt-suspend`` may give a running job 0 (:func:`~bandpilot.scheduling.elastic_srpt.srpt_quotas`;
    ``keep``: when nothing waits, running jobs keep their current size first; ``srpt-marginal`` sizes
    the claims for a cluster of ``n_cluster`` GPUs, default ``n_gpus``)."""
    rule = ADMISSIONS[admission]
    if rule.hesrpt:
        return hesrpt_quotas(cands, n_gpus, host)
    if rule.host_srpt:
        claims = marginal_claims(cands, n_cluster or n_gpus) if rule.marginal else None
        return srpt_quotas(cands, n_gpus, host, rule.suspend, keep, claims)
    admitted = _admitted(cands, n_gpus, ADMISSIONS[admission], n_gpus if n_idle is None else n_idle)
    if not admitted:
        return {}
    used = sum(c.lo for c in admitted if c.running)
    if used > n_gpus:
        raise RequestError(f"running jobs need {used} GPUs at their min_k but only {n_gpus} are in play")
    w = {c.id: max(c.utility, 1e-6) for c in admitted}
    share: dict[str, float] = {}
    fixed: dict[str, float] = {}
    while True:  # water-filling: clamp the ones outside [lo, hi], share the rest again
        free = [c for c in admitted if c.id not in fixed]
        budget = n_gpus - sum(fixed.values())
        tot = sum(w[c.id] for c in free)
        share = {c.id: budget * w[c.id] / tot for c in free} if free else {}
        low = [c for c in free if share[c.id] < c.lo]
        high = [c for c in free if share[c.id] > c.hi]
        if not low and not high:
            break
        for c in low or high:  # fix the lower bounds first: they take budget from the others
            fixed[c.id] = c.lo if low else c.hi
    exact = {**fixed, **share}
    quota = {c.id: snap_size(c, exact[c.id]) for c in admitted}
    left = n_gpus - sum(quota.values())
    # hand out what rounding left, a step at a time, largest shortfall (then utility) first
    for c in sorted(admitted, key=lambda c: (-(exact[c.id] - quota[c.id]), -w[c.id], c.id)):
        if left >= c.step and quota[c.id] + c.step <= c.hi:
            quota[c.id] += c.step
            left -= c.step
    return quota
