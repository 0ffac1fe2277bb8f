"""Fabrics: the ground-truth bandwidth ``B(S)`` of a GPU allocation.

One interface, vectorised over many allocations given as per-host mask rows:

* :class:`TraceFabric` - the oracle on measured data (intra tables per host, an inter table keyed
  by the per-host count pattern, combined as the spec says).
* :class:`EmulatorFabric` - a parametric physical model for clusters we cannot measure: a
  multi-ring (channel) model over the ``nvidia-smi topo`` links inside a host (NVLinks, PCIe
  ports, switch uplinks, the inter-socket link), NIC rails per host (so cross-host bandwidth
  follows the smallest per-host GPU count), a switch cap that falls with the number of hosts, an
  optional domain (rack) level, and seeded measurement noise for profiling. Its parameters are
  fitted to measurement tables by :mod:`bandpilot.fabric.calibration`.

Both share the hierarchy the dispatcher exploits: a cross-host allocation's bandwidth depends on
per-host counts and, through ``min``, on each host's stage-1 (intra) bandwidth - so within a host
only the chosen subset's stage-1 value matters, and ``B`` is monotone in every stage-1 value.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from bandpilot.topology.cluster import ClusterSpec, Topology, load_cluster, popcount
from bandpilot.errors import DataError, SpecError

# Default per-GPU-type emulator parameters (GB/s unless noted), calibrated with
# ``bandpilot calibrate`` against the public BandPilot tables (H100 from its four host tables,
# the Het-4Mix types from one host each; A100 and unknown types are uncalibrated guesses).
#   link        per-pair path capacity by ``nvidia-smi topo`` class (NV: per NVLink)
#   pcie        per-GPU PCIe port;  uplink: PCIe switch-group uplink;  sys: inter-socket link
#   p2p         GPU peer-to-peer over PCIe (false: PCIe traffic is staged through host memory)
#   cap         host ceiling, approached with exponent ``sharpness``
#   hop_penalty pipeline cost of slow hops;  ring_eff: efficiency by rank count k = 2, 3, ...
DEFAULT_GPU_PARAMS: dict[str, dict[str, Any]] = {}  # filled below
GENERIC_GPU_PARAMS: dict[str, Any] = {
    "link": {"NV": 20.0, "PIX": 20.0, "PXB": 18.0, "PHB": 15.0, "NODE": 13.0, "SYS": 10.0},
    "pcie": 24.0,
    "uplink": 24.0,
    "sys": 16.0,
    "p2p": True,
    "cap": 200.0,
    "sharpness": 8.0,
    "hop_penalty": 0.0,
    "k0": 0.3,
}
GPU_PARAM_KEYS = frozenset(
    {"link", "pcie", "uplink", "sys", "p2p", "cap", "sharpness", "hop_penalty", "ring_eff", "k0", "nic_gbps"}
)
DEFAULT_GPU_PARAMS.update(
    {
        "H100": {
            "link": {"NV": 29.72},
            "p2p": True,
            "cap": 239.9,
            "sharpness": 2.103,
            "hop_penalty": 0.3901,
            "ring_eff": [1.0, 1.051, 1.097, 0.9876, 1.0, 1.013, 1.025],
        },
        "A800": {
            "link": {"NV": 42.0},
            "p2p": True,
            "cap": 100.3,
            "sharpness": 40.0,
            "hop_penalty": 0.01,
            "ring_eff": [1.0, 0.9876, 1.005, 0.7691, 0.7459, 0.7408, 0.9394],
        },
        "V100": {
            "link": {"NV": 21.55, "SYS": 17.32},
            "pcie": 12.02,
            "sys": 9.167,
            "p2p": True,
            "cap": 74.21,
            "sharpness": 3.137,
            "hop_penalty": 0.01,
            "ring_eff": [1.0, 1.0, 1.0, 1.0, 1.0, 1.284, 1.35],
        },
        "A6000": {
            "link": {"NV": 28.38, "PXB": 30.27, "SYS": 22.84},
            "pcie": 30.34,
            "uplink": 40.68,
            "sys": 17.79,
            "p2p": True,
            "cap": 41.27,
            "sharpness": 12.1,
            "hop_penalty": 0.4946,
            "ring_eff": [1.0, 1.0, 1.0, 1.0, 1.221, 1.0, 0.9512],
        },
        "RTX4090": {
            "link": {"PIX": 6.464, "PXB": 22.76, "SYS": 42.82},
            "pcie": 12.09,
            "uplink": 13.9,
            "sys": 11.83,
            "p2p": False,
            "cap": 12.07,
            "sharpness": 5.983,
            "hop_penalty": 0.2996,
            "ring_eff": [1.0, 1.105, 1.162, 1.221, 1.221, 1.221, 0.8607],
        },
        # uncalibrated: A800 with 1.5x NVLink
        "A100": {
            "link": {"NV": 63.0},
            "p2p": True,
            "cap": 150.4,
            "sharpness": 40.0,
            "hop_penalty": 0.01,
            "ring_eff": [1.0, 0.9876, 1.005, 0.7691, 0.7459, 0.7408, 0.9394],
        },
    }
)
for _name, _over in DEFAULT_GPU_PARAMS.items():
    _full = {**GENERIC_GPU_PARAMS, **_over, "link": {**GENERIC_GPU_PARAMS["link"], **_over["link"]}}
    if "ring_eff" in _over:
        _full.pop("k0", None)
    DEFAULT_GPU_PARAMS[_name] = _full
# Network defaults: fitted to the H100 cluster's inter-host table (per-pattern MAPE 6 %).
DEFAULT_NETWORK: dict[str, float] = {
    "rail_efficiency": 0.7944,  # achieved busbw per rail / line rate (H100 1+1: 38.5 GB/s of 50)
    "switch_base": 1.041,  # switch cap (in rails' worth of bandwidth) as n_hosts -> infinity
    "switch_peer": 1.588,  # extra cap for few hosts: cap = base + peer / (n_hosts - 1)
    "count_gain": 0.2503,  # cap grows mildly with the smallest per-host count (more channels)
    "imbalance": 0.1552,  # cap falls with mean/min count on >= 3 hosts (long intra-host ring segments)
    "sharpness": 13.81,  # smooth-min exponent between NIC and switch limits
    "cross_domain_factor": 0.5,  # uncalibrated: a 2:1 oversubscribed rack uplink halves the switch cap
}


class Fabric:
    """Ground-truth bandwidth of allocations on one cluster (subclasses fill in the tables)."""

    spec: ClusterSpec

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._stage1: np.ndarray | None = None

    # -- stage 1 -------------------------------------------------------------------------
    def stage1_table(self, h: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def stage1(self) -> np.ndarray:
        """``(n_hosts, 2**max_gpus)`` stage-1 bandwidth of every subset of every host."""
        if self._stage1 is None:
            width = 1 << int(self.spec.gpus_per_host.max())
            tab = np.zeros((self.spec.n_hosts, width))
            for h in range(self.spec.n_hosts):
                t = self.stage1_table(h)
                tab[h, : t.size] = t
            self._stage1 = tab
        return self._stage1

    # -- cross-host network ----------------------------------------------------------------
    def network(self, counts: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """Inter-host bandwidth of count patterns ``(n, H)`` (only rows with >= 2 hosts matter)."""
        raise NotImplementedError

    combine = "min_intra"

    def bandwidth_masks(self, masks: np.ndarray) -> np.ndarray:
        """``B(S)`` for each row of per-host masks; 0 for allocations of <= 1 GPU."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        counts = popcount(masks)
        used = counts > 0
        n_used = used.sum(axis=1)
        intra = self.stage1[np.arange(self.spec.n_hosts)[None, :], masks]
        out = np.zeros(masks.shape[0])
        single = n_used == 1
        out[single] = intra[single].sum(axis=1)
        cross = n_used >= 2
        if cross.any():
            net = self.network(counts[cross])
            if self.combine == "min_intra":
                big = np.where(counts[cross] >= 2, intra[cross], np.inf)
                net = np.minimum(net, big.min(axis=1))
            out[cross] = net
        return out

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        """Same as :meth:`bandwidth_masks`: a fabric is a perfect predictor (Ideal-BP, Exact)."""
        return self.bandwidth_masks(masks)

    def bandwidth(self, allocations: Sequence[Iterable[str]]) -> np.ndarray:
        """``B(S)`` for allocations given as GPU-id lists."""
        return self.bandwidth_masks(self.spec.to_masks([list(a) for a in allocations]))

    def measure(self, masks: np.ndarray, seed: int = 0, repeat: int = 0) -> np.ndarray:
        """A measurement: the truth, plus noise where the fabric models it (emulator)."""
        return self.bandwidth_masks(masks)

    def cap_masks(self, masks: np.ndarray) -> np.ndarray:
        """A physical upper bound per allocation (for sanity checks and property tests)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        counts = popcount(masks)
        intra_max = self.stage1.max(axis=1)
        used = counts > 0
        single = used.sum(axis=1) == 1
        cap = np.where(single, (intra_max[None, :] * used).max(axis=1), 0.0)
        return np.where(single, cap, self._network_cap(counts))

    def _network_cap(self, counts: np.ndarray) -> np.ndarray:
        return np.full(counts.shape[0], np.inf)


# ------------------------------------------------------------------------------------------
class TraceFabric(Fabric):
    """Measured tables as the oracle. Repeated measurements are averaged."""

    def __init__(self, spec: ClusterSpec) -> None:
        super().__init__(spec)
        from bandpilot.fabric.tables import intra_lookup, read_inter_table, read_intra_table

        if spec.source != "trace":
            raise SpecError(f"cluster {spec.name!r} has no measured tables (intra per host + inter)")
        self._tables = []
        for h in spec.hosts:
            assert h.intra is not None
            rows = read_intra_table(h.intra, h.n_gpus)
            self._tables.append(intra_lookup(rows, h.n_gpus, str(h.intra)))
        assert spec.inter is not None
        self.combine = spec.inter.combine
        n = int(spec.gpus_per_host.max())
        rows = read_inter_table(spec.inter.table, spec.n_hosts, n)
        self._base = n + 1
        sums: dict[int, list[float]] = {}
        self._rows = rows
        for r in rows:
            cnt = popcount(np.array(r.masks, dtype=np.int64))
            if (cnt > 0).sum() < 2:
                continue  # single-host rows of the inter table: intra tables are authoritative
            sums.setdefault(self._key(cnt[None, :])[0], []).append(r.busbw)
        if not sums:
            raise DataError(f"{spec.inter.table}: no cross-host rows")
        keys = np.array(sorted(sums), dtype=np.int64)
        self._keys = keys
        self._vals = np.array([np.mean(sums[k]) for k in keys]) * spec.inter.scale

    def _key(self, counts: np.ndarray) -> np.ndarray:
        srt = -np.sort(-counts, axis=1)
        key = np.zeros(counts.shape[0], dtype=np.int64)
        for j in range(srt.shape[1]):
            key = key * self._base + srt[:, j]
        return key

    def stage1_table(self, h: int) -> np.ndarray:
        return self._tables[h]

    def network(self, counts: np.ndarray) -> np.ndarray:
        keys = self._key(counts)
        pos = np.searchsorted(self._keys, keys)
        pos = np.clip(pos, 0, len(self._keys) - 1)
        hit = self._keys[pos] == keys
        if not hit.all():
            bad = counts[np.flatnonzero(~hit)[0]]
            pattern = "+".join(str(int(c)) for c in sorted(bad[bad > 0], reverse=True))
            raise DataError(f"inter table of {self.spec.name!r} has no measurement for count pattern {pattern}")
        return self._vals[pos]

    def measured_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """Every measured cross-host allocation as masks with its value (for round-trip checks)."""
        rows = [r for r in self._rows if sum(1 for m in r.masks if m) >= 2]
        return np.array([r.masks for r in rows], dtype=np.int64), np.array([r.busbw for r in rows])


# ------------------------------------------------------------------------------------------
# Emulator: a channel (multi-ring) model inside a host, NIC rails + switch between hosts.
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


def _switch_group_of(topo: Topology) -> list[int]:
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
        sock = _socket_of(topo)
        grp = _switch_group_of(topo)
        group_size = np.bincount(grp)
        res: dict[tuple, int] = {}

        def rid(key: tuple) -> int:
            return res.setdefault(key, len(res))

        # Per undirected pair: the (resource, load) contributions of one hop over it.
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
        self.resources: list[tuple] = [k for k, _ in sorted(res.items(), key=lambda kv: kv[1])]

        # Subsets grouped by size (then ascending); per size, every subset gets the same ring
        # orders: all rings for hosts up to _FULL_ENUMERATION GPUs, a few seeded ones above.
        E = E[:n_pairs, :n_res]
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


def gpu_params(spec: ClusterSpec, gpu: str) -> dict[str, Any]:
    """Emulator parameters for a GPU type: spec overrides on top of the built-in defaults."""
    base = DEFAULT_GPU_PARAMS.get(gpu, GENERIC_GPU_PARAMS)
    over = (spec.emulator.get("gpus") or {}).get(gpu) or {}
    if not isinstance(over, dict):
        raise SpecError(f"cluster {spec.name!r}: emulator.gpus.{gpu} must be a mapping")
    unknown = set(over) - GPU_PARAM_KEYS
    if unknown:
        raise SpecError(f"cluster {spec.name!r}: unknown emulator.gpus.{gpu} keys {sorted(unknown)}")
    link = {**GENERIC_GPU_PARAMS["link"], **base["link"], **(over.get("link") or {})}
    out = {**base, **over, "link": link}
    if "ring_eff" in over and "k0" not in over:
        out.pop("k0", None)
    elif "k0" in over and "ring_eff" not in over:
        out.pop("ring_eff", None)
    return out


def network_params(spec: ClusterSpec) -> dict[str, float]:
    over = spec.emulator.get("network") or {}
    unknown = set(over) - set(DEFAULT_NETWORK)
    if unknown:
        raise SpecError(f"cluster {spec.name!r}: unknown emulator.network keys {sorted(unknown)}")
    return {**DEFAULT_NETWORK, **{k: float(v) for k, v in over.items()}}


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


class EmulatorFabric(Fabric):
    """Parametric physical model; deterministic ``bandwidth``, noisy ``measure``.

    Cross-host bandwidth is ``softmin(NIC, switch)`` over per-host counts (see :meth:`network`),
    combined with ``min`` over the stage-1 values of hosts with >= 2 GPUs.
    """

    def __init__(self, spec: ClusterSpec, noise: float | None = None, seed: int | None = None) -> None:
        super().__init__(spec)
        self.net = network_params(spec)
        self.noise = float(spec.emulator.get("noise", 0.02) if noise is None else noise)
        self.seed = int(spec.emulator.get("seed", 0) if seed is None else seed)
        if not self.noise >= 0:
            raise SpecError(f"cluster {spec.name!r}: emulator.noise must be >= 0")
        if self.net["rail_efficiency"] <= 0 or self.net["sharpness"] <= 0:
            raise SpecError(f"cluster {spec.name!r}: emulator.network rail_efficiency and sharpness must be positive")
        by_type = {g: gpu_params(spec, g) for g in spec.gpu_types}
        self._host_params = [by_type[h.gpu] for h in spec.hosts]
        per_type_rails = spec.emulator.get("rails") or {}
        self._rails = np.array([int(per_type_rails.get(h.gpu, spec.rails_per_host)) for h in spec.hosts])
        self._rail_gbps = np.array(
            [float(p.get("nic_gbps", spec.nic_gbps)) / 8.0 * self.net["rail_efficiency"] for p in self._host_params]
        )
        doms = [h.domain or "" for h in spec.hosts]
        uniq = {d: i for i, d in enumerate(dict.fromkeys(doms))}
        self._domain = np.array([uniq[d] for d in doms], dtype=np.int64)
        self._n_domains = len(uniq)

    def stage1_table(self, h: int) -> np.ndarray:
        return emulated_stage1(self.spec.hosts[h].topology, self._host_params[h])

    @property
    def stage1(self) -> np.ndarray:
        if self._stage1 is None:
            width = 1 << int(self.spec.gpus_per_host.max())
            tab = np.zeros((self.spec.n_hosts, width))
            done: dict[tuple[Topology, str], int] = {}
            for h, host in enumerate(self.spec.hosts):
                key = (host.topology, host.gpu)
                if key in done:  # hosts of one kind share a row
                    tab[h] = tab[done[key]]
                    continue
                t = self.stage1_table(h)
                tab[h, : t.size] = t
                done[key] = h
            self._stage1 = tab
        return self._stage1

    def network(self, counts: np.ndarray) -> np.ndarray:
        """Inter-host busbw of per-host count patterns.

        * NIC: each GPU drives its own rail, so the host with the fewest GPUs in the allocation
          (fewest rails in use) bounds the ring: ``min_h min(count_h, rails_h) * rail_h``.
        * Switch: ``rail * (switch_base + switch_peer / (n_hosts - 1))``, growing mildly with the
          smallest count (more channels: ``1 + count_gain * ln(min_count)``) and falling with
          imbalance on >= 3 hosts (``1 + imbalance * (mean_count / min_count - 1)``); times
          ``cross_domain_factor`` when the hosts span several domains (racks).
        * The two combine by a smooth minimum of exponent ``sharpness``.
        """
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        used = counts > 0
        n_hosts = used.sum(axis=1)
        rails_used = np.minimum(counts, self._rails[None, :])
        nic = np.where(used, rails_used * self._rail_gbps[None, :], np.inf).min(axis=1)
        big = np.iinfo(np.int64).max
        min_count = np.maximum(np.where(used, counts, big).min(axis=1), 1)
        rail_unit = np.where(used, self._rail_gbps[None, :], np.inf).min(axis=1)
        net = self.net
        peers = np.maximum(n_hosts - 1, 1)
        cap = rail_unit * (net["switch_base"] + net["switch_peer"] / peers)
        cap = cap * (1.0 + net["count_gain"] * np.log(min_count))
        mean_count = counts.sum(axis=1) / np.maximum(n_hosts, 1)
        cap = cap / (1.0 + net["imbalance"] * (n_hosts >= 3) * (mean_count / min_count - 1.0))
        if self._n_domains > 1:
            hit = np.zeros((counts.shape[0], self._n_domains), dtype=bool)
            rows, cols = np.nonzero(used)
            hit[rows, self._domain[cols]] = True
            cap = np.where(hit.sum(axis=1) > 1, cap * net["cross_domain_factor"], cap)
        p = net["sharpness"]
        with np.errstate(over="ignore", divide="ignore"):
            return (nic**-p + cap**-p) ** (-1.0 / p)

    def _network_cap(self, counts: np.ndarray) -> np.ndarray:
        used = counts > 0
        line = np.where(used, np.minimum(counts, self._rails[None, :]) * self._rail_gbps[None, :] / self.net["rail_efficiency"], np.inf)
        return line.min(axis=1)

    def measure(self, masks: np.ndarray, seed: int | None = None, repeat: int = 0) -> np.ndarray:
        """Truth times seeded log-normal noise, deterministic per (allocation, seed, repeat)."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        truth = self.bandwidth_masks(masks)
        if self.noise == 0:
            return truth
        s = self.seed if seed is None else seed
        z = np.array([_noise_z(row.tobytes(), s, repeat) for row in masks])
        return truth * np.exp(self.noise * z)


def _noise_z(key: bytes, seed: int, repeat: int) -> float:
    h = hashlib.blake2b(key + seed.to_bytes(8, "little", signed=True) + repeat.to_bytes(4, "little"), digest_size=8)
    return float(np.random.default_rng(int.from_bytes(h.digest(), "little")).standard_normal())


def make_fabric(spec: ClusterSpec | str, **kwargs: Any) -> Fabric:
    """The fabric a spec describes: measured tables when present, else the emulator."""
    if not isinstance(spec, ClusterSpec):
        spec = load_cluster(spec)
    return TraceFabric(spec) if spec.source == "trace" else EmulatorFabric(spec, **kwargs)
