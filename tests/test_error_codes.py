"""Errors carry a code; the API maps codes to HTTP statuses in one table (no message matching)."""

from __future__ import annotations

import pytest

from bandpilot.api.problems import STATUS_BY_CODE, status_for
from bandpilot.errors import BandPilotError, PlacementError, RequestError, SpecError, StateError
from bandpilot.queue.intake import SubmitError
from bandpilot.queue.quotas import DuplicateId, QuotaExceeded
from bandpilot.queue.store import StoreError


@pytest.mark.parametrize("exc,code,status", [
    (StoreError("store x is busy"), "store_error", 500),  # the text no longer decides
    (StoreError("store x: locked", code="store_busy"), "store_busy", 503),
    (SubmitError(["body: request id 'a' already exists in the store"], 0), "invalid_request", 422),
    (SubmitError(["body: request id 'a' already exists in the store"], 0, "duplicate_id"), "duplicate_id", 409),
    (StateError("no active job 'j'"), "conflict", 409),
    (StateError("no active job 'j'", code="not_found"), "not_found", 404),
    (RequestError("request 'r' is assigned, not pending", code="not_pending"), "not_pending", 409),
    (RequestError("k must be >= 1"), "invalid_request", 422),
    (PlacementError("constraint_unmet", "below min_gbps"), "constraint_unmet", 422),
    (QuotaExceeded("at the limit", 30), "quota_exceeded", 429),
    (DuplicateId("request id 'a' already exists"), "duplicate_id", 409),
    (SpecError("bad spec"), "invalid_spec", 400),
    (BandPilotError("something"), "error", 400),
])
def test_code_decides_the_status(exc, code, status):
    assert exc.code == code and status_for(exc) == status
    assert code in STATUS_BY_CODE or status == 400


def test_submit_and_queue_errors_carry_their_codes(tmp_path):
    from bandpilot import queue as q
    from bandpilot.topology.cluster import load_cluster

    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(load_cluster("params/clusters/h100.yaml"))
    q.submit(store, [{"id": "a", "k": 1}])
    with pytest.raises(SubmitError) as dup:
        q.submit(store, [{"id": "a", "k": 1}])
    with pytest.raises(SubmitError) as bad:
        q.submit(store, [{"id": "b", "k": 0}, {"id": "a", "k": 1}])
    assert (dup.value.code, bad.value.code) == ("duplicate_id", "invalid_request")
    with pytest.raises(StateError) as missing:
        q.release(store, "nope")
    assert missing.value.code == "not_found"
    with pytest.raises(StateError) as pending:
        q.release(store, "a")
    assert pending.value.code == "conflict"  # the request exists but holds no job
    q.cancel(store, "a")
    with pytest.raises(RequestError) as again:
        q.cancel(store, "a")
    assert again.value.code == "not_pending"
