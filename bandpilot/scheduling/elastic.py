"""How many GPUs should each elastic job have for its next epoch, and which ones? The entropy-guided scheduling paper's macro
level: at epoch boundaries the queue redistributes GPUs among the running elastic jobs and the
pending queue by learning utility, then realises the quotas on concrete GPUs.

*Quotas* (:func:`elastic_quotas`, seed eq. 31, :mod:`bandpilot.scheduling.elastic_admission`): the
GPUs in play (free ones plus those of the running jobs at an epoch boundary) are shared by utility
over the jobs admitted, within each job's ``[min_k, max_k]``; pending ones are admitted in the
caller's order (utility first) by an admission rule (:data:`ADMISSIONS`: ``fit-k``, the default,
``min-k``, ``idle``, ``srpt``).

*GPUs* (:func:`grow_gpus`, :func:`shrink_gpus`): growing proposes grown sets (:func:`grow_rows`:
greedy by the predicted bandwidth of ``S ∪ new`` under the current co-tenants, from a few seed
hosts) at a few sizes, and a pricer (:mod:`bandpilot.scheduling.elastic_pricing`) takes one or
none: ``welfare`` (default) by the sum of the predicted epoch-time changes of the job and of the
co-tenants whose NICs it would share, ``self`` by the job's own epoch time only. Admissions choose
their size and placement the same way. Shrinking removes the GPU whose removal leaves the highest
prediction. ``blind=True`` is the baseline that ignores bandwidth: lowest free GPU ids first,
highest held ids released first, every quota taken.

:func:`rebalance` does one round against the store: quotas, shrinks, grows, admissions, all
written in ONE transaction (:mod:`bandpilot.queue.generations` for resizes, the batch's guarded
assignment writes for admissions).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.demand import DEFAULT_DEMAND, pressure_factor
from bandpilot.dispatch.state import State
from bandpilot.errors import PlacementError, RequestError
from bandpilot.queue.clock import now
from bandpilot.queue.generations import Resize, apply_resize
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_ASSIGN, T_REQ
from bandpilot.queue.store import Store
from bandpilot.scheduling.assign_write import write_assignment
from bandpilot.scheduling.batch import load_pending, model_version_of
from bandpilot.scheduling.elastic_admission import (  # noqa: F401 - quotas and admission rules, public here too
    ADMISSIONS, DEFAULT_ADMISSION, Admission, Candidate, snap_size, elastic_quotas)
from bandpilot.scheduling.elastic_pricing import (  # noqa: F401 - grow_ratio, DEFAULT_COMM, GROW_GAIN: public here too
    DEFAULT_COMM, DEFAULT_PRICING, DEFAULT_SCALING_MODE, GROW_GAIN, PRICERS, SCALING_MODES, Context, Grown, current_share,
    grow_ratio)
from bandpilot.scheduling.elastic_marginal import curves_of
from bandpilot.scheduling.elastic_remaining import remaining_work
from bandpilot.scheduling.elastic_srpt import record_resume, suspend_job, was_suspended
from bandpilot.scheduling.elastic_fragments import fill_fragments
from bandpilot.scheduling.elastic_gpus import (  # noqa: F401 - the GPU choice, public here too
    SEED_HOSTS, grow_gpus, grow_rows, idle_best_gbps, shrink_gpus)
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.policies import order_pending, queue_sort, utility_prior
from bandpilot.topology.cluster import popcount


_RUNNING = (
    sa.select(T_REQ.c.id, T_REQ.c.k, T_REQ.c.min_k, T_REQ.c.max_k, T_REQ.c.k_step, T_REQ.c.utility, T_REQ.c.comm_fraction,
              T_REQ.c.scaling, T_ASSIGN.c.gpus)
    .join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id).where(T_REQ.c.status == "assigned")
)


#: Resizes may relocate (benchmarks/bench_elastic.py): measured better on held-out seeds on mean JCT, p95 and
#: makespan than growing around the old GPUs only (``rebalance(relocate=False)``, ``--no-relocate``).
DEFAULT_RELOCATE = True

#: True: growths are priced from the job's collective share at its current size, derived from its
#: declared share at its requested ``k`` (:func:`current_share`; ``rebalance(current_share=True)``,
#: ``--current-share``). False (default): the declared share as if it were the share now. Measured
#: (benchmarks/bench_elastic.py): better makespan everywhere and ``srpt-suspend`` better on every figure, but the
#: default's mean JCT a tie on the ten tuning seeds and 0.35 % worse on ten held-out seeds, +36 % CPU at scale.
CURRENT_SHARE = False

#: True: after admissions, GPUs still free when no request waits are offered to the running jobs at
#: a boundary, shortest remaining work first, each growth priced as any (``rebalance(fill_idle=True)``,
#: ``--fill-idle``). A flag: benchmarks/bench_elastic.py measures it.
FILL_IDLE = False


def _relocating(relocate: bool | None, blind: bool) -> bool:
    """The blind baseline places by GPU id: it never relocates."""
    return not blind and (DEFAULT_RELOCATE if relocate is None else bool(relocate))


@dataclass
class RebalanceReport:
    quotas: dict[str, int] = field(default_factory=dict)
    resized: list[dict[str, Any]] = field(default_factory=list)  # generations.resize summaries
    admitted: dict[str, list[str]] = field(default_factory=dict)  # request id -> GPUs
    waiting: list[str] = field(default_factory=list)  # pending requests not admitted
    suspended: list[str] = field(default_factory=list)  # running jobs sent back to pending (srpt-suspend)


def rebalance(
    store: Store, dispatcher: Any, *, at_boundary: Iterable[str] | None = None, blind: bool = False,
    algorithm: str = "bandpilot", demand: str = DEFAULT_DEMAND, epochs: dict[str, int] | None = None,
    policy: str = "utility", pricing: str = DEFAULT_PRICING, admission: str = DEFAULT_ADMISSION,
    scaling: str = DEFAULT_SCALING_MODE, relocate: bool | None = None, current_share: bool | None = None,
    fill_idle: bool | None = None,
) -> RebalanceReport:
    """One epoch-boundary round: quotas over the running elastic jobs in ``at_boundary`` (all
    running elastic jobs when None) and the pending queue (in ``policy`` order); shrinks, grows and
    admissions in one transaction, growths and admission sizes priced by ``pricing``
    (:data:`~bandpilot.scheduling.elastic_pricing.PRICERS`), pending requests admitted by
    ``admission`` (:data:`ADMISSIONS`), each job's compute priced by its declared ``scaling``
    efficiency or as perfect (``scaling``: :data:`SCALING_MODES`); ``relocate``: a growth may also move
    the job onto a fresh placement of the grown size (:func:`_relocations`; None: :data:`DEFAULT_RELOCATE`;
    never when ``blind``); ``current_share``: a growth is priced from the job's collective share at its
    current size (None: :data:`CURRENT_SHARE`); ``fill_idle``: GPUs left free when nothing waits
    are offered to the jobs at a boundary (:func:`_fill_idle`; None: :data:`FILL_IDLE`). Jobs not at
    a boundary keep their GPUs."""
    _check_names(pricing, admission, scaling)
    spec = dispatcher.model.spec
    rep = RebalanceReport()
    eligible = None if at_boundary is None else set(at_boundary)
    fill = FILL_IDLE if fill_idle is None else bool(fill_idle)
    with store.write() as conn:
        state = store.load_state(conn, spec)
        pending, _ = load_pending(conn)
        running = conn.execute(_RUNNING).all()
        prior = utility_prior(pending) if pending else 1.0
        cands: list[Candidate] = []
        held: dict[str, np.ndarray] = {}
        n_play = state.n_free
        fracs: dict[str, float | None] = {r.id: r.comm_fraction for r in running}
        etas: dict[str, float | None] = {r.id: r.scaling for r in running}
        for r in running:
            lo = r.k if r.min_k is None else r.min_k
            hi = r.k if r.max_k is None else r.max_k
            if lo == hi or (eligible is not None and r.id not in eligible):
                continue
            gpus = json.loads(r.gpus)
            held[r.id] = spec.to_mask(gpus)
            n_play += len(gpus)
            u = r.utility if r.utility is not None else prior
            cands.append(Candidate(r.id, len(gpus), lo, hi, r.k_step or 1, float(u), True))
        expected = None
        if queue_sort(policy).estimates:  # sjf/hrrn order by run-time estimates, as the batch does
            est = Estimates.load(conn, [p.req.id for p in pending])
            expected = {p.req.id: e for p in pending if (e := est.of(p.req)) is not None}
        order = order_pending(pending, policy, expected, now())
        reqs = {p.req.id: p.req for p in order}
        rem: dict[str, float] = {}
        if ADMISSIONS[admission].srpt:  # the rule orders and yields by estimated remaining work
            rem = remaining_work(conn, {c.id: c.k for c in cands} | _elastic_sizes(running, admission), list(reqs.values()), now(),
                                 {**etas, **{r.id: r.scaling for r in reqs.values()}})
            cands = [replace(c, remaining=rem.get(c.id, math.inf)) for c in cands]
        for p in order:
            u = p.req.utility if p.req.utility is not None else prior
            cands.append(Candidate(p.req.id, p.req.k, p.req.lo, p.req.hi, p.req.step, float(u), False,
                                   rem.get(p.req.id, math.inf)))
        host = int(spec.gpus_per_host.max())
        if ADMISSIONS[admission].marginal:  # claims sized on each job's priced speed curve (elastic_marginal)
            cands = curves_of(cands, running, reqs.values(), host, lambda k: idle_best_gbps(dispatcher, k), scaling == "declared",
                              rem)
        rep.quotas = elastic_quotas(cands, n_play, admission, n_idle=state.n_free, host=host, keep=fill,
                                    n_cluster=spec.n_gpus)
        rep.waiting = [p.req.id for p in order if p.req.id not in rep.quotas]
        if any(rep.quotas.get(jid) == 0 for jid in held):  # srpt-suspend: 0 GPUs until it resumes
            _suspend_all(conn, rep, held, rem, {r.id: r.k for r in running})
            state = store.load_state(conn, spec)
        ctx = _Round(dispatcher.model, blind, demand, epochs or {}, {c.id: c for c in cands if c.running}, fracs,
                     PRICERS[pricing], admission, lambda k: idle_best_gbps(dispatcher, k),
                     etas, scaling == "declared", _placer(dispatcher, algorithm) if _relocating(relocate, blind) else None,
                     {r.id: r.k for r in running}, current_share, rem=rem)
        _resize_all(conn, rep, state, held, ctx)
        state = store.load_state(conn, spec)
        _admit(conn, rep, state, reqs, dispatcher, algorithm, ctx)
        if fill and not blind and not rep.waiting:  # shortest remaining work (then highest utility) first
            key = {c.id: (rem.get(c.id, math.inf), -c.utility, c.id) for c in cands}
            _fill_idle(conn, rep, store.load_state(conn, spec), held, ctx, sorted(held, key=key.__getitem__))
    return rep


def _elastic_sizes(running, admission: str) -> dict[str, int]:
    """``srpt-marginal`` counts every running elastic job behind a claim, at a boundary or not: id -> GPUs held."""
    if not ADMISSIONS[admission].marginal:
        return {}
    return {r.id: len(json.loads(r.gpus)) for r in running if (r.min_k or r.k) < (r.max_k or r.k)}


def _check_names(pricing: str, admission: str, scaling: str) -> None:
    if pricing not in PRICERS:
        raise RequestError(f"unknown growth pricing {pricing!r}: use one of {', '.join(PRICERS)}")
    if admission not in ADMISSIONS:
        raise RequestError(f"unknown elastic admission {admission!r}: use one of {', '.join(ADMISSIONS)}")
    if scaling not in SCALING_MODES:
        raise RequestError(f"unknown scaling pricing {scaling!r}: use one of {', '.join(SCALING_MODES)}")


def _suspend_all(conn, rep: RebalanceReport, held: dict[str, np.ndarray], rem: dict[str, float],
                 k_req: dict[str, int]) -> None:
    """The running jobs whose quota is 0 go back to pending (their GPUs freed in this transaction),
    their estimate the remaining run time at their requested ``k``."""
    ts = now()
    for jid in [j for j in held if rep.quotas.get(j) == 0]:
        suspend_job(conn, jid, rem.get(jid, math.inf) / k_req[jid], ts)
        del held[jid], rep.quotas[jid]
        rep.suspended.append(jid)


@dataclass
class _Round:
    model: Any
    blind: bool
    demand: str
    epochs: dict[str, int]
    running: dict[str, Candidate]
    fracs: dict[str, float | None]
    pricer: Any
    admission: str
    best_gbps: Callable[[int], float] | None = None  # best idle-cluster bandwidth of a size (growth bounds)
    etas: dict[str, float | None] = field(default_factory=dict)  # each job's declared scaling (None: not declared)
    declared: bool = True  # price compute by the declared scaling; False: every job as perfect (before)
    place: Callable[[State, int], np.ndarray | None] | None = None  # relocate: a fresh k-GPU placement
    k_req: dict[str, int] = field(default_factory=dict)  # running jobs' requested k (their declared share's size)
    share_now: bool | None = None  # price a growth from the collective share at the current size (None: CURRENT_SHARE)
    priced: set[str] = field(default_factory=set)  # jobs whose growth was priced this round (fill_idle skips them)
    rem: dict[str, float] = field(default_factory=dict)  # estimated remaining work (srpt rules; srpt-fill's order)

    def f_now(self, jid: str, cur: int, b0: float) -> float:
        """The job's collective share at its current size (:func:`current_share`) or, without
        ``share_now`` or a known requested size, its declared one."""
        k0 = self.k_req.get(jid)
        if not (CURRENT_SHARE if self.share_now is None else self.share_now) or k0 is None or self.best_gbps is None:
            return self.f(jid)
        return current_share(self.f(jid), k0, self.best(max(k0, 2)), cur, b0, self.eta(jid))

    def f(self, jid: str) -> float:
        f = self.fracs.get(jid)
        return DEFAULT_COMM if f is None else float(f)

    def eta(self, jid: str) -> float:
        e = self.etas.get(jid) if self.declared else None
        return 1.0 if e is None else float(e)

    def best(self, k: int) -> float:
        return self.best_gbps(k) if self.best_gbps is not None else float("inf")

    def context(self, others: State, jid: str, mask: np.ndarray | None, f: float | None = None) -> Context:
        return Context(self.model, others, jid, self.f(jid) if f is None else f, self.fracs, self.demand, mask,
                       self.eta(jid))


def _predict(model: Any, state: State, mask: np.ndarray) -> float:
    return float(ContentionPredictor(model, state).predict(mask[None, :]).value[0])


def _growth_sizes(c: Candidate, cur: int, target: int, local: int) -> list[int]:
    """The sizes a growth from ``cur`` toward ``target`` is priced at: the target, halvings of the
    increment, one step, and the size that fills the free GPUs of the job's own hosts (growth that
    stays off the NICs); at most a handful, so pricing stays cheap on large clusters."""
    out = {target, snap_size(c, cur + c.step), snap_size(c, min(target, cur + local))}
    d = target - cur
    while d > c.step:
        d //= 2
        out.add(snap_size(c, cur + d))
    return sorted((k for k in out if cur < k <= target), reverse=True)


def _grow_priced(rnd: _Round, others: State, jid: str, mask: np.ndarray, cur: int, target: int) -> tuple[np.ndarray, float | None, int]:
    """The growth up to ``target`` the pricer takes (``B(S ∪ new)`` under contention, and for
    ``welfare`` what it imposes on co-tenants); ``(mask, None, cur)`` if none."""
    c = rnd.running[jid]
    rnd.priced.add(jid)
    b0 = _predict(rnd.model, others, mask) if cur > 1 else 0.0
    f = rnd.f_now(jid, cur, b0)
    own = mask != 0
    local = int(popcount(np.where(own, others.free & ~mask, 0)).sum())
    grown: list[Grown] = []
    for k in _growth_sizes(c, cur, target, local):
        # the most the job itself could gain at k (its size's best idle bandwidth): what imposes on
        # co-tenants only adds to the price, so a size that cannot pass this is not searched
        if cur > 1 and grow_ratio(f, cur, b0, k, rnd.best(k), rnd.eta(jid)) >= 1.0 - GROW_GAIN:
            continue
        rows, value = grow_rows(rnd.model, others, mask, k - cur)
        n_hosts = (rows != 0).sum(axis=1)
        order = np.lexsort((np.arange(len(rows)), n_hosts, -np.round(value, 6)))  # best own bandwidth first
        # the best for the job and the one on fewest hosts (the candidate that imposes least)
        for i in dict.fromkeys([int(order[0]), int(np.lexsort((np.arange(len(rows)), -value, n_hosts))[0])]):
            grown.append((k, rows[i].copy(), float(value[i])))
    if rnd.place is not None:
        room = int(popcount(others.free).max()) if others.free.size else 0
        sizes = set(_growth_sizes(c, cur, target, 0)) | ({snap_size(c, min(target, room))} if cur < room else set())
        grown += _relocations(rnd, others, jid, cur, b0, sorted(x for x in sizes if cur < x <= target), f)
    pick = rnd.pricer.growth(rnd.context(others, jid, mask, f), cur, b0, grown)
    if pick is None:
        return mask, None, cur
    return pick[1], pick[2], pick[0]


def _placer(dispatcher: Any, algorithm: str) -> Callable[[State, int], np.ndarray | None]:
    def place(state: State, k: int) -> np.ndarray | None:
        try:
            return state.spec.to_mask(list(dispatcher.select(k, state, algorithm).gpus))
        except PlacementError:  # no placement of k: no relocation candidate
            return None
    return place


def _relocations(rnd: _Round, others: State, jid: str, cur: int, b0: float, sizes: list[int], f: float) -> list[Grown]:
    """``relocate``: a resize is a checkpoint-restart (``resize_s``), so the grown generation need
    not keep the old GPUs. The entropy-guided scheduling paper realises each epoch's quotas on concrete nodes afresh; a job
    that may only grow around its old set stays where it started - at the tail a job at 4 GPUs on
    a shared host cannot take an idle host (growth across the NICs is slower and refused). The
    candidates: a fresh placement (the job's own GPUs counted free) at the growth sizes and at the
    roomiest host's free GPUs (a job on several hosts whose quota is unchanged: its own size,
    :func:`_move_priced`); the pricer takes one of them or none."""
    out: list[Grown] = []
    for k in sizes:
        if cur > 1 and grow_ratio(f, cur, b0, k, rnd.best(k), rnd.eta(jid)) >= 1.0 - GROW_GAIN:
            continue
        m = rnd.place(others, k)
        if m is not None:
            out.append((k, m, _predict(rnd.model, others, m) if k > 1 else 0.0))
    return out


def _move_priced(rnd: _Round, others: State, jid: str, mask: np.ndarray, cur: int) -> tuple[np.ndarray, float | None]:
    """``relocate``, a job whose quota is unchanged but which spans several hosts: the fresh
    placement of its size if the pricer takes it (a move onto one host frees its NICs)."""
    if cur < 2 or int((mask != 0).sum()) < 2:
        return mask, None
    b0 = _predict(rnd.model, others, mask)
    f = rnd.f_now(jid, cur, b0)
    pick = rnd.pricer.growth(rnd.context(others, jid, mask, f), cur, b0, _relocations(rnd, others, jid, cur, b0, [cur], f))
    return (mask, None) if pick is None else (pick[1], pick[2])


def _resize_all(conn, rep, state, held, rnd: _Round) -> None:
    ts = now()
    jobs = {j.id: j for j in state.jobs}
    # shrinks first: the GPUs they give up are what grows and admissions take
    order = sorted(held, key=lambda jid: (rep.quotas[jid] - len(jobs[jid].gpus), jid))
    for jid in order:
        cur = len(jobs[jid].gpus)
        target = rep.quotas[jid]
        if target == cur and rnd.place is None:
            continue
        others = state.without_job(jid)
        if target == cur:
            mask, value = _move_priced(rnd, others, jid, held[jid], cur)
            if value is None or np.array_equal(mask, held[jid]):
                continue
        elif target < cur:
            mask, value = shrink_gpus(rnd.model, others, held[jid], cur - target, blind=rnd.blind)
        elif rnd.blind:
            mask, value = grow_gpus(rnd.model, others, held[jid], target - cur, blind=True)
        else:
            mask, value, target = _grow_priced(rnd, others, jid, held[jid], cur, target)
            rep.quotas[jid] = target
            if target == cur:
                continue
        state = _write_resize(conn, rep, others, jid, mask, value, target, rnd, ts)


def _write_resize(conn, rep, others: State, jid: str, mask: np.ndarray, value: float | None, k: int, rnd: _Round,
                  ts: float) -> State:
    """One resize as a new generation (audited); returns the state with the job on its new GPUs."""
    gpus = others.spec.from_mask(mask)
    solo = float(rnd.model.predict_masks(mask[None, :])[0]) if k > 1 else 0.0
    pressed = solo * pressure_factor(rnd.fracs.get(jid), rnd.demand)
    rep.resized.append(apply_resize(conn, Resize(jid, tuple(gpus), rnd.epochs.get(jid), value, pressed), ts, "scheduler"))
    return others.with_job(jid, gpus, pressed)


def _fill_idle(conn, rep, state: State, held: dict[str, np.ndarray], rnd: _Round, order: list[str]) -> None:
    """``fill_idle``: the GPUs still free after the quotas' resizes and the admissions, when no
    request waits (nobody pending can use them this round), are offered to the jobs at this boundary
    in ``order`` (shortest remaining work first), each up to ``max_k``, priced as any growth. Why
    (the srpt-suspend tail): with two J1 jobs left on 32 GPUs the leftovers' rule
    gives the shorter one 24, the pricer takes 16 (24 over three hosts is slower) and 8 GPUs idled
    for ~1 h beside the other J1 at 8 on one host, whose growth was never priced. Jobs resized or
    priced for growth this round are skipped (the same candidates were just priced)."""
    done = {r["job"] for r in rep.resized} | rnd.priced
    ts = now()
    for jid in order:
        if state.n_free == 0:
            break
        if jid in done or jid not in held or jid not in rnd.running:
            continue
        mask = next(j.mask for j in state.jobs if j.id == jid)
        cur = int(popcount(mask).sum())
        target = snap_size(rnd.running[jid], min(rnd.running[jid].hi, cur + state.n_free))
        if target <= cur:
            continue
        others = state.without_job(jid)
        grown, value, k = _grow_priced(rnd, others, jid, mask, cur, target)
        if k > cur:
            rep.quotas[jid] = k
            state = _write_resize(conn, rep, others, jid, grown, value, k, rnd, ts)


def _admit(conn, rep, state, reqs, dispatcher, algorithm, rnd: _Round) -> None:
    """Admissions at their quotas; then, if the admission rule fills leftovers, waiting requests in
    queue order on what is still free (growths the model refused leave GPUs the quotas counted on),
    each at the largest size of its range up to its requested k that fits."""
    ts = now()
    version = model_version_of(dispatcher)
    uri = getattr(dispatcher, "model_uri", None) or getattr(getattr(dispatcher, "model", None), "uri", None)
    plan = [(rid, q) for rid, q in rep.quotas.items() if rid in reqs]
    waiting = []
    place = lambda st, req, q: _admit_one(conn, rep, st, req, q, dispatcher, algorithm, rnd, ts, uri, version)  # noqa: E731
    for rid, q in plan:
        state, ok = place(state, reqs[rid], q)
        if not ok:
            waiting.append(rid)
    leftovers = [r for r in reqs if r not in rep.quotas] if ADMISSIONS[rnd.admission].fill_leftovers else []
    waiting += [r for r in reqs if r not in rep.quotas and r not in leftovers]
    if ADMISSIONS[rnd.admission].fill_fragments and not rnd.blind:  # srpt-fill: what the round left free
        state, waiting = fill_fragments(state, waiting, reqs, rnd.rem, int(state.spec.gpus_per_host.max()), place)
    for rid in leftovers:
        req = reqs[rid]
        fit = [k for k in req.sizes() if k <= min(req.k, state.n_free)]
        if not fit:
            waiting.append(rid)
            continue
        state, ok = place(state, req, fit[-1])
        if not ok:
            waiting.append(rid)
    rep.waiting = waiting


def _size_options(req: Request, q: int, one_host: int = 0) -> list[int]:
    """``q`` and a few smaller sizes of the range (a halving, ``min_k``, and the largest that fits
    the roomiest host's ``one_host`` free GPUs): a smaller gang on one host may beat a larger one
    spread over fragments."""
    sizes = [k for k in req.sizes() if k <= q]
    out: list[int] = []
    for x in (q, q // 2):  # one halving: every halving costs a dispatcher search (128 hosts at scale)
        k = max((s for s in sizes if s <= x), default=None)
        if k is not None and k not in out:
            out.append(k)
    local = [s for s in sizes if s <= one_host]
    for k in ([req.lo] if req.lo in sizes else []) + local[-1:]:
        if k not in out:
            out.append(k)
    return out


def _admit_one(conn, rep, state, req, q, dispatcher, algorithm, rnd: _Round, ts, uri, version) -> tuple[State, bool]:
    """Place ``req`` at the size of :func:`_size_options` the pricer picks: its predicted epoch time
    (:func:`grow_ratio` against its declared ``k`` on the best idle placement; for ``welfare`` plus
    what the placement imposes on co-tenants)."""
    f = DEFAULT_COMM if req.comm_fraction is None else req.comm_fraction
    rnd.etas[req.id] = req.scaling
    eta = rnd.eta(req.id)
    ref = req.k if req.k > 1 else 2
    b_ref = idle_best_gbps(dispatcher, ref)
    scale = req.k / ref if req.k == 1 else 1

    def own_cost(k: int, b: float) -> float:
        return grow_ratio(f, ref, b_ref, k, b, eta) * scale

    one_host = int(popcount(state.free).max()) if state.free.size else 0
    options, sels = [], []
    # a quota that fits the roomiest host: under perfect scaling smaller sizes only add compute
    # time, and a one-host set presses no NIC, so only q is placed (on a mostly idle 1,024-GPU
    # cluster most admissions); a job declaring worse scaling may gain less from the extra GPUs
    # than its ring collective loses, so its smaller sizes are priced too
    for k in ([q] if q <= one_host and eta >= 1.0 else _size_options(req, q, one_host)):
        try:
            sel = dispatcher.select(k, state, algorithm, constraints=req.constraints.to_dict() or None)
        except Exception as exc:  # noqa: BLE001 - a placement failure: try the next size / next round
            if type(exc).__name__ != "PlacementError":
                raise
            continue
        options.append((k, state.spec.to_mask(list(sel.gpus)), float(sel.predicted_gbps or 0.0)))
        sels.append(sel)
    pick = rnd.pricer.admission(Context(rnd.model, state, req.id, f, {**rnd.fracs, req.id: req.comm_fraction},
                                        rnd.demand, None, eta), own_cost, options)
    if pick is None:
        return state, False
    q, sel = options[pick][0], sels[pick]
    resumed = ADMISSIONS[rnd.admission].suspend and was_suspended(conn, req.id)
    # the job starts at q (its range allows it): the assignment and job rows say q, the request keeps k
    if write_assignment(conn, replace(req, k=q), sel, None, ts, uri, version, algorithm, rnd.demand) != "assigned":
        return state, False
    if resumed:
        record_resume(conn, req.id, list(sel.gpus), ts)
    pressed = float(getattr(sel, "standalone_gbps", None) or 0.0) * pressure_factor(req.comm_fraction, rnd.demand)
    rep.admitted[req.id] = list(sel.gpus)
    rep.quotas[req.id] = q
    rnd.fracs[req.id] = req.comm_fraction
    return state.with_job(req.id, list(sel.gpus), pressed), True
