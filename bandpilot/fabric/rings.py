"""What does one host sustain for a GPU subset? The multi-ring (channel) model inside a host,
over the ``nvidia-smi topo`` links (NVLinks, PCIe ports, switch uplinks, the inter-socket link),
compiled once per topology into every subset's stage-1 bandwidth.
"""

from __future__ import annotations

import itertools
import json
import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from bandpilot.topology.cluster import Topology
from bandpilot.errors import SpecError

# A channel (multi-ring) model inside a host (the emulator adds NIC rails + switch between hosts).
#
# Inside a host, NCCL runs a collective as a set of rings ("channels") over the GPUs of the
# subset. A ring is an undirected Hamiltonian cycle used in both directions; each of its hops
# loads *resources* of the host, each with a per-direction capacity (GB/s):
#
#   nv(i,j)    the NVLinks between i and j: ``nvlinks * link.NV``
#   pair(i,j)  a PCIe path of class PIX/PXB/PHB/NODE/SYS: ``link[class]`` (what one GPU pair sustains)
#   port(v)    GPU v's PCIe port (``pcie``): every non-NVLink hop at v
#   up(g)      the uplink of PCIe switch group g (GPUs joined by PIX/PXB, ``uplink``): hops that
#              leave the group - or, without GPU peer-to-peer (``p2p: false``, e.g. GeForce cards),
#              *every* PCIe hop, staged through host memory
#   sys        the inter-socket link (``sys``): hops between sockets
#
# Rings are packed greedily like NCCL's search does: take the ring with the highest bottleneck
# rate on the residual capacities, subtract its load, repeat (at most ``MAX_RINGS`` rings). A ring
# at rate r in both directions adds 2r of bus bandwidth (a 2-GPU "ring" loads its only edge twice,
# so it adds the edge's capacity). The packed capacity ``raw`` is then shaped by
#
#   * a pipeline term for slow hops: ``1 / (1/raw + hop_penalty * mean_hop(1/capacity))`` over the
#     best ring's hops, so among rings with the same bottleneck those with faster other hops win;
#   * a smooth cap ``(x**-p + cap**-p) ** (-1/p)``, ``p = sharpness``: the host's copy-engine /
#     memory ceiling (NVSwitch hosts are cap-bound, not link-bound);
#   * ``ring_eff[k-2]``: NCCL's protocol/channel choice per rank count at the profiled message size
#     (fitted; falls back to ``k/(k+k0)`` normalised at k=2).
#
# The table depends only on (topology, GPU-type parameters); it is computed once and cached.
MAX_RINGS = 8
MIN_RING_SHARE = 0.02  # a ring adding less than this share of the subset's bandwidth is not opened
_FULL_ENUMERATION = 8  # hosts up to this size enumerate every ring; larger hosts sample a few
_SAMPLED_RINGS = 4
_HOP_KINDS = ("nv", "pair")


def _socket_of(topo: Topology) -> list[int]:
    """Socket per GPU: NUMA affinity when the spec gives it, else a 2-colouring of the SYS relation
    (GPUs with no SYS link at all share socket 0)."""
    n = topo.n
    if topo.numa is not None:
        return list(topo.numa)
    col = [-1] * n
    nxt = 0
    for s in range(n):
        if col[s] >= 0:
            continue
        if not any(topo.links[s][v] == "SYS" for v in range(n) if v != s):
            col[s] = 0
            continue
        col[s] = nxt
        stack = [s]
        while stack:
            u = stack.pop()
            for v in range(n):
                if v != u and topo.links[u][v] == "SYS" and col[v] < 0:
                    col[v] = 2 * nxt + 1 - col[u]  # the component's other socket (nxt or nxt + 1)
                    stack.append(v)
        nxt += 2
    return col


def switch_group_of(topo: Topology) -> list[int]:
    """PCIe switch group per GPU: connected components of the PIX/PXB relation."""
    n = topo.n
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(n):
        for j in range(i + 1, n):
            if topo.links[i][j] in ("PIX", "PXB"):
                parent[find(i)] = find(j)
    ids: dict[int, int] = {}
    return [ids.setdefault(find(i), len(ids)) for i in range(n)]


def _ring_orders(k: int, full: bool) -> np.ndarray:
    """Ring orders over positions ``0..k-1`` (position 0 first; a ring and its reverse counted once)."""
    if k == 2:
        return np.array([[0, 1]])
    if full:
        return np.array([(0, *p) for p in itertools.permutations(range(1, k)) if p[0] < p[-1]])
    rng = np.random.default_rng(k)  # deterministic sample: the index-order ring plus random ones
    extra = [np.concatenate(([0], 1 + rng.permutation(k - 1))) for _ in range(_SAMPLED_RINGS - 1)]
    return np.array([np.arange(k), *extra])


