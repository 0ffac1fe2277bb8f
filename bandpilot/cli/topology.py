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
        nv = set(spec.nvlink_domains)
        rows = [f"cluster {spec.name}: {spec.n_hosts} hosts, {spec.n_gpus} GPUs, {len(nv)} NVLink domains"]
        doms: dict[str, list[str]] = {}
        for h in spec.hosts:
            doms.setdefault(h.domain or "(none)", []).append(h.name)
        for d, hosts in doms.items():
            kind = "nvlink" if d in nv else "rack" if d != "(none)" else "-"
            n = sum(spec.hosts[spec.host_index[h]].n_gpus for h in hosts)
            rows.append(f"{d}\t{kind}\t{len(hosts)} hosts\t{n} GPUs")
        text = "\n".join(rows) + "\n"
    out = out or output
    if out:
        write_text_atomic(out, text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)
