"""How does a request become a row and back, and how are hot SELECTs read?

One mapper between :class:`~bandpilot.queue.requests.Request` and its ``bp_requests`` row, derived
from the table: every column is either a request field of the same name or the queue's state of the
request (:data:`STATE_COLUMNS`), so a column added to the table and not to the request (or the
reverse) fails the mapper's test instead of being dropped by some hand-written list. The writers
(:func:`~bandpilot.queue.intake.submit`, the asyncpg submit) and readers name columns, never
positions.

Hot SELECTs are read as plain tuples, straight from the DBAPI cursor on SQLite.

A batch reads every pending request and every GPU row; in a long simulated queue (~3,000 pending
requests, thousands of batches) SQLAlchemy's Row objects were ~40 % of reading them. The columns
read this way are integers, floats, text and booleans; sqlite3 returns the first three as
SQLAlchemy does and a boolean as 0/1, so callers that read a boolean column take ``bool()`` of it.
Other dialects go through SQLAlchemy (one fetchall: row-by-row iteration cost ~3x per row).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import sqlalchemy as sa

from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.shape import Shape
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_REQ

#: The queue's state of a request: the columns that are no :class:`Request` field.
STATE_COLUMNS = ("status", "reason", "detail", "attempts", "last_batch", "updated_at")
#: Every column a submit writes, in the table's order (``seq``, the arrival order, is the store's).
REQUEST_COLUMNS = tuple(c.name for c in T_REQ.columns if c.name != T_REQ.c.seq.name)
#: The request's own columns: its fields, in the table's order.
FIELD_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in STATE_COLUMNS)


def _same(value: Any) -> Any:
    return value


#: Stored form of the fields that are not stored as they are (JSON text; NULL = not given).
_ENCODE: dict[str, Callable[[Any], Any]] = {
    "constraints": lambda c: c.key if c.to_dict() else None,
    "shape": lambda s: None if s is None else json.dumps(s.to_dict(), sort_keys=True),
}
#: And back: SQLite gives a boolean as 0/1.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "constraints": lambda t: Constraints.from_dict(json.loads(t)) if t else Constraints(),
    "shape": lambda t: Shape.parse(json.loads(t)) if t else None,
    "preemptible": bool,
}


def request_row(r: Request, ts: float) -> dict[str, Any]:
    """The ``bp_requests`` row of a new pending request submitted at ``ts`` (every column of
    :data:`REQUEST_COLUMNS`)."""
    row = {c: _ENCODE.get(c, _same)(getattr(r, c)) for c in FIELD_COLUMNS}
    if row["submitted_at"] is None:
        row["submitted_at"] = ts
    row.update(status="pending", reason=None, detail=None, attempts=0, last_batch=None, updated_at=ts)
    return row


def request_of(row: Mapping[str, Any]) -> Request:
    """The :class:`Request` a ``bp_requests`` row (a mapping by column name) holds."""
    return Request(**{c: _DECODE.get(c, _same)(row[c]) for c in FIELD_COLUMNS})


_SQL: dict[tuple[int, str], str] = {}


def plain_rows(conn: sa.Connection, stmt: Any) -> Sequence[Any]:
    """Every row of ``stmt`` (a SELECT without bound parameters other than literals) as a tuple."""
    name = conn.dialect.name
    if name != "sqlite":
        return [tuple(r) for r in conn.execute(stmt).all()]
    key = (id(stmt), name)
    sql = _SQL.get(key)
    if sql is None:  # module-level statements: compiled once per process
        sql = _SQL[key] = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None  # a connection in use is open
    cur = dbapi.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall()
    finally:
        cur.close()
