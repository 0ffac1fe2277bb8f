"""What bandwidth will a placement get over its whole run? Lifetime pricing.

The contention predictor (:mod:`bandpilot.dispatch.contention`) prices a candidate against the jobs
running *now*. A placement lives for hours: co-tenants that end soon stop pressing, and the free
GPUs it leaves on its hosts - and the GPUs of jobs that end during its run - are taken by later
jobs, some of which span hosts and press on the same NICs. A spread placement that looks best
against the co-tenants of the moment meets those later ones on every host it touches.

:class:`Outlook` is what the queue knows about that future (built per batch by
:mod:`bandpilot.scheduling.outlook` from the store: run-time estimates, the pending queue and the
recent arrival mix) and travels with the :class:`~bandpilot.dispatch.state.State` the dispatcher is
given. :class:`LifetimePredictor` is the same ``B̂(S, τ)`` formula with the time-averaged traffic
profile over the candidate's estimated run time ``T``:

* a running contender ``j`` expected to end after ``r_j`` presses for the share ``min(1, r_j / T)``
  of the candidate's life;
* every GPU on the candidate's hosts that turns over during its life (a free GPU it leaves, taken
  after the expected fill time; a running job's GPU once that job ends) goes to a cross-host job
  with probability ``q`` (the GPU-weighted cross-host share of the recent mix); such jobs hold
  ``g`` GPUs per host on average and press ``p`` (their mean pressure under the demand model), so a
  host with ``u`` turnover GPUs (time-weighted) expects ``q · u / g`` more co-tenants, each
  pressing ``p``. Their capacity is the candidate's hosts as a whole, ``B̂(full hosts of S)``.

What the candidate imposes counts against it: the slowdown ``max(1, D/C)`` its pressure adds to each
running contender (for as long as they overlap) and to the expected later co-tenants (for its whole
run), in GPU-seconds of communication, converted into its own terms as
``1 / (1 / B_life + harm / (k · f · T · d_S))`` (never above ``B̂(S)``, so the searches' standalone
bound still prunes). Single-host candidates stay uncontended (the predictor's rule), so lifetime
pricing is what makes a host-local placement win when spreading only looks better against today's
co-tenants. Candidates within :data:`NEAR_TIE` of the best are near-equal: fewer hosts, then (the
``lifetime-queue`` pricing only) :meth:`LifetimePredictor.protect`'s lookahead over the next pending
gangs, then the tightest fit decide. Measured in the README ("Placement alone"): within the
seed-to-seed spread of the 0.5 locality margin, so not the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from bandpilot.dispatch.baselines import topo_select
from bandpilot.dispatch.contention import ContentionPredictor, Prediction
from bandpilot.dispatch.model import BandwidthModel
from bandpilot.dispatch.state import State
from bandpilot.topology.cluster import popcount

__all__ = ["LifetimePredictor", "Outlook", "pricing_predictor", "queue_pricing_predictor"]

#: Run time assumed for a request with no estimate at all (no limit, nothing learned yet).
DEFAULT_RUN_S = 3600.0
#: Pending gangs (then arrival-mix sizes) whose next placement the ``lifetime-queue`` pricing protects (item 5).
LOOKAHEAD = 4
#: Candidates within this relative lifetime value of the best are near-equal (run-time estimates are
#: off by up to 3x): fewer hosts, the queue lookahead (lifetime-queue), then the tightest fit decide.
NEAR_TIE = 0.05
#: Near-equal candidates the lookahead scores (the best first).
PROTECT_MAX = 32


@dataclass(frozen=True)
class Outlook:
    """The queue's view of the future a placement will live in (all times in seconds)."""

    remaining: dict[str, float] = field(default_factory=dict)  # running job id -> expected time left (inf: unknown)
    cross_share: float = 0.0  # probability a GPU that turns over goes to a job spanning hosts (GPU-weighted mix)
    slice_gpus: float = 1.0  # GPUs such a job holds per host, on average
    pressure_gbps: float = 0.0  # its mean pressure on shared NICs under the demand model (0: use the candidate's own)
    fill_s: float = 0.0  # expected time until a free GPU is taken (0: requests are waiting)
    queue: tuple[tuple[str, int], ...] = ()  # pending (id, k) in policy order (the first few)
    mix_k: tuple[int, ...] = ()  # gang sizes of the recent arrivals, most frequent first
    comm: dict[str, float] = field(default_factory=dict)  # running job id -> communication fraction
    mix_comm: float = 1.0  # mean communication fraction of the jobs that span hosts (recent mix)
    mix_gpus: float = 2.0  # mean GPUs of such a job
    run_s: float | None = None  # the request being placed: its estimated run time
    request_id: str | None = None  # ... its id (not a gang to protect from itself)
    comm_fraction: float = 1.0  # ... its communication fraction
    press_factor: float = 1.0  # ... and the share of its bandwidth it presses on shared NICs with

    def for_run(self, run_s: float | None, request_id: str | None = None, comm_fraction: float | None = None,
                press_factor: float = 1.0) -> "Outlook":
        ok = run_s is not None and math.isfinite(run_s) and run_s > 0
        return replace(self, run_s=float(run_s) if ok and run_s is not None else None, request_id=request_id,
                       comm_fraction=1.0 if comm_fraction is None else float(comm_fraction), press_factor=press_factor)

    def started(self, job_id: str, run_s: float | None, comm_fraction: float | None = None) -> "Outlook":
        """After a job starts in this batch: it is expected to run ``run_s`` (inf when unknown)
        and is no longer a pending gang to protect."""
        rem, comm = dict(self.remaining), dict(self.comm)
        rem[job_id] = math.inf if run_s is None else float(run_s)
        comm[job_id] = 1.0 if comm_fraction is None else float(comm_fraction)
        return replace(self, remaining=rem, comm=comm, queue=tuple(q for q in self.queue if q[0] != job_id))

    def next_gangs(self, n: int = 4) -> list[int]:
        """Sizes of the ``n`` gangs the placement should leave room for: the next pending ones (other
        than the request itself), topped up from the arrival mix."""
        out = [k for jid, k in self.queue if jid != self.request_id and k >= 2][:n]
        for k in self.mix_k:
            if len(out) >= n:
                break
            if k not in out:
                out.append(k)
        return out

    def horizon(self) -> float:
        if self.run_s is not None:
            return self.run_s
        finite = [r for r in self.remaining.values() if math.isfinite(r) and r > 0]
        return float(np.median(finite)) if finite else DEFAULT_RUN_S


