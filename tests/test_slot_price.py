"""Issue 21, eighth round: the age slot that prices its drain (``--age-slot priced``,
:mod:`bandpilot.scheduling.slot_price`)."""

from __future__ import annotations

import pytest
from test_reservations import Clock, _drain_scenario

from bandpilot.queue.clock import use_clock
from bandpilot.scheduling import age_slot, slot_price

#: G's drain at 9 h: host 3's 8 free GPUs idle until A's expected end (100,000 s); A's 24 GPUs none.
G_IDLE_GPU_H = 8 * (100_000 - 9 * 3600) / 3600


@pytest.mark.parametrize("price, reserved", [
    (1.0, ["G"]),  # 150 idle GPU-h for 640 GPU-h of work (32 GPUs x 20 h): cheap, G takes the slot
    (0.2, ["S"]),  # dearer than 0.2 x 640 = 128 GPU-h: G is priced out, the slot passes to S
])
def test_the_priced_age_slot_skips_a_gang_whose_drain_idles_more_than_it_brings(store, fab, monkeypatch, price, reserved):
    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", 0.0)  # every pending request competes
    monkeypatch.setattr(slot_price, "DRAIN_PRICE", price)
    seen: dict[tuple[str, float], float] = {}  # (request, batch time) -> idle GPU-h
    real = slot_price.idle_gpu_hours

    def spy(book, r):
        seen[r.request_id, book.now] = out = real(book, r)
        return out

    monkeypatch.setattr(slot_price, "idle_gpu_hours", spy)
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
