"""How does a batch assign the pending requests? :func:`run_batch` orders them by policy, places
each with the dispatcher and writes the assignment with guarded compare-and-set statements.

Safety rests on three layers, so no single one has to be perfect:

1. *The schema.* A GPU row holds at most one ``job_id`` and a CHECK ties ``busy`` to it, so a GPU
   cannot be in two jobs; ``bp_assignments`` is keyed by request id, so a request cannot be
   assigned twice.
2. *Compare-and-set writes.* Assigning flips the request ``pending -> assigned`` and the GPUs
   ``free -> busy`` with guarded ``UPDATE ... WHERE status/state = ...`` and checks the row counts;
   a mismatch rolls back that request's savepoint.
3. *Locks.* A write transaction is ``BEGIN IMMEDIATE`` on SQLite (the pysqlite event-hook recipe,
   so two batch runs serialise) and takes ``SELECT ... FOR UPDATE`` row locks on the GPU rows on
   PostgreSQL, always in id order so writers cannot deadlock.

A batch is one transaction by default (``commit="batch"``): a crash (even ``kill -9``) leaves every
request untouched; ``commit="request"`` commits each request on its own, so a crash leaves each
request either untouched or fully assigned and a long batch never blocks other writers for long.
"""

from __future__ import annotations

import operator
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import sqlalchemy as sa

from bandpilot.dispatch.demand import DEFAULT_DEMAND, check_demand_model, pressure_factor
from bandpilot.dispatch.state import State
from bandpilot.errors import ModelError, RequestError
from bandpilot.queue.clock import now
from bandpilot.scheduling.assign_write import AssignConflict, num, write_assignment
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.deferral_notes import flush_outcomes
from bandpilot.scheduling.outcomes import BatchReport, Outcome
from bandpilot.scheduling.placer import Deferred, Placer
from bandpilot.scheduling.postfilter import ReservationPostFilter
from bandpilot.scheduling.preemption import EvictionConflict, PreemptPlan, PreemptPostFilter, evict
from bandpilot.scheduling.reservations import Book, write_reservations
from bandpilot.scheduling.profile import ProfileError, SchedulerProfile, get_profile
from bandpilot.scheduling.startwait import StartOrWait
from bandpilot.scheduling.policies import (
    Pending, order_pending, queue_sort, utility_quotas,
)
from bandpilot.scheduling.pending import load_pending  # also imported from here (elastic, tests)
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_BATCH
from bandpilot.queue.store import Store
from bandpilot.queue.views import sample_fragmentation

COMMIT_MODES = ("batch", "request")
_SEQ = operator.attrgetter("seq")



def model_version_of(dispatcher: Any) -> str | None:
    """Best-effort model version label of a dispatcher (registry version, else URI, else class)."""
    for obj in (dispatcher, getattr(dispatcher, "model", None)):
        if obj is None:
            continue
        for attr in ("model_version", "version"):
            v = getattr(obj, attr, None)
            if v is not None and not callable(v):
                return str(v)
    for attr in ("model_uri", "uri"):
        v = getattr(dispatcher, attr, None)
        if isinstance(v, str):
            return v
    model = getattr(dispatcher, "model", None)
    return type(model).__name__ if model is not None else None


def check_model(store: Store, dispatcher: Any) -> None:
    """The model must describe the store's cluster (same hosts, GPU types, topologies)."""
    spec = store.spec
    mspec = getattr(getattr(dispatcher, "model", None), "spec", None)
    if mspec is None:
        raise ModelError("the dispatcher's model has no cluster spec")
    if mspec.fingerprint() != spec.fingerprint():
        raise ModelError(
            f"the model was built for cluster {mspec.name!r} ({mspec.n_gpus} GPUs, fingerprint {mspec.fingerprint()}), "
            f"but the store holds {spec.name!r} ({spec.n_gpus} GPUs, fingerprint {spec.fingerprint()})"
        )



@dataclass
class _Plan:
    queue: list["Pending"]
    quotas: dict[str, int] | None
    notes: dict[str, tuple[str | None, str | None]]  # stored (reason, detail) per pending id
    max_seq: int
    whole: bool  # every pending request (as of the snapshot) is in the queue


