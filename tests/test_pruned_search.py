"""Count-vector search that never sends provably losing candidates to the model (issue 24) picks
exactly what scoring every candidate picks, with fewer model evaluations."""

import importlib

import numpy as np
import pytest

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search import count_vector
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster, popcount


def _state(fab, rng, n_jobs: int) -> State:
    spec = fab.spec
    free = spec.full_masks.copy()
    jobs = []
    for i in range(n_jobs):
        hs = rng.choice(spec.n_hosts, size=2, replace=False)
        mask = np.zeros(spec.n_hosts, dtype=np.int64)
        for h in hs:
            bits = [b for b in range(spec.hosts[h].n_gpus) if free[h] >> b & 1]
            for b in rng.choice(bits, size=min(len(bits), int(rng.integers(1, 4))), replace=False):
                mask[h] |= np.int64(1) << int(b)
        free &= ~mask
        bw = float(fab.bandwidth_masks(mask[None, :])[0])
        jobs.append({"id": f"j{i}", "gpus": spec.from_mask(mask), "demand_gbps": bw * float(rng.uniform(0.3, 1.0))})
    return State.from_dict(spec, {"free": spec.from_mask(free), "jobs": jobs})


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["het4mix", "h100"])
def test_pruned_equals_scoring_everything(cluster):
    fab = make_fabric(load_cluster(f"params/clusters/{cluster}.yaml"))
    rng = np.random.default_rng(3)
    checked = 0
    for trial in range(12):
        st = _state(fab, rng, int(rng.integers(1, 4)))
        for k in (3, 6, 10, 14):
            if k > st.n_free:
                continue
            ctx = SearchContext(fab, st, st.free, k)
            masks = ctx.enumerate(pareto=True)
            if masks.shape[0] == 0:
                continue
            full = SearchContext(fab, st, st.free, k).best_of(masks, max_pairs=10**9)
            ctx_p = SearchContext(fab, st, st.free, k, predictor=ContentionPredictor(fab, st))
            got = count_vector._pareto_pruned(ctx_p, masks)
            assert np.array_equal(got.mask, full.mask), (trial, k)
            assert got.value == pytest.approx(full.value, rel=1e-12)
            assert int(popcount(got.mask).sum()) == k
            checked += 1
    assert checked >= 20


def test_count_search_evaluates_less_and_agrees():
    fab = make_fabric(load_cluster("params/clusters/het4mix.yaml"))
    rng = np.random.default_rng(5)
    for _ in range(6):
        st = _state(fab, rng, 3)
        for k in (4, 8):
            a = SearchContext(fab, st, st.free, k)
            b = SearchContext(fab, st, st.free, k)
            pruned = count_vector.count_search(a, pareto=True)
            everything = b.best_of(b.enumerate(pareto=True), max_pairs=10**9)
            assert np.array_equal(pruned.mask, everything.mask)
            assert a.pred.evaluations <= b.pred.evaluations


@pytest.mark.slow
def test_pruned_choices_see_every_near_tie_of_the_locality_margin():
    """With a lifetime-locality margin, ``choose`` weighs every candidate within it: pruning must
    score all of them (it used to stop at 1e-9 below the best), in the coarse search too."""
    fab = make_fabric(load_cluster("params/clusters/h100.yaml"))
    rng = np.random.default_rng(11)
    compared = 0
    for _ in range(8):
        st = _state(fab, rng, int(rng.integers(1, 4)))
        for k in (4, 9, 13):
            if k > st.n_free:
                continue
            for loc in (0.0, 0.05, 0.2):
                masks = SearchContext(fab, st, st.free, k).enumerate(coarse=True)
                if masks.shape[0] < 2:
                    continue
                full = SearchContext(fab, st, st.free, k, locality=loc).best_of(masks, max_pairs=10**9)
                ctx = SearchContext(fab, st, st.free, k, locality=loc)
                p = ctx.evaluate(masks, max_pairs=0)
                ref = ctx.pred.predict(masks).value
                near = ref >= ref.max() - max(1e-9, loc) * max(1.0, abs(ref.max()))
                np.testing.assert_allclose(p.value[near], ref[near], rtol=1e-12)
                got = ctx.best_of(masks, max_pairs=count_vector.PRUNE_PAIRS)
                assert np.array_equal(got.mask, full.mask)
                compared += 1
    assert compared >= 10


