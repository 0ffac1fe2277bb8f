"""The per-select unit setup done for all units at once (``search/unit_setup.py``) equals the per-unit
code it replaces: the coarse count-vector count of every unit, its enumerated rows (order included),
the greedy fill row, and the picks."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.search import domains, unit_setup
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units
from bandpilot.fabric.emulator import make_fabric
from tests.test_domain_asymmetric import FAULTS, spec_with
from tests.test_domain_model import nvl_spec
from tests.test_domain_search import random_state


@pytest.fixture(scope="module", params=["asym", "nvl"])
def fab(request):
    # asymmetric trays (degraded NVLink pairs: the per-unit coarse path) and a plain NVL spec with
    # contending jobs (exposed trays)
    return make_fabric(spec_with(FAULTS) if request.param == "asym" else nvl_spec())


def _cases(fab, n=12):
    rng = np.random.default_rng(3)
    for _ in range(n):
        st = random_state(fab.spec, fab, rng)
        for k in (1, 2, 3, 5, 8, 12):
            if k <= st.n_free:
                yield st, k


def _unit_cases(fab):
    """``_cases`` with each case's search context and units (and k)."""
    for st, k in _cases(fab):
        ctx = SearchContext(fab, st, st.free, k)
        yield ctx, Units(ctx), k


def test_coarse_counts_equal_count_vectors_per_unit(fab):
    n = 0
    for ctx, units, _k in _unit_cases(fab):
        got = unit_setup.coarse_counts(units)
        want = np.array([ctx.count_vectors(units.allowed(u), coarse=True) for u in range(units.U)])
        assert np.array_equal(got, want)  # same floats (same convolutions in the same order)
        n += int((want > 0).sum())
    assert n > 20  # units with candidates were compared, not only empty ones


def test_greedy_on_cols_equals_the_dense_greedy_row(fab):
    for ctx, units, k in _unit_cases(fab):
        for u in np.flatnonzero(units.free >= k).tolist():
            cols = units.members[u]
            want = ctx.masks_from_counts(units.part(u, k))[:, cols]
            assert np.array_equal(unit_setup.greedy_on_cols(units, u, cols), want)


def test_enumerate_coarse_equals_enumerate_per_unit(fab):
    rows = 0
    for ctx, units, _k in _unit_cases(fab):
        counts = unit_setup.coarse_counts(units)
        for u in np.flatnonzero(counts <= domains.PER_DOMAIN_LIMIT).tolist():
            cols = units.members[u]
            want = ctx.enumerate(units.allowed(u), coarse=True, cols=cols)
            got = unit_setup.enumerate_coarse(units, u, cols)
            assert got.shape == want.shape and np.array_equal(got, want)  # same rows, same order
            rows += want.shape[0]
    assert rows > 100


def _old_in_unit(ctx, units, u, exact=False, coarse=False):
    """``in_unit``'s coarse path as it was: dense greedy row, ``count_vectors`` per unit."""
    if not coarse:
        return OLD_IN_UNIT(ctx, units, u, exact, coarse)
    cols = units.members[u]
    greedy = ctx.masks_from_counts(units.part(u, ctx.k))[:, cols]
    allowed = units.allowed(u)
    if ctx.count_vectors(allowed, coarse=True) <= domains.PER_DOMAIN_LIMIT:
        return np.concatenate([greedy, ctx.enumerate(allowed, coarse=True, cols=cols)])
    return greedy


OLD_IN_UNIT = domains.in_unit


def test_selections_equal_the_per_unit_setup(fab, monkeypatch):
    new = [(s.mask, s.predicted_gbps) for s in (Dispatcher(fab).select(k, st) for st, k in _cases(fab))]
    monkeypatch.setattr(domains, "in_unit", _old_in_unit)
    old = [(s.mask, s.predicted_gbps) for s in (Dispatcher(fab).select(k, st) for st, k in _cases(fab))]
    assert len(new) > 30
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(new, old))


def test_groups_of_several_candidates_priced_together_as_one_by_one(fab, monkeypatch):
    from bandpilot.dispatch.search import unit_batch
    from bandpilot.dispatch.search.domains import _best

    shared = 0
    for st, k in _cases(fab):
        ctx = SearchContext(fab, st, st.free, k)
        units = Units(ctx)
        groups = []
        for u in np.flatnonzero(units.free >= k).tolist():
            c = units.members[u]
            groups.append((np.concatenate([unit_setup.greedy_on_cols(units, u, c), unit_setup.enumerate_coarse(units, u, c)]), c))
        calls = []

        def best(m, c, p=None):
            calls.append(p is not None)
            return _best(ctx, units, m, 0.0, c, p)

        monkeypatch.setattr(unit_batch, "SEVERAL_CELLS", 10**9)  # every group in one call
        got = unit_batch.best_each(ctx, groups, best)
        want = [_best(ctx, units, m, 0.0, c) if m.shape[0] else None for m, c in groups]
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if g is not None:
                assert np.array_equal(g.mask, w.mask) and g.value == w.value and g.standalone == w.standalone
        shared += sum(calls)
    assert shared > 20  # groups were priced in shared calls
