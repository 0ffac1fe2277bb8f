"""Exposure-aware shape candidates (issue 23): least-demand unit choice, stage balance, half pairing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.search.shape_exposure import balance_stages, counts_least_demand, paired, worst_dp_demand
from bandpilot.dispatch.search.shape_units import counts_rack_stages
from bandpilot.dispatch.shape import Shape


def test_least_demand_takes_clean_room_then_units_whose_tenants_are_paid():
    cap = np.array([2, 2, 2, 2])
    clean = np.array([2, 0, 0, 0])
    # unit 1: tenant 0 (100 GB/s); units 2 and 3: tenant 1 (10 GB/s), unit 3 also tenant 2 (1 GB/s)
    touch = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=bool)
    demand = np.array([100.0, 10.0, 1.0])
    assert counts_least_demand(cap, clean, touch, demand, 2) is None  # the clean room holds it
    n = counts_least_demand(cap, clean, touch, demand, 5)
    assert n.tolist() == [2, 0, 2, 1]  # never the 100 GB/s tenant's unit
    assert counts_least_demand(cap, clean, touch, demand, 8).tolist() == [2, 2, 2, 2]
    assert counts_least_demand(cap, clean, touch, demand, 9).sum() == 8  # short: the rest span


def test_balance_stages_splits_the_tenants_over_the_stages():
    shp = Shape.parse({"tp": 2, "pp": 2, "dp": 2})
    touch_h = np.zeros((4, 2), dtype=bool)
    touch_h[0, 0] = touch_h[1, 1] = True  # hosts 0 and 1 each beside one tenant
    demand = np.array([100.0, 50.0])
    groups = [[(h, 0), (h, 1)] for h in range(4)]  # stage 0 = hosts 0, 1 (both tenants), stage 1 clean
    out = balance_stages(groups, touch_h, demand, shp)
    assert sorted(map(tuple, out)) == sorted(map(tuple, groups))
    assert {out[0][0][0], out[1][0][0]} & {0, 1} and {out[2][0][0], out[3][0][0]} & {0, 1}
    assert worst_dp_demand(out, touch_h, demand, shp) == 100.0 < worst_dp_demand(groups, touch_h, demand, shp)
    assert balance_stages(out, touch_h, demand, shp) is None  # nothing left to gain


def test_balance_stages_keeps_a_tenant_on_two_hosts_in_one_stage():
    # seed 0's busy1 tp=4,pp=2,dp=32 in small: tenant A on hosts 0-2, B beside A on host 1, C on 3-4,
    # D on 5; the best split is {A, B} / {C, D} (74.0). Dealing by resulting demand alone sends host
    # 0 to C's stage (A 34.3 + C 37 < A + B 74), fills it, and leaves {A, B, D} (108.3).
    shp = Shape.parse({"tp": 2, "pp": 2, "dp": 3})
    touch_h = np.zeros((6, 4), dtype=bool)
    touch_h[[0, 1, 2], 0] = touch_h[1, 1] = touch_h[[3, 4], 2] = touch_h[5, 3] = True
    demand = np.array([34.3, 39.7, 37.0, 34.3])
    groups = [[(h, 0), (h, 1)] for h in (0, 3, 5, 1, 2, 4)]  # stages {A, C, D} / {A, B, C}: 111.0
    out = balance_stages(groups, touch_h, demand, shp)
    assert sorted(map(tuple, out)) == sorted(map(tuple, groups))
    assert worst_dp_demand(out, touch_h, demand, shp) == pytest.approx(74.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(2, 2, 4), (4, 2, 2), (2, 4, 2), (8, 2, 2)]))
def test_balance_stages_is_a_permutation_that_lowers_the_worst_dp_group(seed, tpd):
    rng = np.random.default_rng(seed)
    tp, pp, dp = tpd
    shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
    G, n_hosts = pp * dp, pp * dp * 2
    touch_h = rng.random((n_hosts, 5)) < 0.2
    demand = rng.uniform(1, 100, 5)
    # host-aligned groups (several per host) and spanning ones (two halves), as the search cuts them
    groups, h = [], 0
    while len(groups) < G:
        if rng.random() < 0.3 and tp % 2 == 0:
            half = tp // 2
            groups.append([(h, i) for i in range(half)] + [(h + 1, i) for i in range(half)])
            h += 2
        else:
            for _ in range(int(rng.integers(1, 3))):
                if len(groups) < G:
                    groups.append([(h, len(groups) * tp + i) for i in range(tp)])
            h += 1
    touch_h = np.vstack([touch_h, np.zeros((max(h - n_hosts, 0), 5), dtype=bool)])
    out = balance_stages(groups, touch_h, demand, shp)
    if out is not None:
        assert sorted(map(tuple, out)) == sorted(map(tuple, groups))
        assert worst_dp_demand(out, touch_h, demand, shp) < worst_dp_demand(groups, touch_h, demand, shp)


def test_paired_gives_each_tenant_half_a_clean_partner_in_its_rack():
    # units 0-3 in rack 0, 4-5 in rack 1; units 1 and 4 beside tenants
    left = {u: [(u, i) for i in range(4)] for u in range(6)}
    rack = np.array([0, 0, 0, 0, 1, 1])
    cost = np.array([0.0, 30.0, 0.0, 0.0, 40.0, 0.0])
    out = paired(left, rack, 6, 4, cost)
    assert len(out) == 6
    gpus = [g for grp in out for g in grp]
    assert len(set(gpus)) == len(gpus) == 24  # every half used once, 2 + 2 GPUs per group
    for grp in out:
        units = {h for h, _ in grp}
        assert len(units) == 2 and len(units & {1, 4}) <= 1  # never two tenant halves together
        assert len({int(rack[u]) for u in units}) == 1  # all pairs inside a rack here
    # fewer groups than clean halves: no tenant half at all
    left = {u: [(u, i) for i in range(4)] for u in range(6)}
    out = paired(left, rack, 2, 4, cost)
    assert all(h not in (1, 4) for grp in out for h, _ in grp)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=8, max_size=8), st.sampled_from([(2, 2), (3, 2), (2, 3), (4, 1)]))
def test_rack_stages_puts_whole_stages_in_racks(room, pd):
    pp, dp = pd
    room = np.array(room)
    rack = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    shp = Shape.parse({"tp": 2, "pp": pp, "dp": dp})
    n = counts_rack_stages(room, rack, shp)
    if n is None:
        assert pp < 2 or (np.bincount(rack, weights=room) // dp).sum() < pp
        return
    assert n.sum() == pp * dp and (n <= room).all()
    assert (np.bincount(rack, weights=n) % dp == 0).all()


def test_rack_stages_tail_spreads_a_lone_group():
    # tp=2,pp=2,dp=32: rack 0 holds one stage on 8 full hosts; rack 1's fullest-first cut ends 4x7 + 3
    # + 1 (each DP group one rank on the last host); spread: 4x6 + 3 + 3 + 2
    shp = Shape.parse({"tp": 2, "pp": 2, "dp": 32})
    room = np.array([4] * 8 + [4] * 7 + [3, 3, 2, 1])
    rack = np.array([0] * 8 + [1] * 11)
    plain = counts_rack_stages(room, rack, shp)
    tail = counts_rack_stages(room, rack, shp, tail=True)
    assert plain[8:].tolist() == [4] * 7 + [3, 1, 0, 0]
    assert tail[8:].tolist() == [4] * 6 + [0, 3, 3, 2, 0]
    assert np.array_equal(tail[:8], plain[:8]) and (tail <= room).all()
    assert counts_rack_stages(np.array([4] * 16), np.array([0] * 8 + [1] * 8), shp, tail=True).tolist() == [4] * 16
