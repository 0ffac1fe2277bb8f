"""``bandpilot select K --model URI | --cluster SPEC --state state.json``: pick K GPUs.

With ``--cluster`` and no ``--model`` the cluster's fabric (measured tables or the emulator) is the
model, i.e. Ideal-BP; with both, the fabric also serves ``--algorithm ideal/exact`` and the output
adds the true contention-aware bandwidth of the chosen GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bandpilot.cli import common
from bandpilot.cli.common import shape_flags
from bandpilot.cli.main import app
from bandpilot.dispatch import strategies
from bandpilot.errors import RequestError


@app.command("select")
def select_cmd(
    k: Annotated[int, typer.Argument(help="Number of GPUs to allocate.")],
    state: Annotated[Path, typer.Option("--state", "-s", help='Cluster state JSON with "free" (GPU ids) and "jobs" lists (the format of `cluster state --json`).')],
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model URI (models:/name@alias, runs:/..., path).")] = None,
    cluster: Annotated[Path | None, typer.Option("--cluster", "-c", help="Cluster spec (YAML or measurement dir).")] = None,
    algorithm: Annotated[str | None, typer.Option("--algorithm", "-a",
                                                  help=strategies.help_text() + " (default bandpilot); with --shape: "
                                                  "shape (default), blind, segment, bandpilot.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed (random baseline).")] = 0,
    single_host: Annotated[bool, typer.Option("--single-host", help="All K GPUs on one host.")] = False,
    allowed_hosts: Annotated[str | None, typer.Option("--allowed-hosts", help="Comma-separated host names.")] = None,
    min_gbps: Annotated[float | None, typer.Option("--min-gbps", help="Reject results predicted below this.")] = None,
    single_domain: Annotated[bool, typer.Option("--single-domain", help="All K GPUs in one domain.")] = False,
    whole_domains: Annotated[bool, typer.Option("--whole-domains", help="Only wholly free domains.")] = False,
    segment: Annotated[int | None, typer.Option("--segment", help="GPUs per segment kept in one NVLink domain.")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="Parallelism shape tp=T,pp=P,dp=D[,ep=E][,model=PRESET] "
                                              "(K = T*P*D): place each axis and print the rank map.")] = None,
    traffic: Annotated[str | None, typer.Option("--traffic", help="Bytes per step per GPU on each axis, e.g. "
                                                "tp=4GiB,dp=1.5e9 (default: from the shape's preset model).")] = None,
    compute_ms: Annotated[float | None, typer.Option("--compute-ms", help="Compute time per step (ms) for the step time.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the selection as JSON.")] = False,
) -> None:
    """Select K GPUs for a new job under the given cluster state."""
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.dispatch.state import State, read_state_file

    if model is None and cluster is None:
        raise RequestError("give --model URI or --cluster SPEC")
    # Every input is checked before the model loads (torch and the registry take seconds to start).
    doc = read_state_file(state)
    shp = shape_flags(shape, traffic, compute_ms)
    fabric = None
    if cluster is not None:
        from bandpilot.topology.cluster import load_cluster
        from bandpilot.fabric.emulator import make_fabric

        fabric = make_fabric(load_cluster(cluster))
    disp = Dispatcher.load(model, seed=seed) if model is not None else Dispatcher(fabric, seed=seed)
    st = State.from_dict(disp.spec, doc, str(state))
    constraints = {
        "single_host": single_host,
        "allowed_hosts": [h.strip() for h in allowed_hosts.split(",") if h.strip()] if allowed_hosts else None,
        "min_gbps": min_gbps,
        "single_domain": single_domain,
        "whole_domains": whole_domains,
        "segment": segment,
    }
    sel = disp.select(k, st, algorithm, fabric=fabric, constraints=constraints, shape=shp)
    out = sel.to_dict()
    if fabric is not None and model is not None:
        out.update(_truth(fabric, st, sel, shp))
    if as_json:
        print(json.dumps(out, indent=2))
        return
    common.console.print(
        f"[bold]{sel.algorithm}[/bold] k={k}: {sel.predicted_gbps:.2f} GB/s predicted "
        f"(standalone {sel.standalone_gbps:.2f})"
        + (f", true {out['true_gbps']:.2f}" if "true_gbps" in out else "")
        + f" - {sel.search_ms:.1f} ms, {sel.evaluations} evaluations"
    )
    if sel.placement is not None:
        pl = sel.placement
        axes = ", ".join(f"{a} {v:.1f} GB/s ({pl['comm_ms'][a]:.1f} ms)" for a, v in pl["axis_gbps"].items())
        common.console.print(f"  shape {shp}: step {pl['step_ms']:.1f} ms = compute {pl['compute_ms']:.1f} ms + {axes}")
        common.console.print(f"  ranks: {' '.join(pl['ranks'])}")
        return
    for host in sel.hosts:
        idx = [g.rpartition(":")[2] for g in sel.gpus if g.rpartition(":")[0] == host]
        common.console.print(f"  {host}: {', '.join(idx)}")


def _truth(fabric, st, sel, shp) -> dict:
    """What the true fabric (--cluster) says of a model's selection: GB/s, and with a shape the step time."""
    from bandpilot.dispatch.contention import ContentionPredictor
    from bandpilot.dispatch.state import State

    st_f = State.from_dict(fabric.spec, st.to_dict())
    out = {"true_gbps": round(float(ContentionPredictor(fabric, st_f).predict(sel.mask[None, :]).value[0]), 6)}
    if sel.placement is not None and shp is not None:
        from bandpilot.dispatch.search.shape import from_ranks, score

        truth = from_ranks(fabric.spec, sel.placement["ranks"])
        score(ContentionPredictor(fabric, st_f), shp, [truth])
        out["true_step_ms"] = round(float(truth.step_ms), 6)
        out["true_axis_gbps"] = {a: round(float(v), 6) for a, v in truth.axis_gbps.items()}
    return out
