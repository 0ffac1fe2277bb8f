"""Where would one request go right now? The placer filters the free GPUs with the request's
:class:`~bandpilot.dispatch.constraints.Constraints`, asks the dispatcher on an in-memory state and
checks what comes back with the same constraints; it never writes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from bandpilot.dispatch.state import State
from bandpilot.errors import BandPilotError, ModelError, PlacementError, RequestError
from bandpilot.queue.clock import now
from bandpilot.scheduling.outcomes import Outcome, short_detail
from bandpilot.scheduling.postfilter import Plan, PostFilter, RecordReason, Unschedulable, run_post_filters
from bandpilot.queue.requests import Request, validate_request
from bandpilot.dispatch.constraints import Constraints
from bandpilot.topology.cluster import ClusterSpec
from bandpilot.topology.domains import domain_index


#: Why a request cannot be placed on the current free GPUs, as stored in the request's detail.
_SHORT = {
    "allowed": "needs {k} GPUs among the allowed ones, fewer of them are free",
    "single_host": "needs {k} GPUs on one host, no allowed host has that many free",
    "single_domain": "needs {k} GPUs in one domain, no domain has that many free",
}


def merit(sel: Any) -> float:
    """Higher is better: a shaped selection by its predicted step time (what the job runs at; a
    placement with more GB/s on an axis that moves few bytes is not faster), any other by its
    predicted GB/s."""
    placement = getattr(sel, "placement", None)
    if placement and placement.get("step_ms") is not None:
        return -float(placement["step_ms"])
    return float(getattr(sel, "predicted_gbps", None) or 0.0)


class Deferred(Exception):
    def __init__(self, status: str, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


class Placer:
    """Tries one request against an in-memory state with the dispatcher; never writes."""

    def __init__(self, spec: ClusterSpec, dispatcher: Any, algorithm: str) -> None:
        self.spec = spec
        self.dispatcher = dispatcher
        self.algorithm = algorithm
        self.state: State | None = None
        self._n_free = 0
        self.dom_ids, self.dom_names = domain_index(spec.hosts)
        self._allowed: dict[str, np.ndarray | None] = {}
        self._fail: dict[tuple[int, str], tuple[str, str]] = {}
        self._never: dict[tuple[int, str], str | None] = {}
        self._valid: set[tuple[int, str]] = set()
        self.post_filters: list[PostFilter] = [RecordReason()]  # "nothing fits" plug-ins, default last

    def add_post_filter(self, plugin: PostFilter) -> None:
        """Register a "nothing fits" plug-in (:mod:`bandpilot.scheduling.postfilter`); plug-ins are asked
        in the order added, all before the default :class:`RecordReason`."""
        self.post_filters.insert(len(self.post_filters) - 1, plugin)

    def post_filter(self, req: Request, d: Deferred, hidden: np.ndarray | None = None) -> Plan:
        """The PostFilter step: what to record (or do) for a request that did not fit."""
        assert self.state is not None
        return run_post_filters(self.post_filters, Unschedulable(req, self.state, d.status, d.reason, d.detail, hidden))

    def set_state(self, state: State) -> None:
        if self.state is not None and np.any(state.free & ~self.state.free):
            self._fail.clear()  # GPUs came back (another process released): earlier failures are stale
        self.state = state
        self._n_free = state.n_free

    def reset_failures(self) -> None:
        """Forget cached failures (a planner moves the same placer between hypothetical states)."""
        self._fail.clear()

    def allowed_mask(self, c: Constraints) -> np.ndarray | None:
        key = c.key
        if key not in self._allowed:
            self._allowed[key] = c.allowed_mask(self.spec)
        return self._allowed[key]

    def quick_deferral(self, req: Request, version: str | None) -> "Outcome | None":
        """Per-request commits: a request that cannot fit even the last state seen (GPUs only
        leave the pool within our run) is deferred without opening a transaction."""
        k = req.k
        if self._n_free < k and self.state is not None and (k, req.constraints.key) in self._valid:
            return Outcome(req.id, req.tenant, k, "deferred", "insufficient_gpus", short_detail(k), [], None, None, None,
                           version, None, now())
        return None

    @property
    def n_free(self) -> int:
        """Free GPUs of the current state (0 before one is set)."""
        return self._n_free

    @property
    def valid_keys(self) -> set[tuple[int, str]]:
        """(k, constraints key) of the requests validated so far: a quick deferral needs one
        (an invalid request is rejected when tried, whatever is free)."""
        return self._valid

    def place(self, req: Request, hide: np.ndarray | None = None) -> Any:
        """A validated Selection, or raise :class:`Deferred`. ``hide``: free GPUs the request may not
        take (another gang's reservation); hidden free GPUs carry no traffic, contention is unchanged."""
        st = self.state
        assert st is not None
        if hide is not None:
            st = State(st.spec, st.free & ~hide, st.jobs)
        k, c = req.k, req.constraints
        vkey = (k, c.key)
        if vkey not in self._valid:
            try:
                validate_request(req, self.spec)
            except RequestError as exc:
                raise Deferred("rejected", "invalid_request", str(exc)) from None
            self._valid.add(vkey)
        n_free = st.n_free
        if n_free < k:
            raise Deferred("deferred", "insufficient_gpus", short_detail(k))
        feas = c.filter(self.spec, st.free, k, self.dom_ids, self.allowed_mask(c))
        if feas.short in _SHORT:
            raise Deferred("deferred", "constraint_unmet", _SHORT[feas.short].format(k=k))
        elig, per_dom = feas.eligible, feas.per_domain
        key = (k, c.key) if hide is None else (k, c.key, hide.tobytes())
        if key in self._fail:
            reason, detail = self._fail[key]
            raise Deferred("deferred", reason, detail)
        try:
            sel = self._select(req, st, elig, per_dom)
        except Deferred as d:
            if d.status == "deferred" and d.reason == "constraint_unmet" and c.min_gbps is not None:
                never = self._never_satisfiable(req)
                if never:
                    raise Deferred("rejected", "constraint_unmet", never) from None
            if d.status == "deferred" and d.reason in ("insufficient_gpus", "constraint_unmet"):
                self._fail[key] = (d.reason, d.detail)
            raise
        self._check_selection(req, sel, elig)
        return sel

    def _select(self, req: Request, st: State, elig: np.ndarray, per_dom: np.ndarray) -> Any:
        c = req.constraints
        view = st
        if c.allowed_gpus is not None:
            # Hide free GPUs outside the list: hidden free GPUs carry no traffic, so contention is unchanged.
            view = State(st.spec, elig.copy(), st.jobs)
        if not c.single_domain or self.spec.nvlink_domains:  # NVLink domains: the dispatcher keeps it in one
            return self._call(req, view, list(c.allowed_hosts) if c.allowed_hosts is not None else None)
        best, last = None, None
        for d in np.argsort(-per_dom, kind="stable"):
            if per_dom[d] < req.k:
                break
            hosts = [self.spec.hosts[h].name for h in np.flatnonzero(self.dom_ids == d)]
            if c.allowed_hosts is not None:
                hosts = [h for h in hosts if h in set(c.allowed_hosts)]
            try:
                sel = self._call(req, view, hosts)
            except Deferred as d_err:
                if d_err.status == "rejected":
                    raise
                last = d_err
                continue
            if best is None or merit(sel) > merit(best):
                best = sel
        if best is None:
            raise last or Deferred("deferred", "constraint_unmet", f"no domain can host {req.k} GPUs")
        return best

    def _call(self, req: Request, view: State, allowed_hosts: list[str] | None) -> Any:
        c = req.constraints
        # allowed_gpus is applied through the view; a plain cluster's single_domain by the loop over domains
        cons = replace(c, allowed_gpus=None, allowed_hosts=None if allowed_hosts is None else tuple(allowed_hosts),
                       single_domain=c.single_domain and bool(self.spec.nvlink_domains))
        try:
            if req.shape is not None:  # shape-aware search unless the placer was told a shape baseline
                alg = self.algorithm if self.algorithm in ("blind", "segment", "shape") else None
                return self.dispatcher.select(req.k, view, algorithm=alg, constraints=cons, shape=req.shape)
            return self.dispatcher.select(req.k, view, algorithm=self.algorithm, constraints=cons)
        except PlacementError as exc:
            reason = getattr(exc, "reason", None) or "invalid_request"
            status = "rejected" if reason == "invalid_request" else "deferred"
            raise Deferred(status, reason, str(exc)) from None
        except ModelError:
            raise
        except BandPilotError as exc:
            raise Deferred("deferred", "dispatcher_error", f"{type(exc).__name__}: {exc}") from None

    def _never_satisfiable(self, req: Request) -> str | None:
        """A min_gbps that even an idle cluster cannot meet will never be met: reject, don't starve."""
        key = (req.k, req.constraints.key)
        if key not in self._never:
            idle = State.idle(self.spec)
            feas = req.constraints.filter(self.spec, idle.free, req.k, self.dom_ids, self.allowed_mask(req.constraints))
            elig, per_dom = feas.eligible, feas.per_domain
            try:
                self._select(req, idle, elig, per_dom)
                self._never[key] = None
            except Deferred as d:
                self._never[key] = (
                    f"min_gbps {req.constraints.min_gbps:g} is unreachable for k={req.k} even on an idle cluster ({d.detail})"
                    if d.reason == "constraint_unmet" else None
                )
        return self._never[key]

    def _check_selection(self, req: Request, sel: Any, elig: np.ndarray) -> None:
        bad = req.constraints.check_selection(self.spec, getattr(sel, "gpus", []) or [], elig, req.k, self.dom_ids)
        if bad:
            raise Deferred("deferred", "dispatcher_error", f"dispatcher {bad}")

    def commit_to_state(self, req: Request, gpus: list[str], demand: float) -> None:
        assert self.state is not None
        self.state = self.state.with_job(req.id, gpus, demand)
        self._n_free = self.state.n_free
