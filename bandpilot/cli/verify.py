"""``bandpilot verify``: probe the fabric (or read a measurement directory), compare with the model,
give a verdict per host. Exit 0 when every host is healthy, 3 when something is degraded or failed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bandpilot.cli.common import cli_store
from bandpilot.cli.main import app
from bandpilot.cli.queue import cluster_app
from bandpilot.errors import RequestError


@app.command("verify")
def verify_cmd(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model URI (models:/name@alias, runs:/..., path); "
                                                                    "optional with --pairwise.")] = None,
    cluster: Annotated[Path | None, typer.Option("--cluster", "-c", help="Cluster spec to probe (default: the model's).")] = None,
    runner: Annotated[str, typer.Option("--runner", help="emulator | ssh (nccl-tests over mpirun).")] = "emulator",
    hosts: Annotated[str | None, typer.Option("--hosts", help="Comma-separated hosts to verify (default: all).")] = None,
    inject: Annotated[Path | None, typer.Option("--inject", help="Faults for the emulator: a YAML file, keys below.")] = None,
    measurements: Annotated[Path | None, typer.Option("--measurements", help="Verify this measurement directory instead of probing.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the probe command lines and their cost; run nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help='Print the per-host verdicts as JSON on stdout.')] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write verify.md and verify.json here (--pairwise: also heatmap.png).")] = None,
    gate: Annotated[bool, typer.Option("--gate", help="Record the verdicts in the queue store and drain suspects "
                                                      "(undrain what an earlier verify drained and now passes).")] = False,
    store: Annotated[str | None, typer.Option("--store", envvar="BANDPILOT_STORE", help="Queue store URL for --gate.")] = None,
    pairwise: Annotated[Path | None, typer.Option("--pairwise", help="Verify pairwise node-sweep logs in this directory "
                                                                     "(any collective, any GPUs per node; no model needed).")] = None,
    message_bytes: Annotated[int | None, typer.Option("--bytes", min=1, help="--pairwise: message size to compare "
                                                                             "(default: the largest most runs reached).")] = None,
    min_drop: Annotated[float, typer.Option("--min-drop", min=0.01, max=0.9, help="--pairwise: the smallest loss "
                                                                                 "called a fault (0.15 = 15 % below the peers).")] = 0.15,
    nodes: Annotated[str | None, typer.Option("--nodes", help="--pairwise: every node the sweep was meant to cover, "
                                                              "comma-separated or a file (one per line), so pairs "
                                                              "without any log count as missing (default: the nodes "
                                                              "in the logs).")] = None,
) -> None:
    """Verified discovery: a few nccl-tests runs per host against the model's expectation, or pairwise
    sweep logs against their peers (--pairwise DIR; no model needed, --model optional).

    The --inject file is a YAML list of faults (or a mapping whose "faults" key holds the list).
    Each fault scales one part of the emulated fabric; its keys:

    \b
      kind      nvlink_width | nvlink_pair | nic_rail | slow_host | missing_gpu | host_link
      host      a host of the cluster
      gpu       GPU index on that host (nvlink_width, nvlink_pair, nic_rail, missing_gpu;
                nvlink_pair: its first GPU; nic_rail: the GPU whose rail is slow)
      peer      nvlink_pair only: the second GPU
      peer_host host_link only: the host at the other end of the slow path
      factor    bandwidth scale 0..1 (default 0.5; slow_host 0.7; host_link 0.6; missing_gpu 0)

    \b
    Example:
      - kind: nvlink_width
        host: h100-1
        gpu: 3
        factor: 0.25
    """
    from bandpilot.health import verify as hv
    from bandpilot.model.surrogate import Surrogate

    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    st = None
    if gate:  # open (and check) the store first: a bad store must not cost a verify run
        st = cli_store(store)
    if pairwise is not None:
        _pairwise(pairwise, model, message_bytes, min_drop, st, out, as_json, nodes,
                  conflicts=[n for n, v in (("--measurements", measurements), ("--inject", inject), ("--dry-run", dry_run),
                                            ("--hosts", hosts), ("--cluster", cluster)) if v])
        return
    if model is None:
        raise RequestError("verify needs --model (or --pairwise DIR, which compares sweep logs with their peers)")
    if message_bytes is not None or min_drop != 0.15 or nodes is not None:
        raise RequestError("--bytes, --min-drop and --nodes apply to --pairwise")
    if measurements is not None and (inject is not None or dry_run):
        raise RequestError("--measurements verifies existing runs: it takes no --inject or --dry-run")
    if runner not in ("emulator", "ssh"):
        raise RequestError(f"--runner must be emulator or ssh, got {runner!r}")
    sur = Surrogate.load(model)
    rep = _probe(sur, cluster, runner, inject, measurements, dry_run, host_list, as_json)
    if rep is None:  # --dry-run printed the plan
        return
    if st is not None:
        _gate(st, sur, rep)
    if out is not None:
        rep.write(out)
    typer.echo(hv.report_json(rep) if as_json else rep.markdown())
    raise typer.Exit(rep.exit_code)



def _probe(sur, cluster: Path | None, runner: str, inject: Path | None, measurements: Path | None, dry_run: bool,
           host_list: list[str] | None, as_json: bool = False):
    """The verify report of existing measurements or of new probe runs; None after printing a dry run."""
    import json

    from bandpilot.health import verify as hv
    from bandpilot.topology.cluster import load_cluster

    if measurements is not None:
        return hv.verify_measurements(sur, measurements, hosts=host_list)
    spec = load_cluster(cluster) if cluster is not None else sur.spec
    if dry_run:
        plan = hv.dry_run_plan(spec, host_list, model=sur)
        typer.echo(json.dumps(plan, indent=1) if as_json else "\n".join(hv.dry_run_lines(plan=plan)))
        return None
    fabric = None
    if inject is not None:
        if runner != "emulator":
            raise RequestError("--inject injects faults into the emulator: use --runner emulator")
        from bandpilot.fabric.emulator import make_fabric
        from bandpilot.fabric.faults import FaultyFabric, load_faults

        fabric = FaultyFabric(make_fabric(spec), load_faults(inject, spec))
    return hv.verify_probes(sur, spec, runner=runner, fabric=fabric, hosts=host_list)


def _gate(st, sur, rep) -> None:
    """Record the verdicts in the queue store and drain the suspects (``--gate``)."""
    from bandpilot.errors import StateError
    from bandpilot.queue import apply_verdicts, record_observations

    if st.spec.fingerprint() != sur.spec.fingerprint():
        raise StateError(f"store {st.safe_url} is for cluster {st.spec.name!r}, the verify for {sur.spec.name!r}")
    g = apply_verdicts(st, rep.to_json()["hosts"], rep.source)
    record_observations(st, rep.runs, source="verify")
    typer.echo(f"gate: drained {len(g['drained'])}, on release {len(g['pending'])}, undrained {len(g['undrained'])}",
               err=True)


def _node_list(value: str | None) -> list[str] | None:
    """``--nodes``: a file of node names (one per line or separated by commas/blanks, ``#`` comments)
    or a comma-separated list."""
    if value is None:
        return None
    p = Path(value)
    if p.is_file():
        try:
            text = "\n".join(ln.split("#", 1)[0] for ln in p.read_text().splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise RequestError(f"--nodes {value}: cannot read it ({exc.__class__.__name__})") from None
        names = text.replace(",", " ").split()
    else:
        names = [n.strip() for n in value.split(",") if n.strip()]
        if len(names) == 1 and ("/" in value or value.endswith((".txt", ".list"))):
            raise RequestError(f"--nodes {value}: no such file (give a file or a comma-separated list of nodes)")
    if len(names) < 2:
        raise RequestError(f"--nodes {value}: a sweep needs at least 2 nodes, got {len(names)}")
    return names


def _pairwise(directory: Path, model: str | None, message_bytes: int | None, min_drop: float, st, out: Path | None,
              as_json: bool, nodes: str | None, conflicts: list[str]) -> None:
    from bandpilot.health.pairwise import analyze, report_json
    from bandpilot.health.sweeps import read_sweep

    if conflicts:
        raise RequestError(f"--pairwise reads sweep logs: it takes no {', '.join(conflicts)}")
    if not directory.is_dir():
        raise RequestError(f"--pairwise {directory}: not a directory")
    listed = _node_list(nodes)
    expect = None
    if model is not None:
        from bandpilot.health.pairwise_model import model_expectation
        from bandpilot.model.surrogate import Surrogate

        expect = model_expectation(Surrogate.load(model))
    rep = analyze(read_sweep(directory, message_bytes), source=str(directory), expect=expect, min_drop=min_drop,
                  nodes=listed)
    if st is not None:
        from bandpilot.queue import apply_verdicts

        g = apply_verdicts(st, rep.host_verdicts(), f"pairwise {directory}")
        typer.echo(f"gate: drained {len(g['drained'])}, on release {len(g['pending'])}, undrained {len(g['undrained'])}",
                   err=True)
    if out is not None:
        rep.write(out)
        typer.echo(f"wrote {out}/verify.md, verify.json, heatmap.png", err=True)
    typer.echo(report_json(rep) if as_json else rep.markdown())
    raise typer.Exit(rep.exit_code)


@cluster_app.command("drift")
def drift_cmd(
    store: Annotated[str | None, typer.Option("--store", envvar="BANDPILOT_STORE", help="Queue store URL.")] = None,
    params: Annotated[Path, typer.Option("--params", help="Drift thresholds (window, threshold, min_observations).")] = Path("params/drift.yaml"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Observed vs predicted bandwidth over the last observations; exit 3 on a drift event."""
    import json

    import yaml

    from bandpilot.config import project_root
    from bandpilot.errors import SpecError
    from bandpilot.queue import drift

    p = params if params.is_absolute() or params.is_file() else project_root() / params
    cfg: dict = {}
    if p.is_file():
        try:
            cfg = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SpecError(f"{p}: invalid YAML ({exc.__class__.__name__})") from None
        unknown = sorted(set(cfg) - {"window", "threshold", "min_observations"})
        if unknown:
            raise SpecError(f"{p}: unknown keys {unknown}")
    try:
        d = drift(cli_store(store), **{k: (float(v) if k == "threshold" else int(v)) for k, v in cfg.items()})
    except (TypeError, ValueError):
        raise SpecError(f"{p}: window and min_observations must be integers, threshold a number") from None
    if as_json:
        typer.echo(json.dumps(d, indent=2))
    else:
        typer.echo(f"{d['observations']} observations, median |log error| {d['median_log_error']:.3f} "
                   f"(threshold {d['threshold']:.3f}): {'DRIFT on ' + ', '.join(d['drifting_hosts'] or ['the cluster']) if d['event'] else 'no drift'}")
        for h, v in d["hosts"].items():
            typer.echo(f"  {h:<16} {v['observations']:>5} obs  median |log error| {v['median_log_error']:.3f}")
    raise typer.Exit(3 if d["event"] else 0)


@cluster_app.command("health")
def health_cmd(
    store: Annotated[str | None, typer.Option("--store", envvar="BANDPILOT_STORE", help="Queue store URL.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The last verify verdict per host and how many GPUs it keeps out of the pool."""
    import json

    from bandpilot.queue import health

    rows = health(cli_store(store))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        sus = ", ".join(r["links"] or r["gpus"]) or "-"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        typer.echo(f"{r['host']:<16} {r['status']:<9} suspects {sus:<28} measured/expected {ratio:<5} "
                   f"gated GPUs {r['gated_gpus']}  verified {r['verified_at'] or 'never'}")
