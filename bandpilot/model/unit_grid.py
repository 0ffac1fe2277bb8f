"""Which (unit, count) parts does a batch of per-unit count rows use, and where? Read off the
cells that differ from the batch's first row.

A unit-level local-search batch (:func:`bandpilot.dispatch.search.domains.cross_unit`) holds ~4,500
moves of one row ``d``: each row equals ``d`` except in the one or two units a move touches, while
``d`` uses 30-57 units. Scattering every nonzero cell (~200,000) into the prior's token grid was
most of :meth:`~bandpilot.model.prior_proxy.PriorProxy.predict_units`' own time; here the grid is
the first row's tokens repeated, then only the differing cells (~9,000) written. The parts, the
token axis and every grid value are the ones the full scatter gives (``tests/test_unit_grid.py``),
so the prior's values are the same floats; a batch without that structure costs one compare more.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from bandpilot.topology.cluster import dense_unique

#: ``features(units, counts) -> (parts, F) float32``: the features of each (unit, count) part.
Features = Callable[[np.ndarray, np.ndarray], np.ndarray]


class Changed(NamedTuple):
    """The cells of a batch ``D`` that differ from its first row ``ref`` (row ``r``, unit ``c``,
    new count ``v``; ``live``: ``v > 0``), the first row's units ``ru``, and the batch's distinct
    (unit, count) parts ``keys`` (``unit * width + count``, ascending): ``inv`` maps the first row's
    parts, then the live changed cells', to them."""

    ref: np.ndarray
    r: np.ndarray
    c: np.ndarray
    v: np.ndarray
    ru: np.ndarray
    width: int
    live: np.ndarray
    keys: np.ndarray
    inv: np.ndarray


def changed_parts(D: np.ndarray) -> Changed:
    """:class:`Changed` of ``D`` (shared by :func:`token_grid` and
    :class:`~bandpilot.model.move_reduce.MoveReduce`)."""
    U = D.shape[1]
    ref = D[0]
    # flat indices: a 2-D nonzero and gather over ~5,000 x 139 cells cost twice the 1-D ones
    flat = np.flatnonzero(D != ref[None, :])  # the cells a move changed (row-major)
    r, c = np.divmod(flat, U)
    v = D.ravel()[flat]
    ru = np.flatnonzero(ref)
    width = max(int(ref.max(initial=0)), int(v.max(initial=0))) + 1  # every other cell is the first row's
    live = v > 0
    # the parts: the first row's and the changed cells' (the same set as every nonzero cell's)
    keys, inv = dense_unique(np.concatenate([ru * width + ref[ru], c[live] * width + v[live]]), U * width)
    return Changed(ref, r, c, v, ru, width, live, keys, inv)


def token_grid(D: np.ndarray, features: Features, nf: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X, lu)``: ``X[i, j]`` the features of row ``i``'s part in unit ``lu[j]`` (zeros where the
    row leaves the unit empty), ``lu`` every unit nonzero in some row, ascending."""
    n, U = D.shape
    _, r, c, _, ru, width, live, keys, inv = changed_parts(D)
    F = features(keys // width, keys % width) if keys.size else np.zeros((0, nf), np.float32)
    lu, col = dense_unique(np.concatenate([ru, c[live]]), U)
    first = np.zeros((lu.size, nf), dtype=np.float32)
    first[col[: ru.size]] = F[inv[: ru.size]]
    X = np.repeat(first[None, :, :], n, axis=0)  # the first row's tokens, one copy per row
    cells = X.reshape(n * lu.size, nf)
    at = r * lu.size + np.searchsorted(lu, c)  # every changed cell's unit is live (nonzero in row 0 or there)
    cells[at] = 0.0
    cells[at[live]] = F[inv[ru.size :]]
    return X, lu


def token_grid_dense(D: np.ndarray, features: Features, nf: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_grid` by scattering every nonzero cell (the reference for the tests)."""
    r, u = np.nonzero(D)
    width = int(D.max(initial=0)) + 1
    keys, inv = dense_unique(u * width + D[r, u], D.shape[1] * width)
    F = features(keys // width, keys % width) if keys.size else np.zeros((0, nf), np.float32)
    lu, col = dense_unique(u, D.shape[1])
    X = np.zeros((D.shape[0], lu.size, nf), dtype=np.float32)
    X[r, col] = F[inv]
    return X, lu
