"""``bandpilot cluster topology``: the cluster's domains, or a Slurm ``topology.conf`` for operators who
schedule the same racks with Slurm: topology/block (one block per domain) or topology/tree (switches)."""

from __future__ import annotations

from typing import Optional

import typer

from bandpilot.cli.common import cli_store
from bandpilot.cli.queue import STORE_OPT, cluster_app
from bandpilot.errors import RequestError

FORMATS = ("text", "slurm", "slurm-block", "slurm-tree")


@cluster_app.command("topology")
def topology_cmd(
    fmt: str = typer.Option("text", "--format", "-f", help="text (domains and trays); slurm (topology.conf: topology/tree, or topology/block for a cluster "
                                    "with domains when the Slurm found here is 23.11+); slurm-block or slurm-tree to choose."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster spec (default: the store's cluster)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Write to FILE (atomically) instead of stdout."),
    output: Optional[str] = typer.Option(None, "--output", hidden=True),  # the old spelling of --out
    store: Optional[str] = STORE_OPT,
) -> None:
    """The cluster's NVLink domains (or rack domains) and their trays; --format slurm exports a Slurm
    topology.conf: a switch tree, or blocks for a cluster with domains when the installed Slurm has
    topology/block (23.11+; an older slurmctld refuses to start with it)."""
    from bandpilot.io import write_text_atomic
    from bandpilot.topology.cluster import load_cluster, resolve_spec
    from bandpilot.topology.domains import slurm_topology, slurm_tree

    if fmt not in FORMATS:
        raise RequestError(f"unknown --format {fmt!r}: use one of {', '.join(FORMATS)}")
    spec = load_cluster(resolve_spec(cluster)) if cluster else cli_store(store).spec
    if fmt == "slurm":
        from bandpilot.integrations.slurm.commands import installed_version
        from bandpilot.integrations.slurm.topology import choose_plugin

        fmt = "slurm-block" if choose_plugin(spec, "auto", installed_version()) == "topology/block" else "slurm-tree"
    if fmt == "slurm-tree":
        text = slurm_tree(spec)
    elif fmt == "slurm-block":
        text = slurm_topology(spec)
    else:
        text = _summary(spec)
    out = out or output
    if out:
        write_text_atomic(out, text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


def _summary(spec) -> str:
    """One line per domain (NVLink or rack) with its hosts and GPUs; hosts outside any domain are
    listed by GPU model as a Slurm hostlist, so a cluster without domains still shows its hosts."""
    from bandpilot.topology.domains import hostlist

    nv = set(spec.nvlink_domains)
    racks = {h.domain for h in spec.hosts if h.domain and h.domain not in nv}
    parts = [f"{len(nv)} NVLink domains" if nv else "", f"{len(racks)} rack domains" if racks else ""]
    kinds = ", ".join(p for p in parts if p) or "no NVLink or rack domains (hosts meet over the network)"
    rows = [f"cluster {spec.name}: {spec.n_hosts} hosts, {spec.n_gpus} GPUs, {kinds}"]
    groups: dict[tuple[str, str], list] = {}
    for h in spec.hosts:
        groups.setdefault((h.domain, "nvlink" if h.domain in nv else "rack") if h.domain else ("", h.gpu), []).append(h)
    for (dom, kind), hosts in groups.items():
        name = dom or hostlist([h.name for h in hosts])
        rows.append(f"{name}\t{kind}\t{len(hosts)} host{'s' * (len(hosts) != 1)}\t{sum(h.n_gpus for h in hosts)} GPUs")
    return "\n".join(rows) + "\n"