def _pair_loads(topo: Topology, p2p: bool) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """Per undirected GPU pair: the (resource, load) contributions of one ring hop over it, as a
    (pairs, resources) matrix; the pair index of every (i, j); the resources in index order."""
    n = topo.n
    sock = _socket_of(topo)
    grp = switch_group_of(topo)
    group_size = np.bincount(grp)
    res: dict[tuple, int] = {}

    def rid(key: tuple) -> int:
        return res.setdefault(key, len(res))

    pair_id = -np.ones((n, n), dtype=np.int64)
    contrib: list[dict[int, float]] = []
    for i in range(n):
        for j in range(i + 1, n):
            pair_id[i, j] = pair_id[j, i] = len(contrib)
            c: dict[int, float] = {}
            if topo.links[i][j] == "NV" and topo.nvlinks[i][j] > 0:
                c[rid(("nv", i, j))] = 1.0
            else:
                c[rid(("pair", i, j))] = 1.0
                for w in (i, j):
                    c[rid(("port", w))] = c.get(rid(("port", w)), 0.0) + 1.0
                if not p2p or grp[i] != grp[j]:
                    for w in (i, j):
                        if group_size[grp[w]] < 2:
                            continue  # a lone GPU's uplink is its port
                        key = rid(("up", grp[w]))
                        c[key] = c.get(key, 0.0) + 1.0
                if sock[i] != sock[j]:
                    c[rid(("sys",))] = 1.0
            contrib.append(c)
    n_res = len(res)
    n_pairs = len(contrib)
    E = np.zeros((max(n_pairs, 1), max(n_res, 1)))
    for p, c in enumerate(contrib):
        for r, v in c.items():
            E[p, r] = v
    resources = [k for k, _ in sorted(res.items(), key=lambda kv: kv[1])]
    return pair_id, E[:n_pairs, :n_res], resources


