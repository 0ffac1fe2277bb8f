"""After a fault is found, how does the model learn the cluster as it now is? Re-measure, refit.

The verdict gates the hardware at once; the model catches up by profiling the cluster again (the
same plan as ``bandpilot profile``: every intra-host subset and a cross-host sample) into a new
dataset version and fitting on it. On the emulator the runs go to the faulty fabric, so the loop can
be exercised end to end; on a real cluster the ssh runner measures the real hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bandpilot.data.profiling import ProfileReport, run
from bandpilot.data.runners import EmulatorRunner
from bandpilot.topology.cluster import ClusterSpec


def remeasure(spec: ClusterSpec, data_root: str | Path, *, fabric: Any = None, runner: str = "emulator",
              samples: int = 600, seed: int = 0, progress: bool = False) -> ProfileReport:
    """Profile ``spec`` again into ``<data_root>/data/<cluster>/`` (nothing resumed: every run is new).

    ``fabric``: the emulator's truth (e.g. a :class:`~bandpilot.fabric.faults.FaultyFabric`)."""
    execute: Any = EmulatorRunner(spec, fabric=fabric) if runner == "emulator" else runner
    return run(spec, data_root, runner=execute, resume=False, progress=progress, cross_host_samples=samples, seed=seed)
