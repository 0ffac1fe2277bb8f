"""A 'domain' surrogate's tokens per row (the units a row uses, which size and order its forward
chunks) from one OR per (row, unit) block equal the distinct (row, unit) pairs it replaced."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.model.surrogate import Surrogate


def _pairs_reference(masks: np.ndarray, unit: np.ndarray, U: int) -> np.ndarray:
    r, c = np.nonzero(masks != 0)
    pairs = np.unique(r * U + unit[c])
    return np.bincount(pairs // U, minlength=masks.shape[0])


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 30), width=st.integers(0, 60), U=st.integers(1, 12),
       with_cols=st.booleans(), density=st.sampled_from([0.0, 0.05, 0.3, 0.9]))
def test_token_counts_equal_the_distinct_row_unit_pairs(seed, n, width, U, with_cols, density):
    rng = np.random.default_rng(seed)
    H = width + 5
    unit = rng.integers(0, U, H)  # units interleaved over host ids: columns are not grouped
    stand_in = SimpleNamespace(kind="domain", domain_view=SimpleNamespace(ix=SimpleNamespace(unit=unit, U=U)))
    cols = np.sort(rng.choice(H, size=width, replace=False)) if with_cols else None
    w = width if with_cols else H
    masks = np.where(rng.random((n, w)) < density, rng.integers(1, 16, (n, w)), 0)
    got = Surrogate._token_counts(stand_in, masks, cols)
    want = _pairs_reference(masks, unit if cols is None else unit[cols], U)
    assert got.tolist() == want.tolist()
