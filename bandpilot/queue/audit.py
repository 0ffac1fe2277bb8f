"""Who changed what, and when? Every change made through the API (and the token commands) leaves
one ``bp_audit`` row, written in the same transaction as the change; a refused or failed attempt
leaves one too, with its outcome."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import sqlalchemy as sa

from bandpilot.queue.clock import now, iso
from bandpilot.queue.schema import T_AUDIT
from bandpilot.queue.store import AUDIT_CONTEXT, Store

OUTCOMES = ("ok", "denied", "error")


def audit_row(actor: str, action: str, target: str | None, detail: Mapping[str, Any] | str | None) -> dict[str, Any]:
    text = detail if isinstance(detail, str) or detail is None else json.dumps(detail, sort_keys=True, default=str)
    return {"actor": actor[:200], "action": action[:64], "target": target, "detail": text[:4000] if text else None}


def record(store: Store, actor: str, action: str, target: str | None = None, *, outcome: str = "ok",
           detail: Mapping[str, Any] | str | None = None, coalesce_s: float = 0) -> None:
    """One audit row in its own transaction (for attempts that changed nothing). With ``coalesce_s``,
    a repeat of the same attempt (actor, action, target, outcome) within that many seconds of the
    row's first one counts into that row (``detail.count``, ``detail.last``) instead of adding one:
    a hundred refused calls are one row that says 100, not a hundred rows."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown audit outcome {outcome!r}")
    token = AUDIT_CONTEXT.set(None)  # this write is the record itself
    ts = now()
    row = audit_row(actor, action, target, {**(detail if isinstance(detail, Mapping) else
                                          {} if detail is None else {"detail": detail}), "count": 1}
               if coalesce_s else detail)
    try:
        with store.write() as conn:
            if coalesce_s and _coalesced(conn, row, outcome, ts, coalesce_s):
                return
            conn.execute(sa.insert(T_AUDIT).values(**row, at=ts, outcome=outcome))
    finally:
        AUDIT_CONTEXT.reset(token)


def _coalesced(conn: sa.Connection, row: dict[str, Any], outcome: str, ts: float, within: float) -> bool:
    same_target = T_AUDIT.c.target.is_(None) if row["target"] is None else T_AUDIT.c.target == row["target"]
    prev = conn.execute(sa.select(T_AUDIT.c.id, T_AUDIT.c.detail).where(
        T_AUDIT.c.at >= ts - within, T_AUDIT.c.actor == row["actor"], T_AUDIT.c.action == row["action"],
        T_AUDIT.c.outcome == outcome, same_target).order_by(T_AUDIT.c.id.desc()).limit(1)).first()
    if prev is None:
        return False
    try:
        doc = json.loads(prev.detail or "{}")
        count = int(doc.get("count", 1)) if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        count = None
    if count is None:  # not a coalescing row
        return False
    doc.update(count=count + 1, last=iso(ts))
    conn.execute(sa.update(T_AUDIT).where(T_AUDIT.c.id == prev.id).values(detail=json.dumps(doc, sort_keys=True)[:4000]))
    return True


@contextmanager
def audited(store: Store, actor: str, action: str, target: str | None = None,
            detail: Mapping[str, Any] | str | None = None) -> Iterator[dict[str, Any]]:
    """Audit the change made inside the block: the first write transaction in it carries the row.
    If the block raises, nothing of the change is stored and an ``error`` row records the attempt;
    a block that wrote nothing records ``ok`` on its own."""
    entry: dict[str, Any] = {"row": audit_row(actor, action, target, detail), "written": False}
    token = AUDIT_CONTEXT.set(entry)
    active = True
    try:
        yield entry
    except BaseException as exc:
        AUDIT_CONTEXT.reset(token)
        active = False
        why = f"{type(exc).__name__}: {exc}"[:4000]
        if not entry["written"]:
            record(store, actor, action, target, outcome="error", detail=why)
        else:  # the function committed something and then refused (e.g. a read inside its transaction)
            with store.write() as conn:
                conn.execute(sa.update(T_AUDIT).where(T_AUDIT.c.id == entry["id"]).values(outcome="error", detail=why))
        raise
    finally:
        if active:
            AUDIT_CONTEXT.reset(token)
    if not entry["written"]:
        record(store, actor, action, target, detail=detail)


def audit_log(store: Store, *, limit: int = 200, actor: str | None = None, action: str | None = None) -> list[dict[str, Any]]:
    """The newest audit rows first."""
    q = sa.select(T_AUDIT).order_by(T_AUDIT.c.id.desc()).limit(max(1, min(int(limit), 10_000)))
    if actor:
        q = q.where(T_AUDIT.c.actor == actor)
    if action:
        q = q.where(T_AUDIT.c.action == action)
    with store.read() as conn:
        rows = conn.execute(q).mappings().all()
    return [{"id": r["id"], "at": iso(r["at"]), "actor": r["actor"], "action": r["action"], "target": r["target"],
             "outcome": r["outcome"], "detail": r["detail"]} for r in rows]
