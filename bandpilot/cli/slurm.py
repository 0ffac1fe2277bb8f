"""``bandpilot slurm ...``: BandPilot on a Slurm cluster - its configuration from what was measured,
the dispatcher's state read from Slurm, and drains from ``verify`` verdicts. Thin wrappers over
:mod:`bandpilot.integrations.slurm`; Slurm's clients run with the caller's environment
(``SLURM_CONF`` and ``PATH`` choose the cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from bandpilot.cli.main import app
from bandpilot.cli.common import cli_store
from bandpilot.cli.queue import STORE_OPT

slurm_app = typer.Typer(help="Slurm: slurm.conf/gres.conf/topology.conf from measurements, state from Slurm, drains.",
                        no_args_is_help=True)
app.add_typer(slurm_app, name="slurm")

CLUSTER_OPT = typer.Option(None, "--cluster", "-c", help="Cluster spec (default: the store's cluster).")


def cluster_spec(cluster: Optional[str], store: Optional[str]):
    """The spec a command names (``--cluster``) or the store's cluster."""
    from bandpilot.topology.cluster import load_cluster, resolve_spec

    return load_cluster(resolve_spec(cluster)) if cluster else cli_store(store).spec


@slurm_app.command("conf")
def conf_cmd(
    out: Path = typer.Option(Path("."), "--out", "-o", help="Directory for slurm.bandpilot.conf, gres.conf and topology.conf."),
    topology: str = typer.Option("auto", "--topology", help="auto (topology/block when the Slurm found is 23.11+ and the "
                                 "cluster has domains, else topology/tree) | tree | block."),
    slurm_version: Optional[str] = typer.Option(None, "--slurm-version", help="Write for this Slurm version (e.g. 23.11) "
                                                "instead of the one installed here."),
    gpu_type: str = typer.Option("none", "--gpu-type", help="gres Type= per GPU: none | model (Type=h100 on every GPU) | "
                                 "index (Type=h100_3: a type per GPU index, so a job can name exact indices)."),
    cpus_per_gpu: int = typer.Option(8, "--cpus-per-gpu", min=1, help="CPUs= on the node lines, per GPU (take the real "
                                     "figure from `slurmd -C`)."),
    memory_per_gpu: int = typer.Option(65536, "--memory-per-gpu", min=1, help="RealMemory= on the node lines, MB per GPU."),
    partition: str = typer.Option("bandpilot", "--partition", help="Partition holding every node ('' for none)."),
    cluster: Optional[str] = CLUSTER_OPT,
    store: Optional[str] = STORE_OPT,
) -> None:
    """Write Slurm's configuration for the cluster from what was measured: NodeName lines (Gres=gpu:N),
    gres.conf with per-GPU Links= from the measured intra-host bandwidth, and topology.conf."""
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.integrations.slurm.commands import installed_version, parse_version
    from bandpilot.integrations.slurm.config import ConfOptions, write_conf
    from bandpilot.integrations.slurm.topology import choose_plugin, topology_conf

    from bandpilot.errors import one_of

    template = {"none": None, "model": "{gpu}", "index": "{gpu}_{index}"}[one_of(gpu_type, ("none", "model", "index"), "--gpu-type")]
    spec = cluster_spec(cluster, store)
    version = parse_version(slurm_version) if slurm_version else installed_version()
    plugin = choose_plugin(spec, topology, version)
    opts = ConfOptions(cpus_per_gpu=cpus_per_gpu, memory_mb_per_gpu=memory_per_gpu, gpu_type=template,
                       partition=partition or None)
    paths = write_conf(out, spec, make_fabric(spec), topology_conf(spec, plugin), plugin, opts)
    found = f"Slurm {version}" if version else "no Slurm found here"
    typer.echo(f"wrote {', '.join(str(p) for p in paths)} ({plugin}; {found})")


@slurm_app.command("state")
def state_cmd(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the state JSON here (atomically) instead of stdout."),
    form: str = typer.Option("text", "--form", help="How to read Slurm: text (scontrol -o, every version; the faster) | "
                             "json (sinfo/squeue --json)."),
    cluster: Optional[str] = CLUSTER_OPT,
    store: Optional[str] = STORE_OPT,
) -> None:
    """The dispatcher's state read from Slurm (free GPUs, jobs holding GPUs by index; drained and down
    nodes in neither), as the JSON `bandpilot select --state` takes; a summary goes to stderr."""
    import json

    from bandpilot.integrations.slurm.state import read_state

    snap = read_state(cluster_spec(cluster, store), form=form)
    doc = snap.state.to_dict()
    if out:
        from bandpilot.io import write_json_atomic

        write_json_atomic(out, doc)
        typer.echo(f"wrote {out}", err=True)
    else:
        typer.echo(json.dumps(doc, indent=2))
    busy = sum(len(j.gpus) for j in snap.state.jobs)
    typer.echo(f"{snap.state.n_free} free GPUs; {len(snap.state.jobs)} jobs hold {busy} GPUs", err=True)
    gone = list(snap.unavailable.items())
    for node, why in gone[:10]:
        typer.echo(f"unavailable: {node} ({why})", err=True)
    if len(gone) > 10:
        typer.echo(f"unavailable: {len(gone) - 10} more nodes", err=True)


@slurm_app.command("drain")
def drain_cmd(
    nodes: Optional[List[str]] = typer.Argument(None, help="Nodes to drain (Slurm names)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (Slurm shows it in sinfo -R); prefixed 'bandpilot:'."),
    from_verify: Optional[str] = typer.Option(None, "--from-verify", help="A `bandpilot verify --json` report ('-': "
                                               "stdin): drain degraded/failed hosts, resume healthy ones BandPilot had drained."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --from-verify: say what would change, change nothing."),
) -> None:
    """Drain nodes in Slurm (running jobs finish, no new job lands), by name or from a verify report."""
    from bandpilot.errors import RequestError
    from bandpilot.integrations.slurm import drain as dr

    if from_verify is not None:
        if nodes or reason:
            raise RequestError("--from-verify takes no NODE arguments or --reason: the report names hosts and reasons")
        res = dr.apply_verdicts(dr.read_verdicts(from_verify), dry_run=dry_run)
        verb = "would " if dry_run else ""
        typer.echo(f"{verb}drain: {', '.join(res['drained']) or 'none'}; {verb}resume: {', '.join(res['resumed']) or 'none'}; "
                   f"unchanged: {', '.join(res['unchanged']) or 'none'}")
        return
    if not nodes:
        raise RequestError("name the nodes to drain, or give --from-verify REPORT.json")
    if not reason:
        raise RequestError("--reason is required: Slurm shows it in sinfo -R")
    done = dr.drain(nodes, f"bandpilot: {reason}")
    typer.echo(f"drained {', '.join(done)}")


@slurm_app.command("undrain")
def undrain_cmd(
    nodes: List[str] = typer.Argument(..., help="Nodes to resume (Slurm names)."),
) -> None:
    """Resume drained nodes in Slurm (State=RESUME); nodes that are not drained are left as they are."""
    from bandpilot.integrations.slurm import drain as dr

    done = dr.undrain(nodes)
    typer.echo(f"resumed {', '.join(done) or 'none'} (of {', '.join(nodes)})")
