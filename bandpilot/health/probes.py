"""Which few nccl-tests runs localize a fault? The probe plan (group testing, not all subsets).

Per host with ``n`` GPUs: the ``n`` leave-one-out subsets. A GPU fault spares exactly the subset
without that GPU; a pair fault spares the two subsets without either GPU; a slow host spares none.
Across hosts: each host is paired with the next in a ring and GPU ``r`` of one runs with GPU ``r`` of
the other, one GPU per host, so the run is bound by the network alone (no host has two GPUs, stage 1
cannot hide a slow link): a slow rail shows on exactly the two runs of its GPU with the host's two
ring neighbours. 8 GPUs: 8 + 8 = 16 runs per host (all pairs would be 28, all subsets 255).
"""

from __future__ import annotations

from dataclasses import dataclass

from bandpilot.data.planning import PlannedMeasurement, planned
from bandpilot.errors import SpecError
from bandpilot.topology.cluster import ClusterSpec


@dataclass(frozen=True)
class Probe:
    """One planned run and what it tests."""

    kind: str  # "leave_one_out" | "full" (2-GPU hosts) | "rail"
    masks: tuple[int, ...]  # per-host masks in spec order
    measurement: PlannedMeasurement


def _host_mask(spec: ClusterSpec, h: int, mask: int) -> tuple[int, ...]:
    out = [0] * spec.n_hosts
    out[h] = mask
    return tuple(out)


def plan_probes(spec: ClusterSpec, hosts: list[str] | None = None) -> list[Probe]:
    """The probes for ``hosts`` (default: all); cross-host probes pair each host with the next."""
    names = list(spec.host_names) if not hosts else list(hosts)
    unknown = [h for h in names if h not in spec.host_index]
    if unknown:
        raise SpecError(f"verify: hosts {unknown[:3]} are not in cluster {spec.name!r}")
    idx = sorted({spec.host_index[h] for h in names})
    probes: list[Probe] = []
    for h in idx:
        n = spec.hosts[h].n_gpus
        full = (1 << n) - 1
        if n >= 3:
            for g in range(n):
                m = _host_mask(spec, h, full & ~(1 << g))
                probes.append(Probe("leave_one_out", m, planned(spec, m, f"verify:loo{g}")))
        elif n == 2:
            m = _host_mask(spec, h, full)
            probes.append(Probe("full", m, planned(spec, m, "verify:full")))
    # Ring over the chosen hosts (a pair when two; nothing across hosts with one).
    pairs = [(idx[i], idx[(i + 1) % len(idx)]) for i in range(len(idx))] if len(idx) > 2 else (
        [(idx[0], idx[1])] if len(idx) == 2 else [])
    for a, b in pairs:
        for r in range(min(spec.hosts[a].n_gpus, spec.hosts[b].n_gpus)):
            m = [0] * spec.n_hosts
            m[a] = m[b] = 1 << r
            probes.append(Probe("rail", tuple(m), planned(spec, m, f"verify:rail{r}")))
    return probes


def runs_per_host(probes: list[Probe], spec: ClusterSpec) -> float:
    hosts = {h for p in probes for h, m in enumerate(p.masks) if m}
    return len(probes) / max(len(hosts), 1)
