"""How does a batch record what it deferred or rejected? On the request rows: ``attempts + 1`` and
the batch id on every request tried and left pending, and the note (reason, detail) where it
changed - a few statements per batch however long the queue."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import sqlalchemy as sa

from bandpilot.queue.clock import now
from bandpilot.queue.schema import T_REQ
from bandpilot.scheduling.outcomes import Outcome, short_detail

_TOUCH_ALL = (
    sa.update(T_REQ)
    .where(T_REQ.c.status == "pending", T_REQ.c.seq <= sa.bindparam("b_max"))
    .values(attempts=T_REQ.c.attempts + 1, last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_TOUCH_IDS = (
    sa.update(T_REQ)
    .where(T_REQ.c.id.in_(sa.bindparam("b_ids", expanding=True)), T_REQ.c.status == "pending")
    .values(attempts=T_REQ.c.attempts + 1, last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_NOTE = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "pending")
    .values(status=sa.bindparam("b_status"), reason=sa.bindparam("b_reason"), detail=sa.bindparam("b_detail"))
)


def _chunks(seq: list[str], n: int = 500) -> Iterator[list[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def flush_outcomes(conn: sa.Connection, outs: list[Any], batch_id: int | None,
                   notes: Mapping[str, tuple[str | None, str | None]], whole: bool, max_seq: int) -> None:
    """Record deferrals and rejections on the request rows, set-based so a long queue costs a few
    statements per batch: one ``attempts + 1`` over every request tried and left pending, then a
    note (reason, detail) only where it changed. ``outs``: outcomes, and the Request of each quick
    deferral (``insufficient_gpus``). Every statement is guarded by ``status = 'pending'`` so a
    concurrent assignment is never undone. ``notes``: the stored (reason, detail) of each pending
    request as the batch read them; ``whole``: every pending request up to ``max_seq`` was in the
    batch (one set-based ``attempts + 1``)."""
    rows, ids, note_of = [], [], notes.get
    quick: dict[int, tuple[str, str]] = {}  # k -> the note of a quick deferral
    for o in outs:
        if type(o) is not Outcome:  # a quick deferral's Request (most of a long queue, every batch)
            rid, note = o.id, quick.get(o.k)
            if note is None:
                note = quick[o.k] = ("insufficient_gpus", short_detail(o.k))
            ids.append(rid)
            if note_of(rid) != note:
                rows.append({"b_id": rid, "b_status": "pending", "b_reason": note[0], "b_detail": note[1]})
            continue
        if o.status not in ("deferred", "rejected"):
            continue
        ids.append(o.request_id)
        if o.status == "rejected" or note_of(o.request_id) != (o.reason, o.detail):
            rows.append({"b_id": o.request_id, "b_status": "rejected" if o.status == "rejected" else "pending",
                         "b_reason": o.reason, "b_detail": o.detail})
    if not ids:
        return
    ts = now()
    if whole:
        conn.execute(_TOUCH_ALL, {"b_max": max_seq, "b_batch": batch_id, "b_now": ts})
    else:
        for chunk in _chunks(ids):
            conn.execute(_TOUCH_IDS, {"b_ids": chunk, "b_batch": batch_id, "b_now": ts})
    if rows:
        conn.execute(_NOTE, rows)
