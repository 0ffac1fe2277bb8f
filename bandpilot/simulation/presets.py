"""Which named configurations can a simulation be compared against? Baselines are flags, not recipes.

* ``slurm`` - what a Slurm site runs: FIFO order, EASY backfill (``sched/backfill``), compact
  placement (``topo``: fewest hosts, then the tightest GPUs) or, on clusters with NVLink domains,
  ``topology/block`` (``block``), no preemption.
* ``greedy`` - this project's queue before reservations: FIFO, every request takes what fits now
  (backfill with no reservation), BandPilot placement with no locality margin.
* ``greedy-topo`` - the same greedy queue with compact placement (the "FIFO + topo" reference).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bandpilot.errors import BandPilotError
from bandpilot.simulation.engine import SimConfig

# Every queue knob a preset does not name would leak in from the caller's config (the defaults
# move as the recommended configuration changes): a baseline pins them all.
_PLAIN: dict[str, Any] = {"start_or_wait": "off", "reservations": 1, "age_slot": "off", "backfill_check": "set"}

PRESETS: dict[str, dict[str, Any]] = {
    "slurm": {"policy": "fifo", "backfill": "easy", "algorithm": "topo", "locality": 0.0, "placement_pricing": "now", "preempt": "off",
              **_PLAIN},
    "greedy": {"policy": "fifo", "backfill": "greedy", "algorithm": "bandpilot", "locality": 0.0, "placement_pricing": "now", "preempt": "off",
              **_PLAIN},
    "greedy-topo": {"policy": "fifo", "backfill": "greedy", "algorithm": "topo", "locality": 0.0, "placement_pricing": "now", "preempt": "off",
              **_PLAIN},
}


def apply_preset(cfg: SimConfig, name: str, spec: Any) -> SimConfig:
    """``cfg`` with the preset's policy, backfill and placement (``block`` instead of ``topo`` on NVLink domains)."""
    if name not in PRESETS:
        raise BandPilotError(f"unknown baseline {name!r}: use one of {', '.join(PRESETS)}")
    p = dict(PRESETS[name])
    if p["algorithm"] == "topo" and getattr(spec, "nvlink_domains", False) and name == "slurm":
        p["algorithm"] = "block"
    return replace(cfg, **p)
