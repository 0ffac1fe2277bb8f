"""``bandpilot slurm submit|serve|lua``: jobs on the GPUs BandPilot picks, by one command or site-wide
through ``job_submit.lua``. Thin wrappers over :mod:`bandpilot.integrations.slurm.submit` and
:mod:`bandpilot.integrations.slurm.service`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from bandpilot.cli.common import shape_flags
from bandpilot.cli.queue import STORE_OPT
from bandpilot.cli.slurm import CLUSTER_OPT, cluster_spec, slurm_app
from bandpilot.errors import RequestError

MODEL_OPT = typer.Option(None, "--model", "-m", help="Model URI (models:/name@alias, runs:/..., path); default: the "
                         "cluster's fabric (measured tables or the emulator) guides the pick.")


def _dispatcher(spec, model: Optional[str]):
    from bandpilot.dispatch.dispatcher import Dispatcher

    if model is not None:
        disp = Dispatcher.load(model)
        if disp.spec.fingerprint() != spec.fingerprint():
            raise RequestError(f"model {model} is for cluster {disp.spec.name!r}, Slurm's cluster is {spec.name!r}")
        return disp
    from bandpilot.fabric.emulator import make_fabric

    return Dispatcher(make_fabric(spec))


@slurm_app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit_cmd(
    ctx: typer.Context,
    k: Optional[int] = typer.Option(None, "-k", min=1, help="GPUs for the job (with --shape: T*P*D)."),
    shape: Optional[str] = typer.Option(None, "--shape", help="Parallelism shape tp=T,pp=P,dp=D[,ep=E][,model=PRESET]: "
                                        "place each axis; the rank map reaches the tasks (RANK)."),
    traffic: Optional[str] = typer.Option(None, "--traffic", help="Bytes per step per GPU on each axis (with --shape)."),
    compute_ms: Optional[float] = typer.Option(None, "--compute-ms", help="Compute time per step, ms (with --shape)."),
    model: Optional[str] = MODEL_OPT,
    allowed_hosts: Optional[str] = typer.Option(None, "--allowed-hosts", help="Comma-separated nodes to choose from."),
    single_host: bool = typer.Option(False, "--single-host", help="All GPUs on one node."),
    wait: float = typer.Option(60.0, "--wait", min=0, help="Seconds to wait for the job to start and compare the grant "
                               "with the request (0: do not wait)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the batch script; submit nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    cluster: Optional[str] = CLUSTER_OPT,
    store: Optional[str] = STORE_OPT,
) -> None:
    """Submit SCRIPT (bash) on the GPUs BandPilot picks from Slurm's live state: exact nodes and per-node
    counts (one heterogeneous component per node when counts differ), exact indices where nodes declare
    one gres type per GPU, the rank map in every task. Other arguments before SCRIPT go to sbatch.

    Usage: bandpilot slurm submit -k K [--shape ...] [sbatch options] SCRIPT"""
    from bandpilot.integrations.slurm.submit import read_script, submit

    if not ctx.args:
        raise RequestError("give the batch SCRIPT to submit (last argument)")
    *options, script = ctx.args
    shp = shape_flags(shape, traffic, compute_ms)
    if k is None and shp is None:
        raise RequestError("give -k K (GPUs) or --shape")
    k = k if k is not None else shp.k
    body, script_opts = read_script(script)
    spec = cluster_spec(cluster, store)
    cons = {"allowed_hosts": [h.strip() for h in allowed_hosts.split(",") if h.strip()] if allowed_hosts else None,
            "single_host": single_host}
    sub = submit(_dispatcher(spec, model), spec, k, body, options=[*script_opts, *options], shape=shp,
                 constraints=cons, wait=wait, dry_run=dry_run)
    if dry_run:
        typer.echo(sub.script, nl=False)
        return
    _report(sub, as_json)


@slurm_app.command("check")
def check_cmd(
    job: str = typer.Argument(..., help="Slurm job id of a job `bandpilot slurm submit` submitted."),
    model: Optional[str] = MODEL_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    cluster: Optional[str] = CLUSTER_OPT,
    store: Optional[str] = STORE_OPT,
) -> None:
    """Compare what Slurm granted a submitted job with what BandPilot asked (e.g. once a job that was
    pending at submission has started); a differing grant is a warning with both predicted figures."""
    from bandpilot.integrations.slurm.submit import check

    spec = cluster_spec(cluster, store)
    _report(check(_dispatcher(spec, model), spec, job), as_json, verb="job")


def _report(sub, as_json: bool, verb: str = "submitted job") -> None:
    verdict = sub.verdict()
    g = sub.grant
    doc = {"job_id": sub.job_id, "ranks": sub.ranks, "predicted_gbps": round(sub.predicted_gbps, 3),
           "mechanism": ("one job" if sub.single_job else "heterogeneous job, one component per node")
           + (", indices pinned" if sub.indices_pinned else ", indices Slurm's"),
           "state_read_ms": round(sub.state_ms, 1), "place_ms": round(sub.place_ms, 1),
           "granted": {n: list(v) for n, v in g.gpus.items()} if g else None,
           "granted_gbps": None if sub.granted_gbps is None else round(sub.granted_gbps, 3),
           "job_state": g.state if g else None, "equal": verdict}
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    per: dict[str, list[str]] = {}
    for r in sub.ranks:
        n, _, i = r.rpartition(":")
        per.setdefault(n, []).append(i)
    asked = " ".join(f"{n}:{','.join(v)}" for n, v in per.items())
    timing = f" (state read {sub.state_ms:.0f} ms, placed in {sub.place_ms:.0f} ms)" if sub.place_ms else ""
    typer.echo(f"{verb} {sub.job_id} ({doc['mechanism']}): asked {asked} - {sub.predicted_gbps:.2f} GB/s "
               f"predicted{timing}")
    if g is None:
        return
    if not g.gpus:
        why = f" ({g.reason})" if g.reason else ""
        typer.echo(f"job {sub.job_id} is {g.state}{why}: grant not read yet; Slurm holds it to the request above "
                   f"(compare later: bandpilot slurm check {sub.job_id})")
        return
    got = " ".join(f"{n}:{','.join(map(str, v))}" for n, v in g.gpus.items())
    gb = f"{sub.granted_gbps:.2f}" if sub.granted_gbps is not None else "?"
    if all(verdict.values()):
        typer.echo(f"granted {got} - as asked ({gb} GB/s predicted)")
        return
    diff = [w for w in ("nodes", "counts", "indices") if not verdict[w]]
    typer.echo(f"warning: Slurm granted {got} - {gb} GB/s predicted, not the {sub.predicted_gbps:.2f} GB/s asked "
               f"({', '.join(diff)} differ)", err=True)


@slurm_app.command("serve")
def serve_cmd(
    port: int = typer.Option(8765, "--port", help="TCP port of the endpoint job_submit.lua asks."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (slurmctld's host)."),
    refresh: float = typer.Option(1.0, "--refresh", min=0.1, help="Seconds between state reads from Slurm."),
    model: Optional[str] = MODEL_OPT,
    cluster: Optional[str] = CLUSTER_OPT,
    store: Optional[str] = STORE_OPT,
) -> None:
    """Answer job_submit.lua: nodes and per-node GPUs for plain `sbatch --gpus=N` jobs, from Slurm's
    state read every --refresh seconds (never while slurmctld waits on the answer)."""
    from bandpilot.integrations.slurm.service import Placer, Service

    spec = cluster_spec(cluster, store)
    svc = Service(Placer(_dispatcher(spec, model), spec, refresh=refresh), host, port).start()
    typer.echo(f"BandPilot placement for Slurm at {svc.url}/place?gpus=N (cluster {spec.name}); Ctrl-C stops")
    try:
        svc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        svc.stop()


@slurm_app.command("lua")
def lua_cmd(
    out: Path = typer.Option(Path("job_submit.lua"), "--out", "-o", help="Where to write job_submit.lua (slurm.conf's "
                             "directory; add JobSubmitPlugins=lua)."),
    url: str = typer.Option("http://127.0.0.1:8765", "--url", help="The `bandpilot slurm serve` endpoint."),
    timeout: float = typer.Option(1.0, "--timeout", help="Seconds slurmctld waits for BandPilot before Slurm chooses."),
) -> None:
    """Write job_submit.lua: plain `sbatch --gpus=N` jobs get BandPilot's nodes and per-node GPUs;
    when BandPilot does not answer in time Slurm chooses (logged, never a rejected job)."""
    from bandpilot.integrations.slurm.config import write_conf_file
    from bandpilot.integrations.slurm.service import lua_script

    path = write_conf_file(out, lua_script(url, timeout))
    typer.echo(f"wrote {path}: add JobSubmitPlugins=lua to slurm.conf (the file sits beside it) and run "
               f"`bandpilot slurm serve` where {url} reaches it")
