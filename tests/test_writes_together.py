"""Store.writes_together: the writes of a block share one transaction, each a savepoint (the
simulator writes arrivals, estimates, entropy reports and releases before every batch in one
commit). Shared with ``test_queue_pg.py`` (:func:`scenario_writes_together`)."""

from __future__ import annotations

import pytest

from bandpilot import queue as q
from bandpilot.errors import RequestError

from test_queue import h100, new_store


def _ids(store: q.Store) -> set[str]:
    return {r["id"] for r in q.list_requests(store)}


def scenario_writes_together(store: q.Store) -> None:
    with store.writes_together():
        q.submit(store, [{"id": "a", "k": 2}, {"id": "b", "k": 2}])
        q.set_estimates(store, {"a": 60.0})
        with store.writes_together():  # nested: the same transaction
            q.report_entropy(store, [{"job": "a", "entropy": 0.5}])
        assert _ids(store) == set()  # another connection sees nothing before the block ends
        with pytest.raises(RequestError, match="no job 'zz'"):  # a failed write is undone on its own ...
            q.report_entropy(store, [{"job": "b", "entropy": 0.4}, {"job": "zz", "entropy": 0.1}])
        q.submit(store, [{"id": "c", "k": 2}])  # ... and the block goes on
    assert _ids(store) == {"a", "b", "c"}
    assert [h["epoch"] for h in q.entropy_history(store, "a")] == [0]
    assert q.entropy_history(store, "b") == []
    with pytest.raises(RuntimeError):  # an error leaving the block undoes all of it
        with store.writes_together():
            q.submit(store, [{"id": "d", "k": 2}])
            raise RuntimeError("boom")
    assert _ids(store) == {"a", "b", "c"}
    q.submit(store, [{"id": "e", "k": 2}])  # outside a block: a transaction of its own again
    assert "e" in _ids(store)


def test_writes_together_sqlite(tmp_path):
    s = new_store(f"sqlite:///{tmp_path / 'q.db'}", h100())
    try:
        scenario_writes_together(s)
    finally:
        s.close()
