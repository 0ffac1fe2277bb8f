"""The vectorised unit parts (issue 24): ``unit_rows.part_table`` gives every ``(unit, count)``
part exactly as :meth:`Units.part_hosts` does one at a time, and ``mask_rows`` built on it gives
the same rows as the per-part loop it replaced - on random busy states, random (tied and untied)
stage-1 values and random per-unit count rows."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.search import unit_rows
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster

SPEC = "params/clusters/nvl72x16.yaml"


@pytest.fixture(scope="module")
def fab():
    return make_fabric(load_cluster(SPEC))


def _units(fab, seed: int, frac: float, levels: int) -> Units:
    """Units of a random busy state; ``levels`` > 0 redraws the stage-1 values from that many levels
    per count (asymmetric trays, many ties), so every key of the remainder's order decides somewhere."""
    from benchmarks.scale_states import busy_state  # the scale benchmark's state generator

    rng = np.random.default_rng(seed)
    state = busy_state(fab.spec, fab, rng, frac, "moderate", reserve=64) if frac > 0 else None
    if state is None:
        from bandpilot.dispatch.state import State

        state = State.idle(fab.spec)
    ctx = SearchContext(fab, state, state.free, 64)
    if levels:
        ctx.best_val = ctx.best_val * (1 + rng.integers(0, levels, ctx.best_val.shape) / 100)
    return Units(ctx)


def _loop_mask_rows(units: Units, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-part reference: ``mask_rows`` as it was, one ``part_hosts`` call per part."""
    D = np.atleast_2d(np.asarray(D, dtype=np.int64))
    n = D.shape[0]
    ri, ui = np.nonzero(D)
    width = int(D.max(initial=0)) + 1
    keys = np.unique(ui * width + D[ri, ui])
    hs, cs = [], []
    for key in keys.tolist():
        h, c = units.part_hosts(key // width, key % width)
        hs.append(h)
        cs.append(c)
    if not hs:
        return np.zeros((n, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
    h_of, c_of = np.concatenate(hs), np.concatenate(cs)
    ptr = np.r_[0, np.cumsum([h.size for h in hs])]
    cols = np.unique(h_of)
    col_of = np.searchsorted(cols, h_of)
    m_of = units.ctx.best_mask[h_of, c_of]
    out = np.zeros((n, cols.size), dtype=np.int64)
    for r in range(n):
        nz = np.flatnonzero(D[r])
        unit_rows._put(out, np.full(nz.size, r), nz, D[r, nz], keys, width, ptr, col_of, m_of, True)
    return out, cols


def _rows(rng, units: Units, n: int, near: bool) -> np.ndarray:
    """Random count rows within each unit's free GPUs; ``near``: a base row and rows changing one or
    two units of it (a local-search batch), else independent rows."""
    free = units.free
    draw = lambda: np.where(rng.random(units.U) < 0.5, rng.integers(0, free + 1), 0)  # noqa: E731
    if not near:
        return np.array([draw() for _ in range(n)], dtype=np.int64).reshape(n, units.U)
    D = np.tile(draw(), (n, 1))
    for r in range(1, n):
        us = rng.choice(units.U, size=int(rng.integers(1, 3)), replace=False)
        D[r, us] = rng.integers(0, free[us] + 1)
    return D


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), frac=st.sampled_from([0.0, 0.3, 0.6, 0.85]), levels=st.sampled_from([0, 2, 7]),
       n=st.integers(1, 40), near=st.booleans())
def test_vectorised_mask_rows_equal_the_per_part_loop(fab, seed, frac, levels, n, near):
    units = _units(fab, seed, frac, levels)
    D = _rows(np.random.default_rng(seed + 1), units, n, near)
    got, cols = unit_rows.mask_rows(units, D)
    want, want_cols = _loop_mask_rows(units, D)
    assert np.array_equal(cols, want_cols)
    assert np.array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), frac=st.sampled_from([0.0, 0.4, 0.85]), levels=st.sampled_from([0, 3]))
def test_part_table_is_part_hosts_of_every_pair(fab, seed, frac, levels):
    units = _units(fab, seed, frac, levels)
    u = np.repeat(np.arange(units.U), units.free)
    t = np.concatenate([np.arange(1, f + 1) for f in units.free]).astype(np.int64)  # every part there is
    ptr, hosts, counts = unit_rows.part_table(units, u, t)
    for j, (a, b) in enumerate(zip(u.tolist(), t.tolist())):
        h, c = units.part_hosts(a, b)
        assert hosts[ptr[j] : ptr[j + 1]].tolist() == h.tolist()
        assert counts[ptr[j] : ptr[j + 1]].tolist() == c.tolist()


def test_a_part_larger_than_the_unit_raises_as_part_hosts_does(fab):
    units = _units(fab, 0, 0.6, 0)
    u = int(np.argmin(units.free))
    t = int(units.free[u]) + 1
    with pytest.raises(ValueError, match="cannot hold"):
        units.part_hosts(u, t)
    with pytest.raises(ValueError, match="cannot hold"):
        unit_rows.part_table(units, np.array([0, u]), np.array([1, t]))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), frac=st.sampled_from([0.3, 0.6, 0.85]))
def test_jobs_of_parts_are_each_parts_jobs_on(fab, seed, frac):
    """The screen's contending jobs per part in one pass equal ``jobs_on`` of each part's trays."""
    units = _units(fab, seed, frac, 0)
    pred = units.ctx.pred
    assume(units.ctx.exposed.any())  # some free tray shares a host with a job (6-8 of 10 states)
    u = np.repeat(np.arange(units.U), units.free + 1)
    t = np.concatenate([np.arange(f + 1) for f in units.free]).astype(np.int64)  # 0: no part
    ptr, hosts, _ = units.parts(u, t)
    got = pred.jobs_of_parts(ptr, hosts)
    want = np.zeros_like(got)
    for j, (a, b) in enumerate(zip(u.tolist(), t.tolist())):
        if b:
            want[j] = pred.jobs_on(np.sort(units.part_hosts(a, b)[0])).any(axis=1)
    assert want.any() and np.array_equal(got, want)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), frac=st.sampled_from([0.3, 0.6]), pick=st.integers(0, 2**30))
def test_hosts_of_jobs_are_the_hosts_the_jobs_span(fab, seed, frac, pick):
    """``hosts_of_jobs`` (the incidence read backwards, for ``move_classes``' units of contenders)
    equals the hosts where the dense job masks of the picked jobs are non-zero."""
    pred = _units(fab, seed, frac, 0).ctx.pred
    assume(pred.n_jobs > 0)
    jobs = np.random.default_rng(pick).random(pred.n_jobs) < 0.5
    want = np.flatnonzero((pred.job_masks[jobs] != 0).any(axis=0))
    assert np.array_equal(pred.hosts_of_jobs(jobs), want)
    assert pred.hosts_of_jobs(np.zeros(pred.n_jobs, dtype=bool)).size == 0
