"""How do the prior's per-row reductions of a local-search batch cost its changed cells, not its
tokens? Reduce the first row once and patch each row's changed units.

A unit-level batch (:func:`bandpilot.dispatch.search.domains.cross_unit`) holds ~1,000-4,500 moves
of one row: each row equals the first except in the one or two units a move touches, while the
first row uses 30-57 units. The prior (:meth:`~bandpilot.model.networks.HierarchicalNet.prior_log`)
reduces a row's tokens by mins (NIC bandwidth, count, rail, stage-1 bandwidth), a token count and a
sum of counts. A row's min is the first row's smallest value among the units the row did not change
(the first row's ``K + 1`` smallest hold it when a row changes at most ``K`` cells), then the min
with its changed units' new values; the count and the sum are the first row's, less the old parts,
plus the new ones. Mins are exact and the sums are of integer counts (exact in float32 below 2**24,
checked: :attr:`MoveReduce.exact`), so the prior gets the same floats as from the full token grid
(:func:`bandpilot.model.unit_grid.token_grid`; ``tests/test_move_reduce.py``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from bandpilot.model.unit_grid import Changed, changed_parts

#: ``features(units, counts) -> (parts, F) float32``, column 0 the count ``cnt``.
Features = Callable[[np.ndarray, np.ndarray], np.ndarray]


class MoveReduce:
    """The distinct (unit, count) parts of a batch of per-unit count rows ``D`` and each row's
    reductions over its parts; ``tokens``: every part's token features (one row, ``names``)."""

    def __init__(self, D: np.ndarray, features: Features, names: tuple[str, ...], u_rail: np.ndarray,
                 changed: Changed | None = None) -> None:
        n = D.shape[0]
        ref, r, c, _, ru, width, new_live, keys, inv = changed_parts(D) if changed is None else changed
        F = features(keys // width, keys % width) if keys.size else np.zeros((0, len(names)), np.float32)
        P = keys.size
        self.tokens = {k: torch.from_numpy(np.ascontiguousarray(F[None, :, i])) for i, k in enumerate(names)}
        self.tokens["rail"] = torch.from_numpy(u_rail[keys // width].astype(np.float32)[None, :])
        cnt = F[:, 0]
        self._ok = np.r_[cnt > 0, False]  # index P: no part; a part of count 0 is padding, as in the grid
        p0 = inv[: ru.size]
        at_ru = np.searchsorted(ru, c)
        old = np.full(r.size, P)
        had = ref[c] > 0
        old[had] = p0[at_ru[had]]
        new = np.full(r.size, P)
        new[new_live] = inv[ru.size :]
        self.n, self._r, self._p0, self._old, self._new = n, r, p0, old, new
        self._at_ru = np.where(had, at_ru, -1)
        self._K = int(np.bincount(r, minlength=1).max()) + 1
        ok = self._ok.astype(np.int64)
        count = ok[p0].sum() - np.bincount(r, ok[old], n) + np.bincount(r, ok[new], n)
        c64 = np.r_[np.where(cnt > 0, cnt, 0.0), 0.0].astype(np.float64)
        total = c64[p0].sum() - np.bincount(r, c64[old], n) + np.bincount(r, c64[new], n)
        #: integer counts summing below 2**24: float32 sums are exact in any order
        self.exact = bool(np.all(c64 == np.round(c64)) and c64[p0].sum() + c64.sum() < 2.0**24)
        self.rows = {
            "n_hosts": torch.from_numpy(count.astype(np.float32)),
            "sum_cnt": torch.from_numpy(total.astype(np.float32)),
            "xdom": torch.from_numpy((count > 1).astype(np.float32)),
        }
        self.rows["min_cnt"] = self.min(self.tokens["cnt"][0], None).clamp_min(1.0)
        self.rail_min = self.rows["rail_min"] = self.min(self.tokens["rail"][0], None)

    def min(self, values: torch.Tensor, eligible: torch.Tensor | None) -> torch.Tensor:
        """(n,) each row's min of ``values`` (one per part) over its live parts that are
        ``eligible`` (all when None); inf where none."""
        keep = self._ok[:-1] if eligible is None else self._ok[:-1] & eligible.numpy()
        vv = np.r_[np.where(keep, values.detach().numpy(), np.inf), np.inf].astype(np.float32)
        s = vv[self._p0]
        order = np.argsort(s, kind="stable")[: self._K]
        rank = np.full(s.size + 1, self._K)  # index -1 (a cell empty in the first row): no rank
        rank[order] = np.arange(order.size)
        # (K, n): the min over the short axis as K - 1 contiguous minimums, not a strided reduce
        base = np.full((self._K, self.n), np.inf, dtype=np.float32)
        base[: order.size] = s[order][:, None]
        hit = rank[self._at_ru] < self._K  # a changed unit among the first row's K smallest: out
        base[rank[self._at_ru[hit]], self._r[hit]] = np.inf
        out = base.min(axis=0)
        np.minimum.at(out, self._r, vv[self._new])
        return torch.from_numpy(out)
