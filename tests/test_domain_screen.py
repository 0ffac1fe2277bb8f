"""Issue 24: a domain surrogate at rack scale - rows on the columns they use, and the screen that
ranks a big unit-level local-search batch by the model's own prior before the model sees it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bandpilot.data.domain_planning import plan_domains
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.search import screen as screen_mod
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.dispatch.search.domains import Units, _unit_moves, _unit_starts
from bandpilot.dispatch.state import State
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model.tokens import to_torch
from bandpilot.model.unit_grid import changed_parts
from tests.test_domain_model import nvl_spec


@pytest.fixture(scope="module")
def fab():
    return make_fabric(nvl_spec(domains=8, trays=4))


@pytest.fixture(scope="module")
def sur(fab):
    from bandpilot.model.crossval import fit

    pl = [m.masks for m in plan_domains(fab.spec, cross_domain_samples=80, seed=0) if m.cross_host]
    ds = fabric_dataset(fab, cross_masks=np.array(pl, dtype=np.int64), seed=1)
    return fit(ds, {"model": "domain", "epochs": 3, "folds": 2, "threads": 1}, plots=False).surrogate


def _rows(spec, rng, n=120):
    out = np.zeros((n, spec.n_hosts), dtype=np.int64)
    for i in range(n):
        hs = rng.choice(spec.n_hosts, int(rng.integers(1, 12)), replace=False)
        out[i, hs] = rng.integers(1, 16, hs.size)
    out[:10] = 0
    out[:10, 4:6] = 0b0011  # two trays of domain 1: stage 1.5, no net
    return out


def test_predict_columns_equals_predict_masks(sur):
    rows = _rows(sur.spec, np.random.default_rng(0))
    cols = np.flatnonzero(rows.any(axis=0))
    sur.memo_enabled = False
    try:
        assert np.array_equal(sur.predict_columns(rows[:, cols], cols), sur.predict_masks(rows))
        # a batch of rows alike but for a domain or two (the per-unit delta path) still the dense values
        base = np.tile(rows[20], (60, 1))
        base[1:, 8:12] = np.random.default_rng(1).integers(0, 16, (59, 4))
        c2 = np.flatnonzero(base.any(axis=0))
        assert np.array_equal(sur.predict_columns(base[:, c2], c2), sur.predict_masks(base))
    finally:
        sur.memo_enabled = True


def test_prior_proxy_on_unit_rows_is_the_prior_of_their_mask_rows(sur):
    st = State.idle(sur.spec)
    ctx = SearchContext(sur, st, st.free, 40)
    units = Units(ctx)
    D = np.array(_unit_starts(units, 40, 1, np.ones(units.U, dtype=bool)))
    D = np.concatenate([D, np.roll(D, 1, axis=1), np.roll(D, 3, axis=1)])
    masks, cols = units.mask_rows(D)
    with torch.inference_mode():
        want = torch.exp(sur.net.prior_log(to_torch(sur.tokens(masks, cols)))).double().numpy()

    def part(u, t):
        h, c = units.part_hosts(u, t)
        return h, ctx.best_mask[h, c]

    got = sur.screening_model().predict_units(D, part)
    assert np.allclose(got, want, rtol=1e-6)

def test_prior_proxy_incremental_path_is_the_token_grid_bit_for_bit(sur):
    """A batch of unit moves (each row the start but in a source and a target unit), and a batch of
    rolled rows (many units changed): the first-row-patched reductions give the grid's floats."""
    st = State.idle(sur.spec)
    ctx = SearchContext(sur, st, st.free, 40)
    units = Units(ctx)
    d = np.array(_unit_starts(units, 40, 1, np.ones(units.U, dtype=bool))[0])
    moves = _unit_moves(units, d, 1, units.free.copy())
    assert moves.shape[0] > 5 and (moves != d).sum(axis=1).max() == 2
    rng = np.random.default_rng(3)
    rolled = np.concatenate([d[None], np.array([np.roll(d, int(s)) for s in rng.integers(1, 5, 40)])])

    def part(u, t):
        h, c = units.part_hosts(u, t)
        return h, ctx.best_mask[h, c]

    def parts(us, ts):  # every pair's part at once (the screen's): the same floats
        ptr, h, c = units.parts(us, ts)
        return ptr, h, ctx.best_mask[h, c]

    proxy = sur.screening_model()
    for D in (np.concatenate([d[None], moves]), moves, rolled):
        full = proxy.predict_units(D, part, incremental=False)
        assert np.array_equal(proxy.predict_units(D, part), full)
        assert np.array_equal(proxy.predict_units(D, part, parts=parts), full)
        assert np.array_equal(proxy.predict_units(D, part, parts=parts, changed=changed_parts(D)), full)
        assert np.all(np.isfinite(full))


