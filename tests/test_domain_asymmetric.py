"""NVLink-domain search on *asymmetric* trays (``domains.ASYMMETRIC``, commits 853a7a9 + a3369ff):
a model under which a tray's best value for ``c`` GPUs depends on which of its GPUs are free.

The asymmetric model is a real one, no stand-in: the emulator of a small NVLink-domain spec
(3 domains x 3 trays x 4 GB200) whose ``emulator: faults:`` degrade one NVLink pair on 7 of the 9
trays, so ``make_fabric`` returns the :class:`FaultyFabric` the dispatcher uses as Ideal-BP / oracle
for such a spec. Fault-free, the same spec is symmetric (both flags pick alike).

Measured (k = 2..6 fitting a domain, seeds 0-3 x 20 states = 400 cases, factors 0.5-0.9):
``patterns`` evaluates 1,346 rows vs 8,296 for ``per_unit``; ``patterns`` / exact mean 0.988,
min 0.60, worse than ``per_unit`` in 84/400, never better; ``per_unit`` equals exact 400/400. With the
faults scaled to 30 % (factors 0.85-0.97): mean 0.994, min 0.87, worse in 57/400 - see the xfail.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher, PlacementError
from bandpilot.dispatch.search import domains
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from bandpilot.fabric.faults import FaultyFabric
from bandpilot.topology.cluster import popcount, spec_from_dict

TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]
#: (tray, GPU, peer GPU, factor): one degraded NVLink pair on trays t0, t1, t3-t6, t8. ``nvlink_pair``
#: lowers only the stage-1 values of subsets holding both GPUs, so the model keeps the hierarchy the
#: search relies on (``nvlink_width`` does not: a lone narrow GPU also slows cross-tray traffic, which
#: no stage-1 value shows - per_unit then missed exact in 1 of 60 cases; not used here)
FAULTS = [(0, 1, 2, 0.6), (1, 0, 2, 0.8), (3, 0, 3, 0.7), (4, 2, 3, 0.5), (5, 1, 3, 0.9), (6, 0, 1, 0.75), (8, 1, 2, 0.85)]


def spec_with(faults=(), scale: float = 1.0):
    """The tiny NVLink-domain spec; ``faults`` narrowed by ``scale`` of their (1 - factor)."""
    return spec_from_dict({
        "name": "nvl-asym", "gpus_per_host": 4,
        "host_groups": [{"prefix": "t", "count": 9, "gpu": "GB200", "topology": TRAY, "nvlink_domain_size": 3}],
        "network": {"nic_gbps": 400, "rails_per_host": 4},
        "emulator": {
            "gpus": {"GB200": {"link": {"NV": 59.44}, "cap": 479.8, "sharpness": 2.1, "hop_penalty": 0.39,
                               "ring_eff": [1.0, 1.05, 1.1, 0.99, 1.0, 1.01, 1.02]}},
            "faults": [{"kind": "nvlink_pair", "host": f"t{h}", "gpu": g, "peer": q, "factor": 1 - (1 - f) * scale}
                       for h, g, q, f in faults],
        },
    })


@pytest.fixture(scope="module")
def asym():
    fab = make_fabric(spec_with(FAULTS))
    assert isinstance(fab, FaultyFabric)
    return fab


@pytest.fixture(scope="module")
def mild():
    return make_fabric(spec_with(FAULTS, scale=0.3))


@pytest.fixture(scope="module")
def sym():
    return make_fabric(spec_with())


@pytest.fixture
def flag():
    """Set ``domains.ASYMMETRIC`` for one select; restored after the test."""
    old = domains.ASYMMETRIC

    def select(d: Dispatcher, k: int, state: State, how: str, algorithm: str = "bandpilot"):
        domains.ASYMMETRIC = how
        try:
            return d.select(k, state, algorithm)
        finally:
            domains.ASYMMETRIC = old

    yield select
    domains.ASYMMETRIC = old


def states(spec, seed: int, n: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        gpus = list(spec.gpu_ids)
        rng.shuffle(gpus)
        yield State.from_dict(spec, {"free": gpus[int(rng.uniform(0.1, 0.6) * len(gpus)):], "jobs": []})


def cases(spec, seed: int, n: int, ks=(2, 3, 4, 5, 6)):
    """(state, k) with k fitting a domain (the path under test: ``_fitting``)."""
    for s in states(spec, seed, n):
        per_dom = np.bincount(spec.units[0], weights=popcount(s.free))
        yield from ((s, k) for k in ks if k <= per_dom.max())


def brute(fab, state: State, k: int) -> float:
    """The best value of any k free GPUs inside one domain (every subset of every domain: <= 12 GPUs each)."""
    spec = fab.spec
    best = 0.0
    for d in np.unique(spec.units[0]):
        gpus = [g for g in state.free_gpus if spec.units[0][spec.host_index[g.rpartition(":")[0]]] == d]
        if len(gpus) >= k:
            masks = np.array([spec.to_mask(c) for c in itertools.combinations(gpus, k)])
            best = max(best, float(ContentionPredictor(fab, state).predict(masks).value.max()))
    return best


def test_the_pattern_path_is_taken_on_asymmetric_trays_only(asym, sym, flag):
    st_ = next(states(asym.spec, 0, 1))
    ctx = SearchContext(asym, st_, st_.free, 3)
    units = domains.Units(ctx)
    fits = np.flatnonzero(units.free >= 3)
    assert not domains.symmetric_trays(ctx, np.flatnonzero(ctx.fcount > 0))
    domains.ASYMMETRIC = "per_unit"
    try:
        assert domains.patterns(ctx, units, fits, with_exposed=True) is None  # the old per-unit search
    finally:
        domains.ASYMMETRIC = "patterns"
    got = domains.patterns(ctx, units, fits, with_exposed=True)
    assert got is not None and got[0].shape[0] >= 1 and set(got[1].tolist()) <= set(fits.tolist())
    # fault-free, the same spec's trays are symmetric: the flag changes nothing
    ctx0 = SearchContext(sym, st_, st_.free, 3)
    assert domains.symmetric_trays(ctx0, np.flatnonzero(ctx0.fcount > 0))
    d, d0 = Dispatcher(asym), Dispatcher(sym)
    ev_p = ev_u = 0
    for s, k in cases(asym.spec, 1, 10):
        ev_p += flag(d, k, s, "patterns").evaluations
        ev_u += flag(d, k, s, "per_unit").evaluations
        a, b = flag(d0, k, s, "patterns"), flag(d0, k, s, "per_unit")
        assert a.gpus == b.gpus and a.evaluations == b.evaluations
    # measured 165 vs 1,086 rows over these 50 cases: count patterns, not per-unit count vectors
    assert ev_p * 3 < ev_u


CONSTRAINTS = [None, {"allowed_hosts": ["t1", "t3", "t4", "t5", "t8"]}, {"single_domain": True}]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 15), min_size=9, max_size=9), st.integers(1, 12),
       st.sampled_from(["patterns", "per_unit"]), st.sampled_from(CONSTRAINTS))
def test_selections_are_valid(asym, free_masks, k, how, cons):
    spec = asym.spec
    free = [f"t{h}:{g}" for h, m in enumerate(free_masks) for g in range(4) if m >> g & 1]
    if k > len(free):
        return
    state = State.from_dict(spec, {"free": free, "jobs": []})
    per_dom = np.bincount(spec.units[0], weights=popcount(state.free))
    allowed = set(cons["allowed_hosts"]) if cons and "allowed_hosts" in cons else {h.name for h in spec.hosts}
    old, domains.ASYMMETRIC = domains.ASYMMETRIC, how
    try:
        sel = Dispatcher(asym).select(k, state, constraints=cons)
    except PlacementError:  # only when the constraint cannot be met
        assert cons and (sum(g.rpartition(":")[0] in allowed for g in free) < k or per_dom.max() < k)
        return
    finally:
        domains.ASYMMETRIC = old
    assert len(sel.gpus) == len(set(sel.gpus)) == k and set(sel.gpus) <= set(free)
    assert {g.rpartition(":")[0] for g in sel.gpus} <= allowed
    doms = {spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain for g in sel.gpus}
    if k <= per_dom.max() and not (cons and "allowed_hosts" in cons):
        assert len(doms) == 1  # a gang that fits a domain stays in one
    assert sel.predicted_gbps == pytest.approx(float(asym.bandwidth_masks(spec.to_mask(sel.gpus)[None, :])[0]))


def test_patterns_stay_near_the_exhaustive_optimum(asym, mild, flag):
    """Against brute force over every k-subset of every domain (k = 2..6; 75 seeded cases per model,
    deterministic). Measured ``patterns`` / brute: mild mean 0.9882 min 0.8686; asym mean 0.9771 min
    0.5991. Put each part on the worst-valued fitting tray (the value key in ``patterns`` flipped to
    primary, worst first) and it measured mild mean 0.9848 min 0.8500, asym mean 0.9708: fails here.
    ``per_unit`` / brute: asym 75/75 equal, mild 72/75 (coarse count vectors), min 0.995."""
    for fab, mean_min, floor, unit_exact in ((mild, 0.986, 0.86, False), (asym, 0.974, 0.55, True)):
        d = Dispatcher(fab)
        ratios = []
        for s, k in cases(fab.spec, 2, 15):
            best = brute(fab, s, k)
            ratios.append(flag(d, k, s, "patterns").predicted_gbps / best)
            unit = flag(d, k, s, "per_unit").predicted_gbps
            assert unit == pytest.approx(best, rel=1e-9) if unit_exact else unit >= 0.99 * best
        assert len(ratios) == 75
        assert np.mean(ratios) >= mean_min and min(ratios) >= floor, (np.mean(ratios), min(ratios))


def test_per_unit_equals_the_exact_per_domain_optimum(asym, flag):
    d = Dispatcher(asym)
    n = 0
    for s, k in cases(asym.spec, 3, 12):
        exact = flag(d, k, s, "per_unit", "exact").predicted_gbps
        assert flag(d, k, s, "per_unit").predicted_gbps == pytest.approx(exact, rel=1e-9)
        n += 1
    assert n >= 30


@pytest.mark.xfail(strict=True, reason="ASYMMETRIC='patterns' places each pattern on the best-fit unit only: "
                   "another unit with cleaner trays is never tried (the documented approximation); with one "
                   "degraded NVLink pair per tray it is worse than 'per_unit' in 41/200 cases here (min ratio "
                   "0.60). Placing patterns on every fitting unit measured 7/400 worse. Reported to the lead")
def test_patterns_not_worse_than_per_unit_in_most_cases(asym, flag):
    d = Dispatcher(asym)
    worse = total = 0
    for s, k in cases(asym.spec, 0, 40):
        p, u = flag(d, k, s, "patterns"), flag(d, k, s, "per_unit")
        worse += p.predicted_gbps < u.predicted_gbps * (1 - 1e-9)
        total += 1
    assert worse <= 0.05 * total, (worse, total)
