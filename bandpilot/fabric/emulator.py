"""How would a cluster we cannot measure perform? :class:`EmulatorFabric`, a parametric physical
model: the ring model inside a host (:mod:`bandpilot.fabric.rings`), NIC rails per host (so
cross-host bandwidth follows the smallest per-host GPU count), a switch cap that falls with the
number of hosts, an optional domain (rack) level, multi-node NVLink domains (NVL72-class: trays
talk over the NVLink switches inside a domain, over NIC rails between domains - a bandwidth cliff at
the domain boundary), and seeded measurement noise for profiling. Its parameters are fitted to
measurement tables by :mod:`bandpilot.fabric.calibration`.
:func:`make_fabric` picks measured tables when a spec has them, else this emulator.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bandpilot.config import SOURCE_ROOT

from bandpilot.topology.cluster import ClusterSpec, Topology, load_cluster, popcount
from bandpilot.errors import SpecError
from bandpilot.fabric import unit_delta
from bandpilot.fabric.base import Fabric
from bandpilot.fabric.rings import emulated_stage1, ring_efficiency
from bandpilot.fabric.trace import TraceFabric
from bandpilot.fabric.units import unit_index

#: The calibrated constants (per-GPU-type parameters, network, NVLink domains), with their citations
#: and calibration notes: ``params/emulator.yaml`` beside the package. Specs override them per cluster.
CONSTANTS_FILE = SOURCE_ROOT / "params" / "emulator.yaml"
GPU_PARAM_KEYS = frozenset(
    {"link", "pcie", "uplink", "sys", "p2p", "cap", "sharpness", "hop_penalty", "ring_eff", "k0", "nic_gbps"}
)
_CONSTANT_KEYS = ("generic_gpu", "gpu", "network", "nvlink", "count_gain_max")


def load_constants(path: str | Path = CONSTANTS_FILE) -> dict[str, Any]:
    """The emulator's constants file, checked: every section present, no unknown key."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise SpecError(f"emulator constants not found: {p}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: invalid YAML ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict) or set(doc) != set(_CONSTANT_KEYS):
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{p}: expected the sections {list(_CONSTANT_KEYS)}, got {got}")
    for name, gp in {"generic_gpu": doc["generic_gpu"], **{f"gpu.{k}": v for k, v in (doc["gpu"] or {}).items()}}.items():
        if not isinstance(gp, dict) or set(gp) - GPU_PARAM_KEYS or not isinstance(gp.get("link", {}), dict):
            raise SpecError(f"{p}: {name} must be a mapping of {sorted(GPU_PARAM_KEYS)}")
    return doc


_CONSTANTS = load_constants()
GENERIC_GPU_PARAMS: dict[str, Any] = _CONSTANTS["generic_gpu"]
#: Per GPU type: its calibrated parameters over the generic ones (a fitted ``ring_eff`` replaces ``k0``).
DEFAULT_GPU_PARAMS: dict[str, dict[str, Any]] = {}
for _name, _over in _CONSTANTS["gpu"].items():
    _full = {**GENERIC_GPU_PARAMS, **_over, "link": {**GENERIC_GPU_PARAMS["link"], **_over["link"]}}
    if "ring_eff" in _over:
        _full.pop("k0", None)
    DEFAULT_GPU_PARAMS[_name] = _full
DEFAULT_NETWORK: dict[str, float] = {k: float(v) for k, v in _CONSTANTS["network"].items()}
DEFAULT_NVLINK: dict[str, float | None] = dict(_CONSTANTS["nvlink"])
#: The count gain is not extrapolated past the largest host it was fitted on (see the YAML).
COUNT_GAIN_MAX = int(_CONSTANTS["count_gain_max"])


