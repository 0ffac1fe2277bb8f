"""What does a model expect of each node pair? The optional model side of pairwise verification.

The model predicts the busbw of its own collective; a sweep may run others (alltoall, sendrecv).
What carries over is the *shape* across pairs - which pairs cross a rack, an NVLink domain, an
oversubscribed uplink - so the peer comparison divides it out and its level is absorbed by the
matrix median. Pairs of nodes the model does not know are left to the peer comparison alone.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bandpilot.health.pairwise import Matrix


def model_expectation(model: Any) -> Callable[[Matrix, list[str]], np.ndarray | None]:
    """``expect(matrix, nodes)`` for :func:`bandpilot.health.pairwise.analyze`: the model's busbw for
    GPUs ``0..k-1`` of both nodes of every pair (None when it knows fewer than two of the nodes)."""
    spec = model.spec
    cache: dict[tuple[int, tuple[str, ...]], np.ndarray | None] = {}

    def expect(m: Matrix, nodes: list[str]) -> np.ndarray | None:
        key = (m.gpn, tuple(nodes))
        if key in cache:
            return cache[key]
        known = [i for i, n in enumerate(nodes) if n in spec.host_index
                 and spec.hosts[spec.host_index[n]].n_gpus >= m.gpn]
        out = None
        if len(known) >= 2:
            pairs = [(i, j) for a, i in enumerate(known) for j in known[a + 1:]]
            masks = np.zeros((len(pairs), spec.n_hosts), dtype=np.int64)
            for r, (i, j) in enumerate(pairs):
                masks[r, spec.host_index[nodes[i]]] = masks[r, spec.host_index[nodes[j]]] = (1 << m.gpn) - 1
            pred = np.asarray(model.predict_masks(masks), dtype=float)
            typical = float(np.median(pred[pred > 0])) if (pred > 0).any() else 1.0
            out = np.full((len(nodes), len(nodes)), typical)  # unknown pairs: no structure assumed
            for (i, j), p in zip(pairs, pred):
                out[i, j] = out[j, i] = p if p > 0 else typical
        cache[key] = out
        return out

    return expect