def _ring_loads(n: int, pair_id: np.ndarray, E: np.ndarray) -> tuple[list, list, list, list, list]:
    """Subsets grouped by size (then ascending); per size, every subset gets the same ring orders:
    all rings for hosts up to _FULL_ENUMERATION GPUs, a few seeded ones above. Returns per size
    block: the subsets, and the rings' sparse loads (ring, resource, load) and subset of each ring."""
    n_res = E.shape[1]
    all_masks = np.arange(1 << n, dtype=np.int64)
    pc = np.bitwise_count(all_masks)
    bits = (all_masks[:, None] >> np.arange(n)) & 1
    mask_blocks, ent_cyc, ent_res, ent_load, cyc_sub = [], [], [], [], []
    n_subs = n_rings = 0
    for k in range(2, n + 1):
        sub = all_masks[pc == k]
        nodes = np.nonzero(bits[sub])[1].reshape(sub.size, k)  # ascending GPU indices per subset
        orders = _ring_orders(k, full=n <= _FULL_ENUMERATION)
        ring = nodes[:, orders]  # (subsets, rings, k)
        pids = pair_id[ring, np.roll(ring, -1, axis=2)]
        step = max(1, 500_000 // (orders.size * n_res))  # bound the (subsets, rings, k, res) temporary
        for lo in range(0, sub.size, step):
            loads = E[pids[lo : lo + step]].sum(axis=2).reshape(-1, n_res)  # (subsets * rings, resources)
            rows, cols = np.nonzero(loads)
            ent_cyc.append(rows + n_rings)
            ent_res.append(cols)
            ent_load.append(loads[rows, cols])
            n_rings += loads.shape[0]
        cyc_sub.append(np.repeat(np.arange(n_subs, n_subs + sub.size), len(orders)))
        mask_blocks.append(sub)
        n_subs += sub.size
    return mask_blocks, ent_cyc, ent_res, ent_load, cyc_sub


class RingModel:
    """Every ring of every subset of one topology, as sparse resource loads (built once, cached).

    ``masks`` are the subsets of >= 2 GPUs (by size, then ascending), ``sizes`` their GPU counts.
    Rings are stored subset by subset (``cyc_sub``/``sub_start``); their loads sparse (``ent_*``) and
    as a dense ``(width, rings)`` layout (``res2``/``load2``/``hop2``) used by :meth:`pack`.
    """

    def __init__(self, topo: Topology, p2p: bool) -> None:
        n = topo.n
        self.topology = topo
        self.p2p = p2p
        pair_id, E, self.resources = _pair_loads(topo, p2p)
        n_res = len(self.resources)
        mask_blocks, ent_cyc, ent_res, ent_load, cyc_sub = _ring_loads(n, pair_id, E)
        masks = np.concatenate(mask_blocks) if mask_blocks else np.zeros(0, dtype=np.int64)
        sizes = np.bitwise_count(masks).astype(np.int64)
        n_res_ext = n_res + 1  # + the sentinel
        if masks.size:
            e_cyc = np.concatenate(ent_cyc).astype(np.int64)
            e_res = np.concatenate(ent_res).astype(np.int64)
            e_load = np.concatenate(ent_load)
            self.cyc_sub = np.concatenate(cyc_sub).astype(np.int64)
            cyc_start = np.searchsorted(e_cyc, np.arange(self.cyc_sub.size))
            self.sub_start = np.searchsorted(self.cyc_sub, np.arange(masks.size))
        else:
            e_cyc = e_res = cyc_start = self.cyc_sub = self.sub_start = np.zeros(0, dtype=np.int64)
            e_load = np.zeros(0)
        kinds = np.array([key[0] for key in self.resources] or ["none"])
        # Dense (width, rings) layout: column = ring, padded with a sentinel resource of
        # unbounded capacity (index n_res), so per-ring minima are one vectorised reduction.
        n_rings = self.cyc_sub.size
        width = int(np.bincount(e_cyc).max()) if n_rings else 0
        slot = np.arange(e_cyc.size) - cyc_start[e_cyc]
        index_type = np.int32 if masks.size * n_res_ext < 2**31 else np.int64
        self.res2 = np.full((width, n_rings), n_res, dtype=index_type)
        self.load2 = np.ones((width, n_rings))
        self.hop2 = np.zeros((width, n_rings), dtype=bool)
        self.res2[slot, e_cyc] = e_res
        self.load2[slot, e_cyc] = e_load
        self.hop2[slot, e_cyc] = np.isin(kinds[e_res], _HOP_KINDS)
        self.n_res = n_res
        self.masks = masks
        self.sizes = sizes
        self.kinds = {key[0] for key in self.resources}

    def capacities(self, params: dict[str, Any]) -> np.ndarray:
        link = params["link"]
        topo = self.topology
        cap = np.empty(len(self.resources))
        for r, key in enumerate(self.resources):
            kind = key[0]
            if kind == "nv":
                cap[r] = float(link["NV"]) * topo.nvlinks[key[1]][key[2]]
            elif kind == "pair":
                cap[r] = float(link[topo.links[key[1]][key[2]]])
            elif kind == "port":
                cap[r] = float(params.get("pcie", math.inf))
            elif kind == "up":
                cap[r] = float(params.get("uplink", math.inf))
            else:
                cap[r] = float(params.get("sys", math.inf))
        if np.any(~(cap > 0)):
            raise SpecError(f"emulator link capacities must be positive, got {dict(zip(self.resources, cap))}")
        return cap

    def pack(self, capvec: np.ndarray, stop: float) -> tuple[np.ndarray, np.ndarray]:
        """Greedy ring packing: ``(raw busbw, mean 1/capacity over the best ring's hops)`` per subset.

        A subset stops taking rings when its raw bandwidth reaches ``stop``, when nothing is left,
        or when the next ring would add less than ``MIN_RING_SHARE`` of what it has.
        """
        n_sub = len(self.masks)
        raw = np.zeros(n_sub)
        hbar = np.zeros(n_sub)
        if n_sub == 0:
            return raw, hbar
        cap_ext = np.append(np.minimum(np.asarray(capvec, dtype=float), 1e12), 1e30)
        n_res = cap_ext.size
        resid = np.tile(cap_ext, n_sub)
        # Working set, compacted as subsets finish: rings (columns) and the subsets they belong to.
        c_sub = self.cyc_sub  # working-subset index of every ring
        s_ids = np.arange(n_sub)  # working subset -> subset
        flat = (c_sub[None, :] * n_res).astype(self.res2.dtype) + self.res2
        load = self.load2
        inv = 1.0 / load
        s_start = self.sub_start
        for it in range(MAX_RINGS):
            rate = (resid[flat] * inv).min(axis=0)
            best = np.maximum.reduceat(rate, s_start)
            hit = np.flatnonzero(rate >= best[c_sub] * (1 - 1e-12))
            first = np.ones(hit.size, dtype=bool)
            first[1:] = c_sub[hit[1:]] != c_sub[hit[:-1]]
            take = best > np.maximum(1e-9, MIN_RING_SHARE * raw[s_ids])
            rings = hit[first]
            rings = rings[take[c_sub[rings]]]
            if it == 0:
                hops = self.hop2[:, rings]
                w = np.where(hops, load[:, rings] / cap_ext[self.res2[:, rings]], 0.0).sum(axis=0)
                hbar[s_ids[c_sub[rings]]] = w / self.sizes[s_ids[c_sub[rings]]]
            raw[s_ids] += np.where(take, 2.0 * best, 0.0)
            resid[flat[:, rings]] -= best[c_sub[rings]][None, :] * load[:, rings]
            keep = take & (raw[s_ids] < stop)
            if not keep.any():
                break
            if keep.sum() > 0.7 * keep.size:  # compaction pays only when many subsets are done
                continue
            cols = np.flatnonzero(keep[c_sub])
            new_s = np.cumsum(keep) - 1
            c_sub = new_s[c_sub[cols]]
            s_ids = s_ids[keep]
            flat, load, inv = flat[:, cols], load[:, cols], inv[:, cols]
            s_start = np.searchsorted(c_sub, np.arange(s_ids.size))
        return raw, hbar

    def values(self, params: dict[str, Any]) -> np.ndarray:
        """Stage-1 bandwidth of every subset in :attr:`masks` under one GPU type's parameters."""
        if self.masks.size == 0:
            return np.zeros(0)
        cap = float(params["cap"])
        p = float(params.get("sharpness", 8.0))
        raw, hbar = self.pack(self.capacities(params), stop=4.0 * cap)
        alpha = float(params.get("hop_penalty", 0.0))
        if alpha > 0:
            raw = 1.0 / (1.0 / np.maximum(raw, 1e-12) + alpha * hbar)
        shaped = (np.maximum(raw, 1e-12) ** -p + cap**-p) ** (-1.0 / p)
        return ring_efficiency(params, self.sizes) * shaped


def ring_efficiency(params: dict[str, Any], sizes: np.ndarray) -> np.ndarray:
    """Per-subset efficiency by rank count: ``ring_eff[k-2]`` (last value beyond), else ``k/(k+k0)``."""
    sizes = np.asarray(sizes)
    table = params.get("ring_eff")
    if table:
        eff = np.asarray([float(v) for v in table])
        return eff[np.clip(sizes - 2, 0, eff.size - 1)]
    k0 = float(params.get("k0", 0.0))
    return sizes / (sizes + k0) / (2.0 / (2.0 + k0))


@lru_cache(maxsize=32)
def ring_model(topo: Topology, p2p: bool = True) -> RingModel:
    """The compiled ring model of a topology (cached: hosts of one kind share it)."""
    return RingModel(topo, p2p)


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=float)


