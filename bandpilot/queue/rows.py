"""How are hot SELECTs read? As plain tuples, straight from the DBAPI cursor on SQLite.

A batch reads every pending request and every GPU row; in a long simulated queue (~3,000 pending
requests, thousands of batches) SQLAlchemy's Row objects were ~40 % of reading them. The columns
read this way are integers, floats, text and booleans; sqlite3 returns the first three as
SQLAlchemy does and a boolean as 0/1, so callers that read a boolean column take ``bool()`` of it.
Other dialects go through SQLAlchemy (one fetchall: row-by-row iteration cost ~3x per row).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

_SQL: dict[tuple[int, str], str] = {}


def plain_rows(conn: sa.Connection, stmt: Any) -> list[tuple]:
    """Every row of ``stmt`` (a SELECT without bound parameters other than literals) as a tuple."""
    name = conn.dialect.name
    if name != "sqlite":
        return [tuple(r) for r in conn.execute(stmt).all()]
    key = (id(stmt), name)
    sql = _SQL.get(key)
    if sql is None:  # module-level statements: compiled once per process
        sql = _SQL[key] = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cur = conn.connection.dbapi_connection.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall()
    finally:
        cur.close()
