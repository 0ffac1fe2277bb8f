"""A named baseline is the same configuration whatever the caller's config (or the moving defaults) say."""

from dataclasses import fields, replace
from pathlib import Path

import pytest

from bandpilot.simulation.engine import SimConfig
from bandpilot.simulation.presets import PRESETS, apply_preset
from bandpilot.topology.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]

# what the queue does (not the experiment's axes: demand model, seed, elastic jobs, timing)
QUEUE_KNOBS = ("policy", "algorithm", "backfill", "reservations", "locality", "placement_pricing", "preempt",
               "start_or_wait", "age_slot")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_pins_every_queue_knob(name):
    spec = load_cluster(ROOT / "params" / "clusters" / "h100.yaml")
    odd = SimConfig(policy="utility", algorithm="bandpilot", backfill="conservative", reservations=7, locality=0.3,
                    placement_pricing="lifetime", preempt="on", start_or_wait="on", age_slot="oldest")
    plain = SimConfig(policy="fifo", backfill="greedy", reservations=1, locality=0.0, start_or_wait="off")
    a, b = apply_preset(odd, name, spec), apply_preset(plain, name, spec)
    assert {k: getattr(a, k) for k in QUEUE_KNOBS} == {k: getattr(b, k) for k in QUEUE_KNOBS}
    assert a.start_or_wait == "off" and a.preempt == "off" and a.age_slot == "off"  # baselines have none


def test_queue_knobs_cover_the_config():
    """A new SimConfig field that changes the queue must be added here (and pinned by the presets)."""
    names = {f.name for f in fields(SimConfig)}
    assert set(QUEUE_KNOBS) <= names
    assert replace(SimConfig(), reservations=3).reservations == 3
