"""``topology.conf`` for the Slurm that runs the cluster, and what BandPilot's domain constraints
become in that Slurm.

``topology/tree`` (switches) is what every Slurm has and is the default. ``topology/block`` (one
block per NVLink or rack domain, with ``--segment``) arrived in Slurm 23.11: BandPilot writes it
when asked, or by default when the Slurm found is 23.11 or newer and the cluster declares
domains. A Slurm that does not know the plugin refuses to start (``Failed to initialize topology
plugin``), so asking for blocks with an older Slurm installed is an error, not a file.
"""

from __future__ import annotations

from typing import Any, Mapping

from bandpilot.integrations.slurm.commands import SlurmError, Version
from bandpilot.topology.cluster import ClusterSpec
from bandpilot.topology.domains import slurm_topology, slurm_tree

PLUGINS = ("auto", "tree", "block")
#: ``--exclusive=topo`` (a job alone in its blocks) arrived in Slurm 24.05
EXCLUSIVE_TOPO = Version(24, 5)


def has_domains(spec: ClusterSpec) -> bool:
    return bool(spec.nvlink_domains) or any(h.domain for h in spec.hosts)


def choose_plugin(spec: ClusterSpec, requested: str, version: Version | None) -> str:
    """``topology/tree`` or ``topology/block`` for ``requested`` (auto | tree | block) and the
    Slurm found (None: none installed here, the file is for another machine)."""
    if requested not in PLUGINS:
        raise SlurmError(f"unknown topology plugin {requested!r}: use one of {', '.join(PLUGINS)}", code="invalid_request")
    if requested == "block":
        if version is not None and not version.has_block:
            raise SlurmError(f"topology/block needs Slurm 23.11 or newer; the Slurm found is {version}: use "
                             "--topology tree (or name the target's version with --slurm-version)",
                             code="invalid_request")
        return "topology/block"
    if requested == "auto" and version is not None and version.has_block and has_domains(spec):
        return "topology/block"
    return "topology/tree"


def topology_conf(spec: ClusterSpec, plugin: str) -> str:
    """The ``topology.conf`` text for ``plugin`` (``topology/tree`` or ``topology/block``)."""
    return slurm_topology(spec) if plugin == "topology/block" else slurm_tree(spec)


def constraint_options(constraints: Mapping[str, Any], plugin: str, version: Version | None,
                       gpus_per_node: int, nodes: int | None = None) -> list[str]:
    """sbatch options that ask Slurm for BandPilot's domain constraints, or a :class:`SlurmError`
    naming the constraint the Slurm in use cannot express.

    ``single_host`` -> ``--nodes=1``; ``single_domain`` -> ``--switches=1`` (tree: one leaf switch
    per domain) or ``--segment=<nodes>`` (block, ``nodes`` the job's); ``segment`` (GPUs per domain, a multiple of whole
    nodes) -> ``--segment=<nodes>`` (block only); ``whole_domains`` -> ``--exclusive=topo`` (block,
    Slurm 24.05+)."""
    out: list[str] = []
    block = plugin == "topology/block"
    where = f"Slurm {version}" if version is not None else "this Slurm"
    if constraints.get("single_host"):
        out.append("--nodes=1")
    if constraints.get("single_domain"):
        if block and not nodes:
            raise SlurmError("constraint single_domain with topology/block needs the job's node count "
                             "(--segment=<nodes> keeps them in one block)", code="invalid_request")
        out.append(f"--segment={nodes}" if block else "--switches=1")
    seg = constraints.get("segment")
    if seg is not None:
        if not block:
            raise SlurmError(f"constraint segment={seg} needs topology/block (Slurm 23.11+, --segment); "
                             f"{where} with {plugin} cannot express it", code="invalid_request")
        if int(seg) % gpus_per_node:
            raise SlurmError(f"constraint segment={seg} GPUs is not a whole number of {gpus_per_node}-GPU nodes: "
                             "Slurm's --segment counts nodes", code="invalid_request")
        out.append(f"--segment={int(seg) // gpus_per_node}")
    if constraints.get("whole_domains"):
        if not block or (version is not None and version < EXCLUSIVE_TOPO):
            raise SlurmError(f"constraint whole_domains needs --exclusive=topo (topology/block, Slurm 24.05+); "
                             f"{where} with {plugin} cannot express it", code="invalid_request")
        out.append("--exclusive=topo")
    return out
