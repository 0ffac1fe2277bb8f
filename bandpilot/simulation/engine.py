"""How long do jobs take under a queue policy and a placement algorithm? A discrete-event simulation
that drives the REAL queue (a temporary SQLite store) and the real dispatcher.

Events, in this order at equal times: completions, arrivals, and - every ``interval_s`` when
something changed and requests wait - one batch. Before each batch the store catches up: arrivals
are submitted (with their trace submit times, the run-time estimate for ``sjf`` and a warm-up
entropy measurement), running and finished jobs report the entropy of the epochs they completed
(updating their utility) and finished jobs are released (``release_many``); then
``run_batch`` runs with the configuration's scheduler profile.

A running job's progress rate is ``1 / (compute_s · ((1-f) + f · B_ref / B_achieved(t)))``: ``f`` its
communication fraction, ``B_ref`` the best standalone bandwidth of its size on the idle cluster and
``B_achieved`` its TRUE bandwidth under the jobs running alongside
(:class:`~bandpilot.simulation.bandwidth.TrueBandwidth`, co-tenants pressing by ``SimConfig.demand``,
the same demand model the queue stores each job's pressure under for the dispatcher); rates change only at events, so progress
integrates exactly, piecewise. A placement at least as good as the reference runs in ``compute_s``.
1-GPU jobs have no collective (``f`` is ignored).

With a profile that preempts a batch may evict preemptible jobs (:mod:`bandpilot.scheduling.preemption`):
a victim keeps the progress of its last checkpoint (every ``checkpoint_every_s`` of wall time since
its start; none without it - the progress lost is pro rata of this run's progress), pays
``checkpoint_s`` of extra work on restart and queues again with its original submit time; its
``preemptions`` and ``wasted_gpu_s`` (GPUs x (wall time lost + checkpoint_s)) are counted.

Simplifications, stated: the warm-up entropy measurement is free; a job without
a ``time_limit_s`` in the trace gets its exact ``compute_s`` as its run-time estimate (sjf and
reservations see the truth), one with a limit is planned with that limit (which may be far off).
The store runs on the simulated clock (:func:`bandpilot.queue.clock.use_clock`).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bandpilot.dispatch import strategies
from bandpilot.dispatch.demand import DEFAULT_DEMAND, DEMAND_MODELS, pressure_factor
from bandpilot.errors import BandPilotError
from bandpilot.queue import Request, Store, release_many, report_entropy, set_estimates, submit
from bandpilot.queue.clock import use_clock
from bandpilot.scheduling import run_batch
from bandpilot.scheduling.preemption import STARVE_S
from bandpilot.scheduling.profile import COMPACT, RECOMMENDED, SchedulerProfile
from bandpilot.scheduling.elastic import ADMISSIONS, CURRENT_SHARE, DEFAULT_ADMISSION, DEFAULT_RELOCATE, FILL_IDLE
from bandpilot.scheduling.elastic_pricing import DEFAULT_PRICING, DEFAULT_SCALING_MODE, PRICERS, SCALING_MODES
from bandpilot.queue.learning import DEFAULT_LAMBDA
from bandpilot.simulation.bandwidth import TrueBandwidth
from bandpilot.simulation.curves import Curve, curve_for
from bandpilot.simulation.trace import TraceJob
from bandpilot.topology.cluster import popcount

#: The strategies the simulator offers (oracles need the truth at placement time; EHA/PTS are ablations).
ALGORITHMS = strategies.names(default_for="simulate")


class SimulationError(BandPilotError):
    """A simulation cannot run as configured."""


@dataclass(frozen=True)
class SimConfig:
    """How a simulation runs: the queue's scheduler profile (:mod:`bandpilot.scheduling.profile`), the
    dispatch cadence, the utility and demand models, and - for elastic traces - the resize rules."""

    profile: SchedulerProfile = RECOMMENDED
    interval_s: float = 60.0  # dispatch interval (a batch at most every interval)
    epochs: int = 20  # entropy reports per job (at epoch boundaries)
    lam: float = DEFAULT_LAMBDA  # the utility's balance between entropy level and progress
    seed: int = 0  # learning curves and the random algorithm
    demand: str = DEFAULT_DEMAND  # co-tenant pressure, the same in the truth and the queue's predictor
    elastic: bool = False  # per-epoch quotas (bandpilot.simulation.elastic); off: every job is a fixed gang of k
    blind: bool = False  # elastic growth/shrink ignores bandwidth (the baseline)
    pricing: str = DEFAULT_PRICING  # elastic growth/admission pricing: welfare (total effect) | self (own epoch time only)
    admission: str = DEFAULT_ADMISSION  # elastic admission: fit-k (requested k fits) | min-k (min_k fits)
    scaling_pricing: str = DEFAULT_SCALING_MODE  # elastic: compute priced by each job's declared scaling | perfect (before)
    relocate: bool = DEFAULT_RELOCATE  # elastic: a resize may move the job onto a fresh placement
    current_share: bool = CURRENT_SHARE  # elastic: growths priced from the collective share at the current size
    fill_idle: bool = FILL_IDLE  # elastic: GPUs free when nothing waits offered to the jobs at a boundary
    resize_s: float = 30.0  # cost of one resize (checkpoint-restart), seconds of the job's time

    @property
    def policy(self) -> str:
        """The queue order (the profile's QueueSort), as the reports and the elastic reallocation name it."""
        return self.profile.queue_sort

    def check(self) -> None:
        if not isinstance(self.profile, SchedulerProfile):
            raise SimulationError(f"profile must be a SchedulerProfile, got {type(self.profile).__name__}")
        if self.profile.placement not in (*ALGORITHMS, COMPACT):
            raise SimulationError(f"profile {self.profile.name!r}: placement {self.profile.placement!r} cannot be "
                                  f"simulated: use one of {', '.join(ALGORITHMS)} or {COMPACT}")
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise SimulationError(f"dispatch interval must be > 0 seconds, got {self.interval_s}")
        if self.epochs < 1:
            raise SimulationError(f"epochs must be >= 1, got {self.epochs}")
        if not 0.0 <= self.lam <= 1.0:
            raise SimulationError(f"lambda must be in [0, 1], got {self.lam}")
        if not (self.resize_s >= 0 and math.isfinite(self.resize_s)):
            raise SimulationError(f"resize_s must be >= 0 seconds, got {self.resize_s}")
        if self.admission not in ADMISSIONS:
            raise SimulationError(f"unknown elastic admission {self.admission!r}: use one of {', '.join(ADMISSIONS)}")
        if self.pricing not in PRICERS:
            raise SimulationError(f"unknown growth pricing {self.pricing!r}: use one of {', '.join(PRICERS)}")
        if self.scaling_pricing not in SCALING_MODES:
            raise SimulationError(f"unknown scaling pricing {self.scaling_pricing!r}: use one of {', '.join(SCALING_MODES)}")
        if self.demand not in DEMAND_MODELS:
            raise SimulationError(f"unknown demand model {self.demand!r}: use one of {', '.join(DEMAND_MODELS)}")


@dataclass
class JobRecord:
    id: str
    tenant: str
    k: int
    priority: int
    submit_s: float
    compute_s: float
    comm_fraction: float
    start_s: float | None = None
    end_s: float | None = None
    status: str = "pending"  # pending | running | done | rejected | stuck
    gpus: str = ""
    n_hosts: int = 0
    b_ref: float = 0.0
    b_standalone: float = 0.0
    bw_time: float = 0.0  # ∫ B_achieved / B_ref dt while running
    final_utility: float | None = None
    preemptions: int = 0
    wasted_gpu_s: float = 0.0  # GPU-seconds of work lost to preemption + restart time x GPUs
    resizes: int = 0  # elastic resizes (new assignment generations)
    gpu_s: float = 0.0  # GPU-seconds held (elastic jobs change size; fixed ones hold k x service)

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.submit_s

    @property
    def queue_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.submit_s

    @property
    def service_s(self) -> float | None:
        return None if self.end_s is None or self.start_s is None else self.end_s - self.start_s


@dataclass
class RunningJob:
    """A job the simulator has placed: its GPUs, progress and current speed."""

    rec: JobRecord
    mask: np.ndarray
    curve: Curve
    progress: float = 0.0
    rate: float = 0.0
    ratio: float = 1.0  # current B_achieved / B_ref
    reported: int = 1  # last epoch reported (the warm-up reported epochs 0 and 1)
    started: float = 0.0  # when this run (after the last restart) began
    p0: float = 0.0  # progress at that start
    _held: tuple[Any, int] | None = None  # (mask object, its GPU count): popcount once per mask

    @property
    def n_gpus(self) -> int:
        """GPUs held (elastic runs replace ``mask`` on a resize: recounted then)."""
        if self._held is None or self._held[0] is not self.mask:
            self._held = (self.mask, int(popcount(self.mask).sum()))
        return self._held[1]


@dataclass
class SimResult:
    config: SimConfig
    cluster: str
    n_gpus: int
    jobs: list[JobRecord]
    timeline: dict[str, list[float]]  # t, busy, free, stranded, running, pending
    batches: int
    wall_s: float
    truth: str
    model: str
    extra: dict[str, Any] = field(default_factory=dict)


def simulate(
    jobs: Sequence[TraceJob], dispatcher: Any, truth_fabric: Any, config: SimConfig, *,
    store_dir: str | Path | None = None, truth_label: str = "emulator", model_label: str = "",
    progress: Callable[[int, int], None] | None = None, runner: type | None = None,
) -> SimResult:
    """Run the trace through a fresh temporary store; returns every job's times and the timeline.
    ``runner``: the simulation class (:mod:`bandpilot.simulation.elastic` passes its own)."""
    config.check()
    spec = dispatcher.model.spec
    too_big = next((j for j in jobs if j.k > spec.n_gpus), None)
    if too_big is not None:
        raise SimulationError(f"job {too_big.id!r}: k={too_big.k} is larger than the cluster ({spec.n_gpus} GPUs)")
    with tempfile.TemporaryDirectory(prefix="bandpilot-sim-", dir=store_dir) as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'queue.db'}")
        try:
            store.init_cluster(spec)
            if config.elastic and runner is None:
                raise SimulationError("elastic simulations run through bandpilot.simulation.elastic.simulate")
            return (runner or Simulator)(jobs, dispatcher, TrueBandwidth(truth_fabric), config, store, progress).run(truth_label, model_label)
        finally:
            store.close()


