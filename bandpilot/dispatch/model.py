"""What the dispatcher needs from a bandwidth model: the interface a trained surrogate
(:class:`bandpilot.model.surrogate.Surrogate`), the domain-aware model, a fabric (the emulator, a
perfect predictor), the evaluation's timed wrapper and a noisy test stand-in all share.

It is a structural :class:`typing.Protocol`: nothing inherits from it, anything with these three
members is a model (``isinstance(x, BandwidthModel)`` checks the names, :func:`check_model` the
shapes). It lives in ``dispatch/`` because the dispatcher is its consumer; the ``model`` and
``fabric`` stages below implement it without importing it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from bandpilot.errors import ModelError
from bandpilot.topology.cluster import ClusterSpec

__all__ = ["BandwidthModel", "check_model"]


@runtime_checkable
class BandwidthModel(Protocol):
    """Standalone bus bandwidth (GB/s) of GPU subsets of one cluster."""

    #: The cluster the model describes (its hosts, GPU types and topologies).
    spec: ClusterSpec
    #: ``(n_hosts, 2**max_gpus_per_host)`` table: bandwidth of every single-host subset (by bitmask).
    stage1: np.ndarray

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        """Bandwidth of each row of ``masks`` (``(n, n_hosts)`` per-host GPU bitmasks), shape ``(n,)``."""
        ...


def check_model(model: object, what: str = "model") -> ClusterSpec:
    """``model``'s spec, after checking it is a :class:`BandwidthModel` with a well-shaped stage-1 table."""
    for attr in ("spec", "stage1", "predict_masks"):
        if not hasattr(model, attr):
            raise ModelError(f"{what} {type(model).__name__} has no {attr!r} (need spec, stage1, predict_masks)")
    spec = model.spec  # type: ignore[attr-defined]
    if not isinstance(spec, ClusterSpec):
        raise ModelError(f"{what}.spec is not a ClusterSpec")
    shape = np.shape(model.stage1)  # type: ignore[attr-defined]
    need = 1 << int(spec.gpus_per_host.max())
    if len(shape) != 2 or shape[0] != spec.n_hosts or shape[1] < need:
        raise ModelError(f"{what}.stage1 has shape {shape}, expected ({spec.n_hosts}, {need})")
    return spec
