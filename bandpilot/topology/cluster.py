"""Cluster spec: hosts, GPUs, intra-host topology, NIC rails, domains and the bandwidth source.

One picture of a cluster shared by every stage. GPU ids are ``"<host>:<local index>"`` strings at
every API boundary; internally an allocation is a vector of per-host bitmasks (``int64`` per host),
because the hierarchy (stage-1 lookup per host, counts per host for the network) makes every hot
path a table lookup on those masks.

The YAML shape is the one used by the measurement directories in ``shared/data/measurements``::

    name: h100-16m
    collective: all_reduce_perf
    message_bytes: 16777216
    gpus_per_host: 8
    hosts:
      - {name: h100-26, gpu: H100, topology: ../../topology/h100.txt, intra: intra/h100-26.csv}
    network: {nic_gbps: 400, rails_per_host: 8}
    inter: {table: inter.csv, scale: 1.0, combine: min_intra}

Emulated clusters add ``emulator:`` parameters and may declare hosts in bulk with ``host_groups``
(``{prefix, count, gpu, topology, domain_size}``) so a 128-host spec stays a few lines long.
Paths are relative to the spec file. Multi-node NVLink domains (NVL72-class racks of trays) are
declared with ``host_groups[i].nvlink_domain_size`` or a top-level ``nvlink_domains`` list
(:mod:`bandpilot.topology.domains`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import yaml

from bandpilot.errors import SpecError
from bandpilot.topology.domains import nvlink_units, resolve_nvlink_domains
from bandpilot.topology.matrix import LINK_CLASSES, MAX_GPUS_PER_HOST, Topology, parse_topology  # noqa: F401 - re-exported

COMBINE_RULES = ("min_intra", "none")


@dataclass(frozen=True)
class Host:
    name: str
    gpu: str
    topology: Topology
    domain: str | None = None
    intra: Path | None = None  # measured intra-host table (BandPilot CSV), trace clusters only

    @property
    def n_gpus(self) -> int:
        return self.topology.n


@dataclass(frozen=True)
class InterSpec:
    table: Path
    scale: float = 1.0
    combine: str = "min_intra"


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster: hosts in a fixed order, the network, and where bandwidth comes from."""

    name: str
    hosts: tuple[Host, ...]
    collective: str = "all_gather_perf"
    message_bytes: int = 16 * 1024 * 1024
    nic_gbps: float = 400.0
    rails_per_host: int = 8
    network: dict[str, Any] = field(default_factory=dict)
    inter: InterSpec | None = None
    emulator: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: multi-node NVLink domains (host ``domain`` labels whose trays share an NVLink switch fabric)
    nvlink_domains: tuple[str, ...] = ()

    # ---- identity -------------------------------------------------------------------------
    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    @cached_property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @cached_property
    def host_index(self) -> dict[str, int]:
        return {h.name: i for i, h in enumerate(self.hosts)}

    @cached_property
    def gpus_per_host(self) -> np.ndarray:
        return np.array([h.n_gpus for h in self.hosts], dtype=np.int64)

    @property
    def n_gpus(self) -> int:
        return int(self.gpus_per_host.sum())

    @cached_property
    def gpu_ids(self) -> tuple[str, ...]:
        return tuple(f"{h.name}:{i}" for h in self.hosts for i in range(h.n_gpus))

    @cached_property
    def full_masks(self) -> np.ndarray:
        """Per-host mask with every GPU set."""
        return (np.int64(1) << self.gpus_per_host) - 1

    @cached_property
    def units(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale-out unit per host (its NVLink domain, else the host itself) and which units are
        NVLink domains (:func:`bandpilot.topology.domains.nvlink_units`)."""
        return nvlink_units(self.hosts, self.nvlink_domains)

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({h.gpu for h in self.hosts}))

    @property
    def source(self) -> str:
        """``trace`` when every host has a measured table and an inter table exists, else ``emulator``."""
        if self.inter is not None and all(h.intra is not None for h in self.hosts):
            return "trace"
        return "emulator"

    def fingerprint(self) -> str:
        """Stable hash of what a model depends on: hosts, GPU types and topologies (not paths)."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        # Computed once per spec (1.2 s at 25,002 trays; every queue batch checks it twice).
        rows: dict[int, list] = {}  # hosts share topology objects: one as_rows per topology
        for h in self.hosts:
            if id(h.topology) not in rows:
                rows[id(h.topology)] = h.topology.as_rows()
        doc = {
            "name": self.name,
            "hosts": [[h.name, h.gpu, rows[id(h.topology)], h.domain] for h in self.hosts],
        }
        if self.nvlink_domains:  # only then: fingerprints of specs without NVLink domains are unchanged
            doc["nvlink_domains"] = list(self.nvlink_domains)
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    # ---- GPU ids <-> masks ---------------------------------------------------------------
    def parse_gpu(self, gpu_id: str, where: str = "") -> tuple[int, int]:
        """``"host:3"`` -> (host index, local index); unknown ids raise :class:`SpecError`."""
        loc = f" in {where}" if where else ""
        if not isinstance(gpu_id, str) or ":" not in gpu_id:
            raise SpecError(f"malformed GPU id {gpu_id!r}{loc}: expected '<host>:<index>'")
        host, _, idx = gpu_id.rpartition(":")
        h = self.host_index.get(host)
        if h is None:
            raise SpecError(f"unknown host {host!r} (GPU id {gpu_id!r}){loc} in cluster {self.name!r}")
        if not idx.isdigit() or int(idx) >= self.hosts[h].n_gpus:
            raise SpecError(
                f"unknown GPU index {idx!r} on host {host!r}{loc}: it has {self.hosts[h].n_gpus} GPUs"
            )
        return h, int(idx)

    def to_mask(self, gpus: Iterable[str], where: str = "") -> np.ndarray:
        """One allocation (GPU ids) -> per-host mask vector; duplicates are an error."""
        mask = np.zeros(self.n_hosts, dtype=np.int64)
        hosts, masks = self.to_sparse_mask(gpus, where)
        mask[hosts] = masks
        return mask

    def to_sparse_mask(self, gpus: Iterable[str], where: str = "") -> tuple[list[int], list[int]]:
        """One allocation -> (the hosts it uses, ascending; their GPU bitmasks): no vector over every
        host (a dataset of 38,415 rows on 2,502 trays)."""
        gpus = list(gpus)
        fast = self._sparse_mask_fast(gpus)
        if fast is not None:
            return fast
        by_host: dict[int, int] = {}
        for g in gpus:
            h, i = self.parse_gpu(g, where)
            m = by_host.get(h, 0)
            if m >> i & 1:
                raise SpecError(f"GPU {g!r} listed twice{(' in ' + where) if where else ''}")
            by_host[h] = m | 1 << i
        hosts = sorted(by_host)
        return hosts, [by_host[h] for h in hosts]

    def _sparse_mask_fast(self, gpus: list) -> tuple[list[int], list[int]] | None:
        """:meth:`to_sparse_mask` of well-formed, distinct ids in one vectorised pass (every
        ``select`` re-checks its 1-4,096 GPU ids); None when any id is off - the checked path then
        names it. Accepts exactly what :meth:`parse_gpu` accepts."""
        if not gpus:
            return [], []
        index = self.host_index
        try:
            parts = [g.rpartition(":") for g in gpus]
            if not all(p[1] and p[2].isdigit() for p in parts):
                return None
            h = np.array([index[p[0]] for p in parts], dtype=np.int64)
            i = np.array([int(p[2]) for p in parts], dtype=np.int64)
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            return None
        if np.any(i >= self.gpus_per_host[h]) or np.unique(h * 64 + i).size != i.size:
            return None
        order = np.argsort(h, kind="stable")
        h, bits = h[order], np.int64(1) << i[order]
        starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
        return h[starts].tolist(), np.bitwise_or.reduceat(bits, starts).tolist()

    def to_masks(self, allocations: Sequence[Iterable[str]], where: str = "") -> np.ndarray:
        out = np.zeros((len(allocations), self.n_hosts), dtype=np.int64)
        for r, alloc in enumerate(allocations):
            out[r] = self.to_mask(alloc, f"{where} allocation {r}" if where else f"allocation {r}")
        return out

    def from_mask(self, mask: np.ndarray) -> list[str]:
        out: list[str] = []
        mask = np.asarray(mask)
        ids, first = self.gpu_ids, self._first_gpu
        for h in np.flatnonzero(mask).tolist():  # the hosts used only: 25,002 trays at 100k GPUs
            m = int(mask[h])
            n = self.hosts[h].n_gpus
            out.extend(ids[first[h] + i] for i in _bits(m) if i < n)
        return out

    @cached_property
    def _first_gpu(self) -> list[int]:
        """Index of each host's first GPU in :attr:`gpu_ids`."""
        return np.r_[0, np.cumsum(self.gpus_per_host)[:-1]].astype(np.int64).tolist()

    # ---- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Self-contained dict (topologies inline, no paths) for embedding in model artifacts."""
        return {
            "name": self.name,
            "collective": self.collective,
            "message_bytes": self.message_bytes,
            "network": {"nic_gbps": self.nic_gbps, "rails_per_host": self.rails_per_host, **self.network},
            "hosts": [
                {
                    "name": h.name,
                    "gpu": h.gpu,
                    "topology": h.topology.as_rows(),
                    **({"numa": list(h.topology.numa)} if h.topology.numa else {}),
                    **({"domain": h.domain} if h.domain else {}),
                }
                for h in self.hosts
            ],
            **({"emulator": self.emulator} if self.emulator else {}),
            **({"nvlink_domains": list(self.nvlink_domains)} if self.nvlink_domains else {}),
        }


@lru_cache(maxsize=65_536)
def _bits(m: int) -> tuple[int, ...]:
    """Set bit positions of a GPU mask, ascending (masks repeat: a few hundred distinct per spec)."""
    return tuple(i for i in range(m.bit_length()) if m >> i & 1)


def dense_unique(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True)`` for integer codes in ``[0, size)`` by a table, not a
    sort (a search batch's tens of thousands of (unit, count) codes)."""
    seen = np.zeros(size, dtype=bool)
    seen[codes] = True
    rank = np.cumsum(seen) - 1
    return np.flatnonzero(seen), rank[codes]


def ranges(lo: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, a + n) for a, n in zip(lo, lens)])`` without a Python loop: the
    entries of many CSR rows (or column segments) at once."""
    return np.repeat(lo - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))


def popcount(masks: np.ndarray) -> np.ndarray:
    """Per-element number of set bits (GPU counts per host)."""
    return np.bitwise_count(np.asarray(masks, dtype=np.int64)).astype(np.int64)


def _req(doc: dict, key: str, source: str, kind: type | tuple = object) -> Any:
    if not isinstance(doc, dict) or key not in doc:
        raise SpecError(f"{source}: missing required key {key!r}")
    val = doc[key]
    if kind is not object and not isinstance(val, kind):
        raise SpecError(f"{source}: key {key!r} has the wrong type ({type(val).__name__})")
    return val


def _topology_from(value: Any, base: Path, source: str) -> Topology:
    if isinstance(value, list):
        text = "\t".join(f"GPU{i}" for i in range(len(value))) + "\n"
        text += "\n".join(f"GPU{i}\t" + "\t".join(str(r).split()) for i, r in enumerate(value))
        return parse_topology(text, source)
    if isinstance(value, str):
        p = (base / value).resolve()
        if not p.is_file():
            raise SpecError(f"{source}: topology file not found: {value}")
        return parse_topology(p.read_text(), str(p))
    raise SpecError(f"{source}: topology must be a file path or a list of matrix rows")


def _with_numa(topo: Topology, numa: Any, source: str) -> Topology:
    if numa is None:
        return topo
    if not isinstance(numa, list) or len(numa) != topo.n or not all(isinstance(x, int) for x in numa):
        raise SpecError(f"{source}: numa must be a list of {topo.n} integers")
    return Topology(topo.links, topo.nvlinks, tuple(numa))


def spec_from_dict(
    doc: dict[str, Any], base: Path | None = None, source: str = "<spec>", lines: dict[tuple, int] | None = None
) -> ClusterSpec:
    """Build a :class:`ClusterSpec` from a parsed YAML/JSON document (``lines``: source line of
    each key path, for error messages; :func:`load_cluster` fills it in)."""
    base = base or Path.cwd()
    if not isinstance(doc, dict):
        raise SpecError(f"{source}: a cluster spec must be a mapping")
    name = _req(doc, "name", source, str)
    hosts, group_domains = _hosts_from(doc, base, source, lines)
    if not hosts:
        raise SpecError(f"{source}: the spec declares no hosts")
    nvlink: tuple[str, ...] = ()
    if group_domains or doc.get("nvlink_domains") is not None:
        hosts, nvlink = resolve_nvlink_domains(doc, hosts, group_domains, lambda key: _where(source, lines, key))
    names = [h.name for h in hosts]
    dupes = sorted(n for n, c in Counter(names).items() if c > 1)  # linear: 25,000 trays at 100k GPUs
    if dupes:
        raise SpecError(f"{source}: duplicate host names {dupes}")
    gph = doc.get("gpus_per_host")
    if gph is not None:
        bad = [h.name for h in hosts if h.n_gpus != gph]
        if bad:
            raise SpecError(f"{source}: hosts {bad[:3]} do not have gpus_per_host={gph} GPUs in their topology")
    net = dict(doc.get("network") or {})
    nic = float(net.pop("nic_gbps", 400.0))
    rails = int(net.pop("rails_per_host", 8))
    if nic <= 0 or rails <= 0:
        raise SpecError(f"{source}: network.nic_gbps and rails_per_host must be positive")
    inter = _inter_from(doc.get("inter"), base, source)
    emulator = doc.get("emulator") or {}
    if not isinstance(emulator, dict):
        raise SpecError(f"{source}: emulator must be a mapping")
    if doc.get("faults") is not None:  # injected faults (bandpilot.fabric.faults), validated by make_fabric
        emulator = {**emulator, "faults": doc["faults"]}
    mb = doc.get("message_bytes", 16 * 1024 * 1024)
    if not isinstance(mb, int) or mb <= 0:
        raise SpecError(f"{source}: message_bytes must be a positive integer")
    return ClusterSpec(
        name=name,
        hosts=tuple(hosts),
        collective=str(doc.get("collective", "all_gather_perf")),
        message_bytes=mb,
        nic_gbps=nic,
        rails_per_host=rails,
        network=net,
        inter=inter,
        emulator=emulator,
        path=None,
        nvlink_domains=nvlink,
    )


def _hosts_from(doc: dict[str, Any], base: Path, source: str,
                lines: dict[tuple, int] | None) -> tuple[list[Host], dict[str, tuple]]:
    """``hosts`` (one by one) then ``host_groups`` (prefix + count); hosts of one topology share
    it. Also the NVLink domains the groups declare (domain -> key path, for error messages)."""
    hosts: list[Host] = []
    topo_cache: dict[str, Topology] = {}

    def topo_for(value: Any, where: str) -> Topology:
        key = json.dumps(value, sort_keys=True)
        if key not in topo_cache:
            topo_cache[key] = _topology_from(value, base, where)
        return topo_cache[key]

    for i, h in enumerate(doc.get("hosts") or []):
        where = f"{source}: hosts[{i}]"
        hname = _req(h, "name", where, str)
        if ":" in hname or not hname:
            raise SpecError(f"{where}: host name {hname!r} must be non-empty and contain no ':'")
        topo = _with_numa(topo_for(_req(h, "topology", where), where), h.get("numa"), where)
        intra = h.get("intra")
        intra_p = (base / intra).resolve() if intra else None
        hosts.append(Host(hname, str(_req(h, "gpu", where)), topo, h.get("domain"), intra_p))
    group_domains: dict[str, tuple] = {}
    for i, g in enumerate(doc.get("host_groups") or []):
        where = f"{source}: host_groups[{i}]"
        count = _req(g, "count", where, int)
        if count <= 0:
            raise SpecError(f"{where}: count must be positive")
        prefix = str(_req(g, "prefix", where))
        topo = _with_numa(topo_for(_req(g, "topology", where), where), g.get("numa"), where)
        dsize = g.get("domain_size")
        nsize = g.get("nvlink_domain_size")
        if nsize is not None:
            if isinstance(nsize, bool) or not isinstance(nsize, int) or nsize <= 0:
                raise SpecError(f"{_where(source, lines, ('host_groups', i, 'nvlink_domain_size'))}: must be a positive integer (trays per NVLink domain), got {nsize!r}")
            if dsize is not None or g.get("domain") is not None:
                raise SpecError(f"{_where(source, lines, ('host_groups', i))}: give nvlink_domain_size or domain_size/domain, not both")
            dsize = nsize
        for j in range(count):
            if nsize:
                dom = f"{prefix}nvl{j // nsize}"
                group_domains.setdefault(dom, ("host_groups", i))
            else:
                dom = f"{prefix}d{j // dsize}" if dsize else g.get("domain")
            hosts.append(Host(f"{prefix}{j}", str(_req(g, "gpu", where)), topo, dom))
    return hosts, group_domains


def _inter_from(it: Any, base: Path, source: str) -> InterSpec | None:
    """The measured inter-host table of a trace cluster (``inter:``), if any."""
    if not it:
        return None
    table = _req(it, "table", f"{source}: inter", str)
    combine = it.get("combine", "min_intra")
    if combine not in COMBINE_RULES:
        raise SpecError(f"{source}: inter.combine must be one of {COMBINE_RULES}, got {combine!r}")
    scale = float(it.get("scale", 1.0))
    if scale <= 0:
        raise SpecError(f"{source}: inter.scale must be positive")
    return InterSpec((base / table).resolve(), scale, combine)


def _where(source: str, lines: dict[tuple, int] | None, key: tuple) -> str:
    """``file:line: key[0].key`` for a spec key path (line when known)."""
    text = "".join(f"[{k}]" if isinstance(k, int) else (f".{k}" if n else str(k)) for n, k in enumerate(key))
    line = (lines or {}).get(tuple(key))
    return f"{source}:{line}: {text}" if line else f"{source}: {text}"


def _key_lines(node: Any, path: tuple = (), out: dict[tuple, int] | None = None) -> dict[tuple, int]:
    """Source line (1-based) of every key path in a composed YAML node tree."""
    out = {} if out is None else out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                _key_lines(v, path + (k.value,), out)
                out[path + (k.value,)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _key_lines(v, path + (i,), out)
    return out


def resolve_spec(value: str | Path) -> Path:
    """A spec file, a measurement directory, or the name of a spec in ``params/clusters``
    (looked up in the project root, then beside the installed package)."""
    from bandpilot.config import SOURCE_ROOT, project_root

    p = Path(value)
    if p.exists():
        return p
    if not p.suffix and "/" not in str(value):
        for base in (project_root(), SOURCE_ROOT):
            cand = base / "params" / "clusters" / f"{value}.yaml"
            if cand.is_file():
                return cand
    raise SpecError(f"cluster spec not found: {value} (a YAML file, a measurement directory or a name in params/clusters)")


def load_cluster(path: str | Path) -> ClusterSpec:
    """Load a spec file, a measurement directory containing ``cluster.yaml``, or a spec by name
    (:func:`resolve_spec`: every command that takes a cluster accepts the same three)."""
    p = Path(path)
    if not p.exists():
        p = resolve_spec(path)
    if p.is_dir():
        p = p / "cluster.yaml"
    if not p.is_file():
        raise SpecError(f"cluster spec not found: {path}")
    # libyaml when present (same documents and marks): a dataset's self-contained spec lists every
    # host, and the pure-Python parser took 2.9 CPU s for 2,502 trays (load + compose for the lines)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = p.read_text()
    try:
        doc = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{p}{line}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    lines = None
    if isinstance(doc, dict) and ("nvlink_domains" in doc or "host_groups" in doc):
        lines = _key_lines(yaml.compose(text, Loader=loader))
    spec = spec_from_dict(doc, p.parent.resolve(), str(p), lines)
    object.__setattr__(spec, "path", p.resolve())
    return spec
