"""Issue 13: hierarchical (domain -> tray -> GPU) search, its exact oracle, domain constraints and
the Slurm-block-like baseline on clusters with multi-node NVLink domains."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher, IntractableError, PlacementError
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster, popcount, spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]


def nvl_spec(domains: int = 3, trays: int = 3, name: str = "nvl-tiny"):
    return spec_from_dict({
        "name": name, "gpus_per_host": 4,
        "host_groups": [{"prefix": "t", "count": domains * trays, "gpu": "GB200", "topology": TRAY,
                         "nvlink_domain_size": trays}],
        "network": {"nic_gbps": 400, "rails_per_host": 4},
        "emulator": {"gpus": {"GB200": {"link": {"NV": 59.44}, "cap": 479.8, "sharpness": 2.1, "hop_penalty": 0.39,
                                        "ring_eff": [1.0, 1.05, 1.1, 0.99, 1.0, 1.01, 1.02]}}},
    })


@pytest.fixture(scope="module")
def tiny():
    return make_fabric(nvl_spec())


@pytest.fixture(scope="module")
def nvl72():
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "nvl72x16.yaml"))


def random_state(spec, fab, rng, busy_frac=None):
    gpus = list(spec.gpu_ids)
    rng.shuffle(gpus)
    nb = int((busy_frac if busy_frac is not None else rng.uniform(0, 0.6)) * len(gpus))
    busy, free = gpus[:nb], gpus[nb:]
    jobs, i = [], 0
    while i < len(busy):
        size = int(rng.integers(1, 6))
        g = busy[i: i + size]
        i += size
        b = float(fab.bandwidth_masks(spec.to_mask(g)[None, :])[0])
        jobs.append({"id": f"j{len(jobs)}", "gpus": g, "demand_gbps": b * float(rng.uniform(0, 1.2))})
    return State.from_dict(spec, {"free": free, "jobs": jobs})


def domains_of(spec, gpus):
    return {spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain for g in gpus}


def test_exact_equals_brute_force_on_a_tiny_nvl_cluster(tiny):
    spec = tiny.spec
    d = Dispatcher(tiny)
    rng = np.random.default_rng(3)
    for _ in range(6):
        st_ = random_state(spec, tiny, rng)
        for k in (2, 3):
            masks = np.array([spec.to_mask(c) for c in itertools.combinations(st_.free_gpus, k)])
            brute = float(ContentionPredictor(tiny, st_).predict(masks).value.max())
            assert d.select(k, st_, "exact").predicted_gbps == pytest.approx(brute, rel=1e-9)


def test_bandpilot_reaches_the_exact_optimum_and_stays_in_one_domain(tiny):
    spec = tiny.spec
    d = Dispatcher(tiny)
    rng = np.random.default_rng(5)
    gbe = []
    for _ in range(12):
        st_ = random_state(spec, tiny, rng)
        per_dom = np.bincount(spec.units[0], weights=popcount(st_.free))
        for k in (2, 4, 5, 8, int(per_dom.max())):
            if k > st_.n_free:
                continue
            sel = d.select(k, st_)
            if k <= per_dom.max():
                assert len(domains_of(spec, sel.gpus)) == 1
            gbe.append(sel.predicted_gbps / max(d.select(k, st_, "exact").predicted_gbps, 1e-12))
    assert np.mean(gbe) >= 0.99 and min(gbe) >= 0.9


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31), st.integers(1, 200))
def test_search_never_leaves_the_free_set_and_keeps_domain_sized_gangs_whole(nvl72, seed, k):
    spec = nvl72.spec
    rng = np.random.default_rng(seed)
    st_ = random_state(spec, nvl72, rng, busy_frac=float(rng.uniform(0, 0.7)))
    if k > st_.n_free:
        return
    sel = Dispatcher(nvl72).select(k, st_)
    mask = spec.to_mask(sel.gpus)
    assert not np.any(mask & ~st_.free) and len(sel.gpus) == k
    per_dom = np.bincount(spec.units[0], weights=popcount(st_.free))
    if per_dom.max() >= k:  # a gang that fits a domain stays in one
        assert len(domains_of(spec, sel.gpus)) == 1


def test_exact_refuses_what_it_cannot_certify(nvl72):
    d = Dispatcher(nvl72)
    with pytest.raises(IntractableError, match="exceeds every domain"):
        d.select(100, State.idle(nvl72.spec), "exact")
    assert d.select(72, State.idle(nvl72.spec), "exact").predicted_gbps > 400  # one whole domain


def test_segment_whole_domains_and_single_domain(nvl72):
    spec = nvl72.spec
    d = Dispatcher(nvl72)
    rng = np.random.default_rng(11)
    st_ = random_state(spec, nvl72, rng, busy_frac=0.3)
    per_dom = np.bincount(spec.units[0], weights=popcount(st_.free))
    k = 96 if per_dom.max() < 96 else 144
    sel = d.select(k, st_, constraints={"segment": 16})
    counts = np.bincount(spec.units[0], weights=popcount(spec.to_mask(sel.gpus)), minlength=16)
    assert all(c % 16 == 0 for c in counts) and counts.sum() == k
    with pytest.raises(PlacementError, match="segment 7 does not divide k=96") as e:
        d.select(96, st_, constraints={"segment": 7})
    assert e.value.reason == "invalid_request"
    with pytest.raises(PlacementError, match="needs NVLink domains"):
        Dispatcher(make_fabric(load_cluster(ROOT / "params/clusters/h100.yaml"))).select(
            8, State.idle(load_cluster(ROOT / "params/clusters/h100.yaml")), constraints={"segment": 4})
    # whole_domains: only wholly free domains; a busy GPU anywhere in a domain rules it out
    free = st_.free.copy()
    free[:18] = spec.full_masks[:18]  # domain 0 wholly free
    free[18] = 0  # domain 1 has a busy tray
    st2 = State(spec, free, ())
    sel = d.select(40, st2, constraints={"whole_domains": True})
    doms = domains_of(spec, sel.gpus)
    whole = {spec.hosts[h].domain for h in range(spec.n_hosts)
             if np.all(popcount(free)[spec.units[0] == spec.units[0][h]] == 4)}
    assert len(doms) == 1 and doms <= whole
    top = int(per_dom.max())
    sel = d.select(top, st_, constraints={"single_domain": True})
    assert len(domains_of(spec, sel.gpus)) == 1
    with pytest.raises(PlacementError, match="single_domain") as e:
        d.select(top + 1, st_, constraints={"single_domain": True})
    assert e.value.reason == "constraint_unmet"


@pytest.mark.slow
def test_single_domain_on_a_rack_labelled_cluster():
    fab = make_fabric(load_cluster(ROOT / "params/clusters/h100-64.yaml"))
    spec = fab.spec
    st_ = random_state(spec, fab, np.random.default_rng(2), busy_frac=0.5)
    sel = Dispatcher(fab).select(24, st_, constraints={"single_domain": True})
    assert len(domains_of(spec, sel.gpus)) == 1


def test_block_baseline_is_best_fit_then_compact(nvl72):
    spec = nvl72.spec
    free = spec.full_masks.copy()
    free[0:10] = 0  # domain 0: 32 free GPUs (8 trays)
    free[18:24] = 0  # domain 1: 48 free GPUs
    sel = Dispatcher(nvl72).select(30, State(spec, free, ()), "block")
    assert domains_of(spec, sel.gpus) == {"gb200-nvl0"} and len(sel.hosts) == 8  # best fit, fewest trays
    sel = Dispatcher(nvl72).select(100, State(spec, free, ()), "block")
    assert len(sel.gpus) == 100


@pytest.mark.slow
def test_stage_1_5_domain_patterns_predict_unmeasured_patterns(nvl72):
    """Fit on the plan's in-domain measurements (2 % noise), predict held-out patterns and random
    in-domain allocations; compose with a cross-domain model for the dispatcher."""
    from bandpilot.data.domain_planning import plan_domains
    from bandpilot.errors import ModelError
    from bandpilot.model.domain_patterns import DomainAwareModel, DomainPatterns

    spec = nvl72.spec
    pl = [m for m in plan_domains(spec, domain_samples=200, cross_domain_samples=0, seed=1) if m.stratum.startswith("1d")]
    masks = np.array([m.masks for m in pl])
    y = nvl72.measure(masks, seed=1)
    test = np.random.default_rng(0).random(len(pl)) < 0.25
    dp = DomainPatterns.fit(spec, nvl72.stage1, masks[~test], y[~test])
    err = np.abs(dp.predict(masks[test]) / nvl72.bandwidth_masks(masks[test]) - 1)
    assert err.mean() < 0.02 and err.max() < 0.1
    model = DomainAwareModel(nvl72, dp)
    st_ = random_state(spec, nvl72, np.random.default_rng(4), busy_frac=0.4)
    sel = Dispatcher(model).select(16, st_)
    assert len(domains_of(spec, sel.gpus)) == 1
    truth = ContentionPredictor(nvl72, st_).predict(spec.to_mask(sel.gpus)[None, :]).value[0]
    assert truth >= 0.99 * Dispatcher(nvl72).select(16, st_, "exact").predicted_gbps
    with pytest.raises(ModelError, match="no NVLink domains"):
        DomainPatterns.fit(make_fabric(load_cluster(ROOT / "params/clusters/h100.yaml")).spec, nvl72.stage1, masks, y)
    with pytest.raises(ModelError, match="different clusters"):
        DomainAwareModel(make_fabric(nvl_spec()), dp)


def test_locality_margin_keeps_a_small_gang_on_fewer_trays(tiny):
    """Issue 21 (Helios on nvl72x16): with the queue's locality margin a 2-GPU gang takes two GPUs
    of one tray, not the single free GPUs of two trays for the same predicted bandwidth (in-domain
    values tie); without a margin fragmentation still decides (no GPU stranded on a tray)."""
    spec = tiny.spec
    gpus = [g for g in spec.gpu_ids if spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain == spec.hosts[0].domain]
    by_tray: dict[str, list[str]] = {}
    for g in gpus:
        by_tray.setdefault(g.rpartition(":")[0], []).append(g)
    t0, t1, t2 = sorted(by_tray)
    free = [by_tray[t0][0], by_tray[t1][0]] + by_tray[t2]  # one free GPU on two trays, a whole third tray
    st_ = State.from_dict(spec, {"free": free, "jobs": [{"id": "busy", "gpus": by_tray[t0][1:] + by_tray[t1][1:], "demand_gbps": 0.0}]})
    spread = Dispatcher(tiny).select(2, st_)
    assert len(spread.hosts) == 2  # the fragmentation order: both single free GPUs, no tray left partly used
    local = Dispatcher(tiny, locality=0.5).select(2, st_)
    assert local.hosts == [t2] and local.predicted_gbps >= spread.predicted_gbps * 0.5
