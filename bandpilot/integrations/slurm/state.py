"""The dispatcher's state read from Slurm: which GPU indices each node has allocated, which jobs
hold them, and which nodes are drained or down, as a :class:`~bandpilot.dispatch.state.State`
(the ``{"free": [...], "jobs": [...]}`` document ``bandpilot select --state`` takes).

Two reads, in the one-line text form every Slurm version prints (``scontrol -o show node -d``,
then ``scontrol -o show job -d``): the node read says what each node has in use (``GresUsed=
gpu:3(IDX:0-2)``) and its state, the job read groups the busy indices by job (``Nodes=h100-1 ...
GRES=gpu:3(IDX:0-2)``). A GPU is busy when either read says so, so a job that starts or ends
between the reads leaves its GPUs busy for this snapshot - BandPilot never asks for a busy GPU,
at worst it misses a GPU freed a moment ago. GPUs of nodes that are drained, down, failed, not
responding or unknown to Slurm are in neither list (unavailable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from bandpilot.dispatch.state import Job, State
from bandpilot.integrations.slurm.commands import run
from bandpilot.integrations.slurm.hostlist import expand, expand_indices
from bandpilot.topology.cluster import ClusterSpec

#: node state words that keep new work off a node
UNAVAILABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "FUTURE",
                         "MAINT", "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "REBOOT_ISSUED",
                         "REBOOT_REQUESTED", "INVALID_REG", "UNKNOWN"})
#: job states whose GPUs are held
HOLDING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "RESIZING", "SIGNALING",
                     "STAGE_OUT"})

_GRES_IDX = re.compile(r"gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")
_GRES_COUNT = re.compile(r"gpu(?::([^:(,]+))?:(\d+)")
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\]|$)")
_JOB_NODE = re.compile(r"(?<![A-Za-z_])Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")


def _field(line: str, key: str) -> str | None:
    m = re.search(rf"(?<![A-Za-z_]){key}=(\S*)", line)
    return m.group(1) if m else None


@dataclass(frozen=True)
class NodeInfo:
    name: str
    states: tuple[str, ...]
    gpus: int
    used: tuple[int, ...]
    reason: str = ""

    @property
    def available(self) -> bool:
        return not (set(self.states) & UNAVAILABLE)

    @property
    def state(self) -> str:
        return "+".join(self.states)


def parse_nodes(text: str) -> dict[str, NodeInfo]:
    """``scontrol -o show node -d`` -> node name -> :class:`NodeInfo`."""
    out: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        name = _field(line, "NodeName")
        if not name:
            continue
        raw_state = _field(line, "State") or "UNKNOWN"
        states = tuple(s.strip("*~#!%$@^-") for s in raw_state.split("+") if s)
        gres = _field(line, "Gres") or ""
        total = sum(int(m.group(2)) for m in _GRES_COUNT.finditer(gres.split("(S:")[0] if "(S:" in gres else gres))
        used: set[int] = set()
        for m in _GRES_IDX.finditer(_field(line, "GresUsed") or ""):
            if int(m.group(1)):
                used.update(expand_indices(m.group(2)))
        rm = _REASON.search(line)
        reason = rm.group(1).strip() if rm and rm.group(1).strip() not in ("", "(null)") else ""
        out[name] = NodeInfo(name, states, total, tuple(sorted(used)), reason)
    return out


@dataclass(frozen=True)
class JobGpus:
    id: str
    state: str
    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices


def parse_jobs(text: str) -> list[JobGpus]:
    """``scontrol -o show job -d`` -> the GPU-holding jobs and their indices per node."""
    jobs: list[JobGpus] = []
    for line in text.splitlines():
        jid = _field(line, "JobId")
        state = _field(line, "JobState") or ""
        if not jid or state not in HOLDING:
            continue
        gpus: dict[str, tuple[int, ...]] = {}
        for m in _JOB_NODE.finditer(line):
            idx: list[int] = []
            for g in _GRES_IDX.finditer(m.group(2)):
                idx.extend(expand_indices(g.group(2)))
            if idx:
                for node in expand(m.group(1)):
                    gpus[node] = tuple(sorted(set(gpus.get(node, ()) + tuple(idx))))
        if gpus:
            jobs.append(JobGpus(jid, state, gpus))
    return jobs


@dataclass(frozen=True)
class Snapshot:
    """One read of Slurm: the dispatcher's state plus what explains the unavailable GPUs."""

    state: State
    nodes: Mapping[str, NodeInfo]
    #: spec hosts Slurm does not know (their GPUs are unavailable)
    missing: tuple[str, ...] = ()
    #: Slurm nodes the spec does not have (ignored)
    extra: tuple[str, ...] = ()
    jobs: tuple[JobGpus, ...] = field(default=())

    @property
    def unavailable(self) -> dict[str, str]:
        """Node -> why no GPU of it is offered (its Slurm state and reason)."""
        out = {n: (f"{i.state}: {i.reason}" if i.reason else i.state) for n, i in self.nodes.items()
               if not i.available and n in self.state.spec.host_index}
        out.update({n: "unknown to Slurm" for n in self.missing})
        return out

    def allocated(self) -> dict[str, list[int]]:
        """Node -> busy GPU indices (every spec host Slurm knows)."""
        spec = self.state.spec
        busy = self.state.busy_mask() | (spec.full_masks & ~self.state.free)
        return {h.name: [i for i in range(h.n_gpus) if busy[k] >> i & 1]
                for k, h in enumerate(spec.hosts) if h.name in self.nodes and self.nodes[h.name].available}


def build_state(spec: ClusterSpec, nodes: Mapping[str, NodeInfo], jobs: list[JobGpus]) -> Snapshot:
    """Combine the two reads into a :class:`Snapshot` (module docstring: the rules)."""
    import numpy as np

    free = np.zeros(spec.n_hosts, dtype=np.int64)
    busy = np.zeros(spec.n_hosts, dtype=np.int64)
    for k, h in enumerate(spec.hosts):
        info = nodes.get(h.name)
        if info is None or not info.available:
            continue
        n = min(h.n_gpus, info.gpus)
        free[k] = (1 << n) - 1
        for i in info.used:
            busy[k] |= 1 << i
    state_jobs: list[Job] = []
    owner = np.zeros(spec.n_hosts, dtype=np.int64)
    for j in jobs:
        mask = np.zeros(spec.n_hosts, dtype=np.int64)
        for node, idx in j.gpus.items():
            k = spec.host_index.get(node)
            if k is None:
                continue
            for i in idx:
                if i < spec.hosts[k].n_gpus and not owner[k] >> i & 1:
                    mask[k] |= 1 << i
        if mask.any():
            owner |= mask
            busy |= mask
            ids = tuple(spec.from_mask(mask))
            state_jobs.append(Job(j.id, ids, 0.0, mask))
    free &= ~busy
    missing = tuple(h.name for h in spec.hosts if h.name not in nodes)
    extra = tuple(n for n in nodes if n not in spec.host_index)
    return Snapshot(State(spec, free, tuple(state_jobs)), dict(nodes), missing, extra, tuple(jobs))


def read_state(spec: ClusterSpec, env: Mapping[str, str] | None = None) -> Snapshot:
    """Read nodes then jobs from the running Slurm (:class:`SlurmError` when it does not answer)."""
    nodes = parse_nodes(run(["scontrol", "-o", "show", "node", "-d"], env=env))
    jobs = parse_jobs(run(["scontrol", "-o", "show", "job", "-d"], env=env))
    return build_state(spec, nodes, jobs)
