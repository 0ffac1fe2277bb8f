"""What is a job still worth? Entropy reports turned into entropy-guided utility, and run-time estimates.

Jobs report their normalized predictive entropy ``ū ∈ [0, 1]`` at epoch boundaries
(``bandpilot queue report JOB --entropy X``). The utility is the seed's function of it (Sec. 4.5,
eqs. 28-29): the progress proxy ``Δ = ū(t-1) - ū(t)`` and

    U = λ · ū(t) + (1 - λ) · Δ            (clamped at 0: a request's utility is never negative)

with ``λ`` balancing present learning demand and recent progress. With one report ``Δ = 0``. The
utility is written on the request row, so the ``utility`` policy and its tenant quotas (seed eq.
31, :func:`~bandpilot.scheduling.policies.utility_quotas`) use it at the next batch; a pending request
may report a warm-up measurement (the seed's fallback for jobs that have not run yet).

Run-time estimates (``expected_s``) feed the ``sjf`` policy and reservation planning; a request
without one falls back to its ``time_limit_s``, then to what finished jobs of its tenant and size
took (:func:`learned_runtimes`), and sorts after those with one.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import sqlalchemy as sa

from bandpilot.errors import RequestError
from bandpilot.queue.clock import now
from bandpilot.queue.schema import T_ENTROPY, T_ESTIMATES, T_JOBS, T_REQ
from bandpilot.queue.store import Store

#: Default balance between the uncertainty level and its recent decrease (the seed gives no value).
DEFAULT_LAMBDA = 0.5
#: Requests that can still learn: reports for finished ones are refused.
_LIVE = ("pending", "assigned")


def entropy_utility(entropy: float, previous: float | None, lam: float = DEFAULT_LAMBDA) -> float:
    """Entropy-guided utility (the entropy-guided scheduling paper, eqs. 28-29): ``max(0, λ·ū + (1-λ)·(ū_prev - ū))``; ``Δ = 0`` without a previous report."""
    delta = 0.0 if previous is None else previous - entropy
    return max(0.0, lam * entropy + (1.0 - lam) * delta)


def _check_entropy(x: Any, where: str) -> float:
    if isinstance(x, bool):
        raise RequestError(f"{where}: entropy must be a number in [0, 1], got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise RequestError(f"{where}: entropy must be a number in [0, 1], got {x!r}") from None
    if not math.isfinite(v) or v < 0.0 or v > 1.0:
        raise RequestError(f"{where}: normalized entropy must be in [0, 1], got {x!r}")
    return v


def _check_lambda(lam: float) -> float:
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise RequestError(f"utility lambda must be in [0, 1], got {lam!r}")
    return float(lam)


#: the last report (highest id) of each request in ``b_ids``: a running job reports every epoch, so
#: reading every report of every reporting job each time grew with the jobs' histories
_LAST_ID = (
    sa.select(sa.func.max(T_ENTROPY.c.id))
    .where(T_ENTROPY.c.request_id.in_(sa.bindparam("b_ids", expanding=True)))
    .group_by(T_ENTROPY.c.request_id)
)
_LAST = sa.select(T_ENTROPY.c.request_id, T_ENTROPY.c.epoch, T_ENTROPY.c.entropy).where(T_ENTROPY.c.id.in_(_LAST_ID))


def report_entropy(
    store: Store, reports: Iterable[Mapping[str, Any]] | Mapping[str, Any], *, lam: float = DEFAULT_LAMBDA,
) -> list[dict[str, Any]]:
    """Record entropy reports ``{"job": id, "entropy": x[, "epoch": n]}`` in ONE transaction and update
    each request's utility. Any bad report (entropy outside [0, 1], unknown or finished job, an epoch
    not after the job's last one) raises :class:`RequestError` and nothing is written.
    Returns ``[{"job", "epoch", "entropy", "utility"}]``."""
    lam = _check_lambda(lam)
    items = [reports] if isinstance(reports, Mapping) else list(reports)
    parsed: list[tuple[str, float, int | None]] = []
    for n, r in enumerate(items):
        job = r.get("job")
        if not isinstance(job, str) or not job:
            raise RequestError(f"report[{n}]: 'job' must be a request id")
        x = _check_entropy(r.get("entropy"), f"job {job!r}")
        ep = r.get("epoch")
        if ep is not None and (isinstance(ep, bool) or not isinstance(ep, int) or ep < 0):
            raise RequestError(f"job {job!r}: epoch must be an integer >= 0, got {ep!r}")
        parsed.append((job, x, ep))
    if not parsed:
        return []
    ts = now()
    out: list[dict[str, Any]] = []
    ids = sorted({j for j, _, _ in parsed})
    with store.write() as conn:
        status: dict[str, str] = {}
        last: dict[str, tuple[int, float]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            status.update(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status).where(T_REQ.c.id.in_(chunk))).tuples().all())
            for rid, ep, h in conn.execute(_LAST, {"b_ids": chunk}):
                last[rid] = (int(ep), float(h))
        rows, utils = [], {}
        for job, x, ep in parsed:
            st = status.get(job)
            if st is None:
                raise RequestError(f"no job {job!r} in the queue: entropy report refused")
            if st not in _LIVE:
                raise RequestError(f"job {job!r} is {st}: entropy reports are for pending or running jobs")
            prev = last.get(job)
            epoch = ep if ep is not None else (prev[0] + 1 if prev else 0)
            if prev is not None and epoch <= prev[0]:
                raise RequestError(f"job {job!r}: epoch {epoch} is not after its last report (epoch {prev[0]})")
            u = entropy_utility(x, prev[1] if prev else None, lam)
            last[job] = (epoch, x)
            utils[job] = u
            rows.append({"request_id": job, "epoch": epoch, "entropy": x, "utility": u, "at": ts})
            out.append({"job": job, "epoch": epoch, "entropy": x, "utility": u})
        conn.execute(sa.insert(T_ENTROPY), rows)
        conn.execute(
            sa.update(T_REQ).where(T_REQ.c.id == sa.bindparam("b_id")).values(utility=sa.bindparam("b_u"), updated_at=ts),
            [{"b_id": j, "b_u": u} for j, u in utils.items()],
        )
    return out


def entropy_history(store: Store, job: str) -> list[dict[str, Any]]:
    """Every report of ``job`` in order (empty if it never reported)."""
    with store.read() as conn:
        rows = conn.execute(
            sa.select(T_ENTROPY.c.epoch, T_ENTROPY.c.entropy, T_ENTROPY.c.utility, T_ENTROPY.c.at)
            .where(T_ENTROPY.c.request_id == job).order_by(T_ENTROPY.c.id)
        ).all()
    return [{"epoch": e, "entropy": h, "utility": u, "at": a} for e, h, u, a in rows]


def set_estimates(store: Store, estimates: Mapping[str, float]) -> int:
    """Record expected run times (seconds) for requests, one transaction; replaces earlier ones."""
    rows = []
    for rid, s in estimates.items():
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise RequestError(f"request {rid!r}: expected run time must be a positive number of seconds, got {s!r}")
        rows.append({"request_id": rid, "expected_s": float(s)})
    if not rows:
        return 0
    ids = [r["request_id"] for r in rows]
    with store.write() as conn:
        known: set[str] = set()
        for i in range(0, len(ids), 500):
            known.update(conn.execute(sa.select(T_REQ.c.id).where(T_REQ.c.id.in_(ids[i : i + 500]))).scalars())
        missing = [i for i in ids if i not in known]
        if missing:
            raise RequestError(f"no request {missing[0]!r} in the queue: run-time estimate refused")
        for i in range(0, len(ids), 500):
            conn.execute(sa.delete(T_ESTIMATES).where(T_ESTIMATES.c.request_id.in_(ids[i : i + 500])))
        conn.execute(sa.insert(T_ESTIMATES), rows)
    return len(rows)


def load_estimates(conn: sa.Connection, ids: Sequence[str] | None = None) -> dict[str, float]:
    """Expected run times inside the caller's transaction (all, or of ``ids``)."""
    q = sa.select(T_ESTIMATES.c.request_id, T_ESTIMATES.c.expected_s)
    if ids is None:
        return {r: float(s) for r, s in conn.execute(q)}
    out: dict[str, float] = {}
    ids = list(ids)
    for i in range(0, len(ids), 500):
        out.update({r: float(s) for r, s in conn.execute(q.where(T_ESTIMATES.c.request_id.in_(ids[i : i + 500])))})
    return out


