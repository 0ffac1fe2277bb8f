"""Contention-aware predictor ``B̂(S, τ)`` (paper Sec. IV-C), vectorised over many candidates.

A *model* is any object with ``spec``, ``stage1`` (``(n_hosts, 2**max_gpus)`` stage-1 table) and
``predict_masks(masks) -> (n,)`` standalone bandwidth ``B̂(S)`` of per-host mask rows (fabrics are
perfect models; :class:`bandpilot.model.surrogate.Surrogate` is the learned one).

For a candidate ``S`` and the traffic profile ``τ = {(S_j, d_j)}`` of the active jobs:

* contending jobs ``J_c(S) = {j : |H(S_j)| >= 2, d_j > 0, H(S_j) ∩ H(S) ≠ ∅}``;
* capacity ``Ĉ(S) = min_{j ∈ J_c} B̂(S ∪ S_j)`` (per-host union masks: the "super allocation");
* demand ``d_S = B̂(S)``, ``D = d_S + Σ_{j ∈ J_c} d_j``;
* ``B̂(S, τ) = d_S`` if ``D <= Ĉ`` else ``d_S / D · Ĉ``.

Two decisions the paper leaves open, made explicit here:

* **Single-host candidates are never contended.** The paper models contention only among
  cross-host allocations sharing hosts (the NIC / inter-node fabric); a single-host ``S`` talks
  over NVLink/PCIe only, so ``B̂(S, τ) = B̂(S)`` even if a cross-host job shares its host.
* **NVLink-domain traffic is never contended.** On clusters with multi-node NVLink domains a
  job or candidate inside one domain talks over the non-blocking NVLink switches only (each GPU has
  its own links), so "cross-host" above means *spanning several scale-out units* (domains, or
  hosts outside one); clusters without NVLink domains are unchanged.
* **Jobs with zero demand do not contend.** A job with ``d_j = 0`` puts no load on the fabric,
  so it does not enter ``J_c`` (otherwise its super allocation's capacity could still cap ``S``,
  and the idle profile would not reduce to ``B̂(S, τ_idle) = B̂(S)`` as Sec. III requires).

All super allocations of all candidates go into ONE ``predict_masks`` call together with the
candidates themselves (identical rows are de-duplicated first); :attr:`ContentionPredictor.evaluations`
counts the rows actually passed to the model. For very large batches the search uses
:meth:`ContentionPredictor.predict_best`, which exploits ``B̂(S, τ) <= B̂(S)``: one call for every
candidate's standalone value, then super allocations only for candidates that can still win.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from bandpilot.dispatch.model import BandwidthModel
from bandpilot.dispatch.state import State
from bandpilot.fabric.units import UnitIndex, unit_index
from bandpilot.topology.cluster import ranges

#: Candidates per ``predict_masks`` call when a caller hands over a very large batch (Exact).
MAX_BATCH_ROWS = 262_144
#: Hosts from which candidates go to a fabric on the columns they touch (``predict_columns``).
COLUMNS_FROM = 512
#: Pruned evaluations: chunks of more candidates than this are first bounded with one super
#: allocation each (:meth:`ContentionPredictor.predict_best`); the first chunk's best few set the bar.
SEED_ROWS = 8
#: Super allocations per model call in a pruned evaluation (64 MB of mask rows on 128 hosts).
PAIR_ROWS = 65_536


_HASH_W = np.random.default_rng(0x5EED).integers(1, 2**62, size=4096, dtype=np.int64) | 1


def unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for int64 mask rows (order of first
    appearance is not kept). Rows are hashed to one int64 each and the grouping is verified, so
    it is exact; a (never observed) hash collision falls back to a byte-wise sort."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    n, w = rows.shape
    if n <= 1:
        return rows, np.zeros(n, dtype=np.int64)
    if w <= _HASH_W.size:
        with np.errstate(over="ignore"):
            h = rows @ _HASH_W[:w]
            h ^= h >> 29
        _, idx, inv = np.unique(h, return_index=True, return_inverse=True)
        inv = inv.ravel().astype(np.int64)
        rep = idx[inv]
        dup = np.flatnonzero(rep != np.arange(n))
        if dup.size == 0 or np.array_equal(rows[dup], rows[rep[dup]]):
            return rows[idx], inv
    void = rows.view(np.dtype((np.void, 8 * w))).ravel()
    _, idx, inv = np.unique(void, return_index=True, return_inverse=True)
    return rows[idx], inv.ravel().astype(np.int64)


_JOB_HOSTS: dict[int, tuple[np.ndarray, bool]] = {}


def _job_hosts(job: Any, units: UnitIndex | None) -> tuple[np.ndarray, bool]:
    """A job's hosts and whether its traffic leaves NVLink, cached per job object: states change
    by one job at a time and share the others, so predictors after the first pay only for new jobs."""
    got = _JOB_HOSTS.get(id(job))
    if got is None:
        hs = np.flatnonzero(job.mask)
        if units is None:
            spans = hs.size >= 2
        else:
            u = units.unit[hs]
            spans = hs.size >= 2 and bool(np.any(u != u[0]))
        got = (hs, bool(spans))
        try:
            weakref.finalize(job, _JOB_HOSTS.pop, id(job), None)
        except TypeError:  # not weak-referenceable: do not cache
            return got
        _JOB_HOSTS[id(job)] = got
    return got


class WorkSpent(Exception):
    """A model call refused: it would pass the predictor's :attr:`ContentionPredictor.cell_limit`
    (nothing was priced; the counters are unchanged)."""


@dataclass
class Prediction:
    """Contention-aware and standalone predictions for a batch of candidates."""

    value: np.ndarray  # B̂(S, τ)
    standalone: np.ndarray  # B̂(S)


class ContentionPredictor:
    """``B̂(S, τ)`` for one cluster snapshot; call :meth:`predict` with ``(n, n_hosts)`` masks."""

    def __init__(self, model: BandwidthModel, state: State) -> None:
        self.model = model
        self.spec = state.spec
        self.state = state
        n_h = self.spec.n_hosts
        #: hosts grouped by scale-out unit (NVLink-domain clusters only): what "cross-host" means there
        self._units: UnitIndex | None = unit_index(self.spec) if self.spec.nvlink_domains else None
        # jobs kept sparse (their hosts and masks there): 1,000 jobs x 25,000 trays dense is 200 MB
        jobs, hosts_of = [], []
        for j in state.jobs:
            if j.demand_gbps <= 0:
                continue
            hs, spans = _job_hosts(j, self._units)
            if spans:
                jobs.append(j)
                hosts_of.append(hs)
        self.job_ids = [j.id for j in jobs]
        self.job_demand = np.array([j.demand_gbps for j in jobs], dtype=float)
        #: hosts touched by at least one contending-capable job (their GPUs matter beyond counts)
        self._exposed_cols = np.unique(np.concatenate(hosts_of)) if jobs else np.zeros(0, dtype=np.int64)
        self.exposed = np.zeros(n_h, dtype=bool)
        self.exposed[self._exposed_cols] = True
        #: total demand of the contending jobs touching each host (0: unexposed)
        self.host_exposure = np.zeros(n_h)
        for j, hs in zip(jobs, hosts_of):
            self.host_exposure[hs] += j.demand_gbps
        # exposed host -> jobs incidence (CSR, jobs ascending per host, with the job's mask there):
        # contenders by sparse lookups, not a BLAS matmul (which on a loaded 2-core machine spins
        # its threads for tiny batches), and built from the jobs' host lists - a dense exposed-host
        # x job matrix is 15,200 x 353 on a 70 %-busy 100,008-GPU cluster (6-29 ms per predictor)
        sizes = np.array([hs.size for hs in hosts_of], dtype=np.int64)
        if jobs:
            e = np.searchsorted(self._exposed_cols, np.concatenate(hosts_of))
            jid = np.repeat(np.arange(len(jobs)), sizes)
            m = np.concatenate([j.mask[hs] for j, hs in zip(jobs, hosts_of)]).astype(np.int64)
            order = np.lexsort((jid, e))
            self._inc_e, self._inc_jobs, self._inc_masks = e[order], jid[order], m[order]
        else:
            self._inc_e = self._inc_jobs = self._inc_masks = np.zeros(0, dtype=np.int64)
        self._inc_ptr = np.searchsorted(self._inc_e, np.arange(self._exposed_cols.size + 1))
        #: hosts each job spans (:meth:`_lead_contender`)
        self._job_span = sizes
        self._dense: np.ndarray | None = None
        self.evaluations = 0
        self.calls = 0
        #: model cells (rows x host columns of every model call): the work a decision costs, whatever
        #: the cluster's width - a row over 2,000 trays costs the model 100 times one over 18
        self.cells = 0
        #: cells after which :meth:`raw` refuses a call (:class:`WorkSpent`) instead of making it;
        #: None: no limit. A search sets it around the part of its work it can stop early.
        self.cell_limit: int | None = None

    @property
    def n_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def job_masks(self) -> np.ndarray:
        """Dense ``(n_jobs, n_hosts)`` job masks (built on first use)."""
        if self._dense is None:
            self._dense = self.jobs_on(np.arange(self.spec.n_hosts))
        return self._dense

    @property
    def job_used(self) -> np.ndarray:
        return (self.job_masks != 0).astype(np.int32)

    def jobs_on(self, cols: np.ndarray) -> np.ndarray:
        """Job masks on the host columns ``cols`` (sorted): ``(n_jobs, len(cols))``."""
        out = np.zeros((self.n_jobs, cols.size), dtype=np.int64)
        e = np.flatnonzero(self.exposed[cols])
        if e.size:
            idx, lens = self._incidence(np.searchsorted(self._exposed_cols, cols[e]))
            out[self._inc_jobs[idx], np.repeat(e, lens)] = self._inc_masks[idx]
        return out

    def jobs_of_parts(self, ptr: np.ndarray, hosts: np.ndarray) -> np.ndarray:
        """``(parts, n_jobs)`` bool: the jobs holding GPUs on some host of each part (part ``j``:
        ``hosts[ptr[j]:ptr[j + 1]]``) - ``jobs_on(part).any(axis=1)`` of every part in one pass."""
        out = np.zeros((ptr.size - 1, self.n_jobs), dtype=bool)
        e = np.flatnonzero(self.exposed[hosts])
        if e.size:
            idx, lens = self._incidence(np.searchsorted(self._exposed_cols, hosts[e]))
            part = np.repeat(np.repeat(np.arange(ptr.size - 1), np.diff(ptr))[e], lens)
            held = self._inc_masks[idx] != 0
            out[part[held], self._inc_jobs[idx][held]] = True
        return out

    def hosts_of_jobs(self, jobs: np.ndarray) -> np.ndarray:
        """Hosts (sorted, unique) any job of the ``(n_jobs,)`` bool ``jobs`` spans: the
        sparse host -> job incidence read backwards, never a dense job x host matrix."""
        held = np.flatnonzero(jobs[self._inc_jobs])
        return np.unique(self._exposed_cols[self._inc_e[held]])

    def _incidence(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Incidence entries of the exposed hosts ``rows`` (indices into them, entries per row)."""
        lo, hi = self._inc_ptr[rows], self._inc_ptr[rows + 1]
        lens = hi - lo
        return ranges(lo, lens), lens

    def masks_at(self, h: int) -> np.ndarray:
        """Distinct nonzero masks the contending jobs hold on host ``h``."""
        if not self.exposed[h]:
            return np.zeros(0, dtype=np.int64)
        i = int(np.searchsorted(self._exposed_cols, h))
        return np.unique(self._inc_masks[self._inc_ptr[i] : self._inc_ptr[i + 1]])

    # ------------------------------------------------------------------------------------
    def raw(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Standalone ``B̂`` of rows (de-duplicated, one model call, counted); with ``cols`` the
        rows are given on those host columns only (every other host empty)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if masks.shape[0] == 0:
            return np.zeros(0)
        uniq, inv = unique_rows(masks)
        cells = int(uniq.shape[0]) * (self.spec.n_hosts if cols is None else int(cols.size))
        if self.cell_limit is not None and self.cells + cells > self.cell_limit:
            raise WorkSpent(f"{cells} model cells would pass the limit of {self.cell_limit} ({self.cells} spent)")
        if cols is None:
            vals = self.model.predict_masks(uniq)
        elif hasattr(self.model, "predict_columns"):
            vals = self.model.predict_columns(uniq, cols)
        else:
            full = np.zeros((uniq.shape[0], self.spec.n_hosts), dtype=np.int64)
            full[:, cols] = uniq
            vals = self.model.predict_masks(full)
        vals = np.asarray(vals, dtype=float).reshape(-1)
        if vals.shape[0] != uniq.shape[0]:
            raise ValueError(f"model returned {vals.shape[0]} predictions for {uniq.shape[0]} rows")
        self.evaluations += int(uniq.shape[0])
        self.cells += cells
        self.calls += 1
        return vals[inv]

    def _columns(self, masks: np.ndarray, jobs: np.ndarray, cols: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Candidates and job masks on the host columns they touch (the candidates' and the
        contending jobs'), when the rows come column-restricted or the model can evaluate such rows
        (fabrics: ``predict_columns``) on a wide cluster; ``n x n_hosts`` rows of a 25,000-tray
        cluster would dominate every step otherwise."""
        if cols is None and (not hasattr(self.model, "predict_columns") or masks.shape[1] < COLUMNS_FROM):
            return masks, self.job_masks, None
        base = np.flatnonzero(masks.any(axis=0)) if cols is None else cols
        sub = masks[:, base] if cols is None else masks
        if jobs.size:
            held = np.zeros(self._exposed_cols.size, dtype=bool)
            held[self._inc_e[np.isin(self._inc_jobs, jobs)]] = True
            new = np.union1d(base, self._exposed_cols[held])
            if new.size != base.size:
                wide = np.zeros((sub.shape[0], new.size), dtype=np.int64)
                wide[:, np.searchsorted(new, base)] = sub
                sub, base = wide, new
        return sub, self.jobs_on(base), base

    def _spans(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Rows whose traffic leaves NVLink: several hosts, or several NVLink domains."""
        masks = np.atleast_2d(masks)
        if self._units is None:
            return (masks != 0).sum(axis=1) >= 2
        if cols is None:
            return self._units.any(masks).sum(axis=1) >= 2
        u = self._units.unit[cols]
        grouped = bool(np.all(u[1:] >= u[:-1]))  # the usual case: no column reordering (a full copy)
        order = None if grouped else np.argsort(u, kind="stable")
        us = u if order is None else u[order]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]]) if us.size else np.zeros(0, dtype=np.int64)
        if starts.size == 0:
            return np.zeros(masks.shape[0], dtype=bool)
        used = masks != 0 if order is None else masks[:, order] != 0
        return np.logical_or.reduceat(used, starts, axis=1).sum(axis=1) >= 2

    def contenders(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """``(n, n_jobs)`` bool: job ``j`` ∈ ``J_c(S)`` for each candidate row (``cols``: rows
        given on those host columns)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if self.n_jobs == 0:
            return np.zeros((masks.shape[0], 0), dtype=bool)
        if cols is None and masks.shape[1] >= COLUMNS_FROM:
            # wide rows on the columns some row uses (per-unit spans over 2,502 trays per row cost
            # more than the model's in-domain values: a per-domain search on 10,008 GPUs)
            cols = np.flatnonzero(masks.any(axis=0))
            masks = masks[:, cols]
        cross = self._spans(masks, cols)
        if cols is None:
            r, e = np.nonzero(masks[:, self._exposed_cols])
        else:
            at = np.flatnonzero(self.exposed[cols])
            r, i = np.nonzero(masks[:, at])
            e = np.searchsorted(self._exposed_cols, cols[at[i]])
        keep = cross[r]
        r, e = r[keep], e[keep]
        idx, lens = self._incidence(e)
        out = np.zeros((masks.shape[0], self.n_jobs), dtype=bool)
        out[np.repeat(r, lens), self._inc_jobs[idx]] = True
        return out

    def predict(self, masks: np.ndarray, cols: np.ndarray | None = None) -> Prediction:
        """``B̂(S, τ)`` and ``B̂(S)`` for every candidate row, with ONE model call per batch
        (candidates and all their super allocations together)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        if n == 0:
            return Prediction(np.zeros(0), np.zeros(0))
        if n > MAX_BATCH_ROWS:
            parts = [self.predict(masks[i : i + MAX_BATCH_ROWS], cols) for i in range(0, n, MAX_BATCH_ROWS)]
            return Prediction(np.concatenate([p.value for p in parts]), np.concatenate([p.standalone for p in parts]))
        cont = self.contenders(masks, cols)
        ci, ji = np.nonzero(cont)
        masks, jobs, cols = self._columns(masks, ji, cols)
        if ci.size == 0:
            solo = self.raw(masks, cols)
            return Prediction(solo.copy(), solo)
        supers = masks[ci] | jobs[ji]
        allv = self.raw(np.concatenate([masks, supers]), cols)
        solo = allv[:n]
        return Prediction(self._share(n, solo, cont, ci, allv[n:]), solo)

    def share(self, solo: np.ndarray, cont: np.ndarray, ci: np.ndarray, cap_pairs: np.ndarray) -> np.ndarray:
        """``B̂(S, τ)`` from standalone values, the contender matrix and the capacities of the
        ``(candidate, job)`` pairs ``np.nonzero(cont)`` (grows with ``solo`` and every capacity)."""
        return self._share(solo.shape[0], solo, cont, ci, cap_pairs)

    def _share(self, n: int, solo: np.ndarray, cont: np.ndarray, ci: np.ndarray, cap_pairs: np.ndarray) -> np.ndarray:
        cap = np.full(n, np.inf)
        np.minimum.at(cap, ci, cap_pairs)
        demand = solo + cont.astype(float) @ self.job_demand
        with np.errstate(divide="ignore", invalid="ignore"):
            shared = np.where(demand > 0, solo / demand * cap, 0.0)
        return np.where(demand <= cap, solo, shared)

    def predict_best(self, masks: np.ndarray, max_pairs: int = 8192, first: int = 256,
                     cols: np.ndarray | None = None, known: np.ndarray | None = None,
                     margin: float = 1e-9) -> Prediction:
        """Like :meth:`predict`, but only as far as needed to find the maximum and its near-ties.

        Uses ``B̂(S, τ) <= B̂(S)``: one call gives every candidate's standalone value; super
        allocations are then built for the candidates in descending standalone order, a growing
        chunk per call, until the best contention-aware value found exceeds the standalone value
        of every candidate left. Candidates never scored get ``-inf``. Small batches (at most
        ``max_pairs`` super allocations) take the single-call path of :meth:`predict`. ``known``:
        standalone values already evaluated (NaN where not), not sent to the model again.
        ``margin``: relative distance below the best within which every candidate is scored (the
        caller's tie margin: a choice among near-ties must see all of them).
        """
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        n = masks.shape[0]
        cont = self.contenders(masks, cols)
        n_pairs = int(cont.sum())
        if n_pairs <= max_pairs and known is None:
            return self.predict(masks, cols)
        masks, jobs, cols = self._columns(masks, np.flatnonzero(cont.any(axis=0)), cols)
        solo = np.full(n, np.nan) if known is None else np.asarray(known, dtype=float).copy()
        todo_solo = np.flatnonzero(np.isnan(solo))
        for i in range(0, todo_solo.size, MAX_BATCH_ROWS):
            idx = todo_solo[i : i + MAX_BATCH_ROWS]
            solo[idx] = self.raw(masks[idx], cols)
        value = np.full(n, -np.inf)
        free_of = ~cont.any(axis=1)
        value[free_of] = solo[free_of]
        todo = np.flatnonzero(~free_of)
        todo = todo[np.argsort(-solo[todo], kind="stable")]
        best = float(value.max()) if free_of.any() else -np.inf
        pos, step = 0, first
        lead = self._lead_contender(cont)
        while pos < todo.size:
            cut = best - margin * max(1.0, abs(best))
            if solo[todo[pos]] < cut:
                break
            idx = todo[pos : pos + step]
            idx = idx[solo[idx] >= cut]
            pos += step
            step *= 2
            if idx.size > SEED_ROWS:
                # Under contention every value is far below every standalone bound, so the
                # standalone order prunes nothing. One super allocation per candidate (its lead
                # contender) bounds its capacity - a min over fewer jobs is never smaller - and
                # the share grows with the capacity: candidates whose bound is below the best
                # found are skipped without their other super allocations.
                caps1 = self.raw(masks[idx] | jobs[lead[idx]], cols)
                ub = self._share(idx.size, solo[idx], cont[idx], np.arange(idx.size), caps1)
                o = np.argsort(-ub, kind="stable")
                idx, ub = idx[o], ub[o]
                if best == -np.inf:  # nothing scored yet: the most promising few set the bar
                    best = self._score(idx[:SEED_ROWS], solo, cont, masks, jobs, cols, value)
                    idx, ub = idx[SEED_ROWS:], ub[SEED_ROWS:]
                    cut = best - margin * max(1.0, abs(best))
                idx = idx[ub >= cut]
            if idx.size:
                best = max(best, self._score(idx, solo, cont, masks, jobs, cols, value))
        return Prediction(value, solo)

    def _score(self, idx: np.ndarray, solo: np.ndarray, cont: np.ndarray, masks: np.ndarray, jobs: np.ndarray,
               cols: np.ndarray | None, value: np.ndarray) -> float:
        """Contention-aware values of candidates ``idx`` (every super allocation) into ``value``; their
        best. At most :data:`PAIR_ROWS` super allocations per model call: a late chunk of 16,384
        candidates x dozens of contenders was GBs of mask rows (and their copies) at once."""
        n_pairs = cont[idx].sum(axis=1)
        ends = np.searchsorted(np.cumsum(n_pairs), np.arange(PAIR_ROWS, int(n_pairs.sum()), PAIR_ROWS), side="right")
        for part in np.split(idx, np.unique(ends[(ends > 0) & (ends < idx.size)])):
            sub = cont[part]
            ci, ji = np.nonzero(sub)
            caps = self.raw(masks[part][ci] | jobs[ji], cols)
            value[part] = self._share(part.size, solo[part], sub, ci, caps)
        return float(value[idx].max())

    def _lead_contender(self, cont: np.ndarray) -> np.ndarray:
        """Per candidate row, the contending job most likely to set its capacity: the one spanning
        the most hosts (a super allocation over more hosts predicts less). Any choice is a valid
        bound; this one only makes it tight more often."""
        if cont.shape[1] == 0:
            return np.zeros(cont.shape[0], dtype=np.int64)
        span = self._job_span
        return np.where(cont, span[None, :], -1).argmax(axis=1)

    def explain(self, mask: np.ndarray) -> dict[str, Any]:
        """Breakdown for one allocation (CLI / debugging): contenders, capacity, demand."""
        mask = np.asarray(mask, dtype=np.int64).reshape(1, -1)
        cont = self.contenders(mask)[0]
        p = self.predict(mask)
        jobs = [self.job_ids[j] for j in np.flatnonzero(cont)]
        caps = self.raw(mask | self.job_masks[cont]) if jobs else np.zeros(0)
        return {
            "contending_jobs": jobs,
            "capacity_gbps": float(caps.min()) if jobs else None,
            "demand_gbps": float(p.standalone[0] + self.job_demand[cont].sum()),
            "standalone_gbps": float(p.standalone[0]),
            "predicted_gbps": float(p.value[0]),
        }
