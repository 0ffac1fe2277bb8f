"""Issue 21, eighth round: the age slot that prices its drain (``--age-slot priced``,
:mod:`bandpilot.scheduling.slot_price`)."""

from __future__ import annotations

import pytest
from test_reservations import Clock, _a_blocks_g, _drain_scenario

from bandpilot.queue.clock import use_clock
from bandpilot.scheduling import age_slot, slot_price

#: G's drain at 9 h: host 3's 8 free GPUs idle until A's expected end (100,000 s); A's 24 GPUs none.
G_IDLE_GPU_H = 8 * (100_000 - 9 * 3600) / 3600


def _spy_idle(monkeypatch) -> dict[tuple[str, float], float]:
    """(request, batch time) -> the idle GPU-hours slot_price computed for it."""
    seen: dict[tuple[str, float], float] = {}
    real = slot_price.idle_gpu_hours

    def spy(book, r):
        seen[r.request_id, book.now] = out = real(book, r)
        return out

    monkeypatch.setattr(slot_price, "idle_gpu_hours", spy)
    return seen


@pytest.mark.parametrize("price, reserved", [
    (1.0, ["G"]),  # 150 idle GPU-h for 640 GPU-h of work (32 GPUs x 20 h): cheap, G takes the slot
    (0.2, ["S"]),  # dearer than 0.2 x 640 = 128 GPU-h: G is priced out, the slot passes to S
])
def test_the_priced_age_slot_skips_a_gang_whose_drain_idles_more_than_it_brings(store, fab, monkeypatch, price, reserved):
    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", 0.0)  # every pending request competes
    monkeypatch.setattr(slot_price, "DRAIN_PRICE", price)
    seen = _spy_idle(monkeypatch)
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, float("inf"), monkeypatch, age_slot="priced")
    assert [r["request_id"] for r in mid.reservations] == reserved
    assert seen["G", 9 * 3600.0] == pytest.approx(G_IDLE_GPU_H, rel=1e-6)
    if price < 1.0:  # S's GPUs at A's end are two of A's hosts: nothing idles for it, the slot is S's
        assert seen["S", 9 * 3600.0] == 0.0


def test_the_priced_age_slot_is_the_projected_one_when_the_drain_is_cheap(store, fab, monkeypatch):
    """Past the 20 h threshold only G competes, as with ``projected`` (its drain is cheap at price 1)."""
    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", 20 * 3600.0)
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, float("inf"), monkeypatch, age_slot="priced")
    assert [r["request_id"] for r in mid.reservations] == ["G"]


@pytest.mark.parametrize("slack, idle_gpu_h", [
    (1.0, 8 * 5_000 / 3600),  # the plan: A (past its 10,000 s limit at 5 h) ends 5,000 s from now
    (3.0, 8 * 12_000 / 3600),  # priced at 3x its limit: 30,000 s, so host 3 idles 12,000 s for G
])
def test_a_drain_behind_a_job_past_its_estimate_is_priced_at_the_estimate_error(store, fab, monkeypatch, slack, idle_gpu_h):
    from bandpilot import scheduling as sched

    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", 0.0)
    monkeypatch.setattr(slot_price, "OVERDUE_SLACK", slack)
    seen = _spy_idle(monkeypatch)
    clock = Clock()
    with use_clock(clock):
        d = _a_blocks_g(store, fab, clock, 10_000, age_slot="priced")
        clock.t = 18_000.0
        rep = sched.run_batch(store, d, policy="hrrn", backfill="easy", age_slot="priced")
    assert [r["request_id"] for r in rep.reservations] == ["G"]  # 640 GPU-h of work: cheap either way
    assert rep.reservations[0]["start_at"] == pytest.approx(23_000.0)  # the plan itself is unchanged
    assert seen["G", 18_000.0] == pytest.approx(idle_gpu_h, rel=1e-6)


@pytest.mark.parametrize("smaller, reserved", [(True, ["S"]), (False, ["G2"])])
def test_a_priced_out_gang_passes_the_slot_only_to_a_smaller_one(store, fab, monkeypatch, smaller, reserved):
    """At 9 h G (32 GPUs, 20 h) is priced out (150 idle GPU-h > 0.2 x 640); G2 (32 GPUs, 25 h, fresh)
    would drain the same GPUs and passes the price on its longer estimate (0.2 x 800 = 160): with
    FALLBACK_SMALLER it may not take the slot, which goes to the 16-GPU S (nothing idles for it)."""
    from bandpilot import queue as q
    from bandpilot import scheduling as sched

    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", 0.0)
    monkeypatch.setattr(slot_price, "DRAIN_PRICE", 0.2)
    monkeypatch.setattr(slot_price, "FALLBACK_SMALLER", smaller)
    clock = Clock()
    with use_clock(clock):
        d = _a_blocks_g(store, fab, clock)
        clock.t = 9 * 3600.0
        q.submit(store, [{"id": "G2", "k": 32, "time_limit_s": 90_000, "submitted": clock.t},
                         {"id": "S", "k": 16, "time_limit_s": 600, "submitted": clock.t - 700}])
        rep = sched.run_batch(store, d, policy="hrrn", backfill="easy", age_slot="priced")
    assert [r["request_id"] for r in rep.reservations] == reserved
    assert q.check_invariants(store) == []
