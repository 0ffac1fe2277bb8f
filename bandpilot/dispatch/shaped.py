"""``Dispatcher.select(k, state, shape=...)``: shape-aware placement and its baselines.

* ``shape`` (default with a shape): :func:`bandpilot.dispatch.search.shape.shape_search`;
* ``blind``: topology-blind compact placement (:func:`topo_select`), ranks in GPU-id order;
* ``segment``: Slurm ``--segment`` = TP degree with block placement (:func:`block_select`), ranks in
  GPU-id order;
* ``bandpilot``: the bandwidth-only search ignoring the shape, ranks in GPU-id order.

Every result is scored the same way (per-axis GB/s, step time), so they compare like for like.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bandpilot.dispatch.baselines import block_select, topo_select
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, rank_order, score, shape_search
from bandpilot.dispatch.shape import Shape
from bandpilot.errors import PlacementError

SHAPE_ALGORITHMS = ("shape", "blind", "segment", "bandpilot")


def shaped_select(spec: Any, free: np.ndarray, shape: Shape, algorithm: str, pred: ContentionPredictor,
                  bandwidth_only: Callable[[], np.ndarray], bandwidth_seed: bool = True) -> tuple[Placement, int]:
    """The placement ``algorithm`` makes for ``shape`` (scored), and the candidates it scored."""
    if algorithm not in SHAPE_ALGORITHMS:
        raise PlacementError("invalid_request",
                             f"algorithm {algorithm!r} does not take a shape; choose from {list(SHAPE_ALGORITHMS)}")
    k = shape.k
    if algorithm == "shape":
        # the compact and bandwidth-only sets are seeds (re-laid out) and compete as they are (GPU-id
        # order), so the result is never predicted slower than those baselines unless the TP rule
        # (TP groups inside a unit whenever a candidate can) excludes them; the segment baseline
        # is not a seed: block_select's per-segment search costs more than the shape search
        seeds = {"compact": topo_select(spec, free, k)}
        if bandwidth_seed:  # the bandwidth-only search's cost, for its set: less contended hosts
            seeds["bandwidth"] = bandwidth_only()
        fixed = []
        for name, m in seeds.items():
            fixed.append(rank_order(spec, m))
            fixed[-1].label = f"{name}/gpu-order"
        return shape_search(pred, free, shape, seeds, fixed)
    if algorithm == "blind":
        mask = topo_select(spec, free, k)
    elif algorithm == "segment":
        mask = block_select(spec, free, k, shape.tp)
    else:
        mask = bandwidth_only()
    p = rank_order(spec, mask)
    p.label = algorithm
    score(pred, shape, [p])
    return p, 1


def placement_dict(p: Placement, spec: Any, shape: Shape) -> dict[str, Any]:
    return {
        "shape": shape.to_dict(),
        "ranks": p.gpus(spec),
        "axis_gbps": {a: round(float(v), 6) for a, v in p.axis_gbps.items()},
        "comm_ms": {a: round(float(v), 6) for a, v in p.comm_ms.items()},
        "compute_ms": round(float(p.compute_ms), 6),
        "step_ms": round(float(p.step_ms), 6),
        "layout": p.label,
    }
