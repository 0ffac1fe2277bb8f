"""The batch loop's quick deferrals found in stretches (:class:`QuickScan`) must try the same
requests in the same order and record the same outcomes and rows as the per-request loop
(``_Batch.scan = False``, the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.constraints import Constraints
from bandpilot.queue.clock import use_clock
from bandpilot.queue.requests import Request
from bandpilot.scheduling import batch as batch_mod
from bandpilot.scheduling.quick_scan import QuickScan

from test_bulk_deferrals import _rows
from test_queue import GreedyDispatcher, h100, new_store


def _req(i: int, k: int, cons: Constraints | None = None) -> Request:
    return Request(f"r{i}", k, constraints=cons or Constraints())


def test_next_tried_by_size_and_validation():
    host = Constraints(single_host=True)
    reqs = [_req(0, 16), _req(1, 8), _req(2, 4, host), _req(3, 16), _req(4, 2), _req(5, 8, host)]
    scan = QuickScan(reqs)
    none: set = set()
    assert scan.next_tried(0, 0, none) == 0  # nothing validated yet: the first is tried
    valid = {(16, Constraints().key), (8, Constraints().key)}
    assert scan.next_tried(0, 4, valid) == 2  # (4, single_host) not validated although 4 <= 4 fits too
    valid.add((4, host.key))
    assert scan.next_tried(0, 3, valid) == 4  # 16, 8, 4, 16 do not fit 3 free GPUs; (2, plain) is new
    valid.add((2, Constraints().key))
    assert scan.next_tried(0, 1, valid) == 5  # (8, single_host) is a different key than plain 8
    valid.add((8, host.key))
    assert scan.next_tried(0, 1, valid) == scan.n  # every request validated and too large
    assert scan.next_tried(1, 8, valid) == 1 and scan.next_tried(3, 8, valid) == 4
    assert scan.next_tried(6, 99, valid) == scan.n


def test_codes_share_constraints_objects():
    c = Constraints()
    scan = QuickScan([_req(i, k, c) for i, k in enumerate([2, 4, 2, 2, 4])])
    assert len(scan.vkeys) == 2 and np.array_equal(scan.codes, [0, 1, 0, 0, 1])


def _workload(store: q.Store, wave: int) -> None:
    ks = [16, 8, 32, 4, 16, 2, 32, 8, 24, 4, 16, 32, 1, 8]
    docs = [{"id": f"w{wave}-{i:02d}", "k": k, "tenant": "AB"[i % 2]} for i, k in enumerate(ks)]
    docs += [{"id": f"w{wave}-host{i}", "k": 8, "constraints": {"single_host": True}} for i in range(2)]
    q.submit(store, docs)


@pytest.mark.parametrize("commit", ["batch", "request"])
def test_scanned_batches_equal_the_per_request_loop(tmp_path, monkeypatch, commit):
    scanned, each = (new_store(f"sqlite:///{tmp_path / n}.db", h100()) for n in ("scan", "each"))
    disp = {s: GreedyDispatcher(s.spec) for s in (scanned, each)}
    t = [1000.0]
    try:
        with use_clock(lambda: t[0]):
            for wave in range(4):
                for s in (scanned, each):
                    _workload(s, wave)
                t[0] += 60.0
                reps = []
                for s, use in ((scanned, True), (each, False)):
                    monkeypatch.setattr(batch_mod, "USE_SCAN", use)
                    reps.append(sched.run_batch(s, disp[s], policy="fifo", commit=commit))
                rs, re_ = reps
                assert [o.to_dict() for o in rs.outcomes] == [o.to_dict() for o in re_.outcomes]
                assert rs.to_dict() == re_.to_dict() and _rows(scanned) == _rows(each)
                assert [(c[0], c[2]) for c in disp[scanned].calls] == [(c[0], c[2]) for c in disp[each].calls]
                assert rs.counts()["deferred"] > 0
                for s, rep in ((scanned, rs), (each, re_)):  # free some GPUs: the next batch places more
                    for o in rep.assigned[:2]:
                        q.release(s, o.request_id)
        assert len(disp[scanned].calls) > 0
    finally:
        scanned.close()
        each.close()
