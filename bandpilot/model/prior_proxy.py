"""What is a cheap stand-in for a domain surrogate when a search has a thousand candidates to rank?
Its own physics prior on unit-level rows: :class:`PriorProxy`.

A unit-level local-search batch on 10,008 GPUs holds ~1,000 candidate moves of 2,048-4,096 GPUs,
each ~1,000-2,000 trays wide (2,000-10,000 model rows with the contending jobs' super allocations).
The prior (:meth:`~bandpilot.model.networks.HierarchicalNet.prior_log`: NIC bottleneck over
domains, switch cap by domains, ``min`` with the in-domain values, the constants this model fitted
to its data) reads only the domain tokens, and a candidate of the unit-level search is a row of
per-unit counts whose every unit share is one fixed *part* (the trays a search fills for ``t`` GPUs
in unit ``u``): the tokens are the parts' tokens, each computed once per batch, so a row costs its
units, not its trays, and no net runs. Standalone values: the search
(:mod:`bandpilot.dispatch.search.screen`) sends the best-ranked candidates to the surrogate, which
prices them with contention.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from bandpilot.model.move_reduce import MoveReduce
from bandpilot.model.unit_grid import Changed, token_grid, token_grid_dense

#: ``part(u, t) -> (hosts, masks)``: the trays (sorted or not) and GPU masks unit ``u``'s share of
#: ``t`` GPUs takes.
Part = Callable[[int, int], tuple[np.ndarray, np.ndarray]]
#: ``parts(units, counts) -> (ptr, hosts, masks)``: :data:`Part` of many pairs at once, concatenated
#: (pair ``j``'s part is ``hosts[ptr[j]:ptr[j + 1]]``), the same trays and masks.
Parts = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


#: Token features the prior reads (:meth:`HierarchicalNet._terms`; ``rail``, ``pad``, ``xdom`` aside).
PRIOR_FEATURES = ("cnt", "rails", "intra", "speed")


class PriorProxy:
    """A 'domain' :class:`~bandpilot.model.surrogate.Surrogate`'s prior, on per-unit count rows."""

    def __init__(self, sur: Any) -> None:
        self.sur = sur
        self.view = sur.domain_view

    def predict_units(self, D: np.ndarray, part: Part, cache: dict[int, np.ndarray] | None = None,
                      incremental: bool = True, parts: Parts | None = None, changed: Changed | None = None) -> np.ndarray:
        """Prior bandwidth of rows of per-unit GPU counts ``D`` (n, U), unit ``u``'s share of ``t``
        GPUs placed as ``part(u, t)``. ``cache``: part features already computed for the same
        ``part`` (one search's batches share most parts), filled in here. ``incremental``: each row's
        token reductions patched from the first row's (:class:`~bandpilot.model.move_reduce.MoveReduce`:
        a batch of moves costs its changed cells; the same floats as the token grid, which it falls
        back to when its sums would not be exact). ``parts``: ``part`` of many pairs at once (a
        round's ~100-400 new parts without a Python call each). ``changed``: ``changed_parts(D)``
        when the caller has it."""
        D = np.atleast_2d(np.asarray(D, dtype=np.int64))
        cache = {} if cache is None else cache
        many = _one_by_one(part) if parts is None else parts
        feats = lambda us, ts: self._cached_features(us, ts, many, cache)  # noqa: E731
        if incremental and D.shape[0]:
            red = MoveReduce(D, feats, PRIOR_FEATURES, self.view.u_rail, changed)
            if red.exact:
                with torch.inference_mode():
                    return torch.exp(self.sur.net.prior_log_rows(red.tokens, red)).double().numpy().reshape(D.shape[0])
        grid = token_grid if D.shape[0] else token_grid_dense  # a batch's moves share its first row
        X, lu = grid(D, feats, len(PRIOR_FEATURES))
        used = X[..., 0] > 0
        # the prior reads every token alike, padding masked: the live units are the token axis as
        # they are (no packing of each row's units to the front)
        t = {k: torch.from_numpy(X[..., i]) for i, k in enumerate(PRIOR_FEATURES)}
        t["pad"] = torch.from_numpy(~used)
        t["rail"] = torch.from_numpy(self.view.u_rail[lu].astype(np.float32)).expand(used.shape)
        t["xdom"] = torch.from_numpy((used.sum(axis=1) > 1).astype(np.float32))
        with torch.inference_mode():
            return torch.exp(self.sur.net.prior_log(t)).double().numpy().reshape(D.shape[0])

    def _cached_features(self, units: np.ndarray, counts: np.ndarray, parts: Parts, cache: dict[int, np.ndarray]) -> np.ndarray:
        """(parts, PRIOR_FEATURES) float32, from ``cache`` where there (keyed ``unit << 20 | count``)."""
        codes = (units << 20 | counts).tolist()
        miss = [i for i, c in enumerate(codes) if c not in cache]
        if miss:
            feats = self._part_features(units[miss], counts[miss], parts)
            got = np.stack([feats[k] for k in PRIOR_FEATURES], axis=1).astype(np.float32)
            for i, row in zip(miss, got):
                cache[codes[i]] = row
        return np.stack([cache[c] for c in codes]) if codes else np.zeros((0, len(PRIOR_FEATURES)), np.float32)

    def _part_features(self, units: np.ndarray, counts: np.ndarray, parts: Parts) -> dict[str, np.ndarray]:
        """Domain-token features of each part (one row per part: its unit's features)."""
        ptr, h_all, m_all = parts(units, counts)
        lens = np.diff(ptr)
        cols = np.unique(h_all)
        rows = np.zeros((units.size, cols.size), dtype=np.int64)
        rows[np.repeat(np.arange(units.size), lens), np.searchsorted(cols, h_all)] = m_all
        lu, z = self.view.live_units(rows, cols)
        j = np.searchsorted(lu, units)
        at = np.arange(units.size)
        return {name: x[at, j] for name, x in z.items()}



def _one_by_one(part: Part) -> Parts:
    """:data:`Parts` from a :data:`Part`: one call per pair."""

    def many(units: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hs, ms = zip(*(part(int(a), int(b)) for a, b in zip(units, counts)))
        return np.r_[0, np.cumsum([h.size for h in hs])], np.concatenate(hs), np.concatenate(ms)

    return many
