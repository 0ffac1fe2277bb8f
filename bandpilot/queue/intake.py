"""How do requests enter the queue, and leave it before they are assigned? :func:`submit` and
:func:`cancel`, each one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import sqlalchemy as sa

from bandpilot.errors import RequestError
from bandpilot.queue.clock import now
from bandpilot.queue.requests import Request, coerce, validate_request
from bandpilot.queue.rows import request_row
from bandpilot.queue.schema import T_REQ, T_RESERVE
from bandpilot.queue.store import Store
from bandpilot.topology.cluster import ClusterSpec


_EXISTING = sa.select(T_REQ.c.id).where(T_REQ.c.id.in_(sa.bindparam("ids", expanding=True)))


@dataclass
class SubmitReport:
    submitted: list[str]
    errors: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"submitted": len(self.submitted), "ids": self.submitted, "errors": self.errors}


class SubmitError(RequestError):
    """Some requests are invalid and nothing was submitted; ``errors`` lists every problem."""

    def __init__(self, errors: Sequence[str], n_valid: int, code: str = "invalid_request") -> None:
        self.errors = list(errors)
        self.n_valid = n_valid
        more = f"{len(self.errors)} invalid request(s), first: " if len(self.errors) > 1 else ""
        valid = "the valid one" if n_valid == 1 else f"the {n_valid} valid ones"
        hint = f" (submit with partial / --partial to queue {valid})" if n_valid else ""
        super().__init__(f"{more}{self.errors[0]}; nothing submitted{hint}", code=code)


def check_requests(requests: Iterable[Request | Mapping[str, Any]], spec: ClusterSpec, *,
                   labels: Sequence[str] | None = None, errors: Sequence[str] = ()
                   ) -> tuple[list[Request], list[str], dict[str, str]]:
    """Validate requests against ``spec`` (:func:`validate_request`) and among themselves (an id
    given twice): the valid ones, every error (``errors`` first), and each valid id's label."""
    errs = list(errors)
    good: list[Request] = []
    where: dict[str, str] = {}
    for n, item in enumerate(requests):
        w = labels[n] if labels is not None else f"request[{n}]"
        try:
            req = coerce(item, w)
            validate_request(req, spec, w)
        except RequestError as exc:
            errs.append(str(exc))
            continue
        if req.id in where:
            errs.append(f"{w}: duplicate request id {req.id!r} (also at {where[req.id]})")
            continue
        where[req.id] = w
        good.append(req)
    return good, errs, where


def submit(
    store: Store,
    requests: Iterable[Request | Mapping[str, Any]],
    *,
    partial: bool = False,
    errors: Sequence[str] = (),
    labels: Sequence[str] | None = None,
    guard: Callable[[sa.Connection], None] | None = None,
) -> SubmitReport:
    """Queue requests in one transaction.

    Each is validated against the store's cluster (:func:`validate_request`); a bad one, an id
    repeated or already in the store, or any ``errors`` passed in from parsing make the call raise
    :class:`SubmitError` with nothing queued - unless ``partial``, which queues the valid ones and
    reports the rest. ``labels`` (e.g. ``file:line``) prefix each request's error messages.
    ``guard(conn)`` runs first inside the transaction and may refuse by raising (e.g. a tenant's
    limits, :mod:`bandpilot.queue.quotas`).
    """
    good, errs, where = check_requests(requests, store.spec, labels=labels, errors=errors)
    ts = now()
    with store.write() as conn:
        if guard is not None and good:
            guard(conn)
        existing: set[str] = set()
        ids = [r.id for r in good]
        for i in range(0, len(ids), 500):
            existing.update(conn.execute(_EXISTING, {"ids": ids[i : i + 500]}).scalars())
        first_dup = not errs  # the first problem is an id already in the store: a conflict, not bad input
        if existing:
            errs.extend(f"{where[rid]}: request id {rid!r} already exists in the store" for rid in ids if rid in existing)
            good = [r for r in good if r.id not in existing]
        if errs and not partial:
            raise SubmitError(errs, len(good), "duplicate_id" if first_dup and existing else "invalid_request")
        rows = [request_row(r, ts) for r in good]
        if rows:
            try:
                conn.execute(sa.insert(T_REQ), rows)
            except sa.exc.IntegrityError:
                raise RequestError("a request id was submitted concurrently by another process; nothing submitted",
                                   code="duplicate_id") from None
    return SubmitReport([r.id for r in good], errs)


def cancel(store: Store, request_id: str) -> None:
    """Withdraw a pending request (an assigned one must be released instead)."""
    with store.write() as conn:
        r = conn.execute(
            sa.update(T_REQ)
            .where(T_REQ.c.id == request_id, T_REQ.c.status == "pending")
            .values(status="cancelled", updated_at=now())
        )
        if r.rowcount == 1:
            conn.execute(sa.delete(T_RESERVE).where(T_RESERVE.c.request_id == request_id))  # it no longer waits
            return
        st = conn.execute(sa.select(T_REQ.c.status).where(T_REQ.c.id == request_id)).scalar()
    if st is None:
        raise RequestError(f"no request {request_id!r}")
    hint = "; release the job instead" if st == "assigned" else ""
    raise RequestError(f"request {request_id!r} is {st}, not pending{hint}", code="not_pending")