def _rolled_batch(model, st):
    """A search's context and units for k = 40 on ``st`` and a batch of distinct unit-count rows
    (the starts, rolled over 8 units) for the screens to price."""
    ctx = SearchContext(model, st, st.free, 40)
    units = Units(ctx)
    D = np.array(_unit_starts(units, 40, 1, np.ones(units.U, dtype=bool)))
    D = np.unique(np.concatenate([np.roll(D, s, axis=1) for s in range(8)]), axis=0)
    assert D.shape[0] > 6
    return ctx, units, D


def test_screen_prices_best_ranked_chunks_first_and_a_fabric_whole_at_fabric_first_0(sur, fab, monkeypatch):
    st = State.idle(sur.spec)
    ctx, units, D = _rolled_batch(sur, st)
    seen = []

    def price(rows):
        seen.append(rows)
        return SimpleNamespace(value=float(rows.shape[0]), evaluated=rows.shape[0])

    got, n = screen_mod.screen_for(ctx, units, budget=10**9, top=D.shape[0])(D, price, 0.0)
    assert len(seen) == 1 and seen[0] is D and n == D.shape[0]  # a small batch: priced whole
    seen.clear()
    value = sur.screening_model().predict_units(D, lambda u, t: (units.part_hosts(u, t)[0],
                                                                ctx.best_mask[units.part_hosts(u, t)]))
    order = np.argsort(-value, kind="stable")
    got, n = screen_mod.screen_for(ctx, units, budget=10**9, top=2)(D, price, 1e9)  # nothing beats the bar
    sizes, pos, step = [], 0, 2
    while pos < D.shape[0]:
        sizes.append(min(step, D.shape[0] - pos))
        pos, step = pos + step, 2 * step
    assert [c.shape[0] for c in seen] == sizes  # every candidate in the end, best-ranked first
    assert np.array_equal(seen[0], D[np.sort(order[:2])]) and np.array_equal(seen[1], D[np.sort(order[2:6])])
    seen.clear()
    got, n = screen_mod.screen_for(ctx, units, budget=10**9, top=2)(D, price, 1.0)  # the first chunk beats it
    assert len(seen) == 1 and got.value == 2.0 and n == 2
    fctx = SearchContext(fab, st, st.free, 40)
    seen.clear()
    monkeypatch.setattr(screen_mod, "FABRIC_FIRST", 0)  # the exact path (the default is batch order)
    screen_mod.screen_for(fctx, Units(fctx), budget=10**9, top=1)(D, price, 1e9)
    assert len(seen) == 1 and seen[0] is D  # a fabric has no stand-in: the whole batch


def test_screen_max_stops_a_batch_without_an_improvement_after_its_best_ranked(sur, monkeypatch):
    """``SCREEN_MAX`` (448 by default): a batch with no improvement ends once that many of its
    best-ranked candidates are priced; 0, every candidate is priced."""
    assert screen_mod.SCREEN_MAX == 448  # the default (README, issue 24)
    st = State.idle(sur.spec)
    ctx, units, D = _rolled_batch(sur, st)
    assert D.shape[0] > 6
    seen = []

    def price(rows):
        seen.append(rows)
        return SimpleNamespace(value=float(rows.shape[0]), evaluated=rows.shape[0])

    monkeypatch.setattr(screen_mod, "SCREEN_MAX", 6)
    got, n = screen_mod.screen_for(ctx, units, budget=10**9, top=2)(D, price, 1e9)
    assert [c.shape[0] for c in seen] == [2, 4] and n == 6 and got.value == 4.0
    seen.clear()
    monkeypatch.setattr(screen_mod, "SCREEN_MAX", 0)
    got, n = screen_mod.screen_for(ctx, units, budget=10**9, top=2)(D, price, 1e9)
    assert n == D.shape[0] and sum(c.shape[0] for c in seen) == D.shape[0]


