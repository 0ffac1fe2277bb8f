"""One BLAS thread for a placement search (as :mod:`bandpilot.model.surrogate` runs small torch
batches on one intra-op thread).

The shape search's hot path is many small numpy products (the sibling-incidence matmul, contender
sums); with numpy's BLAS pool at 2 threads on an oversubscribed 2-core machine its threads spin
against the other processes: shaped ``select`` on 1,152 GPUs, interleaved A/B in one load window
(load 8): p99 684 ms with 2 threads, 171 ms with 1, p50 unchanged (``python -m benchmarks shape``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from threadpoolctl import ThreadpoolController

_controller: ThreadpoolController | None = None


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context that limits the BLAS libraries to one thread and restores them on exit (~7 us per
    use). The libraries are inspected once per process (~1 ms), at the first use: numpy's, which the
    search's products run on, is loaded with numpy; a copy loaded later (scipy's) is not the search's."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")