def run_batch(
    store: Store,
    dispatcher: Any,
    profile: SchedulerProfile | str,
    limit: int | None = None,
    *,
    commit: str = "batch",
    model_uri: str | None = None,
    demand: str = DEFAULT_DEMAND,
    after_each: Callable[[Outcome], None] | None = None,
) -> BatchReport:
    """Assign pending requests with ``dispatcher`` as ``profile`` says (a :class:`SchedulerProfile`
    or the name of one, :mod:`bandpilot.scheduling.profile`: the order, the placement, backfill,
    preemption and start-or-wait).

    Each request is tried once (twice for a utility request held back by its tenant's quota): an
    assigned one becomes an active job whose demand is its predicted standalone bandwidth, so later
    requests see its contention; one that cannot be placed now is deferred with the reason and
    retried next batch; an invalid one is rejected. ``limit`` caps the requests considered.
    ``commit="batch"`` is one transaction; ``"request"`` one per request (state re-read each time).
    ``demand`` is the demand model (:mod:`bandpilot.dispatch.demand`) a new job's pressure is stored under.
    ``after_each(outcome)`` runs after each request, inside the transaction (a progress hook; the
    crash tests use it to ``kill -9`` a batch mid-way).
    """
    try:
        profile = get_profile(profile)
    except ProfileError as exc:
        raise RequestError(str(exc)) from None
    if commit not in COMMIT_MODES:
        raise RequestError(f"unknown commit mode {commit!r}: use one of {', '.join(COMMIT_MODES)}")
    if limit is not None and limit < 1:
        raise RequestError(f"limit must be >= 1, got {limit}")
    try:
        check_demand_model(demand)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    if hasattr(dispatcher, "with_locality"):
        dispatcher = dispatcher.with_locality(float(profile.locality))
    store.refresh()
    check_model(store, dispatcher)
    b = _Batch(store, dispatcher, profile, limit, commit, model_uri, demand)
    b.after_each = after_each
    (b.in_one_transaction if commit == "batch" else b.per_request)()
    return b.report


