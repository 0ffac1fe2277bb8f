"""The ``srpt`` elastic admission rule (issue 22, a flag): pending requests by estimated remaining
work, a newcomer claiming half its k, the admitted jobs with less remaining work keeping their size
against it; and the remaining-work estimate from the store (run-time estimate minus attained
service over the job's generations)."""

from __future__ import annotations

import math

import pytest

from bandpilot import queue as q
from bandpilot.queue.clock import use_clock
from bandpilot.queue.generations import Resize, resize
from bandpilot.scheduling.batch import run_batch
from bandpilot.scheduling.elastic import Candidate, elastic_quotas
from bandpilot.scheduling.elastic_remaining import done_share, remaining_work, speed

from tests.test_elastic import _Lowest, new_store
from bandpilot.scheduling.profile import SchedulerProfile


def test_srpt_admits_by_remaining_work_and_only_longer_jobs_yield():
    # a running job with little work left keeps its 16 GPUs: a long newcomer (claim 8) does not fit
    # beside it and a 12-GPU short one; a short newcomer makes the long running one yield to min_k
    short_run = Candidate("r", 16, 2, 16, 1, 0.5, True, remaining=100.0)
    long_p = Candidate("long", 16, 4, 32, 1, 0.9, False, remaining=1e6)
    short_p = Candidate("short", 24, 4, 32, 1, 0.1, False, remaining=50.0)
    got = elastic_quotas([short_run, long_p, short_p], 32, "srpt")
    assert set(got) == {"r", "short"}  # short: r (more remaining) yields to 2, 2 + 12 <= 32; long: 16 + 24 + 8 > 32
    # the same candidates under fit-k (utility order, running at min_k): the long one is admitted first
    assert set(elastic_quotas([short_run, long_p, short_p], 32, "fit-k")) == {"r", "long"}
    # a running job with MORE remaining work than the newcomer yields to its min_k
    long_run = Candidate("r", 16, 2, 16, 1, 0.5, True, remaining=1e7)
    assert set(elastic_quotas([long_run, long_p], 32, "srpt")) == {"r", "long"}  # 2 + 8 <= 32
    # unknown remaining work (inf) orders last, ties keep the caller's order
    a = Candidate("a", 8, 8, 8, 1, 0.5, False)
    b = Candidate("b", 8, 8, 8, 1, 0.5, False, remaining=10.0)
    assert list(elastic_quotas([a, b], 8, "srpt")) == ["b"]


def test_speed_and_done_share_follow_the_runtime_models_compute_share():
    assert speed(8, 8, 0.9) == 1.0 and speed(16, 8, 0.9) == pytest.approx(2 * 0.9)
    assert speed(2, 8, 0.9) == pytest.approx(0.25 / 0.81)
    assert done_share([(100.0, 8)], 8, 1.0, 400.0) == pytest.approx(0.25)
    assert done_share([(100.0, 8), (100.0, 16)], 8, 1.0, 400.0) == pytest.approx(0.75)
    assert done_share([(1000.0, 8)], 8, 1.0, 400.0) == 1.0


def test_remaining_work_reads_estimates_and_attained_generations(tmp_path):
    t = [1000.0]
    with use_clock(lambda: t[0]):
        s = new_store(tmp_path)
        try:
            q.submit(s, [{"id": "e", "k": 8, "min_k": 2, "max_k": 16, "submitted_at": 900.0},
                         {"id": "p", "k": 4, "min_k": 1, "max_k": 8, "submitted_at": 950.0},
                         {"id": "u", "k": 4, "min_k": 1, "max_k": 8, "submitted_at": 960.0}])
            q.set_estimates(s, {"e": 4000.0, "p": 600.0})
            run_batch(s, _Lowest(s.spec), SchedulerProfile("test"))  # everything fits: all three start at t = 1000
            t[0] = 2000.0  # 1,000 s at 8 GPUs: a quarter of e's estimate
            held = q.assignment(s, "e")["gpus"]
            resize(s, Resize("e", tuple(held[:2])))  # then 2 GPUs: speed 0.25 / 0.81 of 8 (eta 0.9)
            t[0] = 2000.0 + 810.0
            with s.read() as conn:
                rem = remaining_work(conn, {"e": 2, "u": 4}, [], t[0], {"e": 0.9})
            done = 0.25 + 810.0 * (0.25 / 0.81) / 4000.0
            assert rem["e"] == pytest.approx(4000.0 * 8 * (1 - done))
            assert rem["u"] == math.inf  # no estimate, nothing learned: unknown
            pend = q.Request(id="x", k=4)
            with s.read() as conn:
                assert remaining_work(conn, {}, [pend], t[0], {})["x"] == math.inf
        finally:
            s.close()
