"""What does a degraded link do to bandwidth? Fault injection for any fabric (emulator or trace).

Each fault scales one part of the fabric by ``factor`` (0 = failed); allocations feel it through the
fabric's hierarchy (see :class:`FaultyFabric`):

* ``nvlink_width`` - one GPU's NVLink at reduced width: every allocation using that GPU (a ring is as
  fast as its slowest link);
* ``nvlink_pair``  - one degraded GPU pair: allocations using both GPUs;
* ``nic_rail``     - a slow NIC rail (GPU ``rail``'s rail): cross-host allocations using that GPU;
* ``slow_host``    - every allocation touching the host;
* ``missing_gpu``  - the GPU is gone: allocations using it fail (factor 0);
* ``host_link``    - the path between two hosts (a cable, a switch port, a route): cross-host
  allocations using both ``host`` and ``peer_host``. Not in :data:`KINDS` (the probe plan's decoder
  localizes faults inside a host); pairwise sweeps (:mod:`bandpilot.health.pairwise`) find it.

Faults come from a spec (``faults:``) or a YAML/JSON file (``--inject FILE``), or are drawn at random
(:func:`random_fault`), seeded and reproducible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bandpilot.errors import SpecError
from bandpilot.fabric.base import Fabric
from bandpilot.topology.cluster import ClusterSpec, popcount

KINDS = ("nvlink_width", "nvlink_pair", "nic_rail", "slow_host", "missing_gpu")
LINK_KINDS = ("host_link",)
DEFAULT_FACTOR = {"nvlink_width": 0.5, "nvlink_pair": 0.5, "nic_rail": 0.5, "slow_host": 0.7, "missing_gpu": 0.0,
                  "host_link": 0.6}


@dataclass(frozen=True)
class Fault:
    kind: str
    host: str
    gpu: int | None = None  # nvlink_width, missing_gpu, nic_rail (the rail's GPU); nvlink_pair: first GPU
    peer: int | None = None  # nvlink_pair: second GPU
    factor: float | None = None
    peer_host: str | None = None  # host_link: the other end

    @property
    def scale(self) -> float:
        return DEFAULT_FACTOR[self.kind] if self.factor is None else float(self.factor)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_faults(items: Any, spec: ClusterSpec, source: str = "faults") -> list[Fault]:
    """Validate fault entries against the cluster: one clear error naming the entry and what is wrong."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise SpecError(f"{source}: faults must be a list")
    out = []
    for i, it in enumerate(items):
        where = f"{source}[{i}]"
        if not isinstance(it, dict):
            raise SpecError(f"{where}: a fault must be a mapping with kind and host")
        unknown = sorted(set(it) - {"kind", "host", "gpu", "peer", "factor", "peer_host"})
        if unknown:
            raise SpecError(f"{where}: unknown keys {unknown}")
        kind, host = it.get("kind"), it.get("host")
        if kind not in KINDS + LINK_KINDS:
            raise SpecError(f"{where}: kind must be one of {KINDS + LINK_KINDS}, got {kind!r}")
        if host not in spec.host_index:
            raise SpecError(f"{where}: host {host!r} is not in cluster {spec.name!r}")
        other = it.get("peer_host")
        if kind == "host_link" and (other not in spec.host_index or other == host):
            raise SpecError(f"{where}: host_link needs peer_host = another host of cluster {spec.name!r}, got {other!r}")
        if kind != "host_link" and other is not None:
            raise SpecError(f"{where}: only host_link takes peer_host")
        n = spec.hosts[spec.host_index[host]].n_gpus
        needs = {"nvlink_width": ("gpu",), "missing_gpu": ("gpu",), "nic_rail": ("gpu",),
                 "nvlink_pair": ("gpu", "peer"), "slow_host": (), "host_link": ()}[kind]
        for key in needs:
            v = it.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
                raise SpecError(f"{where}: {kind} needs {key} = a GPU index 0..{n - 1} of {host}, got {v!r}")
        if kind == "nvlink_pair" and it["gpu"] == it["peer"]:
            raise SpecError(f"{where}: nvlink_pair needs two different GPUs")
        factor = it.get("factor")
        if factor is not None and (not isinstance(factor, (int, float)) or not 0 <= factor <= 1):
            raise SpecError(f"{where}: factor must be a number in [0, 1], got {factor!r}")
        out.append(Fault(kind, host, it.get("gpu"), it.get("peer"), None if factor is None else float(factor), other))
    return out


def load_faults(path: str | Path, spec: ClusterSpec) -> list[Fault]:
    import yaml

    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read fault file {p}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: invalid YAML ({exc.__class__.__name__})") from None
    if isinstance(doc, dict):
        doc = doc.get("faults")
    return parse_faults(doc, spec, str(p))


