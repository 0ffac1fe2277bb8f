"""Fabrics: the ground-truth bandwidth ``B(S)`` of a GPU allocation.

One interface, vectorised over many allocations given as per-host mask rows:

* :class:`TraceFabric` - the oracle on measured data (intra tables per host, an inter table keyed
  by the per-host count pattern, combined as the spec says).
* :class:`EmulatorFabric` - a parametric physical model for clusters we cannot measure: ring
  bottlenecks over the ``nvidia-smi topo`` link classes inside a host, NIC rails per host (so
  cross-host bandwidth follows the smallest per-host GPU count), a switch cap that falls with the
  number of hosts, an optional domain (rack) level, and seeded measurement noise for profiling.

Both share the hierarchy the dispatcher exploits: a cross-host allocation's bandwidth depends on
per-host counts and, through ``min``, on each host's stage-1 (intra) bandwidth - so within a host
only the chosen subset's stage-1 value matters.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from bandpilot.cluster import ClusterSpec, Topology, load_cluster, popcount
from bandpilot.errors import DataError, SpecError

# Default per-GPU-type parameters (GB/s). ``link`` is busbw a ring edge of that class sustains
# (NV is per NVLink), ``k0`` shapes how ring efficiency grows with ring size, ``cap`` bounds a
# host (NVSwitch/PCIe root complex). Calibrated against the public BandPilot tables: see README.
DEFAULT_GPU_PARAMS: dict[str, dict[str, Any]] = {
    "H100": {"link": {"NV": 16.4, "PIX": 25.0, "PXB": 22.0, "PHB": 18.0, "NODE": 16.0, "SYS": 12.0}, "k0": 0.56, "cap": 262.0},
    "A800": {"link": {"NV": 12.8, "PIX": 20.0, "PXB": 18.0, "PHB": 15.0, "NODE": 13.0, "SYS": 10.0}, "k0": 0.2, "cap": 110.0},
    "A100": {"link": {"NV": 12.8, "PIX": 20.0, "PXB": 18.0, "PHB": 15.0, "NODE": 13.0, "SYS": 10.0}, "k0": 0.2, "cap": 240.0},
    "V100": {"link": {"NV": 21.1, "PIX": 10.0, "PXB": 9.0, "PHB": 8.0, "NODE": 7.0, "SYS": 4.0}, "k0": 0.1, "cap": 95.0},
    "A6000": {"link": {"NV": 9.6, "PIX": 22.0, "PXB": 20.3, "PHB": 15.0, "NODE": 13.0, "SYS": 11.9}, "k0": 0.1, "cap": 45.0},
    "RTX4090": {"link": {"NV": 10.0, "PIX": 3.8, "PXB": 7.0, "PHB": 8.0, "NODE": 9.0, "SYS": 10.7}, "k0": 0.1, "cap": 11.0},
}
GENERIC_GPU_PARAMS: dict[str, Any] = {
    "link": {"NV": 20.0, "PIX": 20.0, "PXB": 18.0, "PHB": 15.0, "NODE": 13.0, "SYS": 10.0},
    "k0": 0.3,
    "cap": 200.0,
}
DEFAULT_NETWORK: dict[str, float] = {
    "rail_efficiency": 0.77,  # achieved busbw per rail / line rate (H100 1+1 = 38.5 GB/s of 50)
    "switch_base": 1.1,  # switch cap (in rails' worth of bandwidth) as n_hosts -> infinity
    "switch_peer": 1.8,  # extra cap for few hosts: cap = base + peer / (n_hosts - 1)
    "count_gain": 0.08,  # cap grows mildly with the smallest per-host count (more channels)
    "sharpness": 12.0,  # smooth-min exponent between NIC and switch limits
    "cross_domain_factor": 0.5,  # traffic leaving a domain (rack) shares its uplinks
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
        from bandpilot.dataset import intra_lookup, read_inter_table, read_intra_table

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
def gpu_params(spec: ClusterSpec, gpu: str) -> dict[str, Any]:
    """Emulator parameters for a GPU type: spec overrides on top of the built-in defaults."""
    base = DEFAULT_GPU_PARAMS.get(gpu, GENERIC_GPU_PARAMS)
    over = (spec.emulator.get("gpus") or {}).get(gpu) or {}
    link = {**base["link"], **(over.get("link") or {})}
    return {**base, **over, "link": link}


def network_params(spec: ClusterSpec) -> dict[str, float]:
    over = spec.emulator.get("network") or {}
    unknown = set(over) - set(DEFAULT_NETWORK)
    if unknown:
        raise SpecError(f"cluster {spec.name!r}: unknown emulator.network keys {sorted(unknown)}")
    return {**DEFAULT_NETWORK, **{k: float(v) for k, v in over.items()}}


def _edge_matrix(topo: Topology, link: dict[str, float]) -> np.ndarray:
    n = topo.n
    bw = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            cls = topo.links[i][j]
            bw[i, j] = link["NV"] * topo.nvlinks[i][j] if cls == "NV" else link[cls]
    return bw


def ring_bottleneck(bw: np.ndarray, nodes: Sequence[int]) -> float:
    """Best ring's slowest edge over ``nodes`` (exact for <= 8 GPUs, spanning-tree bound above)."""
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
                continue  # a ring and its reverse are the same ring
            ring = (first, *perm, first)
            val = min(bw[ring[i], ring[i + 1]] for i in range(k))
            if val > best:
                best = val
        return float(best)
    # Larger hosts: the max-min spanning tree bottleneck bounds any ring; good enough for a model.
    sub = bw[np.ix_(nodes, nodes)]
    in_tree = {0}
    best = math.inf
    while len(in_tree) < k:
        cand = [(sub[i, j], j) for i in in_tree for j in range(k) if j not in in_tree]
        val, j = max(cand)
        best = min(best, val)
        in_tree.add(j)
    return float(best)