def test_lead_contender_bound_prunes_under_contention_and_keeps_every_near_tie():
    """A busy 128-host cluster where every candidate is contended (the simulator's coarse search):
    the one-super-allocation capacity bound skips candidates, and every candidate within the tie
    margin of the best still gets its exact value."""
    fab = make_fabric(load_cluster("params/clusters/h100-128.yaml"))
    rng = np.random.default_rng(7)
    pruned_some = 0
    for _ in range(3):
        st = _busy128(fab, rng)
        for k in (12, 20):
            ctx = SearchContext(fab, st, st.free, k)
            rank, allowed = ctx.host_rank(), np.zeros(ctx.H, dtype=bool)
            for p in range(rank.size):  # the coarse search's best-ranked host prefix, <= 3,000 candidates
                allowed[rank[p]] = True
                if ctx.count_vectors(allowed, coarse=True) > 3000:
                    allowed[rank[p]] = False
                    break
            masks = ctx.enumerate(allowed, coarse=True)
            assert ctx.pred.contenders(masks).any(axis=1).all()  # every candidate is contended
            for loc in (0.0, 0.05):
                ref_ctx = SearchContext(fab, st, st.free, k, locality=loc)
                ref = ref_ctx.pred.predict(masks).value
                p_ctx = SearchContext(fab, st, st.free, k, locality=loc)
                p = p_ctx.evaluate(masks, max_pairs=0)
                near = ref >= ref.max() - max(1e-9, loc) * max(1.0, abs(ref.max()))
                np.testing.assert_allclose(p.value[near], ref[near], rtol=1e-12)
                assert np.all(p.value <= ref + 1e-9 * np.abs(ref))  # unscored ones are -inf, never above
                pruned_some += int(np.isneginf(p.value).sum() > 0)
                assert p_ctx.pred.evaluations < ref_ctx.pred.evaluations
    assert pruned_some >= 3


def _busy128(fab, rng) -> State:
    """Every host of h100-128 in a cross-host job of 1-3 GPUs per host with a random partner host."""
    spec = fab.spec
    perm = rng.permutation(spec.n_hosts)
    jobs, free = [], spec.full_masks.copy()
    for i in range(0, spec.n_hosts, 2):
        mask = np.zeros(spec.n_hosts, dtype=np.int64)
        for h in perm[i : i + 2]:
            mask[h] = (1 << int(rng.integers(1, 4))) - 1
        free &= ~mask
        bw = float(fab.bandwidth_masks(mask[None, :])[0])
        jobs.append({"id": f"j{i}", "gpus": spec.from_mask(mask), "demand_gbps": bw * float(rng.uniform(0.3, 1.0))})
    return State.from_dict(spec, {"free": spec.from_mask(free), "jobs": jobs})


def test_pts_eha_and_local_search_prune_and_pick_what_scoring_everything_picks(monkeypatch):
    """The hybrid search's PTS steps, EHA and local-search moves score super allocations only for
    candidates that can still win: the same picks and values as scoring every candidate, with
    fewer model evaluations (the 10,000-job simulation's drain sent them all to the net)."""
    # the modules (the package's names are the search functions)
    eha, local, pts = (importlib.import_module(f"bandpilot.dispatch.search.{m}") for m in ("eha", "local", "pts"))
    fab = make_fabric(load_cluster("params/clusters/h100-128.yaml"))
    rng = np.random.default_rng(13)
    fewer = 0
    for _ in range(2):
        st = _busy128(fab, rng)
        for k in (12, 24):
            for loc in (0.0, 0.05):
                got, evals = {}, {}
                for mode in ("everything", "pruned"):
                    for mod in (eha, local, pts):
                        monkeypatch.setattr(mod, "PRUNE_PAIRS", 10**9 if mode == "everything" else count_vector.PRUNE_PAIRS)
                    ctx = SearchContext(fab, st, st.free, k, locality=loc)
                    rank = ctx.host_rank()  # PTS from the best-ranked hosts holding k + 12, as the hybrid starts it
                    start = np.zeros(ctx.H, dtype=np.int64)
                    top = rank[: int(np.searchsorted(np.cumsum(ctx.fcount[rank]), k + 12)) + 1]
                    start[top] = ctx.free[top]
                    a = pts.pts(ctx, start=start, single_host_first=False)
                    b = eha.eha(ctx)
                    c = local.local_search(ctx, ctx.pick([a, b]))
                    got[mode], evals[mode] = (a, b, c), ctx.pred.evaluations
                for x, y in zip(got["everything"], got["pruned"]):
                    assert np.array_equal(x.mask, y.mask)
                    assert y.value == pytest.approx(x.value, rel=1e-12)
                assert evals["pruned"] <= evals["everything"]
                fewer += evals["pruned"] < evals["everything"]
    assert fewer >= 4
