"""Slurm configuration from what was measured: ``slurm.conf`` node lines (``Gres=gpu:N``), a
``gres.conf`` with one line per GPU whose ``Links=`` come from the measured intra-host bandwidth,
and the files written together (``topology.conf`` comes from :mod:`.topology`).

``Links=`` mapping. Slurm reads ``Links`` as a connection count per other GPU (``-1`` for the GPU
itself) and only compares the counts: when it picks GPUs on a node, cons_tres prefers the ones
with the most connections to those already picked. BandPilot fills them from the pairwise
bandwidth of the host's fabric (the measured table on a trace cluster, the calibrated emulator
otherwise): pair bandwidths are grouped into tiers (a new tier starts where a value is more than
:data:`TIER_GAP` above the previous one, so measurement noise never splits a tier) and a tier's
count is ``round(LINK_SCALE * tier / best tier)``, at least 1. On an NVSwitch host every pair is
one tier (``16``); on a PCIe host with NVLink bridges the bridged pairs get 16 and the rest their
fraction of it. The counts are relative bandwidth, not cable counts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.topology.domains import hostlist

#: the count the best-connected pairs of a host get
LINK_SCALE = 16
#: relative gap between two pair bandwidths that starts a new tier
TIER_GAP = 0.15
#: default device files, one per GPU index
DEVICE_TEMPLATE = "/dev/nvidia{index}"
FRAGMENT = "slurm.bandpilot.conf"


@dataclass(frozen=True)
class ConfOptions:
    """What the measurements cannot say about a node, with sane defaults an operator overrides
    from ``slurmd -C`` on a real node."""

    cpus_per_gpu: int = 8
    memory_mb_per_gpu: int = 64 * 1024
    device_template: str = DEVICE_TEMPLATE
    #: ``Type=`` per GPU: None for none, else a template over ``{gpu}`` (model, lower case) and
    #: ``{index}``: ``"{gpu}"`` types every GPU by model, ``"{gpu}_{index}"`` gives every index a
    #: type of its own (a job can then name exact indices with ``--gres=gpu:h100_3:1``)
    gpu_type: str | None = None
    partition: str | None = "bandpilot"
    default_partition: bool = False
    #: extra ``key=value`` words per node name (one machine running several slurmd: Port=, NodeHostname=)
    node_extra: Mapping[str, str] = field(default_factory=dict)


def pair_bandwidth(fabric, h: int) -> np.ndarray:
    """``(n, n)`` bandwidth of every GPU pair of host ``h`` (0 on the diagonal)."""
    n = int(fabric.spec.hosts[h].n_gpus)
    row = fabric.stage1[h]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = out[j, i] = float(row[(1 << i) | (1 << j)])
    return out


def link_counts(bw: np.ndarray) -> np.ndarray:
    """Slurm ``Links`` counts from a pair bandwidth matrix (module docstring: the mapping)."""
    n = bw.shape[0]
    out = np.full((n, n), -1, dtype=np.int64)
    if n < 2:
        return out
    vals = sorted({float(v) for v in bw[~np.eye(n, dtype=bool)]})
    tiers: list[list[float]] = []
    for v in vals:
        if tiers and v <= tiers[-1][-1] * (1 + TIER_GAP):
            tiers[-1].append(v)
        else:
            tiers.append([v])
    level = {v: float(np.median(t)) for t in tiers for v in t}
    best = max(level.values())
    for i in range(n):
        for j in range(n):
            if i != j:
                out[i, j] = max(1, round(LINK_SCALE * level[float(bw[i, j])] / best)) if best > 0 else 0
    return out


_TYPE_OK = re.compile(r"[^a-z0-9_]")


def gpu_type_name(template: str | None, gpu: str, index: int) -> str | None:
    if template is None:
        return None
    return _TYPE_OK.sub("_", template.format(gpu=gpu.lower(), index=index).lower())


def _gres(spec: ClusterSpec, h: int, opts: ConfOptions) -> str:
    host = spec.hosts[h]
    types = [gpu_type_name(opts.gpu_type, host.gpu, i) for i in range(host.n_gpus)]
    if types[0] is None:
        return f"gpu:{host.n_gpus}"
    counts: dict[str, int] = {}
    for t in types:
        assert t is not None  # a cluster's GPUs are all typed or none is
        counts[t] = counts.get(t, 0) + 1
    return ",".join(f"gpu:{t}:{c}" for t, c in counts.items())


def _group(spec: ClusterSpec, line_of: Callable[[int], str]) -> list[tuple[list[str], str]]:
    """Hosts with identical lines share one line under a hostlist (order of first appearance)."""
    groups: dict[str, list[str]] = {}
    for h, host in enumerate(spec.hosts):
        groups.setdefault(line_of(h), []).append(host.name)
    return [(names, line) for line, names in groups.items()]


def sockets(spec: ClusterSpec, h: int, opts: ConfOptions) -> tuple[int, int, list[int]] | None:
    """``(sockets, cores per socket, socket of each GPU)`` from the spec's ``numa`` list (None
    without one): GPU i's NUMA node is taken as its socket, numbered in order of the NUMA ids."""
    host = spec.hosts[h]
    numa = host.topology.numa
    if not numa:
        return None
    ids = sorted(set(numa))
    n_sockets = len(ids)
    per = max(1, -(-opts.cpus_per_gpu * host.n_gpus // n_sockets))
    return n_sockets, per, [ids.index(x) for x in numa]


def node_lines(spec: ClusterSpec, opts: ConfOptions = ConfOptions()) -> list[str]:
    """``NodeName=`` lines: CPUs (and sockets where the spec knows each GPU's NUMA node),
    RealMemory and ``Gres=`` per node (grouped where identical)."""

    def line(h: int) -> str:
        n = spec.hosts[h].n_gpus
        sock = sockets(spec, h, opts)
        cpus = [f"CPUs={sock[0] * sock[1]}", f"Sockets={sock[0]}", f"CoresPerSocket={sock[1]}", "ThreadsPerCore=1"] \
            if sock else [f"CPUs={max(1, opts.cpus_per_gpu * n)}"]
        words = [*cpus, f"RealMemory={max(1, opts.memory_mb_per_gpu * n)}", f"Gres={_gres(spec, h, opts)}"]
        extra = opts.node_extra.get(spec.hosts[h].name)
        if extra:
            words.append(extra)
        return " ".join(words) + " State=UNKNOWN"

    return [f"NodeName={hostlist(names)} {rest}" for names, rest in _group(spec, line)]


def slurm_conf_fragment(spec: ClusterSpec, topology_plugin: str, opts: ConfOptions = ConfOptions()) -> str:
    """The part of ``slurm.conf`` BandPilot knows: GPU scheduling, the topology plugin, the nodes
    and (optionally) a partition holding them. An operator ``Include``s it or pastes it."""
    lines = [
        f"# Slurm settings for cluster {spec.name}, generated by `bandpilot slurm conf` from its measurements.",
        "# Include this file from slurm.conf (Include <dir>/" + FRAGMENT + ") or paste it; CPUs and",
        "# RealMemory are defaults: take the real figures from `slurmd -C` on each node.",
        "GresTypes=gpu",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        f"TopologyPlugin={topology_plugin}",
        *node_lines(spec, opts),
    ]
    if opts.partition:
        default = "YES" if opts.default_partition else "NO"
        lines.append(f"PartitionName={opts.partition} Nodes={hostlist(list(spec.host_names))} "
                     f"Default={default} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gres_conf(spec: ClusterSpec, fabric, opts: ConfOptions = ConfOptions()) -> str:
    """``gres.conf``: one line per GPU index (``File=``, optional ``Type=``, ``Links=`` from the
    measured pair bandwidth), hosts with identical lines grouped under one hostlist."""
    per_host: dict[int, list[str]] = {}
    for h, host in enumerate(spec.hosts):
        links = link_counts(pair_bandwidth(fabric, h))
        sock = sockets(spec, h, opts)
        rows = []
        for i in range(host.n_gpus):
            t = gpu_type_name(opts.gpu_type, host.gpu, i)
            words = ["Name=gpu"] + ([f"Type={t}"] if t else []) + [f"File={opts.device_template.format(index=i)}"]
            if sock:  # the GPU's socket: Slurm keeps a job's GPUs on as few sockets as it can
                first = sock[2][i] * sock[1]
                words.append(f"Cores={first}-{first + sock[1] - 1}")
            if host.n_gpus > 1:
                words.append("Links=" + ",".join(str(int(c)) for c in links[i]))
            rows.append(" ".join(words))
        per_host[h] = rows
    out = [
        f"# gres.conf for cluster {spec.name}, generated by `bandpilot slurm conf`: one line per GPU;",
        f"# Links= are relative measured pair bandwidths (the best pairs of a host: {LINK_SCALE}), so",
        "# Slurm's own GPU picks follow the measured NVLink/PCIe fabric.",
        "AutoDetect=off",
    ]
    for names, block in _group(spec, lambda h: "\n".join(per_host[h])):
        out.extend(f"NodeName={hostlist(names)} {row}" for row in block.split("\n"))
    return "\n".join(out) + "\n"


def write_conf_file(path: str | Path, text: str) -> Path:
    """Write atomically with the mode the umask gives (slurmctld may run as another user and must
    read gres.conf and topology.conf: a 0600 file stops it)."""
    from bandpilot.io import write_text_atomic

    path = write_text_atomic(path, text)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
    return path


def write_conf(directory: str | Path, spec: ClusterSpec, fabric, topology_text: str, topology_plugin: str,
               opts: ConfOptions = ConfOptions()) -> list[Path]:
    """Write the slurm.conf fragment, gres.conf and topology.conf into ``directory``."""
    d = Path(directory)
    return [
        write_conf_file(d / FRAGMENT, slurm_conf_fragment(spec, topology_plugin, opts)),
        write_conf_file(d / "gres.conf", gres_conf(spec, fabric, opts)),
        write_conf_file(d / "topology.conf", topology_text),
    ]
