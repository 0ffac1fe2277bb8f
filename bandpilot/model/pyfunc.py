"""What does MLflow load as the model? The pyfunc wrapper around the surrogate directory (its only
artifact). Registered versions pickle this class by reference; ``bandpilot.registry`` keeps the
0.1 import path pointing here."""

from __future__ import annotations

from typing import Any

import mlflow

ARTIFACT_NAME = "surrogate"


def _quiet_type_hint_nag() -> Any:
    """MLflow warns at class creation that ``predict`` has no type hints (we take DataFrames or
    lists, so none fits) and re-enables the warning inside; mute just that helper meanwhile."""
    try:
        import mlflow.pyfunc.utils.data_validation as dv
    except ImportError:  # pragma: no cover - other MLflow layouts
        return None, None
    orig = getattr(dv, "color_warning", None)
    if orig is not None:
        dv.color_warning = lambda *a, **k: None
    return dv, orig


_dv, _orig_warning = _quiet_type_hint_nag()
try:

    class SurrogatePyfunc(mlflow.pyfunc.PythonModel):
        """pyfunc wrapper: input = DataFrame with a ``gpus`` column (comma-joined ids) or a list of
        GPU-id lists; output = predicted busbw (GB/s)."""

        def load_context(self, context):  # MLflow inspects these signatures
            from bandpilot.model.surrogate import Surrogate

            self.surrogate = Surrogate.load_dir(context.artifacts[ARTIFACT_NAME])

        def predict(self, context, model_input, params=None):
            import pandas as pd

            if isinstance(model_input, pd.DataFrame):
                col = model_input["gpus"] if "gpus" in model_input.columns else model_input.iloc[:, 0]
                allocs = [v.split(",") if isinstance(v, str) else list(v) for v in col]
            else:
                allocs = [a.split(",") if isinstance(a, str) else list(a) for a in model_input]
            return self.surrogate.predict(allocs)
finally:
    if _dv is not None and _orig_warning is not None:
        _dv.color_warning = _orig_warning