def nvlink_params(spec: ClusterSpec) -> dict[str, float | None]:
    over = spec.emulator.get("nvlink") or {}
    if not isinstance(over, dict):
        raise SpecError(f"cluster {spec.name!r}: emulator.nvlink must be a mapping")
    unknown = set(over) - set(DEFAULT_NVLINK)
    if unknown:
        raise SpecError(f"cluster {spec.name!r}: unknown emulator.nvlink keys {sorted(unknown)}")
    out = {**DEFAULT_NVLINK, **over}
    for key, val in out.items():
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0):
            raise SpecError(f"cluster {spec.name!r}: emulator.nvlink.{key} must be a positive number, got {val!r}")
    return out


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
        pod_racks = self.net["pod_racks"]
        if pod_racks < 0 or pod_racks != int(pod_racks) or not 0 < self.net["cross_pod_factor"] <= 1:
            raise SpecError(f"cluster {spec.name!r}: emulator.network pod_racks must be a whole number >= 0 "
                            "and cross_pod_factor in (0, 1]")
        self._pod = self._domain // int(pod_racks) if pod_racks else None
        self._nvl = bool(spec.nvlink_domains)
        if self._nvl:
            self._units = unit_index(spec)
            self._unit, self._unit_nvl = self._units.unit, self._units.is_nvl
            nv = nvlink_params(spec)
            # per host: in-domain cross-tray busbw before the rank-count efficiency
            self._nvl_gbps = np.array(
                [float(nv["gbps"]) if nv["gbps"] else float(nv["efficiency"]) * float(p["cap"]) for p in self._host_params]
            )
            # per unit: the slowest tray's NVLink term (inf outside NVLink domains)
            self._unvl = np.full(self._unit_nvl.size, np.inf)
            np.minimum.at(self._unvl, self._unit, np.where(self._unit_nvl[self._unit], self._nvl_gbps, np.inf))
            nvl_hosts = np.flatnonzero(self._unit_nvl[self._unit])
            self._nvl_p0 = self._host_params[int(nvl_hosts[0])] if nvl_hosts.size else None

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
          ``cross_domain_factor`` when the hosts span several domains (racks), and
          ``cross_pod_factor`` more when they span several pods (``pod_racks`` racks under one
          spine: a three-tier leaf/spine/core fat-tree).
        * The two combine by a smooth minimum of exponent ``sharpness``.
        """
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        if self._nvl:
            return self._network_nvl(counts)
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
            if self._pod is not None:
                pods = np.where(used, self._pod[None, :], -1)
                lo = np.where(used, self._pod[None, :], np.iinfo(np.int64).max).min(axis=1)
                cap = np.where(pods.max(axis=1) > lo, cap * net["cross_pod_factor"], cap)
        p = net["sharpness"]
        with np.errstate(over="ignore", divide="ignore"):
            return (nic**-p + cap**-p) ** (-1.0 / p)

    def predict_columns(self, masks: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Exact column-restricted ``B`` (see :meth:`Fabric.predict_columns`): stage 1 and the
        network read only the used hosts' parameters, so ``n x len(cols)`` work, not ``n x n_hosts``."""
        if type(self).bandwidth_masks is not Fabric.bandwidth_masks or not self._nvl or self.combine != "min_intra":
            return super().predict_columns(masks, cols)
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        cols = np.asarray(cols, dtype=np.int64)
        if masks.shape[0] >= unit_delta.DELTA_FROM:
            got = unit_delta.predict_columns_delta(self, masks, cols)
            if got is not None:
                return got
        counts = popcount(masks)
        used = counts > 0
        n_used = used.sum(axis=1)
        intra = self.stage1[cols[None, :], masks]
        out = np.zeros(masks.shape[0])
        single = n_used == 1
        out[single] = intra[single].sum(axis=1)
        cross = n_used >= 2
        if cross.any():
            net = self._network_nvl(counts[cross], cols)
            big = np.where(counts[cross] >= 2, intra[cross], np.inf)
            out[cross] = np.minimum(net, big.min(axis=1))
        return out

    def _groups(self, cols: np.ndarray | None):
        """Columns grouped by unit: (column order or None, segment starts, unit of each segment)."""
        if cols is None:
            ix = self._units
            return (None if ix.sorted else ix.order), ix.starts, np.arange(ix.U), None
        u = self._unit[cols]
        order = None if np.all(np.diff(u) >= 0) else np.argsort(u, kind="stable")
        us = u if order is None else u[order]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]])
        return order, starts, us[starts], (cols if order is None else cols[order])

    def _network_nvl(self, counts: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Cross-host busbw on a cluster with NVLink domains: the unit that talks over NIC rails is
        the NVLink domain (a host outside any domain is its own unit).

        * Inside one domain (several trays): the NVLink switch path, ``nvl_gbps * ring_eff(k)``,
          the same for every split over trays (the switches are non-blocking).
        * Across units: the inter-host formula of :meth:`network` with units for hosts - NIC term
          ``min_u Σ_trays min(count, rails) * rail``, switch cap by units used, smallest and mean
          unit count (count gain capped at :data:`COUNT_GAIN_MAX`) - and never above the NVLink
          term of a domain the allocation spans several trays of.
        """
        # per-unit sums as segmented sums over the columns grouped by unit (``cols``: only these hosts)
        order, starts, seg_unit, gcols = self._groups(cols)
        if order is not None:
            counts = counts[:, order]
        hcols = slice(None) if gcols is None else gcols
        return self._network_units(*unit_delta.unit_sums(counts, self._rails[hcols], self._rail_gbps[hcols], starts), seg_unit)

    def _network_units(self, ucount: np.ndarray, urails: np.ndarray, utrays: np.ndarray, railmin: np.ndarray,
                       seg_unit: np.ndarray) -> np.ndarray:
        """:meth:`_network_nvl` from per-unit sums ``(n, units)`` (:func:`unit_delta.unit_sums`) of
        the units ``seg_unit``: GPUs, NIC line rate, trays used, slowest rail of a used tray."""
        uused = ucount > 0
        n_u = uused.sum(axis=1)
        # NVLink term per domain spanned over >= 2 trays: its own rank count's ring efficiency
        eff = np.ones(ucount.shape)
        multi = (utrays >= 2) & self._unit_nvl[seg_unit][None, :]
        if multi.any():
            eff[multi] = ring_efficiency(self._nvl_p0, ucount[multi])
        nvl_term = np.where(multi, self._unvl[seg_unit][None, :] * eff, np.inf).min(axis=1)
        out = nvl_term.copy()
        cross = n_u >= 2
        if cross.any():
            uc, ur, uu = ucount[cross], urails[cross], uused[cross]
            nic = np.where(uu, ur, np.inf).min(axis=1)
            big = np.iinfo(np.int64).max
            min_count = np.maximum(np.where(uu, uc, big).min(axis=1), 1)
            rail_unit = railmin[cross].min(axis=1)
            net = self.net
            nu = n_u[cross]
            cap = rail_unit * (net["switch_base"] + net["switch_peer"] / np.maximum(nu - 1, 1))
            cap = cap * (1.0 + net["count_gain"] * np.log(np.minimum(min_count, COUNT_GAIN_MAX)))
            mean_count = uc.sum(axis=1) / nu
            cap = cap / (1.0 + net["imbalance"] * (nu >= 3) * (mean_count / min_count - 1.0))
            p = net["sharpness"]
            with np.errstate(over="ignore", divide="ignore"):
                x = (nic**-p + cap**-p) ** (-1.0 / p)
            out[cross] = np.minimum(x, nvl_term[cross])
        return out

    def scale_out(self, counts: np.ndarray) -> np.ndarray:
        """Rows whose traffic rides NIC rails: several NVLink domains (or hosts outside one)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        if not self._nvl:
            return super().scale_out(counts)
        return self._units.any(counts).sum(axis=1) >= 2

    def nvlink_spanning(self, counts: np.ndarray) -> np.ndarray:
        """Rows spanning >= 2 trays of some NVLink domain (their GPUs' NVLinks carry cross-tray traffic)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        if not self._nvl:
            return super().nvlink_spanning(counts)
        trays = self._units.sum(counts > 0)
        return ((trays >= 2) & self._unit_nvl[None, :]).any(axis=1)

    def _network_cap(self, counts: np.ndarray) -> np.ndarray:
        used = counts > 0
        if self._nvl:  # line rate of the NIC rails between units; NVLink inside a domain: unbounded here
            line = self._units.sum(np.minimum(counts, self._rails[None, :]) * self._rail_gbps[None, :])
            bound = np.where(line > 0, line, np.inf).min(axis=1) / self.net["rail_efficiency"]
            return np.where(self.scale_out(counts), bound, np.inf)
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
    fab: Fabric = TraceFabric(spec) if spec.source == "trace" else EmulatorFabric(spec, **kwargs)
    if spec.emulator.get("faults"):
        from bandpilot.fabric.faults import FaultyFabric, parse_faults

        fab = FaultyFabric(fab, parse_faults(spec.emulator["faults"], spec, f"{spec.name}: faults"))
    return fab
