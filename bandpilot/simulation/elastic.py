"""How long does an elastic job's epoch take, and what happens at its boundaries? The simulator's
elastic side (``simulate --elastic on``).

*Runtime model.* A job declares its size ``k0`` (the trace's ``k``), its run time ``compute_s`` on a
best placement of ``k0`` GPUs, ``epochs`` (default :attr:`SimConfig.epochs`), its communication
fraction ``f`` and a compute scaling efficiency ``η`` per doubling of GPUs (``scaling``, default
:data:`DEFAULT_SCALING`). With ``T = compute_s / epochs``, one epoch at ``k`` GPUs on a set ``S`` takes

    t(k, S) = (1 - f) · T · (k0 / k) / η^log2(k / k0)                     compute share
            + f · T · (r(k) / r(k0')) · B_ref(k0') / B_achieved(S)          collective share

``r(k) = 2 (k - 1) / k`` (ring all-reduce traffic per GPU relative to bus bandwidth, so busbw
numbers compare across sizes), ``k0' = max(k0, 2)`` (a 1-GPU job's reference collective is that of
2 GPUs), ``B_ref`` the best idle-cluster bandwidth of a size and ``B_achieved`` the TRUE bandwidth
of ``S`` under the co-tenants (:class:`~bandpilot.simulation.bandwidth.TrueBandwidth`, as the fixed-gang
engine); 1 GPU has no collective. At ``k = k0`` this is exactly the fixed-gang engine's rate.

*Epoch boundaries.* Every dispatch interval, the jobs that crossed an epoch boundary since their
last resize (at most one resize per epoch) and the pending queue go through
:func:`bandpilot.scheduling.elastic.rebalance` on the live store. A resize costs ``resize_s`` of the
job's time at its new rate (checkpoint-restart) and is counted in ``resizes``. A round is skipped
when no job reached a new boundary and neither the GPUs held nor the queue changed since the last
one (it would decide the same), and a job whose growth was refused is priced again only at a new
epoch or on a new state (at 1,024 GPUs, pricing refused growths every interval was most of the time).

Simplifications, stated: the decision is taken at the dispatch tick after the boundary, and the
job keeps its fractional progress into the epoch (as if it resized in place); learning is
independent of the size (the seed's micro level keeps time-to-accuracy per epoch comparable).
"""

from __future__ import annotations

import math
from typing import Any


from bandpilot.errors import BandPilotError
from bandpilot.scheduling.elastic import rebalance
from bandpilot.simulation.curves import curve_for
from bandpilot.simulation.engine import SimConfig, SimResult, RunningJob, Simulator
from bandpilot.simulation.engine import simulate as _simulate
from bandpilot.topology.cluster import popcount

#: Compute scaling efficiency per doubling of GPUs when the trace gives none.
DEFAULT_SCALING = 0.9
#: ``simulate --elastic``: ``auto`` (the default) runs per-epoch quotas when some job of
#: the trace declares a range (``min_k < max_k``) and the fixed-gang queue otherwise, so a trace without
#: ranges runs exactly as with ``off``.
ELASTIC_MODES = ("auto", "on", "off")
DEFAULT_ELASTIC = "auto"


def elastic_for(mode: str, jobs: Any) -> bool:
    """Does ``simulate --elastic MODE`` run ``jobs`` with per-epoch quotas? (A bad mode: a one-line error.)"""
    m = str(mode).strip().lower()
    if m not in ELASTIC_MODES:
        raise BandPilotError(f"--elastic must be one of {', '.join(ELASTIC_MODES)}, got {mode!r}")
    if m != "auto":
        return m == "on"
    return any((j.min_k or j.k) < (j.max_k or j.k) for j in jobs)


def _r(k: int) -> float:
    return 2.0 * (k - 1) / k if k > 1 else 0.0


def epoch_time(epoch_s: float, k0: int, k: int, f: float, scaling: float, b_ref0: float, b_achieved: float) -> float:
    """Seconds per epoch at ``k`` GPUs (module docstring); ``b_ref0`` = ``B_ref(max(k0, 2))``."""
    comp = (1.0 - f) * epoch_s * (k0 / k) / scaling ** math.log2(k / k0)
    if k < 2 or b_ref0 <= 0:
        return comp
    comm = f * epoch_s * (_r(k) / _r(max(k0, 2))) * b_ref0 / max(b_achieved, 1e-9 * b_ref0)
    return comp + comm