class Simulator:
    """The event loop replaying one trace through the real queue and scheduler."""

    def __init__(self, jobs, dispatcher, truth, cfg, store, progress) -> None:
        self.trace = list(jobs)
        self.d = dispatcher
        self.truth = truth
        self.cfg = cfg
        self.store = store
        self.progress = progress
        self.spec = dispatcher.model.spec
        self.recs = {j.id: JobRecord(j.id, j.tenant, j.k, j.priority, j.submit_s, j.compute_s, j.comm_fraction) for j in self.trace}
        self.running: dict[str, RunningJob] = {}
        self.pending: set[str] = set()
        self.busy = np.zeros(self.spec.n_hosts, dtype=np.int64)
        self.tl: dict[str, list[float]] = {k: [] for k in ("t", "busy", "free", "stranded", "running", "pending")}
        self.batches = 0
        self.done = 0
        self.t = 0.0
        self._to_submit: list[TraceJob] = []
        self._to_release: list[str] = []
        self._final_rows: list[dict[str, Any]] = []
        self.jobs = {j.id: j for j in self.trace}
        self._kept: dict[str, tuple[float, int]] = {}  # preempted: (progress kept, epochs reported)

    def _epochs(self, jid: str) -> int:
        """The job's epochs (trace column), else the configured default: it reports once per epoch
        (the entropy-guided scheduling paper Sec. 4.6), so a 50-epoch job reports 50 times over its run."""
        return self.jobs[jid].epochs or self.cfg.epochs

    # -- store operations ------------------------------------------------------------------
    # The queue acts only at batches, so arrivals, releases and entropy reports since the last one
    # are written just before it (submit times come from the trace), in one transaction per batch
    # (each write a savepoint: Store.writes_together).
    def _flush(self) -> None:
        with self.store.writes_together():
            self._write_pending()

    def _write_pending(self) -> None:
        rows = self._final_rows
        self._final_rows = []
        if self._to_submit:
            batch, self._to_submit = self._to_submit, []
            submit(self.store, [Request(j.id, j.k, j.tenant, j.priority, j.utility, j.submit_s,
                                        time_limit_s=j.time_limit_s, comm_fraction=j.comm_fraction,
                                        preemptible=j.preemptible, checkpoint_s=j.checkpoint_s,
                                        checkpoint_every_s=j.checkpoint_every_s,
                                        # elastic off: every job is a fixed gang of its k
                                        min_k=j.min_k if self.cfg.elastic else None,
                                        max_k=j.max_k if self.cfg.elastic else None,
                                        k_step=j.k_step if self.cfg.elastic else None,
                                        # the trace's declared efficiency (None: undeclared) for the growth pricing
                                        scaling=j.scaling if self.cfg.elastic else None) for j in batch])
            # a job without a time limit in the trace gets its exact compute time as the estimate
            # (the stated oracle); one with a limit is planned with that limit, errors and all
            oracle = {j.id: j.compute_s for j in batch if j.time_limit_s is None}
            if oracle:
                set_estimates(self.store, oracle)
            for j in batch:
                if j.utility is None:  # the seed's warm-up measurement: entropy before and after epoch 1
                    c = curve_for(j.id, self.cfg.seed)
                    ep = self._epochs(j.id)
                    rows += [{"job": j.id, "epoch": 0, "entropy": c.at(0, ep)},
                             {"job": j.id, "epoch": 1, "entropy": c.at(1, ep)}]
        for jid, r in self.running.items():
            ep = self._epochs(jid)
            now_epoch = min(ep, int(r.progress * ep + 1e-9))
            rows += [{"job": jid, "epoch": e, "entropy": r.curve.at(e, ep)} for e in range(r.reported + 1, now_epoch + 1)]
            r.reported = max(r.reported, now_epoch)
        if rows:
            for out in report_entropy(self.store, rows, lam=self.cfg.lam):
                self.recs[out["job"]].final_utility = out["utility"]
        if self._to_release:
            ids, self._to_release = self._to_release, []
            release_many(self.store, ids)

    def _batch(self, t: float) -> int:
        self._flush()
        rep = run_batch(self.store, self.d, self.cfg.profile, demand=self.cfg.demand)
        self.batches += 1
        for plan in rep.preempted:  # victims first: the gang took their GPUs
            for vid in plan["victims"]:
                self._evict(t, vid)
        for o in rep.tried():  # not the quick deferrals (most of a long queue, every batch): nothing to record
            if o.status == "deferred":
                continue
            rec = self.recs[o.request_id]
            if o.status == "assigned":
                mask = self.spec.to_mask(o.gpus)
                self.busy |= mask
                rec.start_s = t if rec.start_s is None else rec.start_s  # a restart keeps the first start
                rec.status = "running"
                rec.gpus = ",".join(o.gpus)
                rec.n_hosts = int((mask != 0).sum())
                rec.b_ref = self.truth.reference(rec.k)
                p0, reported = self._kept.pop(rec.id, (0.0, 1))
                self.running[rec.id] = RunningJob(rec, mask, curve_for(rec.id, self.cfg.seed), progress=p0,
                                            reported=reported, started=t, p0=p0)
                self.pending.discard(rec.id)
            elif o.status == "rejected":
                rec.status = "rejected"
                self.pending.discard(rec.id)
                self.done += 1
        return len(rep.assigned)

    def _next_starving(self, t: float) -> float:
        """With preemption on, a batch when the next waiting request reaches the starvation bound
        (nothing else may change for hours, and a batch only runs when something did)."""
        if not self.cfg.profile.preempt or not self.pending:
            return math.inf
        due = [self.recs[j].submit_s + STARVE_S for j in self.pending]
        later = [x for x in due if x > t + 1e-6]
        if not later:
            return math.inf
        return math.ceil(min(later) / self.cfg.interval_s - 1e-9) * self.cfg.interval_s

    def _evict(self, t: float, jid: str) -> None:
        """A preempted job: back to the queue with the progress of its last checkpoint, plus the restart."""
        r = self.running.pop(jid)
        j, rec = self.jobs[jid], r.rec
        ran = max(0.0, t - r.started)
        every = j.checkpoint_every_s
        lost = ran % every if every else ran
        gained = max(0.0, r.progress - r.p0)
        kept = r.progress - (gained * lost / ran if ran > 0 else gained)
        restart = float(j.checkpoint_s or 0.0)
        self._kept[jid] = (kept - restart / rec.compute_s, r.reported)
        rec.preemptions += 1
        rec.wasted_gpu_s += rec.k * (lost + restart)
        rec.status = "pending"
        self.busy &= ~r.mask
        self.pending.add(jid)

    def _complete(self, t: float, ids: list[str]) -> None:
        for jid in ids:
            r = self.running.pop(jid)
            ep = self._epochs(jid)
            self._final_rows += [{"job": jid, "epoch": e, "entropy": r.curve.at(e, ep)}
                                 for e in range(r.reported + 1, ep + 1)]
            self._to_release.append(jid)
            self.busy &= ~r.mask
            r.rec.end_s, r.rec.status = t, "done"
            self.done += 1

    # -- rates and progress ---------------------------------------------------------------
    def _achieved(self) -> list[tuple[Any, float, float]]:
        """(running job, bandwidth it gets under its co-tenants, standalone bandwidth) for every
        running job, co-tenant pressure by the configured demand model: the truth both runners share."""
        if not self.running:
            return []
        runs = list(self.running.values())
        masks = np.array([r.mask for r in runs], dtype=np.int64)
        factors = np.array([pressure_factor(r.rec.comm_fraction, self.cfg.demand) for r in runs])
        b, solo = self.truth.achieved(masks, factors)
        return [(r, float(bi), float(si)) for r, bi, si in zip(runs, b, solo)]

    def _rates(self) -> None:
        for r, bi, si in self._achieved():
            rec = r.rec
            rec.b_standalone = si
            if rec.k < 2 or rec.b_ref <= 0:
                r.ratio, slow = 1.0, 1.0
            else:
                r.ratio = float(bi) / rec.b_ref
                slow = max(1.0, rec.b_ref / max(float(bi), 1e-9 * rec.b_ref))
            r.rate = 1.0 / (rec.compute_s * ((1.0 - rec.comm_fraction) + rec.comm_fraction * slow))

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        for r in self.running.values():
            r.progress = min(1.0, r.progress + r.rate * dt)
            r.rec.bw_time += min(1.0, r.ratio) * dt
            r.rec.gpu_s += r.n_gpus * dt

    # -- hooks (bandpilot.simulation.elastic overrides them) --------------------------------
    def _wants_batch(self) -> bool:
        """Is there anything a batch could do? Fixed gangs: only when requests wait."""
        return bool(self.pending)

    def _retick(self) -> bool:
        """Should another batch follow at the next interval even if nothing changes?"""
        return False

    def _sample(self, t: float) -> None:
        used = popcount(self.busy)
        full = self.spec.gpus_per_host
        free = full - used
        stranded = int(free[(used > 0) & (free > 0)].sum())
        for key, v in (("t", t), ("busy", int(used.sum())), ("free", int(free.sum())), ("stranded", stranded),
                       ("running", len(self.running)), ("pending", len(self.pending))):
            self.tl[key].append(float(v))

    # -- main loop ------------------------------------------------------------------------
    def run(self, truth_label: str, model_label: str) -> SimResult:
        with use_clock(lambda: self.t):  # the store's times (starts, ends, batches) are simulated time
            return self._run(truth_label, model_label)

    def _run(self, truth_label: str, model_label: str) -> SimResult:
        t0 = time.perf_counter()
        trace, cfg = self.trace, self.cfg
        n = len(trace)
        ai = 0
        t = 0.0
        dirty = False
        last_batch = -math.inf
        self._sample(0.0)
        while self.done < n:
            t_arr = trace[ai].submit_s if ai < n else math.inf
            ends = {jid: t + (1.0 - r.progress) / r.rate for jid, r in self.running.items()}
            t_done = min(ends.values(), default=math.inf)
            t_tick = math.inf
            if dirty and self._wants_batch():
                t_tick = math.ceil(t / cfg.interval_s - 1e-9) * cfg.interval_s
                if t_tick <= last_batch:
                    t_tick += cfg.interval_s
            t_starve = self._next_starving(t)
            t_next = min(t_arr, t_done, t_tick, t_starve)
            if t_next == math.inf:  # requests wait, nothing runs or arrives, the last batch placed none
                for jid in self.pending:
                    self.recs[jid].status = "stuck"
                break
            self._advance(t_next - t)
            t = self.t = t_next
            changed = False
            finished = [jid for jid, e in ends.items() if e <= t + 1e-6]
            if finished:
                self._complete(t, finished)
                dirty = changed = True
            batch = []
            while ai < n and trace[ai].submit_s <= t:
                batch.append(trace[ai])
                ai += 1
            if batch:
                self._to_submit += batch
                self.pending.update(j.id for j in batch)
                dirty = True
            if t_starve <= t:  # a waiting gang turns starving: it may preempt now
                dirty = True
            if (dirty and t > last_batch and self._wants_batch()
                    and t >= math.ceil(t / cfg.interval_s - 1e-9) * cfg.interval_s - 1e-9):
                placed = self._batch(t)
                last_batch = t
                dirty = self._retick()
                changed = changed or placed > 0
            if changed:
                self._rates()
            self._sample(t)
            if self.progress:
                self.progress(self.done, n)
        self._flush()  # the last completions: the store ends with every job released
        return SimResult(cfg, self.spec.name, self.spec.n_gpus, list(self.recs.values()), self.tl, self.batches,
                         time.perf_counter() - t0, truth_label, model_label)
