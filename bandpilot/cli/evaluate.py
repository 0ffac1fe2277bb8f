"""``bandpilot evaluate`` and ``bandpilot promote``: thin wrappers over
:func:`bandpilot.evaluation.runner.evaluate` and :func:`bandpilot.evaluation.gate.promote` / :func:`~bandpilot.evaluation.gate.approve`."""

from __future__ import annotations

import datetime as _dt
import re
import sys
from pathlib import Path
from typing import Optional

import typer

import bandpilot.cli.main as _main
from bandpilot.cli.main import app
from bandpilot.dispatch import strategies
from bandpilot.errors import BandPilotError, SpecError


def _ks(value: Optional[str]) -> Optional[list[int]]:
    """``1-8,16,32`` -> [1..8, 16, 32]."""
    if not value:
        return None
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise SpecError(f"--ks: {part!r} is not a number or a range like 4-8")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        out.extend(range(lo, hi + 1))
    return out


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "model"


def evaluate_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Model URI: models:/NAME@alias, models:/NAME/VERSION, runs:/ID/model or a path."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster spec (YAML, measurement dir or name in params/clusters); default: the model's."),
    truth: Optional[Path] = typer.Option(None, "--truth", help="Measured directory used as ground truth (TraceFabric); default: the cluster's emulator."),
    profiles: Optional[str] = typer.Option(None, "--profiles", "-p", help="Comma list of idle,moderate,heavy."),
    repeats: Optional[int] = typer.Option(None, "--repeats", "-r", help="Scenarios per request size k (paper: 50)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Scenario seed."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=0, help="Worker processes (0: min(2, CPUs); 1: in-process)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Report directory (default: reports/evaluate/<cluster>-<model>-<time>)."),
    algorithms: Optional[str] = typer.Option(None, "--algorithms", help="Comma list (default: " + ",".join(strategies.names(default_for="evaluate")) + ")."),
    ks: Optional[str] = typer.Option(None, "--ks", help="Request sizes, e.g. 1-8,16 (default: 1..N)."),
    scenarios: Optional[Path] = typer.Option(None, "--scenarios", help="Replay scenarios.jsonl of an earlier run exactly."),
    log: bool = typer.Option(True, "--log/--no-log", help="Log metrics + report to MLflow (the model version's run)."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Render the figures (matplotlib)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (bars on a terminal, lines otherwise; BANDPILOT_PROGRESS=off|lines|bars)."),
    metrics_out: Optional[Path] = typer.Option(None, "--metrics-out", help="Also write the flat metrics as JSON (DVC metrics file)."),
) -> None:
    """Paper Sec. V evaluation: GBE vs the exact optimum, bandwidth loss, search latency -> report."""
    from bandpilot.cli.common import console
    from bandpilot.config import project_root
    from bandpilot.evaluation.params import evaluate_defaults
    from bandpilot.evaluation.report import rich_table
    from bandpilot.evaluation.runner import evaluate
    from bandpilot.evaluation.truth import resolve_truth
    from bandpilot.model.surrogate import Surrogate

    d = evaluate_defaults()
    if repeats is not None and repeats < 1:
        raise BandPilotError(f"zero scenarios: --repeats must be >= 1 (got {repeats})")
    if log:
        from bandpilot.model import registry

        registry.tracking_setup()
    m = Surrogate.load(model)
    fabric = resolve_truth(m.spec, truth=truth, cluster=cluster)
    out = out or project_root() / "reports" / "evaluate" / f"{fabric.spec.name}-{_slug(model.split(':/')[-1])}-{_stamp()}"
    from bandpilot.cli.reporting import shown

    with shown(progress):
        res = evaluate(
            m,
            fabric,
            profiles=profiles or d["profiles"],
            repeats=d["repeats"] if repeats is None else repeats,
            seed=d["seed"] if seed is None else seed,
            workers=d["workers"] if workers is None else workers,
            out_dir=out,
            progress=False,
            algorithms=algorithms or d["algorithms"],
            ks=_ks(ks),
            scenarios=scenarios,
            figures=figures,
        )
    res.model_uri = model
    console.print(rich_table(res))
    for n in res.notes:
        console.print(f"[yellow]note:[/yellow] {n}")
    console.print(f"report: {res.out_dir / 'report.md'}  ({res.n_scenarios} scenarios, {res.elapsed_s:.1f} s)")
    if metrics_out:
        from bandpilot.io import write_json_atomic

        write_json_atomic(metrics_out, res.metrics())
    if log:
        from bandpilot.model.artifacts import resolve

        run_id = None
        if model.startswith(("models:/", "runs:/")):
            _, _, run_id = resolve(model)
        used = res.log_to_mlflow(run_id)
        console.print(f"logged to MLflow run {used}")