@lru_cache(maxsize=64)
def _emulated_stage1(topo: Topology, link_items: tuple, k0: float, cap: float) -> np.ndarray:
    link = dict(link_items)
    bw = _edge_matrix(topo, link)
    n = topo.n
    table = np.zeros(1 << n)
    for mask in range(1 << n):
        nodes = [i for i in range(n) if mask >> i & 1]
        k = len(nodes)
        if k < 2:
            continue
        ring = ring_bottleneck(bw, nodes)
        # Ring efficiency rises with ring size (more channels, better pipelining), capped per host.
        eff = k / (k + k0) / (2 / (2 + k0))
        table[mask] = min(ring * eff, cap)
    table.setflags(write=False)
    return table


class EmulatorFabric(Fabric):
    """Parametric physical model; deterministic ``bandwidth``, noisy ``measure``."""

    def __init__(self, spec: ClusterSpec, noise: float | None = None, seed: int | None = None) -> None:
        super().__init__(spec)
        self.net = network_params(spec)
        self.noise = float(spec.emulator.get("noise", 0.02) if noise is None else noise)
        self.seed = int(spec.emulator.get("seed", 0) if seed is None else seed)
        if self.noise < 0:
            raise SpecError(f"cluster {spec.name!r}: emulator.noise must be >= 0")
        self._host_params = [gpu_params(spec, h.gpu) for h in spec.hosts]
        rail = spec.nic_gbps / 8.0 * self.net["rail_efficiency"]
        per_host = spec.emulator.get("rails") or {}
        self._rails = np.array([int(per_host.get(h.gpu, spec.rails_per_host)) for h in spec.hosts])
        self._rail_gbps = np.array(
            [float(self._host_params[i].get("nic_gbps", spec.nic_gbps)) / 8.0 * self.net["rail_efficiency"] for i in range(spec.n_hosts)]
        )
        self._rail_default = rail
        doms = [h.domain or "" for h in spec.hosts]
        uniq = {d: i for i, d in enumerate(dict.fromkeys(doms))}
        self._domain = np.array([uniq[d] for d in doms])
        self._multi_domain = len(uniq) > 1

    def stage1_table(self, h: int) -> np.ndarray:
        p = self._host_params[h]
        link = tuple(sorted((k, float(v)) for k, v in p["link"].items()))
        return _emulated_stage1(self.spec.hosts[h].topology, link, float(p["k0"]), float(p["cap"]))

    def network(self, counts: np.ndarray) -> np.ndarray:
        used = counts > 0
        n_hosts = used.sum(axis=1)
        rails_used = np.minimum(counts, self._rails[None, :])
        # NIC saturation: every rank exchanges through its host's rails, so the host with the
        # fewest GPUs (fewest rails in use) bounds the collective.
        per_host = np.where(used, rails_used * self._rail_gbps[None, :], np.inf)
        nic = per_host.min(axis=1)
        min_count = np.where(used, counts, np.iinfo(np.int64).max).min(axis=1)
        rail_unit = np.where(used, self._rail_gbps[None, :], np.inf).min(axis=1)
        peers = np.maximum(n_hosts - 1, 1)
        cap = rail_unit * (self.net["switch_base"] + self.net["switch_peer"] / peers)
        cap = cap * (1.0 + self.net["count_gain"] * np.log(np.maximum(min_count, 1)))
        if self._multi_domain:
            doms = np.where(used, self._domain[None, :], -1)
            n_dom = np.array([len(set(r[r >= 0].tolist())) for r in doms])
            cap = np.where(n_dom > 1, cap * self.net["cross_domain_factor"], cap)
        p = self.net["sharpness"]
        return (nic ** -p + cap ** -p) ** (-1.0 / p)

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
