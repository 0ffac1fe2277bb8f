"""Column-restricted evaluation (issue 24): rows given on the host columns they touch must predict
exactly what the full rows predict - for the emulator's ``predict_columns``, for the contention
predictor (candidates, contenders, super allocations) and for models without ``predict_columns``."""

import numpy as np
import pytest

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster

SPEC = "params/clusters/nvl72x16.yaml"


@pytest.fixture(scope="module")
def fab():
    return make_fabric(load_cluster(SPEC))


def _busy(fab, seed: int) -> State:
    from benchmarks.scale_states import busy_state  # the scale benchmark's state generator

    return busy_state(fab.spec, fab, np.random.default_rng(seed), 0.5, "heavy", reserve=64)


def _candidates(spec, free: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((n, spec.n_hosts), dtype=np.int64)
    hosts = np.flatnonzero(free)
    for i in range(n):
        for h in rng.choice(hosts, size=int(rng.integers(1, 30)), replace=False):
            bits = [b for b in range(4) if free[h] >> b & 1]
            take = rng.choice(bits, size=int(rng.integers(1, len(bits) + 1)), replace=False)
            out[i, h] = sum(1 << int(b) for b in take)
    return out


class _Plain:
    """A model without ``predict_columns`` (like the surrogate): rows are widened for it."""

    def __init__(self, fab):
        self.spec, self.stage1, self._fab = fab.spec, fab.stage1, fab

    def predict_masks(self, masks):
        return self._fab.predict_masks(masks)


def test_fabric_predict_columns_exact(fab):
    masks = _candidates(fab.spec, fab.spec.full_masks, 60, seed=1)
    cols = np.flatnonzero(masks.any(axis=0))
    np.testing.assert_allclose(fab.predict_columns(masks[:, cols], cols), fab.bandwidth_masks(masks), rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_predictor_columns_match_full_rows(fab, seed):
    st = _busy(fab, seed)
    masks = _candidates(fab.spec, st.free, 80, seed=seed + 10)
    cols = np.flatnonzero(masks.any(axis=0))
    for model in (fab, _Plain(fab)):
        pred = ContentionPredictor(model, st)
        assert pred.n_jobs > 0
        full = pred.predict(masks)
        sub = pred.predict(masks[:, cols], cols)
        np.testing.assert_allclose(sub.value, full.value, rtol=1e-12)
        np.testing.assert_allclose(sub.standalone, full.standalone, rtol=1e-12)
        assert np.array_equal(pred.contenders(masks[:, cols], cols), pred.contenders(masks))
        best = pred.predict_best(masks[:, cols], max_pairs=4, first=8, cols=cols)
        i = int(np.argmax(full.value))
        assert best.value.max() == pytest.approx(full.value[i], rel=1e-12)


def test_sparse_jobs_match_dense_definition(fab):
    st = _busy(fab, 3)
    pred = ContentionPredictor(fab, st)
    unit = fab.spec.units[0]
    want = [j for j in st.jobs if j.demand_gbps > 0 and np.unique(unit[j.mask != 0]).size >= 2]
    assert pred.job_ids == [j.id for j in want]
    assert np.array_equal(pred.job_masks, np.array([j.mask for j in want]))
    exposure = (np.array([j.mask for j in want]) != 0).T @ np.array([j.demand_gbps for j in want])
    np.testing.assert_allclose(pred.host_exposure, exposure)
    dense = np.array([j.mask for j in want])
    cols = np.sort(np.random.default_rng(3).choice(fab.spec.n_hosts, size=60, replace=False))
    assert np.array_equal(pred.jobs_on(cols), dense[:, cols])
    for h in np.flatnonzero(dense.any(axis=0))[:40]:
        assert np.array_equal(pred.masks_at(int(h)), np.unique(dense[:, h][dense[:, h] != 0]))


def _part_reference(ctx, units, u: int, t: int) -> np.ndarray:
    """The loop Units.part replaced: whole trays in order, the remainder on the best-fitting tray."""
    hs = units.members[u]
    hs = hs[ctx.fcount[hs] > 0]
    top = ctx.best_val[hs, ctx.fcount[hs]]
    order = hs[np.lexsort((hs, -top, -ctx.fcount[hs], ctx.exposed[hs]))]
    counts = np.zeros(ctx.H, dtype=np.int64)
    left, used = t, set()
    for h in order:
        if left == 0:
            break
        fits = [x for x in order if int(x) not in used and ctx.fcount[x] >= left]
        if fits:
            best = min(fits, key=lambda x: (bool(ctx.exposed[x]), int(ctx.fcount[x]), -float(ctx.best_val[x, left])))
            counts[best] = left
            return counts
        counts[h] = ctx.fcount[h]
        left -= int(ctx.fcount[h])
        used.add(int(h))
    assert left == 0
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_parts_match_the_reference_loop(fab, seed):
    from bandpilot.dispatch.search.context import SearchContext
    from bandpilot.dispatch.search.domains import Units

    st = _busy(fab, seed)
    ctx = SearchContext(fab, st, st.free, 8)
    units = Units(ctx)
    for u in range(units.U):
        for t in range(1, int(units.free[u]) + 1):
            assert np.array_equal(units.part(u, t), _part_reference(ctx, units, u, t)), (u, t)
