"""Busy cluster states for the scale benchmark, built in time linear in the busy GPUs.

``bench_dispatch.random_state`` scans every host per job and calls the fabric once per job, which
is fine on 1,000 GPUs and takes minutes on 100,000. Here jobs are drawn the way a
domain-aware scheduler leaves a big cluster: most jobs packed into one NVLink domain (or, larger
than a domain, over whole domains), some scattered over random trays (fragmentation), sizes
spread from 1 GPU to 1,024 so the number of jobs grows with the cluster but stays in the
hundreds to low thousands. Demands come from one chunked fabric call at the end.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.state import Job, State
from bandpilot.topology.cluster import ClusterSpec

#: Job sizes (GPUs) and their weights: many small jobs, some rack-sized and multi-rack ones.
SIZES = np.array([1, 2, 4, 8, 16, 32, 64, 72, 128, 144, 256, 512, 1024])
WEIGHTS = np.array([6, 5, 6, 6, 5, 4, 3, 3, 2, 2, 1.5, 1, 0.5])
#: Share of jobs scattered over random trays instead of packed (fragmentation).
SCATTER = 0.3


def busy_state(spec: ClusterSpec, fabric, rng: np.random.Generator, frac: float, profile: str = "moderate",
               reserve: int = 0, scatter: float = SCATTER) -> State:
    """A state with about ``frac`` of the GPUs busy (at least ``reserve`` left free); ``profile``
    sets the jobs' demand: ``idle`` (0), ``moderate`` (25-75 % of their bandwidth), ``heavy`` (all).
    ``scatter``: share of the jobs' draws that take a random tray instead of a whole domain (1.0:
    every domain keeps some free GPUs - the state where a large gang spans the most domains)."""
    H = spec.n_hosts
    unit = spec.units[0]
    free = [int(m) for m in spec.full_masks.tolist()]
    members: dict[int, list[int]] = {}
    for h, u in enumerate(unit.tolist()):
        members.setdefault(u, []).append(h)
    units = list(members)
    target = min(int(frac * spec.n_gpus), spec.n_gpus - reserve)
    p = WEIGHTS / WEIGHTS.sum()
    busy, jobs = 0, []
    while busy < target:
        size = int(min(rng.choice(SIZES, p=p), target - busy))
        taken: dict[int, int] = {}
        left = size
        tries = 0
        while left > 0 and tries < 50 * size + 1000:
            tries += 1
            if rng.random() < scatter:
                hosts = [int(rng.integers(H))]
            else:
                hosts = members[units[int(rng.integers(len(units)))]]
            for h in hosts:
                bits = free[h]
                while bits and left > 0:
                    b = bits & -bits
                    bits ^= b
                    free[h] ^= b
                    taken[h] = taken.get(h, 0) | b
                    left -= 1
                if left == 0:
                    break
        if left:  # the cluster is too full for this draw; stop
            for h, m in taken.items():
                free[h] |= m
            break
        busy += size
        jobs.append(taken)
    masks = np.zeros((len(jobs), H), dtype=np.int64)
    for i, taken in enumerate(jobs):
        for h, m in taken.items():
            masks[i, h] = m
    demand = np.zeros(len(jobs))
    if profile != "idle" and jobs:
        bw = np.concatenate([fabric.bandwidth_masks(masks[i : i + 64]) for i in range(0, len(jobs), 64)])
        demand = bw if profile == "heavy" else bw * rng.uniform(0.25, 0.75, size=len(jobs))
    names = spec.host_names
    out = []
    for i, taken in enumerate(jobs):
        gpus = tuple(f"{names[h]}:{g}" for h in sorted(taken) for g in range(64) if taken[h] >> g & 1)
        out.append(Job(f"j{i}", gpus, float(demand[i]), masks[i]))
    return State(spec, np.array(free, dtype=np.int64), tuple(out))
