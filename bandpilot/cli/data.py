"""``bandpilot profile`` and ``bandpilot ingest``: measurements -> dataset (-> DVC)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bandpilot.cli.main import app
from bandpilot.topology.cluster import resolve_spec
from bandpilot.errors import SpecError




def profile_cmd(
    cluster: str = typer.Option(..., "--cluster", "-c", help="Cluster spec (YAML file or name in params/clusters)."),
    out: Path = typer.Option(Path("."), "--out", "-o", help="Root directory; writes data/<cluster>/ under it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command lines and the plan size only."),
    samples: int = typer.Option(200, "--samples", "-n", min=0, help="Cross-host allocations to sample."),
    seed: int = typer.Option(0, "--seed", help="Seed of the cross-host sample."),
    runner: str = typer.Option("emulator", "--runner", help="emulator | ssh (real nccl-tests runs)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Concurrent runs (default: one per host)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Skip measurements already done."),
    track: bool = typer.Option(True, "--track/--no-track", help="dvc add <out>/data and push to the default remote."),
    binary: Optional[str] = typer.Option(None, "--binary", help="nccl-tests binary (default: the spec's collective)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (bars on a terminal, lines otherwise; BANDPILOT_PROGRESS=off|lines|bars)."),
) -> None:
    """Measure every intra-host GPU subset and a stratified cross-host sample; build the dataset."""
    from bandpilot.data import planning, profiling, runners
    from bandpilot.topology.cluster import load_cluster

    if runner not in runners.RUNNERS:
        raise SpecError(f"unknown runner {runner!r}; expected one of {', '.join(runners.RUNNERS)}")
    spec = load_cluster(resolve_spec(cluster))
    if spec.nvlink_domains:  # per tray, in-domain count patterns shared by identical domains, cross-domain
        from bandpilot.data.domain_planning import plan_domains

        measurements = plan_domains(spec, cross_domain_samples=samples, seed=seed)
    else:
        measurements = planning.plan(spec, cross_host_samples=samples, seed=seed)
    if dry_run:
        for m in measurements:
            where = f"{m.hosts[0]}$" if not m.cross_host else "launcher$"
            for line in runners.command_lines(m, spec, binary):
                typer.echo(f"{where} {line}")
        n_cross = sum(m.cross_host for m in measurements)
        typer.echo(
            f"plan: {len(measurements)} measurements ({len(measurements) - n_cross} single-host, "
            f"{n_cross} cross-host) on {spec.n_hosts} hosts of {spec.name}"
        )
        return
    from bandpilot.cli.reporting import shown

    with shown(progress):
        report = profiling.run(
            spec, out, runner=runner, resume=resume, progress=False, jobs=jobs,
            measurements=measurements, binary=binary,
        )
    if track and report.ingest is not None:
        from bandpilot.data import dvc

        report.dvc_md5 = dvc.track(Path(out) / "data", Path(out))
        dvc.push(Path(out))
    typer.echo(report.summary())
    if report.failed:
        typer.echo(f"warning: {report.failed} measurements failed; re-run to retry them", err=True)
        raise typer.Exit(1)


def ingest_cmd(
    directory: Path = typer.Argument(..., help="Measurement directory (cluster.yaml + CSV tables, or manifest.jsonl + raw logs)."),
    out: Path = typer.Option(..., "--out", "-o", help="Dataset directory to write (measurements.parquet + cluster.yaml)."),
) -> None:
    """Validate a measurement directory and write it as a dataset."""
    from bandpilot.data.ingest import ingest

    rep = ingest(directory, out)
    typer.echo(
        f"ingested {rep.cluster}: {rep.rows} rows, {len(rep.hosts)} hosts ({', '.join(rep.hosts)}), "
        f"{rep.single_host} single-host, {rep.cross_host} cross-host -> {rep.out}"
    )
    for why, n in sorted(rep.skipped.items()):
        if n:
            typer.echo(f"skipped {n} {why}")


def _register(target: typer.Typer) -> None:
    target.command("profile")(profile_cmd)
    target.command("ingest")(ingest_cmd)


_register(app)
