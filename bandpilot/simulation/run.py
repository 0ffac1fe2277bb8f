"""One simulation from files: trace + cluster + model (+ truth) -> report directory and MLflow run.

The model is a surrogate URI (``models:/...``, ``runs:/...``, a path) or ``emulator``: the truth
fabric itself as a perfect predictor (labelled so in every report). The truth is chosen exactly
as ``bandpilot evaluate`` does (:func:`bandpilot.evaluation.truth.resolve_truth`): ``--truth DIR``
(measured tables), else the cluster spec's fabric, else the model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bandpilot.errors import BandPilotError
from bandpilot.simulation.elastic import simulate
from bandpilot.simulation.engine import SimConfig, SimResult
from bandpilot.simulation.trace import TraceJob, parse_trace

PERFECT = "emulator"


@dataclass
class Setup:
    dispatcher: Any
    truth: Any
    model_label: str
    truth_label: str


def load_setup(model: str, *, cluster: str | Path | None = None, truth: str | Path | None = None, seed: int = 0) -> Setup:
    """The dispatcher (model) and the truth fabric, checked to describe the same hosts."""
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.evaluation.truth import resolve_cluster, resolve_truth

    if model == PERFECT:
        if cluster is None and truth is None:
            raise BandPilotError("--model emulator needs --cluster SPEC (or --truth DIR): which cluster?")
        spec = resolve_cluster(cluster if cluster is not None else truth)
        fab = resolve_truth(spec, truth=truth, cluster=cluster)
        model_obj: Any = fab  # a perfect predictor: the dispatcher sees the truth itself
        label = f"perfect predictor ({'measured tables' if fab.spec.source == 'trace' else 'emulator'})"
    else:
        from bandpilot.model.surrogate import Surrogate

        model_obj = Surrogate.load(model)
        fab = resolve_truth(model_obj.spec, truth=truth, cluster=cluster)
        label = model
    tlabel = f"measured tables ({fab.spec.path})" if fab.spec.source == "trace" else f"emulator ({fab.spec.name})"
    return Setup(Dispatcher(model_obj, seed=seed), fab, label, tlabel)


def run_one(
    trace: str | Path | list[TraceJob], setup: Setup, config: SimConfig, out: str | Path | None = None, *,
    figures: bool = True, log: bool = False, progress: Callable[[int, int], None] | None = None,
) -> tuple[SimResult, dict[str, Any]]:
    """Parse (all-or-nothing), simulate, write ``out`` and log an MLflow run when ``log``."""
    from bandpilot.simulation.report import log_to_mlflow, summarize, write_outputs

    spec = setup.dispatcher.model.spec
    jobs = trace if isinstance(trace, list) else parse_trace(trace, n_gpus=spec.n_gpus)
    config.check()
    res = simulate(jobs, setup.dispatcher, setup.truth, config, truth_label=setup.truth_label,
                   model_label=setup.model_label, progress=progress)
    if out is None:
        return res, summarize(res)
    summary = write_outputs(res, out, figures=figures)
    if log:
        summary["mlflow_run_id"] = log_to_mlflow(summary, out)
    return res, summary
