"""Which fabric is the ground truth of an evaluation, and does it describe the same hosts as the
evaluated model?"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from bandpilot.errors import BandPilotError, ModelError
from bandpilot.topology.cluster import ClusterSpec, load_cluster, resolve_spec


def resolve_cluster(value: str | Path | ClusterSpec) -> ClusterSpec:
    """A spec file, a measurement directory, or the name of an embedded default (``h100``)."""
    if isinstance(value, ClusterSpec):
        return value
    return load_cluster(resolve_spec(value))


def check_same_cluster(model_spec: ClusterSpec, other: ClusterSpec, what: str = "truth cluster") -> None:
    """The model's cluster and ``other`` must have the same hosts (names, order, GPU types and counts, topology)."""
    a = [(h.name, h.gpu, h.n_gpus, h.topology.links, h.topology.nvlinks) for h in model_spec.hosts]
    b = [(h.name, h.gpu, h.n_gpus, h.topology.links, h.topology.nvlinks) for h in other.hosts]
    if a == b:
        return
    src = f" ({other.path})" if other.path else ""
    diff = ""
    if [x[0] for x in a] != [x[0] for x in b]:
        diff = f"hosts {_brief([x[0] for x in b])} vs the model's {_brief([x[0] for x in a])}"
    else:
        i = next(i for i in range(len(a)) if a[i] != b[i])
        if a[i][1:3] != b[i][1:3]:
            diff = f"host {a[i][0]!r} is {b[i][1]} x{b[i][2]} there but {a[i][1]} x{a[i][2]} in the model"
        else:
            diff = f"host {a[i][0]!r} has a different intra-host topology (nvidia-smi topo -m) than in the model"
    raise ModelError(
        f"{what} {other.name!r}{src} does not match the model's cluster {model_spec.name!r}: {diff}"
    )


def _brief(names: Sequence[str], n: int = 4) -> str:
    s = ",".join(names[:n])
    return f"[{s}{',...' if len(names) > n else ''}] ({len(names)})"


def resolve_truth(model_spec: Any, *, truth: Any = None, cluster: Any = None) -> Any:
    """The ground-truth fabric: ``truth`` (a measurement directory / spec / fabric), else the
    ``cluster`` spec's fabric, else the embedded default of the model's cluster name, else the
    emulator of the spec embedded in the model. Every one must match the model's hosts."""
    from bandpilot.fabric.base import Fabric
    from bandpilot.fabric.emulator import make_fabric

    if cluster is not None:
        cspec = resolve_cluster(cluster)
        check_same_cluster(model_spec, cspec, "--cluster spec")
    else:
        cspec = None
    if truth is not None:
        if isinstance(truth, Fabric):
            fab = truth
        else:
            tspec = resolve_cluster(truth)
            check_same_cluster(model_spec, tspec, "truth cluster")
            fab = make_fabric(tspec)
        check_same_cluster(model_spec, fab.spec, "truth cluster")
        return fab
    if cspec is not None:
        return make_fabric(cspec)
    try:
        spec = resolve_cluster(model_spec.name)
        check_same_cluster(model_spec, spec, "embedded cluster")
    except BandPilotError:
        spec = model_spec
    return make_fabric(spec)