class ElasticSim(Simulator):
    def __init__(self, jobs, dispatcher, truth, cfg, store, progress) -> None:
        super().__init__(jobs, dispatcher, truth, cfg, store, progress)
        self.jobs = {j.id: j for j in self.trace}
        self.last_resize: dict[str, int] = {}  # job -> epoch of its last resize (or start)
        self.waiting_resize = False
        self.priced: dict[str, tuple[int, tuple[bytes, int]]] = {}  # job -> (epoch, round key) of its last pricing
        self.last_key: tuple[bytes, int] | None = None

    def _wants_batch(self) -> bool:
        if self.pending:
            return True
        free = self.spec.n_gpus - int(popcount(self.busy).sum())
        return free > 0 and any(self._can_grow(r) for r in self.running.values())

    def _can_grow(self, r: RunningJob) -> bool:
        j = self.jobs[r.rec.id]
        return (j.max_k or j.k) > int(popcount(r.mask).sum())

    def _retick(self) -> bool:
        return self.waiting_resize

    def _key(self) -> tuple[bytes, int]:
        """What a round decides from besides the jobs at a boundary: the GPUs held and the queue."""
        return self.busy.tobytes(), len(self.pending)

    def _batch(self, t: float) -> int:
        at, seen = [], {}
        key = self._key()
        self.waiting_resize = False
        for jid, r in self.running.items():
            j = self.jobs[jid]
            if (j.min_k or j.k) == (j.max_k or j.k):
                continue
            ep = int(max(0.0, r.progress) * self._epochs(jid) + 1e-9)
            if ep > self.last_resize.get(jid, 0):
                seen[jid] = ep
                if self.priced.get(jid) != (ep, key):  # a refused growth is priced again only on a new state
                    at.append(jid)
            else:
                self.waiting_resize = True
        if not at and key == self.last_key:
            return 0  # no boundary, nothing freed or queued since the last round: it would decide the same
        self._flush()
        rep = rebalance(self.store, self.d, at_boundary=at, blind=self.cfg.blind, algorithm=self.cfg.profile.algorithm_for(self.spec),
                        demand=self.cfg.demand, policy=self.cfg.policy, pricing=self.cfg.pricing,
                        admission=self.cfg.admission, scaling=self.cfg.scaling_pricing, relocate=self.cfg.relocate,
                        current_share=self.cfg.current_share, fill_idle=self.cfg.fill_idle,
                        epochs={jid: int(max(0.0, self.running[jid].progress) * self._epochs(jid)) for jid in at})
        self.batches += 1
        for jid in at:
            self.priced[jid] = (seen[jid], key)
        for jid in rep.suspended:  # first: their GPUs are what the others took
            self._suspend(jid)
        for rz in rep.resized:
            r = self.running[rz["job"]]
            self.busy &= ~r.mask
            gpus = [g for g in r.rec.gpus.split(",") if g not in set(rz["released"])] + rz["added"]
            r.mask = self.spec.to_mask(gpus)
            self.busy |= r.mask
            r.rec.gpus = ",".join(gpus)
            r.rec.n_hosts = int((r.mask != 0).sum())
            r.rec.resizes += 1
            r.rec.wasted_gpu_s += self.cfg.resize_s * rz["k"]
            self.last_resize[r.rec.id] = int(max(0.0, r.progress) * self._epochs(r.rec.id))
            r.resize_pending = True  # type: ignore[attr-defined]
        for rid, gpus in rep.admitted.items():
            rec = self.recs[rid]
            mask = self.spec.to_mask(gpus)
            self.busy |= mask
            rec.start_s = t if rec.start_s is None else rec.start_s  # a resumed job keeps its first start
            rec.status = "running"
            rec.gpus = ",".join(gpus)
            rec.n_hosts = int((mask != 0).sum())
            rec.b_ref = self.truth.reference(max(rec.k, 2))
            p0, reported = self._kept.pop(rid, (0.0, 1))
            r = self.running[rid] = RunningJob(rec, mask, curve_for(rid, self.cfg.seed), progress=p0, reported=reported,
                                         started=t, p0=p0)
            self.last_resize[rid] = int(p0 * self._epochs(rid) + 1e-9)
            if p0 > 0:  # resuming costs one resize (restart from the checkpoint at its boundary)
                rec.resizes += 1
                rec.wasted_gpu_s += self.cfg.resize_s * len(gpus)
                r.resize_pending = True  # type: ignore[attr-defined]
            self.pending.discard(rid)
        if any(getattr(r, "resize_pending", False) for r in self.running.values()):  # the resize cost: resize_s more of the job's time at its new rate
            self._rates()
            for r in self.running.values():
                if getattr(r, "resize_pending", False):
                    r.progress -= self.cfg.resize_s * r.rate
                    r.resize_pending = False  # type: ignore[attr-defined]
        self.last_key = self._key()
        return len(rep.admitted) + len(rep.resized)

    def _suspend(self, jid: str) -> None:
        """Suspended at its epoch boundary (srpt-suspend): back to the queue with its progress (the
        checkpoint is the boundary; like a resize, the fraction into the epoch is kept)."""
        r = self.running.pop(jid)
        self._kept[jid] = (r.progress, r.reported)
        r.rec.preemptions += 1
        r.rec.status = "pending"
        self.busy &= ~r.mask
        self.pending.add(jid)

    def _rates(self) -> None:
        for r, bi, si in self._achieved():
            rec, j = r.rec, self.jobs[r.rec.id]
            k = int(popcount(r.mask).sum())
            rec.b_standalone = si
            ref_k = self.truth.reference(k) if k >= 2 else 0.0
            r.ratio = float(bi) / ref_k if ref_k > 0 else 1.0
            ep = self._epochs(rec.id)
            t_ep = epoch_time(rec.compute_s / ep, rec.k, k, rec.comm_fraction, j.scaling or DEFAULT_SCALING,
                              rec.b_ref, float(bi))
            r.rate = 1.0 / (ep * t_ep)


def simulate(jobs: Any, dispatcher: Any, truth_fabric: Any, config: SimConfig, **kw: Any) -> SimResult:
    """:func:`bandpilot.simulation.engine.simulate`, with per-epoch quotas when ``config.elastic``."""
    return _simulate(jobs, dispatcher, truth_fabric, config, runner=ElasticSim if config.elastic else None, **kw)