@lru_cache(maxsize=128)
def _emulated_stage1(topo: Topology, key: str) -> np.ndarray:
    params = json.loads(key)
    model = ring_model(topo, bool(params.get("p2p", True)))
    table = np.zeros(1 << topo.n)
    table[model.masks] = model.values(params)
    table.setflags(write=False)
    return table


def emulated_stage1(topo: Topology, params: dict[str, Any]) -> np.ndarray:
    """Stage-1 table (``2**n`` entries, 0 for <= 1 GPU) of a topology under GPU-type parameters."""
    return _emulated_stage1(topo, _params_key(params))


def ring_bottleneck(bw: np.ndarray, nodes: Sequence[int]) -> float:
    """Best single ring's slowest edge over ``nodes`` (exact for <= 8 GPUs, spanning-tree bound above)."""
    k = len(nodes)
    if k < 2:
        return 0.0
    if k == 2:
        return float(bw[nodes[0], nodes[1]])
    if k <= 8:
        first, rest = nodes[0], nodes[1:]
        best = 0.0
        for perm in itertools.permutations(rest):
            if perm[0] > perm[-1]:
                continue
            ring = (first, *perm, first)
            best = max(best, min(bw[ring[i], ring[i + 1]] for i in range(k)))
        return float(best)
    sub = bw[np.ix_(nodes, nodes)]
    in_tree = {0}
    best = math.inf
    while len(in_tree) < k:
        val, j = max((sub[i, j], j) for i in in_tree for j in range(k) if j not in in_tree)
        best = min(best, val)
        in_tree.add(j)
    return float(best)
