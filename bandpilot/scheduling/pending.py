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

import weakref
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
#: per engine (one store's database): seq -> [the request columns of its full pending row, its Pending]
_SEEN: "weakref.WeakKeyDictionary[Any, dict[int, list]]" = weakref.WeakKeyDictionary()
_SEEN_MAX = 200_000


def load_pending(conn: sa.Connection) -> tuple[list[Pending], dict[str, tuple[str | None, str | None]]]:
    """Pending requests (parsed once per process and row version) and their stored notes."""
    seen = _SEEN.get(conn.engine)
    if seen is None:
        seen = _SEEN[conn.engine] = {}
    narrow = plain_rows(conn, NARROW_STMT)
    # one pass over the rows: a known row's Pending as is (rebuilt if its utility changed); rows not
    # seen before (or a seq reused) leave a gap filled after one bulk read of their full rows
    get, out, notes, gaps = seen.get, [], {}, []
    for seq, rid, k, sub, util, reason, detail in narrow:
        e = get(seq)
        if e is None or e[0][_ID] != rid or e[0][_K] != k or e[0][_SUB] != sub:
            gaps.append((len(out), seq, util))
            out.append(None)
        else:
            if e[0][_UTIL] != util:  # the one request column that changes while it waits (entropy reports)
                _set_util(e, util)
            out.append(e[1])
        notes[rid] = (reason, detail)
    if gaps:
        if len(seen) + len(gaps) > _SEEN_MAX:  # start afresh: every row read in full
            seen.clear()
            gaps = [(i, r[0], r[4]) for i, r in enumerate(narrow)]
        missing = [seq for _, seq, _ in gaps]
        for i in range(0, len(missing), 500):
            for t in conn.execute(_FULL_BY_SEQ, {"b_seqs": missing[i : i + 500]}).all():
                row = tuple(t)[:PENDING_REQ_COLS]
                seen[t[0]] = [row, row_to_pending(row)]
        for pos, seq, util in gaps:
            e = seen[seq]
            if e[0][_UTIL] != util:  # reported between the two reads
                _set_util(e, util)
            out[pos] = e[1]
    if len(seen) > 2 * len(narrow) + 1024:  # requests no longer pending: forget them
        _SEEN[conn.engine] = {r[0]: seen[r[0]] for r in narrow}
    return out, notes


def _set_util(e: list, util: Any) -> None:
    row = e[0] = e[0][:_UTIL] + (util,) + e[0][_UTIL + 1 :]
    e[1] = row_to_pending(row)
