"""Which requests wait, as the batch reads them? :func:`load_pending`: every pending request,
parsed, in storage order, and its stored note.

Every batch reads every pending request. In a long queue (a 10,000-job simulation keeps ~1,000-3,000
pending through thousands of batches) reading all 20 columns of each row every batch was most of
the queue's own cost, although only the utility (entropy reports) and the note change while a
request waits. So a store's pending rows are remembered by ``seq``: each batch reads the narrow
columns that change or identify the row (id, k, submission time, utility, note) and the full row only
for requests not seen before or whose identity columns differ (a seq reused for another
request). Nothing in BandPilot edits a pending request's other columns (requests are never
updated in place except status, note, utility and bookkeeping counters).
"""

from __future__ import annotations

import operator
import weakref
from itertools import compress, repeat
from typing import Any

import sqlalchemy as sa

from bandpilot.queue.rows import plain_rows
from bandpilot.queue.schema import T_REQ
from bandpilot.scheduling.policies import PENDING_REQ_COLS, PENDING_STMT, Pending, row_to_pending

_ORDER = (T_REQ.c.submitted_at, T_REQ.c.seq)
#: (seq, id, k, submitted_at, utility, reason, detail) of every pending request, in the batch's order
NARROW_STMT = sa.select(T_REQ.c.seq, T_REQ.c.id, T_REQ.c.k, T_REQ.c.submitted_at, T_REQ.c.utility, T_REQ.c.reason,
                        T_REQ.c.detail).where(T_REQ.c.status == "pending").order_by(*_ORDER)
_FULL_BY_SEQ = PENDING_STMT.where(T_REQ.c.seq.in_(sa.bindparam("b_seqs", expanding=True)))
#: position of id, k, submitted_at, utility in a full pending row
_ID, _K, _SUB, _UTIL = 1, 2, 6, 5
#: per engine (one store's database): [(seq, id, k, submitted_at, utility) -> its Pending,
#: seq -> the request columns of its full pending row (utility as last read)]
_SEEN: "weakref.WeakKeyDictionary[Any, list[dict]]" = weakref.WeakKeyDictionary()
_SEEN_MAX = 200_000
_KEY = operator.itemgetter(0, 1, 2, 3, 4)  # a narrow row's (seq, id, k, submitted_at, utility)
_RID, _NOTE = operator.itemgetter(1), operator.itemgetter(5, 6)


def load_pending(conn: sa.Connection) -> tuple[list[Pending], dict[str, tuple[str | None, str | None]]]:
    """Pending requests (parsed once per process and row version) and their stored notes."""
    memo = _SEEN.get(conn.engine)
    if memo is None:
        memo = _SEEN[conn.engine] = [{}, {}]
    by_key, full = memo
    narrow = plain_rows(conn, NARROW_STMT)
    # a known row is its Pending by (seq, identity, utility), looked up at C level; rows not seen
    # in that version (new, utility changed, a seq reused) are filled in after
    keys = list(map(_KEY, narrow))
    out = list(map(by_key.get, keys))
    notes = dict(zip(map(_RID, narrow), map(_NOTE, narrow)))
    gaps = list(compress(range(len(out)), map(operator.is_, out, repeat(None))))
    if gaps:
        _fill(conn, memo, keys, out, gaps)
    if len(by_key) > 2 * len(narrow) + 1024:  # requests no longer pending, utilities replaced: forget them
        memo[0] = dict(zip(keys, out))
        memo[1] = {key[0]: r for key in keys if (r := full.get(key[0])) is not None}
    return out, notes


def _fill(conn: sa.Connection, memo: list[dict], keys: list[tuple], out: list, gaps: list[int]) -> None:
    """The Pending of each gap: from the remembered full row when only the utility changed (the one
    request column that changes while it waits: entropy reports), else one bulk read by seq."""
    by_key, full = memo
    missing = []
    for i in gaps:
        seq, rid, k, sub, util = keys[i]
        r = full.get(seq)
        if r is None or r[_ID] != rid or r[_K] != k or r[_SUB] != sub:
            missing.append(i)
            continue
        out[i] = by_key[keys[i]] = _with_util(full, seq, r, util)
    if not missing:
        return
    if len(full) + len(missing) > _SEEN_MAX:  # start afresh
        full.clear()
        by_key.clear()
    for j in range(0, len(missing), 500):
        part = missing[j : j + 500]
        for t in conn.execute(_FULL_BY_SEQ, {"b_seqs": [keys[i][0] for i in part]}).all():
            full[t[0]] = tuple(t)[:PENDING_REQ_COLS]
        for i in part:
            seq, util = keys[i][0], keys[i][4]
            out[i] = by_key[keys[i]] = _with_util(full, seq, full[seq], util)


def _with_util(full: dict, seq: int, row: tuple, util: Any) -> Pending:
    """The Pending of ``row`` with the utility the narrow read gave (reported between the reads)."""
    if row[_UTIL] != util:
        row = full[seq] = row[:_UTIL] + (util,) + row[_UTIL + 1 :]
    return row_to_pending(row)
