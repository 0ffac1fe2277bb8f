"""BandPilot: performance- and contention-aware GPU dispatching.

Data flows one way: measurements -> dataset -> surrogate -> predictor -> search -> assignment.
Heavy modules (torch, mlflow) are imported lazily so ``import bandpilot`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ClusterSpec": "bandpilot.topology.cluster",
    "load_cluster": "bandpilot.topology.cluster",
    "State": "bandpilot.dispatch.state",
    "Dispatcher": "bandpilot.dispatch.dispatcher",
    "Selection": "bandpilot.dispatch.dispatcher",
    "Surrogate": "bandpilot.model.surrogate",
    "make_fabric": "bandpilot.fabric.emulator",
    "TraceFabric": "bandpilot.fabric.trace",
    "EmulatorFabric": "bandpilot.fabric.emulator",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'bandpilot' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