def test_fabric_first_prices_a_fabric_batch_in_order_until_a_chunk_improves(fab, monkeypatch):
    st = State.idle(fab.spec)
    ctx, units, D = _rolled_batch(fab, st)
    seen = []

    def price(rows):  # the value of a chunk: its first row's position in D (the best is the last row)
        seen.append(rows)
        at = int(np.flatnonzero((D == rows[-1]).all(axis=1))[0])
        return SimpleNamespace(value=float(at), evaluated=rows.shape[0])

    monkeypatch.setattr(screen_mod, "FABRIC_FIRST", 2)
    got, n = screen_mod.screen_for(ctx, units, budget=10**9)(D, price, 2.5)  # rows 0-1, then 2-5 beat 2.5
    assert [c.shape[0] for c in seen] == [2, 4] and np.array_equal(np.concatenate(seen), D[:6])
    assert got.value == 5.0 and n == 6
    seen.clear()
    got, n = screen_mod.screen_for(ctx, units, budget=10**9)(D, price, 1e9)  # nothing beats it: every row
    assert np.array_equal(np.concatenate(seen), D) and n == D.shape[0] and got.value == D.shape[0] - 1


def test_small_batches_pick_as_without_the_screen(sur, monkeypatch):
    st = State.idle(sur.spec)
    picks = [Dispatcher(sur).select(k, st).mask for k in (20, 40, 72)]
    monkeypatch.setattr(screen_mod, "SCREEN_TOP", 10**9)
    again = [Dispatcher(sur).select(k, st).mask for k in (20, 40, 72)]
    assert all(np.array_equal(a, b) for a, b in zip(picks, again))


def test_lone_candidates_priced_together_as_one_by_one(sur):
    from bandpilot.dispatch.search import unit_batch
    from bandpilot.dispatch.search.domains import _best

    from tests.test_domain_search import random_state

    st = random_state(sur.spec, make_fabric(sur.spec), np.random.default_rng(5), busy_frac=0.4)
    ctx = SearchContext(sur, st, st.free, 3)
    units = Units(ctx)
    groups = []
    for u in np.flatnonzero(units.free >= 3).tolist():
        cols = units.members[u]
        groups.append((ctx.masks_from_counts(units.part(u, 3))[:, cols], cols))
    assert len(groups) >= 3
    groups.append((groups[0][0][:0], groups[0][1]))  # a domain without candidates
    seen = []

    def best(m, c):
        seen.append(m.shape[0])
        return _best(ctx, units, m, 0.0, c)

    got = unit_batch.best_each(ctx, groups, best)
    assert seen == []  # every lone candidate went through the shared call
    want = [_best(ctx, units, m, 0.0, c) if m.shape[0] else None for m, c in groups]
    assert got[-1] is None and want[-1] is None
    for g, w in zip(got[:-1], want[:-1]):
        assert np.array_equal(g.mask, w.mask) and g.value == w.value and g.standalone == w.standalone
    assert len({g.value for g in got[:-1]}) > 1  # the domains' free trays differ: not one value copied


@pytest.fixture(scope="module")
def asym_sur(sur):
    """``sur`` with a noisy stage 1 (each tray's row scaled by 0.9-1.0, like a measured one): trays
    no longer interchangeable, so a gang that fits a domain is searched in every domain."""
    import copy

    out = copy.copy(sur)
    out.stage1 = sur.stage1 * np.random.default_rng(3).uniform(0.9, 1.0, (sur.stage1.shape[0], 1))
    out._view, out._screen, out._memo = None, None, None
    return out


