"""Issue 24: the unit-level local search prices one move per class of interchangeable moves
(:mod:`bandpilot.dispatch.search.move_classes`): every move of a class has its first move's value
under the emulator, the round's pick is the same, and a no-improvement round on alike domains
prices a handful of moves, not every (source, size, target)."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.dispatch.search import domains, move_classes
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units, _best, _unit_moves, _unit_starts, domain_search
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from tests.test_domain_model import nvl_spec
from tests.test_domain_search import random_state


@pytest.fixture(scope="module")
def fab():
    return make_fabric(nvl_spec(domains=12, trays=4))


def _partly_busy(fab, rng, domains: int = 4) -> State:
    """Jobs of 1-5 GPUs (many spanning two domains: contenders) on the first ``domains`` domains
    only, the rest idle: alike cold domains next to hot ones."""
    spec = fab.spec
    gpus = [g for g in spec.gpu_ids if spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain
            in {spec.hosts[i * 4].domain for i in range(domains)}]
    rng.shuffle(gpus)
    jobs, i = [], 0
    while i < len(gpus) // 2:
        g = gpus[i : i + int(rng.integers(1, 6))]
        i += len(g)
        b = float(fab.bandwidth_masks(spec.to_mask(g)[None, :])[0])
        jobs.append({"id": f"j{len(jobs)}", "gpus": g, "demand_gbps": b * float(rng.uniform(0.2, 1.2))})
    used = {x for j in jobs for x in j["gpus"]}
    return State.from_dict(spec, {"free": [g for g in spec.gpu_ids if g not in used], "jobs": jobs})


def _rounds(fab, rng, busy):
    """(ctx, units, d, moves) of first rounds on a state ``busy`` (0: idle; "part": jobs on a few
    domains) for a few gang sizes."""
    if busy == "part":
        st = _partly_busy(fab, rng)
    else:
        st = State.idle(fab.spec) if busy == 0 else random_state(fab.spec, fab, rng, busy_frac=busy)
    for k in (20, 36, 60):
        if k > st.n_free:
            continue
        ctx = SearchContext(fab, st, st.free, k)
        units = Units(ctx)
        cap = units.free.copy()
        for d in _unit_starts(units, k, 1, np.ones(units.U, dtype=bool)):
            moves = _unit_moves(units, d, 1, cap)
            if moves.shape[0] > 1:
                yield ctx, units, d, moves


@pytest.mark.parametrize("seed,busy", [(0, 0.0), (1, 0.3), (2, 0.5), (3, 0.6), (4, "part"), (5, "part")])
def test_a_class_shares_its_value_and_the_round_keeps_its_pick(fab, seed, busy):
    rng = np.random.default_rng(seed)
    merged = 0
    for ctx, units, d, moves in _rounds(fab, rng, busy):
        keep = move_classes.one_per_class(units, moves, d)
        masks, cols = units.mask_rows(moves)
        value = ctx.pred.predict(masks, cols).value
        # each move equals (value) the kept move of its class: the last kept index at or before it
        r, u = np.nonzero(moves != d[None, :])
        cls = move_classes.unit_classes(units, d, u, moves[r, u])
        for i in range(moves.shape[0]):
            ch = np.flatnonzero(moves[i] != d)
            sig = sorted((cls[u], d[u], moves[i, u]) for u in ch)
            rep = [j for j in keep if sorted((cls[u], d[u], moves[j, u]) for u in np.flatnonzero(moves[j] != d)) == sig]
            assert len(rep) == 1 and rep[0] <= i
            assert value[i] == value[rep[0]]
        whole = _best(ctx, units, masks, 0.0, cols)
        m, c = units.mask_rows(moves[keep])
        part = _best(ctx, units, m, 0.0, c)
        assert np.array_equal(whole.mask, part.mask) and whole.value == part.value
        merged += moves.shape[0] - keep.size
    if busy in (0, "part"):  # alike cold domains: moves merged (random busy states: every domain hot)
        assert merged > 0


def test_a_no_improvement_round_on_alike_domains_prices_a_few_moves(fab, monkeypatch):
    """Idle cluster, 12 alike domains of 16 GPUs, k = 36: the balanced start over 3 domains cannot
    be improved; its round had every (source, size, target) move priced (> 20), now one per class."""
    st = State.idle(fab.spec)
    evals = {}
    for on in (False, True):
        monkeypatch.setattr(move_classes, "MOVE_CLASSES", on)
        ctx = SearchContext(fab, st, st.free, 36)
        got = domain_search(ctx)
        evals[on] = (ctx.pred.evaluations, got.value, got.mask.tolist())
    assert evals[True][1:] == evals[False][1:]
    assert evals[False][0] > 20
    assert evals[True][0] <= 12


@pytest.mark.parametrize("seed", [4, 5])
def test_search_picks_unchanged_on_busy_states(fab, seed, monkeypatch):
    monkeypatch.setattr(domains, "UNIT_EVAL_BUDGET", 10**9)  # the budget never stops either search
    rng = np.random.default_rng(seed)
    for _ in range(3):
        st = random_state(fab.spec, fab, rng, busy_frac=float(rng.uniform(0.2, 0.6)))
        for k in (18, 30, 44):
            if k > st.n_free:
                continue
            got = {}
            for on in (False, True):
                monkeypatch.setattr(move_classes, "MOVE_CLASSES", on)
                ctx = SearchContext(fab, st, st.free, k)
                f = domain_search(ctx)
                got[on] = (f.mask.tolist(), f.value)
            assert got[True] == got[False]
