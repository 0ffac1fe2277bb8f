"""One mapper between a request and its ``bp_requests`` row, derived from the table."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot.dispatch.constraints import Constraints
from bandpilot.dispatch.shape import Shape
from bandpilot.queue.requests import Request
from bandpilot.queue.rows import FIELD_COLUMNS, REQUEST_COLUMNS, STATE_COLUMNS, request_of, request_row
from bandpilot.queue.schema import T_REQ


def test_every_column_is_a_request_field_or_queue_state():
    fields = {f.name for f in dataclasses.fields(Request)}
    assert set(FIELD_COLUMNS) == fields
    assert set(REQUEST_COLUMNS) == fields | set(STATE_COLUMNS)
    assert [c.name for c in T_REQ.columns] == ["seq", *REQUEST_COLUMNS]


def test_a_submitted_request_reads_back_from_its_row(store):
    host = store.spec.host_names[0]
    shaped = Request("shaped", 8, "t1", priority=3, utility=0.25, submitted_at=1000.0,
                     constraints=Constraints.parse({"allowed_hosts": [host], "min_gbps": 10.0}),
                     time_limit_s=3600.0, comm_fraction=0.3, shape=Shape.parse("tp=2,pp=2,dp=2"), scaling=0.9)
    elastic = Request("elastic", 4, "t2", submitted_at=1001.0, preemptible=True, checkpoint_s=60.0,
                      checkpoint_every_s=900.0, min_k=2, max_k=8, k_step=2)
    plain = Request("plain", 1, submitted_at=1002.0)
    q.submit(store, [shaped, elastic, plain])
    with store.read() as conn:
        rows = {r["id"]: r for r in conn.execute(sa.select(T_REQ)).mappings()}
    for req in (shaped, elastic, plain):
        assert request_of(rows[req.id]) == req
        assert rows[req.id]["status"] == "pending" and rows[req.id]["attempts"] == 0
    # what a submit writes is what the mapper makes: every column but the store's arrival order
    written = request_row(elastic, ts=5.0)
    assert set(written) == set(REQUEST_COLUMNS)
    assert {c: rows["elastic"][c] for c in FIELD_COLUMNS} == {c: written[c] for c in FIELD_COLUMNS}
    # a request without a submit time is stamped with the submit's
    assert request_row(dataclasses.replace(plain, submitted_at=None), ts=7.0)["submitted_at"] == 7.0
