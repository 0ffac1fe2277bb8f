"""Where an evaluation lands in MLflow: its flat metrics, tags and report directory on the model
version's run (or a new run).

``res`` is an ``EvaluationResult``, typed ``Any``: result.py imports this module (``log_to_mlflow``).
"""

from __future__ import annotations

import math
import time
from typing import Any

from bandpilot.evaluation.params import EvaluationError


def log_to_mlflow(res: Any, run_id: str | None = None, *, artifact_path: str | None = None,
                  experiment: str = "bandpilot-evaluation") -> str:
    """Metrics, params-as-tags and the report directory on ``run_id`` (the model version's run).

    Without a run id (a model loaded from a path) a new run in ``experiment`` is created.
    Returns the run id used.
    """
    import mlflow
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if res.out_dir is None:
        raise EvaluationError("write the report (out_dir) before logging it to MLflow")
    client = MlflowClient()
    if run_id is None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            from bandpilot.model.registry import artifact_root_for

            exp_id = client.create_experiment(experiment, artifact_location=artifact_root_for(mlflow.get_tracking_uri()))
        else:
            exp_id = exp.experiment_id
        run_id = client.create_run(exp_id, run_name=f"evaluate-{res.cluster}").info.run_id
        client.set_terminated(run_id)
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, 0) for k, v in res.metrics().items() if math.isfinite(float(v))]
    for i in range(0, len(metrics), 900):
        client.log_batch(run_id, metrics=metrics[i : i + 900])
    dest = artifact_path or f"evaluation/{res.out_dir.name}"
    client.log_artifacts(run_id, str(res.out_dir), dest)
    # Tag keys are stored data: unchanged since 0.1, so runs logged before and after compare.
    tags = {
        "bandpilot.evaluation.path": dest,
        "bandpilot.evaluation.truth": res.truth[:250],
        "bandpilot.evaluation.scenarios": str(res.n_scenarios),
        "bandpilot.evaluation.seed": str(res.seed),
        "bandpilot.evaluation.reference": "exact" if res.exact_everywhere else "best-found (partial)",
    }
    for k, v in tags.items():
        client.set_tag(run_id, k, v)
    return run_id
