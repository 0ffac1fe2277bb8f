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
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units
from bandpilot.dispatch.search.shape import Placement, rank_order, score, shape_search
from bandpilot.dispatch.search.shape_moves import refine_nonlocal
from bandpilot.dispatch.search.shape_rail import refine_rail
from bandpilot.dispatch.search.shape_repair import refine_repair
from bandpilot.dispatch.search.shape_refine import refine
from bandpilot.dispatch.shape import Shape
from bandpilot.errors import PlacementError

SHAPE_ALGORITHMS = ("shape", "blind", "segment", "bandpilot")

#: Refinement passes of the shape search's pick (each ``(pred, shape, placement, free) -> placement``,
#: never predicted slower than its input); ``Dispatcher.shape_refiners`` names the ones that run.
REFINERS: dict[str, Callable[..., Placement]] = {"local": refine, "nonlocal": refine_nonlocal, "rail": refine_rail,
                                                 "repair": refine_repair}
DEFAULT_REFINERS: tuple[str, ...] = ("local", "nonlocal", "repair")


def default_refiners(spec: Any) -> tuple[str, ...]:
    """The passes ``Dispatcher.shape_refiners = None`` runs: ``local`` + ``nonlocal`` + ``repair``
    where units are hosts, ``local`` + ``rail`` on NVLink-domain clusters. Measured (``python -m benchmarks
    shape``, 36 idle + busy cases): on h100-128 the non-local pass gained 3.2 points true (8.3 ->
    11.5 % below blind), p50 about 2x (interleaved A/B at load 12.5: 24.8 -> 50.8 ms, p99 225 ->
    401 ms); on nvl72x16 it gained 0.0 points (p50 35 vs 12 ms). The rail layout on nvl72x16
    (scratch A/B, ``run_cluster(..., busy=2, seed, frag=1)``): tuning state 14.6 -> 16.2 %, two held-out
    states 16.6 -> 18.1 % and 16.6 -> 17.9 % (frag states +0.5 / +1.5 / +1.7 points); CPU per
    select p50 14.9 -> 19.4 ms, p99 60 -> 66 ms (interleaved, load 10). Where units are hosts it
    only permutes a host's ranks. The re-pairing of spanning TP groups (h100-128, 2 busy + 1 frag
    states, true step time): the tuning case busy tp=8,pp=4,dp=8 1,192 -> 1,155 ms; 4 held-out state sets one
    case faster (-0.3 %), the rest identical; 7 more four faster (up to -11 %), two slower (+0.9,
    +1.7 %: the noisy guide); CPU per select p50 9.1 -> 9.4 ms, p99 37.8 -> 44.7 ms (load 2.7)."""
    return ("local", "rail") if spec.nvlink_domains else DEFAULT_REFINERS


def _chain(names: tuple[str, ...]) -> Callable[..., Placement] | None:
    passes = [REFINERS[n] for n in names]
    if not passes:
        return None

    def run(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray) -> Placement:
        for f in passes:
            best = f(pred, shape, best, free)
        return best
    return run

#: The baselines' GPU sets: each competes as it is (GPU-id order), so the shape search's predicted
#: step time is never above theirs unless the TP rule (TP groups inside a unit whenever a candidate
#: can) excludes a baseline's rank map; the compact set is also re-laid out (cut into TP groups, both
#: layouts). The block cut needs no re-layout here: the search's ``segment`` unit order makes it.
#: Both are cheap (compact < 1 ms, the block cut <= 2 ms on 1,152 GPUs at k = 256).
BASELINE_SETS: dict[str, Callable[[Any, np.ndarray, Shape], np.ndarray]] = {
    "compact": lambda spec, free, shape: topo_select(spec, free, shape.k),
    "segment": lambda spec, free, shape: block_select(spec, free, shape.k, shape.tp),
}
#: The baseline sets the search also re-lays out.
RELAID = ("compact", "bandwidth")
#: Count vectors (with the Pareto subsets of exposed hosts) up to which the bandwidth-only search is
#: an exhaustive count search of at most this many rows: cheap enough to seed every shaped search
#: with its set (4 x 8 H100 tables: <= 2,589 vectors, <= 4 ms CPU). Beyond it (h100-128: 10^18 and
#: more, the hybrid search at 18-400 ms CPU, 3-25x the shape search) the set is not a candidate
#: unless ``Dispatcher.shape_bandwidth_seed = True``.
SEED_COUNT_VECTORS = 5_000
#: Hosts with free GPUs above which the rule does not even count the vectors (counting costs ~3 ms
#: on 128 hosts, a third of a shaped select there, for a count of 10^18 and more).
SEED_MAX_HOSTS = 64


def bandwidth_seed_cheap(spec: Any, free: np.ndarray, context: Callable[[], SearchContext]) -> bool:
    """The budget rule for seeding the shape search with the bandwidth-only set: its search is
    cheap when it is exhaustive over few count vectors, or, on NVLink-domain clusters, when the job
    fits one domain's free GPUs (the domain search then scores only in-domain count patterns, 2-5 ms
    CPU on 1,152 GPUs; across domains 8-38 ms, as much as the shape search itself)."""
    if spec.nvlink_domains:
        ctx = context()
        return bool(Units(ctx).free.max(initial=0) >= ctx.k)
    if int(np.count_nonzero(free)) > SEED_MAX_HOSTS:
        return False
    return context().count_vectors(pareto=True) <= SEED_COUNT_VECTORS


def shaped_select(spec: Any, free: np.ndarray, shape: Shape, algorithm: str, pred: ContentionPredictor,
                  bandwidth_only: Callable[[], np.ndarray],
                  bandwidth_seed: bool | Callable[[], bool] = True,
                  refiners: tuple[str, ...] = DEFAULT_REFINERS) -> tuple[Placement, int]:
    """The placement ``algorithm`` makes for ``shape`` (scored), and the candidates it scored.
    ``bandwidth_seed``: whether the bandwidth-only set is a candidate, or the budget rule deciding
    it (called only for the shape search)."""
    if algorithm not in SHAPE_ALGORITHMS:
        raise PlacementError("invalid_request",
                             f"algorithm {algorithm!r} does not take a shape; choose from {list(SHAPE_ALGORITHMS)}")
    if algorithm == "shape":
        seeds = {name: make(spec, free, shape) for name, make in BASELINE_SETS.items()}
        if bandwidth_seed() if callable(bandwidth_seed) else bandwidth_seed:
            # the bandwidth-only search's set: less contended hosts, better spanning TP groups
            seeds["bandwidth"] = bandwidth_only()
        fixed, seen = [], set()
        for name, m in list(seeds.items()):
            if m.tobytes() in seen:  # the block cut is often the compact set: one copy is enough
                del seeds[name]
                continue
            seen.add(m.tobytes())
            fixed.append(rank_order(spec, m))
            fixed[-1].label = f"{name}/gpu-order"
        return shape_search(pred, free, shape, {n: m for n, m in seeds.items() if n in RELAID}, fixed, _chain(refiners))
    if algorithm in ("blind", "segment"):
        mask = BASELINE_SETS["compact" if algorithm == "blind" else algorithm](spec, free, shape)
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
