"""Rail layout of a shaped placement: inside each unit, one host's GPUs carry ranks of ONE DP group.

The search cuts TP groups host by host, so on a host (an NVL72 tray: 4 GPUs) the ranks are one TP
group, i.e. ``tp`` different DP groups, and every DP ring of the job leaves the host on its rails
beside the others: the contention rule prices them as siblings sharing the host's capacity. The
rail layout re-deals the GPUs the placement already holds in each unit (host set, GPU set and the
ranks each unit holds unchanged): the unit's GPUs in host order go to its ranks ordered by stage,
then TP index, then DP replica, so a host carries consecutive replicas of one (stage, TP index) -
one DP group - and each TP group spreads over ``tp`` hosts of the unit. On clusters whose unit
is an NVLink domain the TP groups stay inside it (NVLink switches, a few percent below one tray),
while the DP rings stop sharing hosts. Where units are hosts the re-deal only permutes ranks within
a host (no change in groups' hosts), so it is meant for NVLink-domain clusters.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, score
from bandpilot.dispatch.shape import Shape


def rail_layout(p: Placement, shape: Shape, unit: np.ndarray, stage_first: bool = True) -> Placement:
    """``p`` with each unit's GPUs re-dealt to its ranks in (stage, TP index, replica) order (or
    (TP index, stage, replica) with ``stage_first`` off)."""
    k, tp, dp = shape.k, shape.tp, shape.dp
    r = np.arange(k)
    t, d, s = r % tp, (r // tp) % dp, r // (tp * dp)
    u = unit[p.hosts]
    gpu_order = np.lexsort((p.idx, p.hosts, u))  # ranks' GPUs, unit by unit, in host order
    keys = (d, t, s) if stage_first else (d, s, t)
    rank_order = np.lexsort(keys + (u,))  # ranks, unit by unit, in the rail order
    hosts, idx = np.empty_like(p.hosts), np.empty_like(p.idx)
    hosts[rank_order], idx[rank_order] = p.hosts[gpu_order], p.idx[gpu_order]
    return Placement(hosts, idx, label=p.label.split("+rail")[0] + "+rail")


def refine_rail(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray) -> Placement:
    """``best`` or its rail layout (either order), whichever is predicted fastest (two candidates)."""
    unit = pred.spec.units[0]
    cands = [rail_layout(best, shape, unit, first) for first in (True, False)]
    score(pred, shape, cands)
    top = min(cands, key=lambda c: c.step_ms)
    return top if top.step_ms < best.step_ms * (1 - 1e-9) else best
