"""Which growth or admission of an elastic job is worth it? Pricing plug-ins for
:mod:`bandpilot.scheduling.elastic` (the model prices ``B(S ∪ new)`` under contention).

The elastic round proposes candidates - a running job's grown GPU sets at a few sizes, a pending
job's placements at a few sizes - and a *pricer* (:data:`PRICERS`) picks one, or none:

* ``welfare`` (the default): the **total** predicted effect. A change of job ``x`` from set ``A``
  (or nothing, for an admission) to ``B`` moves the predicted epoch time of ``x`` and of every
  cross-host co-tenant whose NICs ``A`` or ``B`` touch. Each job's epoch time is
  ``(1 - f) · compute + f · collective`` with the collective at its predicted contended bandwidth
  (:func:`tenant_bandwidths`, the contention predictor's formula with the job left out of its own
  contenders), so a co-tenant ``j`` at ``B_j`` before and ``B_j'`` after changes by
  ``f_j · (B_j / B_j' - 1)`` of its epoch time. The price of a change is the sum of these relative
  changes over ``x`` and its co-tenants (each job's current epoch time counts as 1): a growth is taken
  only if that sum is a gain of at least :data:`GROW_GAIN`; an admission takes the option with the
  lowest sum (its own epoch time relative to its declared size on the best idle placement, plus what
  it imposes). Under the ``full`` demand model a NIC-spanning newcomer roughly halves each
  co-tenant's collective bandwidth, which the job's own prediction never saw.
* ``self`` (the baseline, the pricing before): only the job's own predicted epoch time at the
  contended ``B(S ∪ new)``; what it imposes on co-tenants is free.

Both price a job's compute share by its **declared** scaling efficiency ``η`` per doubling of GPUs
(the request's ``scaling``; an undeclared one as perfect, ``η = 1``), the simulator's runtime model:
compute at ``k1`` relative to ``k0`` is ``(k0 / k1) / η^log2(k1 / k0)``. ``scaling="perfect"``
(:data:`SCALING_MODES`) prices every job as perfectly scaling, the pricing before it was declarable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.demand import pressure_factor
from bandpilot.dispatch.state import State

#: A candidate growth: (size, GPU mask, its predicted bandwidth under the other jobs).
Grown = tuple[int, np.ndarray, float]
#: Communication fraction assumed for a job that declares none (pricing only).
DEFAULT_COMM = 0.5
#: A growth must cut the predicted epoch time (the sum, for ``welfare``) by at least this much:
#: it costs a restart.
GROW_GAIN = 0.02
#: How the compute share of a growth is priced: by each request's declared ``scaling`` (undeclared:
#: perfect) or as perfect for every job (the pricing before ``scaling`` was declarable; comparison).
SCALING_MODES = ("declared", "perfect")
DEFAULT_SCALING_MODE = "declared"


def current_share(f: float, k_req: int, b_ref: float, k: int, b: float, eta: float = 1.0) -> float:
    """The collective share of a job's epoch at ``k`` GPUs on bandwidth ``b``, when it declares the
    share ``f`` at its requested ``k_req`` on the best idle placement ``b_ref`` (the runtime model:
    compute ``(1 - f) · (k_req / k) / η^log2(k / k_req)``, collective ``f · r(k) / r(k_req) · b_ref / b``).
    :func:`grow_ratio` wants the share *now*: a 16-GPU job declaring 0.45 across the NICs spends far
    less of its epoch in the collective at 8 GPUs on one NVSwitch host, so growing it back across the
    NICs costs less than the declared share says. ``f`` itself when a size is below 2 or a bandwidth unknown."""
    if k < 2 or b <= 0 or not math.isfinite(b_ref) or b_ref <= 0:
        return f
    comp = (1.0 - f) * k_req / k / eta ** math.log2(k / k_req)
    comm = f * (2.0 * (k - 1) / k) / (2.0 * (max(k_req, 2) - 1) / max(k_req, 2)) * b_ref / b
    return comm / (comp + comm)


def grow_ratio(f: float, k0: int, b0: float, k1: int, b1: float, eta: float = 1.0) -> float:
    """The scheduler's predicted epoch time at ``k1`` GPUs on bandwidth ``b1`` relative to now
    (``k0`` on ``b0``; ``f`` the job's collective share now):
    ``(1 - f) · (k0 / k1) / η^log2(k1 / k0) + f · r(k1) / r(k0) · b0 / b1`` with ``r(k) = 2 (k - 1) / k``
    (ring all-reduce) and ``η`` the job's compute scaling efficiency per doubling (1: perfect, the
    default, optimistic about growing); a 1-GPU job's ``f`` is read as its share at 2 GPUs on the
    predicted set."""
    comp = (1.0 - f) * k0 / k1
    if eta != 1.0:
        comp /= eta ** math.log2(k1 / k0)
    if k1 < 2:
        return comp
    r1 = 2.0 * (k1 - 1) / k1
    if k0 < 2:
        return comp + f * r1
    return comp + f * r1 / (2.0 * (k0 - 1) / k0) * b0 / max(b1, 1e-9)


def tenant_bandwidths(model: Any, state: State, ids: Sequence[str]) -> np.ndarray:
    """Predicted contended bandwidth of each listed job of ``state`` under all the others: the
    contention predictor's ``B̂(S, τ)`` with the job itself left out of its own contenders. One
    model call for every job and super allocation."""
    if not ids:
        return np.zeros(0)
    pred = ContentionPredictor(model, state)
    by_id = {j.id: j for j in state.jobs}
    masks = np.array([by_id[i].mask for i in ids], dtype=np.int64)
    cont = pred.contenders(masks)
    own = {jid: n for n, jid in enumerate(pred.job_ids)}
    for r, i in enumerate(ids):
        if i in own:
            cont[r, own[i]] = False
    ci, ji = np.nonzero(cont)
    n = len(ids)
    vals = pred.raw(np.concatenate([masks, masks[ci] | pred.job_masks[ji]]) if ci.size else masks)
    solo = vals[:n]
    cap = np.full(n, np.inf)
    np.minimum.at(cap, ci, vals[n:])
    demand = solo + cont.astype(float) @ pred.job_demand
    with np.errstate(divide="ignore", invalid="ignore"):
        shared = np.where(demand > 0, solo / demand * cap, 0.0)
    return np.where(demand <= cap, solo, shared)


@dataclass
class Context:
    """What a pricer needs about one job and the cluster around it."""

    model: Any
    others: State  # the cluster without the job
    job: str
    f: float  # the job's collective share (DEFAULT_COMM if undeclared)
    fracs: dict[str, float | None]  # every running job's declared comm fraction
    demand: str  # the demand model the pressures are stored under
    mask: np.ndarray | None = None  # the job's current GPUs (None: pending)
    eta: float = 1.0  # the job's compute scaling efficiency per doubling as priced (1: perfect)

    def _pressed(self, mask: np.ndarray) -> float:
        if int(np.count_nonzero(mask)) < 2:
            return 0.0  # a single-host job never presses a NIC (the predictor ignores it anyway)
        return float(self.model.predict_masks(mask[None, :])[0]) * pressure_factor(self.fracs.get(self.job), self.demand)

    def _with(self, mask: np.ndarray | None) -> State:
        if mask is None:
            return self.others
        gpus = self.others.spec.from_mask(mask)
        return self.others.with_job(self.job, gpus, self._pressed(mask))

    def cotenants(self, *masks: np.ndarray | None) -> list[str]:
        """Cross-host jobs with pressure that share a host with any of ``masks`` (when that set
        itself spans hosts: a one-host set talks over NVLink and presses no NIC)."""
        hosts = np.zeros(self.others.spec.n_hosts, dtype=bool)
        for m in masks:
            if m is not None and int(np.count_nonzero(m)) >= 2:
                hosts |= m != 0
        if not hosts.any():
            return []
        return [j.id for j in self.others.jobs if j.demand_gbps > 0 and j.cross_host and bool(hosts[j.mask != 0].any())]

    def imposed(self, before: np.ndarray | None, after: np.ndarray) -> tuple[float, float]:
        """(the job's predicted bandwidth on ``after``, the sum of the co-tenants' relative epoch-time
        changes when the job moves from ``before`` to ``after``)."""
        cot = self.cotenants(before, after)
        ids = [self.job, *cot]
        b_after = tenant_bandwidths(self.model, self._with(after), ids)
        if not cot:
            return float(b_after[0]), 0.0
        b_before = tenant_bandwidths(self.model, self._with(before), cot)
        fr = np.array([DEFAULT_COMM if self.fracs.get(j) is None else float(self.fracs[j]) for j in cot])
        delta = fr * (b_before / np.maximum(b_after[1:], 1e-9) - 1.0)
        return float(b_after[0]), float(delta.sum())


class Welfare:
    """Price the total effect: the job's own relative epoch-time change plus its co-tenants'."""

    name = "welfare"

    def growth(self, ctx: Context, k0: int, b0: float, cands: Sequence[Grown]) -> Grown | None:
        best = None
        for k, mask, _ in cands:
            b1, imposed = ctx.imposed(ctx.mask, mask)
            total = grow_ratio(ctx.f, k0, b0, k, b1, ctx.eta) - 1.0 + imposed
            if total < -GROW_GAIN and (best is None or total < best[0] - 1e-9):
                best = (total, k, mask, b1)
        return None if best is None else best[1:]

    def admission(self, ctx: Context, own_cost: Callable[[int, float], float],
                  options: Sequence[tuple[int, np.ndarray, float]]) -> int | None:
        costs = []
        for k, mask, _ in options:
            b1, imposed = ctx.imposed(None, mask)
            costs.append(own_cost(k, b1) + imposed)
        return int(np.argmin(costs)) if costs else None


class SelfOnly:
    """The job's own predicted epoch time only (the pricing before ``welfare``): the largest growth
    that cuts it by :data:`GROW_GAIN`; the admission option of lowest own epoch time."""

    name = "self"

    def growth(self, ctx: Context, k0: int, b0: float, cands: Sequence[Grown]) -> Grown | None:
        best: dict[int, Grown] = {}
        for c in cands:  # per size, the set of highest own predicted bandwidth (ties: the first)
            if c[0] not in best or c[2] > best[c[0]][2] + 1e-9:
                best[c[0]] = c
        for k in sorted(best, reverse=True):
            if grow_ratio(ctx.f, k0, b0, k, best[k][2], ctx.eta) < 1.0 - GROW_GAIN:
                return best[k]
        return None

    def admission(self, ctx: Context, own_cost: Callable[[int, float], float],
                  options: Sequence[tuple[int, np.ndarray, float]]) -> int | None:
        costs = [own_cost(k, b) for k, _, b in options]
        return int(np.argmin(costs)) if costs else None


#: Growth/admission pricers by name (``rebalance(pricing=...)``, ``simulate --growth-pricing``).
PRICERS: dict[str, Any] = {p.name: p for p in (Welfare(), SelfOnly())}
DEFAULT_PRICING = "welfare"
