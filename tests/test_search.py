"""Search algorithms: Exact equals brute force, bandpilot reaches the optimum, EHA/PTS behaviour."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bandpilot.dispatch import search
from bandpilot.topology.cluster import load_cluster, popcount, spec_from_dict
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher, IntractableError, PlacementError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.search import SearchContext, partition_counts, partitions
from bandpilot.dispatch.search import hybrid
from bandpilot.dispatch.state import State

# Three heterogeneous 4-GPU hosts: subsets differ in stage-1, unions with busy GPUs matter.
TOPO_A = ["X NV2 PIX SYS", "NV2 X SYS PIX", "PIX SYS X NV1", "SYS PIX NV1 X"]
TOPO_B = ["X PXB PXB SYS", "PXB X PIX SYS", "PXB PIX X SYS", "SYS SYS SYS X"]


@pytest.fixture(scope="module")
def small():
    spec = spec_from_dict({
        "name": "t3x4",
        "gpus_per_host": 4,
        "hosts": [
            {"name": "a", "gpu": "A6000", "topology": TOPO_A},
            {"name": "b", "gpu": "V100", "topology": TOPO_A},
            {"name": "c", "gpu": "RTX4090", "topology": TOPO_B},
        ],
        "network": {"nic_gbps": 100, "rails_per_host": 4},
    })
    return make_fabric(spec)


def random_state(spec, fab, rng, max_busy=None):
    gpus = list(spec.gpu_ids)
    rng.shuffle(gpus)
    nb = int(rng.integers(0, (max_busy or spec.n_gpus // 2) + 1))
    busy, free = gpus[:nb], gpus[nb:]
    jobs, i = [], 0
    while i < len(busy):
        size = int(rng.integers(1, 4))
        g = busy[i: i + size]
        i += size
        b = float(fab.bandwidth_masks(spec.to_mask(g)[None, :])[0])
        jobs.append({"id": f"j{len(jobs)}", "gpus": g, "demand_gbps": b * float(rng.uniform(0, 1.2))})
    return State.from_dict(spec, {"free": free, "jobs": jobs})


def brute_force(fab, st, k):
    spec = st.spec
    masks = np.array([spec.to_mask(c) for c in itertools.combinations(st.free_gpus, k)])
    return float(ContentionPredictor(fab, st).predict(masks).value.max())


def test_partition_counts_match_enumeration():
    for n, f, kmax in [(1, 8, 10), (3, 4, 12), (5, 8, 20), (64, 8, 16), (2, 16, 20)]:
        counts = partition_counts(n, f, kmax)
        for t in range(kmax + 1):
            p = partitions(t, n, f)
            assert len(p) == counts[t]
            assert np.all(p.sum(axis=1) == t) and np.all(p <= f)
            assert np.all(np.diff(p, axis=1) <= 0)
            assert len({tuple(r) for r in p.tolist()}) == len(p)


@pytest.mark.slow
def test_exact_and_bandpilot_equal_brute_force(small):
    """Exact = max over ALL subsets of the true B(S, τ); Ideal-BP (count-vector search) too."""
    spec = small.spec
    d = Dispatcher(small)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(40):
        st = random_state(spec, small, rng)
        for k in range(1, st.n_free + 1):
            want = brute_force(small, st, k)
            ex = d.select(k, st, "exact", fabric=small)
            assert ex.predicted_gbps == pytest.approx(want, rel=1e-9, abs=1e-12)
            bp = d.select(k, st, "bandpilot")
            assert bp.predicted_gbps == pytest.approx(want, rel=1e-9, abs=1e-12)
            checked += 1
    assert checked > 100


def test_count_vectors_matches_enumerate(small):
    rng = np.random.default_rng(1)
    h100 = make_fabric(load_cluster("params/clusters/h100.yaml"))
    for fab in (small, h100):
        for _ in range(10):
            st = random_state(fab.spec, fab, rng)
            for k in range(1, st.n_free + 1, 3):
                ctx = SearchContext(fab, st, st.free, k)
                for kw in ({}, {"pareto": True}, {"coarse": True}):
                    rows = ctx.enumerate(**kw)
                    assert len(rows) == ctx.count_vectors(**kw)
                    assert np.all(popcount(rows).sum(axis=1) == k)
                    assert not np.any(rows & ~st.free)


def test_symmetry_reduction_on_idle_homogeneous_cluster():
    fab = make_fabric(load_cluster("params/clusters/h100.yaml"))
    st = State.idle(fab.spec)
    ctx = SearchContext(fab, st, st.free, 16)
    assert ctx.n_classes == 1
    # partitions of 16 into <= 4 parts each <= 8 (8+8, 8+7+1, ..., 4+4+4+4) instead of
    # the 489 count vectors or C(32, 16) = 601,080,390 subsets
    assert ctx.count_vectors() == len(partitions(16, 4, 8)) == 33


def test_eha_single_host_then_balanced():
    fab = make_fabric(load_cluster("params/clusters/h100.yaml"))
    st = State.idle(fab.spec)
    got = search.eha(SearchContext(fab, st, st.free, 6))
    assert (popcount(got.mask) > 0).sum() == 1
    got = search.eha(SearchContext(fab, st, st.free, 10))  # paper Fig. 1: 5 + 5 beats 8 + 2
    assert sorted(popcount(got.mask)[popcount(got.mask) > 0].tolist()) == [5, 5]


def test_pts_one_batched_call_per_step():
    fab = make_fabric(load_cluster("params/clusters/het4mix.yaml"))
    st = State.idle(fab.spec)
    ctx = SearchContext(fab, st, st.free, 20)
    got = search.pts(ctx, single_host_first=False)
    assert int(popcount(got.mask).sum()) == 20
    assert ctx.pred.calls == 32 - 20  # one model call per elimination step


def test_bandpilot_fallback_path(small, monkeypatch):
    """Beyond the count-vector limit: EHA + coarse search + PTS + local search, still valid/near."""
    monkeypatch.setattr(hybrid, "COUNT_SEARCH_LIMIT", 0)
    monkeypatch.setattr(hybrid, "COARSE_SEARCH_LIMIT", 3)
    d = Dispatcher(small)
    rng = np.random.default_rng(11)
    ratios = []
    for _ in range(15):
        st = random_state(small.spec, small, rng)
        for k in range(2, st.n_free + 1):
            got = d.select(k, st, "bandpilot")
            assert len(set(got.gpus)) == k and set(got.gpus) <= set(st.free_gpus)
            best = brute_force(small, st, k)
            ratios.append(got.predicted_gbps / best if best > 0 else 1.0)
    assert np.mean(ratios) > 0.9


def test_exact_intractable_error():
    doc = {
        "name": "big",
        "gpus_per_host": 8,
        "host_groups": [{"prefix": "h", "count": 64, "gpu": "H100",
                         "topology": [" ".join("X" if i == j else "NV18" for j in range(8)) for i in range(8)]}],
    }
    spec = spec_from_dict(doc)
    fab = make_fabric(spec)
    # 32 cross-host jobs touching every host: 64 singleton host classes
    jobs = [{"id": f"j{i}", "gpus": [f"h{2 * i}:0", f"h{2 * i + 1}:0"], "demand_gbps": 10.0} for i in range(32)]
    busy = {g for j in jobs for g in j["gpus"]}
    st = State.from_dict(spec, {"free": [g for g in spec.gpu_ids if g not in busy], "jobs": jobs})
    d = Dispatcher(fab)
    with pytest.raises(IntractableError) as exc:
        d.select(24, st, "exact", fabric=fab)
    assert exc.value.reason == "invalid_request"
    assert "intractable" in str(exc.value) and "\n" not in str(exc.value)
    assert isinstance(exc.value, PlacementError)
    # but bandpilot still answers (fallback) and idle 64x8 is fine for exact
    assert len(d.select(24, st, "bandpilot").gpus) == 24
    assert d.select(24, State.idle(spec), "exact", fabric=fab).predicted_gbps > 0
