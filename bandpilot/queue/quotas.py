"""How much may one tenant queue? Per-tenant limits on pending requests and on the GPUs they ask
for together, checked inside the submit transaction (so concurrent submits cannot overshoot), and
the per-tenant id check that goes with them: a tenant's ids are its own namespace."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import sqlalchemy as sa

from bandpilot.errors import RequestError
from bandpilot.queue.schema import T_REQ
from bandpilot.queue.store import Store


@dataclass(frozen=True)
class TenantLimits:
    """``None`` means unlimited; ``max_pending_gpus=None`` is twice the cluster's GPUs."""

    max_pending: int | None = 100
    max_pending_gpus: int | None = None
    retry_after_s: int = 30


class QuotaExceeded(RequestError):
    """A tenant is at its limit; retry after ``retry_after_s`` (a batch may have placed some)."""

    code = "quota_exceeded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = int(retry_after_s)


class DuplicateId(RequestError):
    """The tenant already has a request with this id."""

    code = "duplicate_id"


_pending = T_REQ.c.status == "pending"
_mine = T_REQ.c.id.in_(sa.bindparam("ids", expanding=True))
#: A tenant's pending requests, their GPUs, and whether one of the given ids is its; built once.
_USAGE = (sa.select(sa.func.sum(sa.case((_pending, 1), else_=0)), sa.func.sum(sa.case((_pending, T_REQ.c.k), else_=0)),
                    sa.func.max(sa.case((_mine, 1), else_=0)))
          .where(T_REQ.c.tenant == sa.bindparam("tenant"), sa.or_(_pending, _mine)))


def tenant_guard(store: Store, tenant: str, k: int, own_ids: Sequence[str], shown: str,
                 limits: TenantLimits | None) -> Callable[[sa.Connection], None]:
    """A check for :func:`bandpilot.queue.intake.submit`'s transaction: none of ``own_ids`` (the
    ids this request could be known by) exists for ``tenant`` (:class:`DuplicateId`, naming ``shown``),
    and one more request of ``k`` GPUs stays within ``limits`` (:class:`QuotaExceeded`)."""

    def check(conn: sa.Connection) -> None:
        if limits is not None and store.backend == "postgresql":
            # one tenant's submits in turn (READ COMMITTED would let two both see room for one more)
            key = zlib.crc32(f"bandpilot-tenant:{tenant}".encode()) & 0x7FFFFFFF
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
        n, gpus, dup = conn.execute(_USAGE, {"tenant": tenant, "ids": list(own_ids)}).one()
        if dup:
            raise DuplicateId(f"request id {shown!r} already exists")
        if limits is None:
            return
        n, gpus = int(n or 0), int(gpus or 0)
        if limits.max_pending is not None and n + 1 > limits.max_pending:
            raise QuotaExceeded(f"tenant {tenant!r} has {n} pending requests, the limit is {limits.max_pending}; "
                                "retry when some are placed or cancelled", limits.retry_after_s)
        cap = limits.max_pending_gpus if limits.max_pending_gpus is not None else 2 * store.spec.n_gpus
        if gpus + k > cap:
            raise QuotaExceeded(f"tenant {tenant!r} has {gpus} pending GPUs requested, {k} more would exceed the "
                                f"limit of {cap}; retry when some are placed or cancelled", limits.retry_after_s)

    return check