def load_live_estimates(conn: sa.Connection) -> dict[str, float]:
    """Expected run times of the requests still pending or running: all a batch asks about (the
    estimates of every request ever submitted grow with the store's history)."""
    q = (sa.select(T_ESTIMATES.c.request_id, T_ESTIMATES.c.expected_s)
         .join(T_REQ, T_REQ.c.id == T_ESTIMATES.c.request_id).where(T_REQ.c.status.in_(_LIVE)))
    return {r: float(s) for r, s in conn.execute(q).all()}


#: Finished jobs looked at to learn run times (the most recent ones).
LEARN_WINDOW = 2000


def learned_runtimes(conn: sa.Connection, window: int = LEARN_WINDOW) -> tuple[dict[tuple[str, int], float], dict[int, float]]:
    """Median run time (seconds) of the most recent released jobs, per (tenant, k) and per k."""
    rows = conn.execute(
        sa.select(T_JOBS.c.tenant, T_JOBS.c.k, T_JOBS.c.ended_at - T_JOBS.c.started_at)
        .where(T_JOBS.c.status == "released", T_JOBS.c.ended_at.is_not(None))
        .order_by(T_JOBS.c.ended_at.desc()).limit(window)
    ).all()
    by_tk: dict[tuple[str, int], list[float]] = {}
    by_k: dict[int, list[float]] = {}
    for tenant, k, d in rows:
        if d is None or d <= 0:
            continue
        by_tk.setdefault((tenant, int(k)), []).append(float(d))
        by_k.setdefault(int(k), []).append(float(d))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731 - upper median, no numpy needed
    return {key: med(v) for key, v in by_tk.items()}, {key: med(v) for key, v in by_k.items()}
