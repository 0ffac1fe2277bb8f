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


def _row(actor: str, action: str, target: str | None, detail: Mapping[str, Any] | str | None) -> dict[str, Any]:
    text = detail if isinstance(detail, str) or detail is None else json.dumps(detail, sort_keys=True, default=str)
    return {"actor": actor[:200], "action": action[:64], "target": target, "detail": text[:4000] if text else None}


def record(store: Store, actor: str, action: str, target: str | None = None, *, outcome: str = "ok",
           detail: Mapping[str, Any] | str | None = None) -> None:
    """One audit row in its own transaction (for attempts that changed nothing)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown audit outcome {outcome!r}")
    token = AUDIT_CONTEXT.set(None)  # this write is the record itself
    try:
        with store.write() as conn:
            conn.execute(sa.insert(T_AUDIT).values(**_row(actor, action, target, detail), at=now(), outcome=outcome))
    finally:
        AUDIT_CONTEXT.reset(token)


@contextmanager
def audited(store: Store, actor: str, action: str, target: str | None = None,
            detail: Mapping[str, Any] | str | None = None) -> Iterator[dict[str, Any]]:
    """Audit the change made inside the block: the first write transaction in it carries the row.
    If the block raises, nothing of the change is stored and an ``error`` row records the attempt;
    a block that wrote nothing records ``ok`` on its own."""
    entry: dict[str, Any] = {"row": _row(actor, action, target, detail), "written": False}
    token = AUDIT_CONTEXT.set(entry)
    try:
        yield entry
    except BaseException as exc:
        AUDIT_CONTEXT.reset(token)
        token = None
        why = f"{type(exc).__name__}: {exc}"[:4000]
        if not entry["written"]:
            record(store, actor, action, target, outcome="error", detail=why)
        else:  # the function committed something and then refused (e.g. a read inside its transaction)
            with store.write() as conn:
                conn.execute(sa.update(T_AUDIT).where(T_AUDIT.c.id == entry["id"]).values(outcome="error", detail=why))
        raise
    finally:
        if token is not None:
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