def promote_cmd(
    candidate: Optional[str] = typer.Option(None, "--candidate", help="Candidate version: models:/bandpilot-<cluster>/VERSION (or @alias)."),
    manual: bool = typer.Option(False, "--manual", help="Only set 'challenger'; a human approves with --approve."),
    approve: Optional[str] = typer.Option(None, "--approve", help="Approve VERSION of --name as champion (after --manual)."),
    name: Optional[str] = typer.Option(None, "--name", help="Registered model name for --approve (bandpilot-<cluster>)."),
    force: bool = typer.Option(False, "--force", help="With --approve: approve even if the gate failed or never ran."),
    truth: Optional[Path] = typer.Option(None, "--truth", help="Measured directory used as ground truth."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster spec (default: the model's)."),
    holdout: Optional[Path] = typer.Option(None, "--holdout", help="Held-out dataset directory for the MAPE check."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (default: params/promotion.yaml)."),
    profiles: Optional[str] = typer.Option(None, "--profiles", "-p", help="Comma list (default: the policy's)."),
    algorithms: Optional[str] = typer.Option(None, "--algorithms", help="Comma list (default: the policy's; bandpilot is always run)."),
    repeats: Optional[int] = typer.Option(None, "--repeats", "-r", help="Scenarios per k (default: the policy's)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Scenario seed (default: the policy's)."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=0, help="Worker processes."),
    ks: Optional[str] = typer.Option(None, "--ks", help="Request sizes, e.g. 1-8,16 (default: 1..N)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Report directory (default: reports/promotion/...)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (bars on a terminal, lines otherwise; BANDPILOT_PROGRESS=off|lines|bars)."),
) -> None:
    """Gate a candidate against the champion on the same scenarios; move registry aliases."""
    from bandpilot.cli.common import console
    from bandpilot.evaluation.decision import rich_decision
    from bandpilot.evaluation.gate import approve as approve_fn
    from bandpilot.evaluation.gate import promote

    if approve is not None:
        if candidate is not None:
            raise BandPilotError("use either --candidate or --approve, not both")
        if not name:
            raise BandPilotError("--approve needs --name bandpilot-<cluster>")
        got = approve_fn(name, approve, force=force)
        prev = f" (previous champion v{got['previous']} -> 'previous')" if got["previous"] else " (first champion)"
        console.print(f"approved: {name} v{got['version']} is now 'champion'{prev}")
        return
    if candidate is None:
        raise BandPilotError("give --candidate URI (or --approve VERSION --name NAME)")
    if repeats is not None and repeats < 1:
        raise BandPilotError(f"zero scenarios: --repeats must be >= 1 (got {repeats}); nothing was promoted")
    from bandpilot.cli.reporting import shown

    with shown(progress):
        dec = promote(
            candidate,
            policy=policy,
            truth=truth,
            cluster=cluster,
            holdout=holdout,
            profiles=profiles,
            algorithms=algorithms,
            repeats=repeats,
            seed=seed,
            workers=workers,
            ks=_ks(ks),
            manual=manual,
            out_dir=out,
            progress=False,
        )
    console.print(rich_decision(dec))
    for c in dec.checks:
        console.print(f"  {'[green]PASS[/green]' if c.passed else '[red]FAIL[/red]'} {c.detail}")
    console.print(f"report: {dec.report_dir / 'promotion.md'}")
    if not dec.passed:
        raise typer.Exit(1)


def _register(target: typer.Typer) -> None:
    target.command("evaluate")(evaluate_cmd)
    target.command("promote")(promote_cmd)


_register(app)
# ``python -m bandpilot.cli.main`` runs main.py as ``__main__`` (a second ``app``): register there too.
_entry = sys.modules.get("__main__")
if (
    _entry is not None
    and isinstance(getattr(_entry, "app", None), typer.Typer)
    and _entry.app is not app
    and Path(getattr(_entry, "__file__", "") or "").resolve() == Path(_main.__file__).resolve()
):
    _register(_entry.app)