class _Batch:
    """One batch run: the placer, the report and the profile, and the steps of the loop."""

    def __init__(self, store: Store, dispatcher: Any, profile: SchedulerProfile, limit: int | None, commit: str,
                 model_uri: str | None, demand: str) -> None:
        self.store, self.dispatcher, self.profile, self.limit = store, dispatcher, profile, limit
        self.policy, self.backfill = profile.queue_sort, profile.backfill
        self.algorithm, self.demand = profile.algorithm_for(store.spec), demand
        self.version = model_version_of(dispatcher)
        self.uri = (model_uri or getattr(dispatcher, "model_uri", None)
                    or getattr(getattr(dispatcher, "model", None), "uri", None))
        self.mspec = dispatcher.model.spec  # same fingerprint as the store's; states built on it skip re-hashing
        self.placer = Placer(self.mspec, dispatcher, self.algorithm)
        self.report = BatchReport(None, self.policy, commit, self.uri, self.version, now(), backfill=self.backfill)
        self.book: Book | None = None
        self.preemptor: PreemptPostFilter | None = None
        self.starter: StartOrWait | None = None
        self.after_each: Callable[[Outcome], None] | None = None
        self._estimates: Estimates | None = None

    def estimates(self, conn: sa.Connection) -> Estimates:
        """The run-time estimates of this batch, loaded once for the order, the book and preemption."""
        if self._estimates is None:
            self._estimates = Estimates.load_live(conn)
        return self._estimates

    # ---- the two commit modes ----------------------------------------------------------------
    def in_one_transaction(self) -> None:
        store, report = self.store, self.report
        with store.write() as conn:
            store.lock_gpus(conn)
            state = store.load_state(conn, self.mspec)
            self.placer.set_state(state)
            pl = self.plan(load_pending(conn), state, conn)
            report.batch_id = batch_id = self.new_batch(conn)
            self.load_book(conn, state)

            @contextmanager
            def same_conn() -> Iterator[sa.Connection]:
                yield conn

            to_flush = self.run(same_conn, pl, batch_id)
            self.finish(conn, to_flush, pl)

    def per_request(self) -> None:
        store, report = self.store, self.report
        with store.write() as conn:
            report.batch_id = batch_id = self.new_batch(conn)
        with store.read() as conn:
            state = store.load_state(conn, self.mspec)
            pl = self.plan(load_pending(conn), state, conn)
            self.load_book(conn, state)

        @contextmanager
        def fresh_conn() -> Iterator[sa.Connection]:
            with store.write() as conn:
                store.lock_gpus(conn)
                self.placer.set_state(store.load_state(conn, self.mspec))
                yield conn

        self.placer.set_state(state)
        to_flush = self.run(fresh_conn, pl, batch_id)
        report.finished_at = now()
        with store.write() as conn:  # deferral notes are informational: one write at the end
            self.finish(conn, to_flush, pl)

    # ---- the steps -----------------------------------------------------------------------------
    def new_batch(self, conn: sa.Connection) -> int:
        return int(conn.execute(
            sa.insert(T_BATCH)
            .values(policy=self.policy, commit_mode=self.report.commit, model_uri=self.uri, model_version=self.version,
                    pid=os.getpid(), started_at=self.report.started_at)
            .returning(T_BATCH.c.id)
        ).scalar_one())

    def load_book(self, conn: sa.Connection, state: State) -> None:
        """The PostFilter and Permit plug-ins of the profile, loaded from the store."""
        if self.backfill != "greedy":
            self.book = Book.load(conn, self.backfill, state, Placer(self.mspec, self.dispatcher, self.algorithm), now(),
                                  self.profile.reservations, estimates=self.estimates(conn))
            if self.profile.start_or_wait:
                self.starter = StartOrWait.load(conn, self.book)
        if self.profile.preempt:
            self.preemptor = PreemptPostFilter.load(conn, state, Placer(self.mspec, self.dispatcher, self.algorithm),
                                                    now(), estimates=self.estimates(conn))
        # in the profile's order: a preemption plan that starts the gang now beats a reservation for later
        for plugin in (self.preemptor, ReservationPostFilter(self.book) if self.book is not None else None):
            if plugin is not None:
                self.placer.add_post_filter(plugin)

    def plan(self, loaded: tuple[list[Pending], dict], state: State, conn: sa.Connection) -> _Plan:
        pending, notes = loaded
        self.report.pending_before = len(pending)
        expected = None
        sort = queue_sort(self.policy)
        if sort.estimates:
            est = self.estimates(conn)
            expected = {p.req.id: e for p in pending if (e := est.of(p.req)) is not None}
        queue = order_pending(pending, self.policy, expected, now())
        whole = self.limit is None or self.limit >= len(queue)
        if not whole:
            queue = queue[: self.limit]
        quotas = utility_quotas(queue, state.n_free) if sort.quotas else None
        self.report.quotas = quotas
        return _Plan(queue, quotas, notes, max(map(_SEQ, pending), default=0), whole)

    def run(self, conn_for: Callable[[], Any], pl: _Plan, batch_id: int) -> list[Any]:
        """Every request of the plan in order; over-quota ones after the rest. Returns what to note:
        outcomes, and the Request of each quick deferral."""
        used: dict[str, int] = {}
        held: list[Pending] = []
        to_flush: list[Any] = []
        report, placer = self.report, self.placer
        # A request that cannot fit what is free (most of a long queue) is deferred in bulk, inline:
        # what one() would record, without building an Outcome (BatchReport.add_quick). GPUs only
        # leave the pool within the batch, so n_free is re-read only after a request was tried.
        bulk = self.book is None and self.after_each is None and placer.state is not None
        valid, n_free = placer.valid_keys, placer.n_free
        report.stamp(now())
        for p in pl.queue:
            req = p.req
            if pl.quotas is not None and used.get(req.tenant, 0) + req.k > pl.quotas.get(req.tenant, 0):
                held.append(p)  # over its tenant's quota: only gets GPUs nobody within quota took
                continue
            if bulk and n_free < req.k and (req.k, req.constraints.key) in valid:
                to_flush.append(req)
                report.add_quick(req)
                continue
            self.one(conn_for, p, batch_id, False, used, to_flush)
            n_free = placer.n_free
            report.stamp(now())
        for p in held:
            self.one(conn_for, p, batch_id, True, used, to_flush)
        return to_flush

    def one(self, conn_for: Callable[[], Any], p: Pending, batch_id: int, second_pass: bool,
            used: dict[str, int], to_flush: list[Outcome]) -> None:
        o = self.placer.quick_deferral(p.req, self.version) if self.book is None else None
        if o is None:
            with conn_for() as conn:
                o = self.attempt(conn, p, batch_id)
        if o.status in ("deferred", "rejected"):
            if second_pass and o.status == "deferred":
                o.detail = f"{o.detail}; held back by its tenant's utility quota"
            to_flush.append(o)
        elif o.status == "assigned":
            used[p.req.tenant] = used.get(p.req.tenant, 0) + p.req.k
        self.report.add(o)
        if self.after_each is not None:
            self.after_each(o)

    def attempt(self, conn: sa.Connection, p: Pending, batch_id: int) -> Outcome:
        req, placer = p.req, self.placer
        ts = now()
        out = Outcome(req.id, req.tenant, req.k, "deferred", model_version=self.version, at=ts)
        hidden = self.book.hidden_for(req) if self.book is not None else None
        try:
            sel = placer.place(req, hidden)
        except Deferred as d:  # nothing fits: the PostFilter plug-ins say what to record
            plan = placer.post_filter(req, d, hidden)
            if isinstance(plan, PreemptPlan) and plan.victims:
                return self.preempt_for(conn, p, plan, batch_id, out)
            out.status, out.reason, out.detail = d.status, plan.reason, plan.detail
            return out
        if self.starter is not None:
            wait = self.starter.consider(req, sel)
            if wait is not None:  # a nearby end gives a placement that saves more than the wait costs
                out.reason, out.detail = wait.reason, wait.detail
                return out
        try:
            res = write_assignment(conn, req, sel, batch_id, ts, self.uri, self.version, self.algorithm, self.demand)
        except AssignConflict as exc:
            out.reason, out.detail = "conflict", f"GPUs changed under the batch: {exc}"
            placer.set_state(self.store.load_state(conn, self.mspec))
            return out
        if res == "skipped":
            out.status, out.detail = "skipped", "no longer pending (taken or cancelled by another process)"
            return out
        return self.started(req, sel, out)

    def preempt_for(self, conn: sa.Connection, p: Pending, plan: PreemptPlan, batch_id: int, out: Outcome) -> Outcome:
        """Carry a preemption plan out in one savepoint: evict, then assign the gang on the planned GPUs."""
        req, ts = p.req, now()
        try:
            with conn.begin_nested():
                evict(conn, plan, req, ts)
                res = write_assignment(conn, req, plan.selection, batch_id, ts, self.uri, self.version,
                                        self.algorithm, self.demand)
                if res != "assigned":
                    raise EvictionConflict(f"request {req.id!r} is no longer pending")
        except (EvictionConflict, AssignConflict) as exc:
            out.reason, out.detail = "conflict", f"preemption abandoned: {exc}"
            self.placer.set_state(self.store.load_state(conn, self.mspec))
            return out
        st = self.placer.state
        assert st is not None
        for v in plan.victims:
            st = st.without_job(v)
        self.placer.set_state(st)
        for f in self.placer.post_filters:  # the book frees the victims' GPUs; the planner counts its plan
            f.evicted(plan.victims, planned=f.name == plan.plugin)
        self.report.preempted.append({"request_id": req.id, "victims": list(plan.victims), "detail": plan.detail,
                                      "lost_gpu_h": plan.cost_gpu_h, "at": ts})
        out = self.started(req, plan.selection, out)
        out.detail = plan.detail
        return out

    def started(self, req: Request, sel: Any, out: Outcome) -> Outcome:
        placer = self.placer
        gpus = list(sel.gpus)
        pressed = float(getattr(sel, "standalone_gbps", None) or 0.0) * pressure_factor(req.comm_fraction, self.demand)
        placer.commit_to_state(req, gpus, pressed)
        if self.book is not None:
            self.book.started(req, gpus, pressed)
        out.status, out.gpus = "assigned", gpus
        out.predicted_gbps = num(sel.predicted_gbps)
        out.standalone_gbps = num(getattr(sel, "standalone_gbps", None))
        out.algorithm = str(getattr(sel, "algorithm", None) or self.algorithm)
        out.search_ms = num(getattr(sel, "search_ms", None))
        return out

    def finish(self, conn: sa.Connection, to_flush: list[Any], pl: _Plan) -> None:
        """Reservations, deferral notes, the batch row and a fragmentation sample, in that order."""
        report = self.report
        assert report.batch_id is not None
        _write_book(conn, self.book, report.batch_id, self.backfill, report)
        if self.starter is not None:  # how long each request has been held, for the next batch
            self.starter.save(conn, (o.request_id for o in report.assigned))
        flush_outcomes(conn, to_flush, report.batch_id, pl.notes, pl.whole, pl.max_seq)
        if report.commit == "batch":  # one transaction: finished once the notes are written
            report.finished_at = now()
        _finish_batch(conn, report.batch_id, report)
        sample_fragmentation(conn, self.store.spec, report.finished_at)  # fragmentation over time


def _write_book(conn: sa.Connection, book: Book | None, batch_id: int, backfill: str, report: BatchReport) -> None:
    """This batch's reservations replace the stored ones (none under greedy: stale ones go)."""
    res = book.reservations if book is not None else []
    write_reservations(conn, res, batch_id, backfill, now())
    report.reservations = [r.to_dict() for r in res]


def _finish_batch(conn: sa.Connection, batch_id: int, report: BatchReport) -> None:
    c = report.counts()
    conn.execute(
        sa.update(T_BATCH)
        .where(T_BATCH.c.id == batch_id)
        .values(
            finished_at=report.finished_at, n_considered=report.n_outcomes, n_assigned=c["assigned"],
            n_deferred=c["deferred"], n_rejected=c["rejected"],
        )
    )