def test_inside_bound_bounds_every_in_domain_row(asym_sur):
    """``Surrogate.inside_bound`` is >= the model's value of every row of k GPUs over >= 2 trays of a
    domain (random rows of every domain), and the search's per-unit bound (with stage 1 for one tray)
    >= every candidate it would price there."""
    from bandpilot.dispatch.search.domains import in_unit
    from bandpilot.dispatch.search.unit_batch import unit_bounds
    from tests.test_domain_search import random_state

    sur = asym_sur
    spec, rng = sur.spec, np.random.default_rng(7)
    units = np.unique(spec.units[0])
    for k in (2, 3, 4, 5, 8):
        b = sur.inside_bound(units, k)
        for u in units.tolist():
            hosts = np.flatnonzero(spec.units[0] == u)
            rows = np.zeros((200, spec.n_hosts), dtype=np.int64)
            for r in range(200):  # k GPUs over >= 2 trays of domain u
                gpus = rng.choice(hosts.size * 4, k, replace=False)
                if np.unique(gpus // 4).size < 2:
                    gpus[0] = (gpus[1] // 4 + 1) % hosts.size * 4 + (gpus[0] % 4)
                    gpus = np.unique(gpus)
                for g in gpus:
                    rows[r, hosts[g // 4]] |= 1 << (g % 4)
            rows = rows[(np.bitwise_count(rows).sum(axis=1) == k) & ((rows != 0).sum(axis=1) >= 2)]
            assert rows.shape[0] > 50 and np.all(sur.predict_masks(rows) <= b[u])
    fab = make_fabric(spec)
    tight = 0
    for _ in range(6):
        st = random_state(spec, fab, rng, busy_frac=0.4)
        for k in (1, 2, 3, 4):
            ctx = SearchContext(sur, st, st.free, k)
            u_ = Units(ctx)
            us = np.flatnonzero(u_.free >= k).tolist()
            if len(us) < 2:
                continue
            bound = unit_bounds(ctx, u_, us)
            for i, u in enumerate(us):
                m = in_unit(ctx, u_, u, coarse=True)
                v = ctx.evaluate(m, u_.members[u]).value
                assert v.max() <= bound[i]
                tight += bool(v.max() == bound[i])
    assert tight > 0  # the bound is reached somewhere: not a loose constant


def test_bounded_domain_search_picks_as_without_bound(asym_sur, monkeypatch):
    from bandpilot.dispatch.search import unit_batch
    from tests.test_domain_search import random_state

    sur = asym_sur
    fab, rng = make_fabric(sur.spec), np.random.default_rng(11)
    cases = [(random_state(sur.spec, fab, rng), k) for _ in range(10) for k in (1, 2, 3, 4)]
    calls = []
    real = unit_batch.unit_bounds
    monkeypatch.setattr(unit_batch, "unit_bounds", lambda *a: calls.append(1) or real(*a))
    new = [Dispatcher(sur).select(k, st) for st, k in cases if k <= st.n_free]
    assert calls
    monkeypatch.setattr(unit_batch, "unit_bounds", lambda *a: None)
    old = [Dispatcher(sur).select(k, st) for st, k in cases if k <= st.n_free]
    assert len(new) > 30
    assert all(np.array_equal(a.mask, b.mask) and a.predicted_gbps == b.predicted_gbps for a, b in zip(new, old))
    assert sum(a.evaluations for a in new) < sum(b.evaluations for b in old)  # domains were skipped


def test_domain_net_forward_is_the_host_nets_computation_bit_for_bit(sur, monkeypatch):
    """The domain net's shortcuts - a token's domain-mates are itself (its tokens are distinct
    domains), attention scores scaled and masked in place - give the floats of the host net's
    (b, t, t) comparison and of out-of-place attention, on rows of 1-8 domains (both attention
    paths: <= 8 tokens broadcast, more by matmul)."""
    from bandpilot.model import networks

    rng = np.random.default_rng(5)
    rows = _rows(sur.spec, rng, n=200)
    wide = np.zeros((40, sur.spec.n_hosts), dtype=np.int64)
    wide[:, :] = rng.integers(0, 16, size=wide.shape) * (rng.random(wide.shape) < 0.6)
    for masks in (rows[sur.net_rows(rows)], wide[sur.net_rows(wide)]):
        t = to_torch(sur.tokens(masks))
        assert t["pad"].shape[1] >= 2
        mates = networks.HierarchicalNet._domain_mates(sur.net, t["dom"], t["pad"])
        assert torch.equal(sur.net._domain_mates(t["dom"], t["pad"])[~t["pad"]], mates[~t["pad"]])
        with torch.inference_mode():
            got = sur.net(t)
        monkeypatch.setattr(type(sur.net), "_domain_mates", networks.HierarchicalNet._domain_mates)
        with torch.inference_mode():
            assert torch.equal(sur.net(t), got)
        monkeypatch.undo()

    block = networks.EncoderBlock(16, 4, 32).eval()
    x = torch.randn(6, 12, 16, generator=torch.Generator().manual_seed(0))
    pad = torch.zeros(6, 12, dtype=torch.bool)
    pad[:, 9:] = True
    bias = torch.zeros(6, 12).masked_fill(pad, -1e9)

    def out_of_place(x, bias):  # the attention before the in-place scaling
        b, t, d = x.shape
        q, k, v = block.qkv(block.norm1(x)).view(b, t, 3, block.heads, d // block.heads).unbind(2)
        qh, kh, vh = (z.transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(qh @ kh.transpose(-1, -2) * ((d // block.heads) ** -0.5) + bias[:, None, None, :], dim=-1)
        x = x + block.out((att @ vh).transpose(1, 2).reshape(b, t, d))
        return x + block.ff(block.norm2(x))

    with torch.inference_mode():
        assert torch.equal(block(x, bias), out_of_place(x, bias))
    y = block(x.requires_grad_(), bias).sum()  # and it trains: autograd keeps neither product
    y.backward()
    assert torch.isfinite(x.grad).all()