def random_fault(spec: ClusterSpec, kind: str, rng: np.random.Generator, factor: float | None = None) -> Fault:
    """One fault of ``kind`` at a random host/GPU/pair (seeded by ``rng``)."""
    h = spec.hosts[int(rng.integers(spec.n_hosts))]
    if kind == "host_link":
        other = spec.hosts[int((spec.host_index[h.name] + 1 + rng.integers(spec.n_hosts - 1)) % spec.n_hosts)]
        return Fault(kind, h.name, None, None, factor, other.name)
    g = int(rng.integers(h.n_gpus))
    peer = None
    if kind == "nvlink_pair":
        peer = int((g + 1 + rng.integers(h.n_gpus - 1)) % h.n_gpus)
    return Fault(kind, h.name, None if kind == "slow_host" else g, peer, factor)


class FaultyFabric(Fabric):
    """``base`` with faults, through the fabric's own hierarchy: NVLink faults lower the stage-1 values of
    the subsets they touch (and reach cross-host allocations through the ``min`` with stage 1), a slow
    NIC rail lowers the network term of cross-host allocations using its GPU, a slow host both, and an
    allocation with a missing GPU gets nothing."""

    def __init__(self, base: Fabric, faults: Sequence[Fault]) -> None:
        super().__init__(base.spec)
        self.base = base
        self.faults = list(faults)
        self.combine = base.combine
        idx = base.spec.host_index
        self._where = [(f, idx[f.host]) for f in self.faults]
        self._other = {id(f): idx[f.peer_host] for f in self.faults if f.peer_host is not None}

    def _hits(self, masks: np.ndarray, kinds: tuple[str, ...], cross: np.ndarray | None = None,
              spanning: np.ndarray | None = None) -> np.ndarray:
        out = np.ones(masks.shape[0])
        for f, h in self._where:
            if f.kind not in kinds:
                continue
            m = masks[:, h]
            if f.kind == "slow_host":
                hit = m != 0
            elif f.kind == "host_link":
                hit = (m != 0) & (masks[:, self._other[id(f)]] != 0)
            elif f.kind == "nvlink_pair":
                assert f.gpu is not None and f.peer is not None  # checked when the fault was made
                both = (1 << f.gpu) | (1 << f.peer)
                hit = (m & both) == both
            else:  # nvlink_width, missing_gpu, nic_rail: the GPU (or the rail it drives) is used
                hit = ((m >> f.gpu) & 1).astype(bool)
                if f.kind == "nvlink_width":
                    # stage 1: a lone GPU uses no NVLink; network: only rows across trays of an NVLink domain
                    hit &= (popcount(m) >= 2) if spanning is None else spanning
                if f.kind == "nic_rail" and cross is not None:
                    hit &= cross
            out = np.where(hit, out * (0.0 if f.kind == "missing_gpu" else f.scale), out)
        return out

    def stage1_table(self, h: int) -> np.ndarray:
        t = self.base.stage1[h].copy()
        masks = np.zeros((t.size, self.spec.n_hosts), dtype=np.int64)
        masks[:, h] = np.arange(t.size)
        return t * self._hits(masks, ("nvlink_width", "nvlink_pair", "slow_host", "missing_gpu"))

    def network(self, counts: np.ndarray) -> np.ndarray:
        return self.base.network(counts)

    def bandwidth_masks(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        counts = popcount(masks)
        used = counts > 0
        cross = used.sum(axis=1) >= 2
        intra = self.stage1[np.arange(self.spec.n_hosts)[None, :], masks]
        out = np.where(used.sum(axis=1) == 1, intra.sum(axis=1), 0.0)
        if cross.any():
            c = masks[cross]
            # NIC faults hit traffic that leaves NVLink (every cross-host row, except inside an
            # NVLink domain); a narrow NVLink also slows the rows crossing a domain's switches
            net = self.base.network(counts[cross]) * self._hits(
                c, ("nic_rail", "slow_host", "nvlink_width", "host_link"), self.base.scale_out(counts[cross]),
                self.base.nvlink_spanning(counts[cross]))
            if self.combine == "min_intra":
                net = np.minimum(net, np.where(counts[cross] >= 2, intra[cross], np.inf).min(axis=1))
            out[cross] = net
        return out * self._hits(masks, ("missing_gpu",))

    def measure(self, masks: np.ndarray, seed: int | None = None, repeat: int = 0) -> np.ndarray:
        """The faulty truth with the base fabric's measurement noise."""
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        truth = self.base.bandwidth_masks(masks)
        noise = np.divide(self.base.measure(masks, seed=seed, repeat=repeat), truth, out=np.ones_like(truth), where=truth > 0)
        return self.bandwidth_masks(masks) * noise
