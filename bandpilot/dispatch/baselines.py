"""Model-free dispatching baselines (paper Sec. V-A4): Random, Default (proximity), Topo (Slurm-like).

Each takes the cluster spec, the (constraint-filtered) free mask vector and ``k`` and returns a
per-host mask vector with exactly ``k`` free GPUs. None of them looks at bandwidth.

* **Random** - ``k`` free GPUs uniformly at random from a seeded generator.
* **Default** (proximity) - fill GPUs in host order, and inside a host in NUMA-node then index
  order (``topology.numa`` from the spec; index order when absent).
* **Topo** (Slurm-like compactness) - fewest hosts and best fit: if a host can hold ``k``, the one
  whose free count fits ``k`` most tightly; otherwise fill the fullest hosts first and put the
  remainder on the host that fits it most tightly. Inside a host, pick the subset with the best
  link classes, i.e. the smallest sum of pairwise link weights (NV < PIX < PXB < PHB/NODE < SYS),
  as Slurm's topology weights would.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, Topology, popcount

#: Slurm-style link weights (lower is better / more compact).
LINK_WEIGHT = {"X": 0.0, "NV": 1.0, "PIX": 2.0, "PXB": 3.0, "PHB": 4.0, "NODE": 4.0, "SYS": 5.0}


def random_select(spec: ClusterSpec, free: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    free = np.asarray(free, dtype=np.int64)
    gpus = [(h, i) for h in range(spec.n_hosts) for i in range(spec.hosts[h].n_gpus) if free[h] >> i & 1]
    pick = rng.choice(len(gpus), size=k, replace=False)
    out = np.zeros(spec.n_hosts, dtype=np.int64)
    for j in pick:
        h, i = gpus[int(j)]
        out[h] |= np.int64(1) << i
    return out


def _numa_order(topo: Topology) -> list[int]:
    numa = topo.numa or (0,) * topo.n
    return sorted(range(topo.n), key=lambda i: (numa[i], i))


def default_select(spec: ClusterSpec, free: np.ndarray, k: int) -> np.ndarray:
    free = np.asarray(free, dtype=np.int64)
    out = np.zeros(spec.n_hosts, dtype=np.int64)
    left = k
    for h, host in enumerate(spec.hosts):
        for i in _numa_order(host.topology):
            if left == 0:
                return out
            if free[h] >> i & 1:
                out[h] |= np.int64(1) << i
                left -= 1
    return out


@lru_cache(maxsize=64)
def _compactness(topo: Topology) -> np.ndarray:
    """Sum of pairwise link weights of every subset mask of one host."""
    n = topo.n
    masks = np.arange(1 << n, dtype=np.int64)
    cost = np.zeros(1 << n)
    for i in range(n):
        for j in range(i + 1, n):
            both = ((masks >> i) & 1) & ((masks >> j) & 1)
            cost += both * LINK_WEIGHT[topo.links[i][j]]
    cost.setflags(write=False)
    return cost


def compact_subset(topo: Topology, free_mask: int, c: int) -> int:
    """The most compact ``c``-subset of ``free_mask`` (lowest link-weight sum, then lowest mask)."""
    n = topo.n
    masks = np.arange(1 << n, dtype=np.int64)
    ok = ((masks & ~np.int64(free_mask)) == 0) & (popcount(masks) == c)
    cand = masks[ok]
    cost = _compactness(topo)[cand]
    return int(cand[np.lexsort((cand, cost))[0]])


def topo_select(spec: ClusterSpec, free: np.ndarray, k: int) -> np.ndarray:
    free = np.asarray(free, dtype=np.int64)
    f = popcount(free)
    hosts = np.arange(spec.n_hosts)
    counts = np.zeros(spec.n_hosts, dtype=np.int64)
    fit = hosts[f >= k]
    if fit.size:
        h = fit[np.lexsort((fit, f[fit]))[0]]  # tightest fit, then host order
        counts[h] = k
    else:
        order = hosts[np.lexsort((hosts, -f))]  # fullest first
        left = k
        used = np.zeros(spec.n_hosts, dtype=bool)
        for h in order:
            if f[h] == 0 or left == 0:
                break
            # last host: best fit for the remainder among the hosts not used yet
            rest = np.flatnonzero(~used & (f >= left))
            if rest.size:
                counts[rest[np.lexsort((rest, f[rest]))[0]]] = left
                left = 0
                break
            counts[h] = f[h]
            left -= int(f[h])
            used[h] = True
    out = np.zeros(spec.n_hosts, dtype=np.int64)
    for h in np.flatnonzero(counts):
        out[h] = compact_subset(spec.hosts[h].topology, int(free[h]), int(counts[h]))
    return out


def block_select(spec: ClusterSpec, free: np.ndarray, k: int, segment: int | None = None) -> np.ndarray:
    """Slurm ``topology/block``-like: blocks are the units (NVLink domains, else hosts). A job that
    fits a block goes to the best-fit block (fewest free nodes' GPUs left, then block order);
    a larger one is cut into segments (``segment`` GPUs, default a whole block) and each segment
    goes to the best-fit block in turn. Inside a block, :func:`topo_select` (compact)."""
    free = np.asarray(free, dtype=np.int64)
    unit, _ = spec.units
    U = int(unit.max()) + 1
    f = popcount(free)
    ufree = np.bincount(unit, weights=f, minlength=U).astype(np.int64)
    size = np.bincount(unit, weights=spec.gpus_per_host, minlength=U).astype(np.int64)
    out = np.zeros(spec.n_hosts, dtype=np.int64)
    if int(ufree.max()) >= k:
        chunks = [k]
    else:
        seg = int(segment or size.max())
        chunks = [seg] * (k // seg) + ([k % seg] if k % seg else [])
    for c in chunks:
        fit = np.flatnonzero(ufree >= c)
        if fit.size:
            u = int(fit[np.lexsort((fit, ufree[fit]))[0]])
        else:  # no block holds the chunk: the fullest block, the rest to the next chunks
            u = int(np.argmax(ufree))
            c = int(ufree[u])
        if c == 0:
            break
        part = topo_select(spec, np.where(unit == u, free, 0), c)
        out |= part
        free = free & ~part
        ufree[u] -= c
    if int(popcount(out).sum()) < k:  # defensive: fill anywhere compactly
        out |= topo_select(spec, free, k - int(popcount(out).sum()))
    return out
