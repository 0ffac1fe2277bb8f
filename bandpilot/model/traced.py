"""A traced (TorchScript) copy of a hierarchical net for inference: the same floats, less per-call
overhead, for long-running processes.

A decision on a 32-GPU cluster asks the net about a handful of rows at a time (~5 rows per call,
~0.5 forward calls per decision), so a forward pass is mostly Python: ~25 module calls and ~150
small ops. The traced graph runs the same ops without the module machinery (0.54-0.76 vs 0.91 ms
per call on 1-20 rows at load ~8, bit-identical outputs). A trace is specific to what Python
decided while recording it, so one is kept per *layout*: the token keys present and which
attention path the token count takes (``networks.BROADCAST_ATTENTION_MAX_TOKENS``, the only
data-dependent branch); the first output of each trace is checked against the module's own and a
layout whose trace differs, or fails, stays eager. A layout is traced after :data:`TRACE_AFTER`
calls (and run twice more there, TorchScript's optimising runs: the whole one-off cost in that
call), and the traces are dropped when the weights change (a version token like the prediction
memo's). ``torch.jit.trace`` is deprecated in favour of ``torch.compile`` / ``torch.export``, which
need a compiler toolchain or re-run Python per op; with the pinned torch it works, and any error
falls back to the module.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from bandpilot.model.networks import BROADCAST_ATTENTION_MAX_TOKENS, HierarchicalNet

#: Forward calls of one layout before it is traced (0: never trace). Tracing and TorchScript's first
#: optimising runs cost ~110-160 ms CPU once (a loaded 2-core machine), ~250 saved forward calls'
#: worth: a long-running scheduler, API server or simulation traces, a benchmark of 160 decisions
#: (~85 forward calls) or a one-shot command does not.
TRACE_AFTER = 256


class TracedForward:
    """``self(net, tokens)``: ``net(tokens)`` in inference, through a trace of ``net`` per layout."""

    def __init__(self) -> None:
        self._token: tuple | None = None
        self._params: tuple[nn.Module, list[torch.Tensor]] | None = None
        self._traces: dict[tuple, Any] = {}
        self._calls: dict[tuple, int] = {}

    def __call__(self, net: nn.Module, tok: dict[str, torch.Tensor]) -> torch.Tensor:
        if TRACE_AFTER <= 0 or net.training or type(net) is not HierarchicalNet:
            return net(tok)
        if self._params is None or self._params[0] is not net:
            self._params = (net, list(net.parameters()) + list(net.buffers()))
        token = (id(net), sum(p._version for p in self._params[1]))
        if token != self._token:  # new weights: old traces hold the old ones
            self._token, self._traces, self._calls = token, {}, {}
        layout = (tuple(sorted(tok)), int(tok["cnt"].shape[1]) <= BROADCAST_ATTENTION_MAX_TOKENS)
        traced = self._traces.get(layout)
        if traced is not None:
            return traced(tok)
        if traced is None and layout in self._traces:  # tried: stays eager
            return net(tok)
        n = self._calls.get(layout, 0) + 1
        self._calls[layout] = n
        out = net(tok)
        if n >= TRACE_AFTER:
            self._traces[layout] = _trace(net, tok, out)
        return out


def _trace(net: nn.Module, tok: dict[str, torch.Tensor], want: torch.Tensor) -> Any:
    """A trace of ``net`` on ``tok`` whose output equals ``want`` exactly, else None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation notice; the one branch is in the layout key
            traced = torch.jit.trace(net, (tok,), strict=False, check_trace=False)
            for _ in range(2):  # the profiling executor optimises on the first runs: here, not in later decisions
                traced(tok)
            got = traced(tok)
    except Exception:  # any tracing failure: this layout stays eager
        return None
    return traced if torch.equal(got, want) else None