class LifetimePredictor(ContentionPredictor):
    """``B̂(S, τ̄)`` with ``τ̄`` the traffic profile averaged over the candidate's run (module doc)."""

    def __init__(self, model: BandwidthModel, state: State, outlook: Outlook, lookahead: int = 0) -> None:
        super().__init__(model, state)
        self.outlook = outlook
        #: queue protection (item 5): how many next gangs decide among near-equal candidates (0: none,
        #: fewer hosts then the tightest fit decide)
        self.lookahead = int(lookahead)
        #: candidates within this relative value of the best are near-equal (the estimates are rough)
        self.near_tie, self.protect_max = NEAR_TIE, PROTECT_MAX
        self._jobs_now: tuple[np.ndarray, ...] | None = None
        T = outlook.horizon()
        rem = np.array([outlook.remaining.get(j, math.inf) for j in self.job_ids], dtype=float)
        #: share of the candidate's life each running contender still presses
        self.present = np.clip(rem / T, 0.0, 1.0) if rem.size else rem
        self._demand_now = self.job_demand * self.present
        # time-weighted GPUs per host that turn over to the queue during the run: a job ending after
        # r_j frees its GPUs for the share 1 - r_j / T of the candidate's life
        turn = np.zeros(self.spec.n_hosts)
        if state.jobs:
            gone = np.clip(1.0 - np.array([outlook.remaining.get(j.id, math.inf) for j in state.jobs]) / T, 0.0, 1.0)
            turn = gone @ popcount(np.array([j.mask for j in state.jobs], dtype=np.int64))
        self.free_w = float(np.clip(1.0 - outlook.fill_s / T, 0.0, 1.0))
        self.fcount = popcount(state.free).astype(float)
        rate = outlook.cross_share / max(outlook.slice_gpus, 1.0)  # future co-tenants per turnover GPU
        self._per_turn = rate
        self._base = rate * turn  # co-tenants expected from running jobs' GPUs (the candidate's own free GPUs add more)
        self.full = np.asarray(self.spec.full_masks, dtype=np.int64)
        #: symmetry: hosts with different futures are not interchangeable (SearchContext classes)
        self.host_key = np.rint((self._base + rate * self.free_w * self.fcount) * 1e6).astype(np.int64)
        self.host_exposure = self.host_exposure + self._base * max(outlook.pressure_gbps, 1.0)

    def protect(self, masks: np.ndarray, value: np.ndarray) -> np.ndarray:
        """Queue protection (item 5), a lookahead over the next gangs' start: for near-equal full
        candidate rows, each of the next gangs gets the GPUs the candidate leaves free plus those
        of running jobs in order of expected end (the candidate itself ending after its run time,
        as a reservation is planned) until it fits; its compact (Slurm-like) placement there is
        valued by the model, relative to its best over the candidates, weighted 1, 1/2, 1/3...
        in queue order. A choice that leaves the next gangs their best placement scores highest."""
        gangs = self.outlook.next_gangs(self.lookahead)
        out = np.zeros(masks.shape[0])
        if not gangs:
            return out
        T, rem = self.outlook.horizon(), self.outlook.remaining
        jobs = sorted(self.state.jobs, key=lambda j: rem.get(j.id, math.inf))
        ends = np.array([rem.get(j.id, math.inf) for j in jobs])
        jm = np.array([j.mask for j in jobs], dtype=np.int64).reshape(len(jobs), self.spec.n_hosts)
        rows, where = [], []
        for i, cand in enumerate(masks):
            # frees in expected-end order: running jobs, the candidate among them at its own end
            seq = np.insert(jm, int(np.searchsorted(ends, T, side="right")), cand, axis=0)
            free = self.state.free & ~cand
            acc = np.bitwise_or.accumulate(np.vstack([free[None, :], seq]), axis=0)
            n_acc = popcount(acc).sum(axis=1)
            for g, k in enumerate(gangs):
                at = int(np.searchsorted(n_acc, k))
                if at < acc.shape[0]:
                    rows.append(topo_select(self.spec, acc[at], k))
                    where.append((g, i))
        if not rows:
            return out
        vals = self.raw(np.array(rows))
        per = np.zeros((len(gangs), masks.shape[0]))
        for (g, i), v in zip(where, vals):
            per[g, i] = v
        top = per.max(axis=1, keepdims=True)
        rel = np.divide(per, top, out=np.zeros_like(per), where=top > 0)
        return (rel / np.arange(1, len(gangs) + 1)[:, None]).sum(axis=0)

    def _future(self, masks: np.ndarray, cols: np.ndarray | None) -> np.ndarray:
        """Later co-tenants expected on each candidate's hosts, time-averaged (0 for host-local rows)."""
        used = masks != 0
        fc = self.fcount if cols is None else self.fcount[cols]
        base = self._base if cols is None else self._base[cols]
        left = np.where(used, fc[None, :] - popcount(masks), 0.0)
        n = (used * base[None, :]).sum(axis=1) + self._per_turn * self.free_w * left.sum(axis=1)
        return np.where(self._spans(masks, cols), n, 0.0)

    def _running(self) -> tuple[np.ndarray, ...]:
        """Per contending running job: its demand and capacity, its slowdown now ``max(1, D_j / C_j)`` (the same formula
        among the running jobs), its own standalone and the GPU-seconds of communication it has
        left to overlap the candidate (``k_j · f_j · min(T, r_j)``). Built on first use."""
        if self._jobs_now is None:
            n, T, o = self.n_jobs, self.outlook.horizon(), self.outlook
            jm = self.job_masks
            solo = self.raw(jm) if n else np.zeros(0)
            used = (jm != 0).astype(np.float32)
            share = (used @ used.T) > 0.5
            np.fill_diagonal(share, False)
            a, b = np.nonzero(share)
            cap = np.full(n, np.inf)
            if a.size:
                np.minimum.at(cap, a, self.raw(jm[a] | jm[b]))
            demand = solo + share.astype(float) @ self.job_demand
            slow = np.maximum(1.0, np.divide(demand, cap, out=np.zeros(n), where=np.isfinite(cap)))
            rem = np.array([o.remaining.get(j, math.inf) for j in self.job_ids], dtype=float)
            f = np.array([o.comm.get(j, 1.0) for j in self.job_ids], dtype=float)
            weight = popcount(jm).sum(axis=1) * f * np.minimum(T, rem)
            self._jobs_now = (demand, cap, slow, weight)
        return self._jobs_now

    def predict(self, masks: np.ndarray, cols: np.ndarray | None = None) -> Prediction:
        """Lifetime value: ``B̂`` under the time-averaged profile, discounted by the slowdown the
        candidate's pressure imposes on its co-tenants (running ones for as long as they overlap,
        expected later ones for its run), both in GPU-seconds of communication, converted into the
        candidate's own terms: ``1 / (1 / B_life + harm / (k · f · T · d_S))``."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        if n == 0:
            return Prediction(np.zeros(0), np.zeros(0))
        o, T = self.outlook, self.outlook.horizon()
        cont = self.contenders(masks, cols)
        ci, ji = np.nonzero(cont)
        n_fut = self._future(masks, cols)
        hosts_full = np.where(masks != 0, self.full if cols is None else self.full[cols], 0)
        wm, jobs, wcols = self._columns(masks, ji, cols)
        wfull, _, _ = self._columns(hosts_full, ji, cols)
        fi = np.flatnonzero(n_fut > 0)
        rows = [wm] + ([wm[ci] | jobs[ji]] if ci.size else []) + ([wfull[fi]] if fi.size else [])
        allv = self.raw(np.concatenate(rows), wcols)
        solo = allv[:n]
        pair_cap = allv[n : n + ci.size]
        cap = np.full(n, np.inf)
        if ci.size:
            np.minimum.at(cap, ci, pair_cap)
        cap_f = np.full(n, np.inf)
        cap_f[fi] = allv[n + ci.size :]
        p_f = o.pressure_gbps if o.pressure_gbps > 0 else solo
        others = cont.astype(float) @ self._demand_now + n_fut * p_f  # co-tenants' time-averaged pressure
        cap = np.minimum(cap, cap_f)
        demand = solo + others
        with np.errstate(divide="ignore", invalid="ignore"):
            life = np.where(demand <= cap, solo, np.where(demand > 0, solo / demand * cap, 0.0))
        press = solo * o.press_factor  # what the candidate charges its co-tenants
        harm = np.zeros(n)
        if ci.size:  # running contenders: slowdown with the candidate minus without, for as long as they overlap
            d_j, cap_j, slow_j, w_j = self._running()
            after = np.maximum(1.0, (d_j[ji] + press[ci]) / np.minimum(cap_j[ji], pair_cap))
            np.add.at(harm, ci, w_j[ji] * np.maximum(0.0, after - slow_j[ji]))
        if fi.size:  # later co-tenants meet it for its whole run, as it meets them
            solo_f = p_f / max(o.mix_comm, 1e-3)
            base = np.maximum(1.0, (solo_f + others) / cap_f)
            more = np.maximum(1.0, (solo_f + others + press) / cap_f) - base
            harm += np.where(np.isfinite(more), n_fut * o.mix_gpus * o.mix_comm * T * more, 0.0)
        own = popcount(masks).sum(axis=1) * max(o.comm_fraction, 0.05) * T * np.maximum(solo, 1e-9)
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(life > 0, 1.0 / (1.0 / life + harm / own), 0.0)
        return Prediction(value, solo)

    def predict_best(self, masks: np.ndarray, max_pairs: int = 8192, first: int = 256,
                     cols: np.ndarray | None = None, known: np.ndarray | None = None,
                     margin: float = 1e-9) -> Prediction:
        """:meth:`predict` over the candidates in descending standalone order, a growing chunk at a
        time, until the best value found beats every standalone value left (values <= standalone).
        ``margin``: every candidate within this relative distance of the best is scored (the
        caller's tie margin, as in :meth:`ContentionPredictor.predict_best`)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        if n <= first:
            return self.predict(masks, cols)
        solo = np.full(n, np.nan) if known is None else np.asarray(known, dtype=float).copy()
        todo = np.flatnonzero(np.isnan(solo))
        if todo.size:
            solo[todo] = self.raw(masks[todo], cols)
        value = np.full(n, -np.inf)
        order = np.argsort(-solo, kind="stable")
        best, pos, step = -np.inf, 0, first
        while pos < n:
            bound = best - margin * max(1.0, abs(best))
            if solo[order[pos]] < bound:
                break
            idx = order[pos : pos + step]
            value[idx] = self.predict(masks[idx], cols).value
            best = max(best, float(value[idx].max()))
            pos += step
            step *= 2
        return Prediction(value, solo)


def pricing_predictor(model: BandwidthModel, state: State) -> ContentionPredictor:
    """The ``lifetime`` pricing: lifetime-priced when the state carries an :class:`Outlook`, else
    today's contention (a caller with no queue behind it has no future to price)."""
    outlook = getattr(state, "outlook", None)
    if outlook is None:
        return ContentionPredictor(model, state)
    return LifetimePredictor(model, state, outlook)


def queue_pricing_predictor(model: BandwidthModel, state: State) -> ContentionPredictor:
    """The ``lifetime-queue`` pricing: ``lifetime`` plus the lookahead over the next
    :data:`LOOKAHEAD` pending gangs among near-equal candidates (:meth:`LifetimePredictor.protect`)."""
    outlook = getattr(state, "outlook", None)
    if outlook is None:
        return ContentionPredictor(model, state)
    return LifetimePredictor(model, state, outlook, lookahead=LOOKAHEAD)
