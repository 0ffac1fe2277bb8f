"""Lifetime pricing and queue protection, as a registered pricing plug-in of the dispatcher.

A placement is priced over its estimated run time: running co-tenants press for as long as they
overlap it, the GPUs that turn over on its hosts go to later cross-host jobs at the recent mix's
rate, and what it presses on its co-tenants counts against it; among near-equal candidates the one
that leaves the next gangs their best placement wins. All on the emulated 4 x 8 H100 fabric."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bandpilot.dispatch import strategies
from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.lifetime import LifetimePredictor, Outlook
from bandpilot.dispatch.state import State
from bandpilot.errors import PlacementError


def mask(spec, counts: dict[int, int], offset: int = 0) -> np.ndarray:
    """``counts[h]`` GPUs on host ``h`` from index ``offset`` up."""
    out = np.zeros(spec.n_hosts, dtype=np.int64)
    for h, c in counts.items():
        out[h] = ((1 << c) - 1) << offset
    return out


def state_with(spec, jobs: list[tuple[str, np.ndarray, float]]) -> State:
    st = State.idle(spec)
    for jid, m, demand in jobs:
        st = st.with_job(jid, spec.from_mask(m), demand)
    return st


def test_the_pricings_are_registered_and_an_unknown_one_is_a_one_line_error(fab):
    assert {"now", "lifetime", "lifetime-queue"} <= set(strategies.pricings())
    with pytest.raises(PlacementError, match="unknown pricing 'soon'"):
        Dispatcher(fab, pricing="soon")


def test_without_an_outlook_lifetime_pricing_is_todays_contention(fab):
    spec = fab.spec
    st = state_with(spec, [("x", mask(spec, {0: 4, 1: 4}), 140.0), ("y", mask(spec, {2: 2}), 200.0)])
    for k in (2, 4, 8, 12):
        a = Dispatcher(fab).select(k, st)
        b = Dispatcher(fab, pricing="lifetime").select(k, st)
        assert a.gpus == b.gpus and a.predicted_gbps == b.predicted_gbps


def test_a_co_tenant_that_ends_soon_presses_less_and_later_cross_host_jobs_press_more(fab):
    spec = fab.spec
    st = state_with(spec, [("x", mask(spec, {0: 4, 1: 4}), 140.0)])
    cand = mask(spec, {0: 2, 1: 2}, offset=4)[None, :]
    now = ContentionPredictor(fab, st).predict(cand).value[0]
    quiet = Outlook(remaining={"x": math.inf})
    life = lambda o: LifetimePredictor(fab, st, o).predict(cand).value[0]  # noqa: E731
    # a candidate that presses nothing on x is priced as now; pressing on x costs x's slowdown
    assert life(quiet.for_run(3600.0, press_factor=0.0)) == pytest.approx(now, rel=1e-6)
    assert life(quiet.for_run(3600.0)) < 0.9 * now
    ending = Outlook(remaining={"x": 360.0})  # gone after a tenth of the candidate's run
    assert life(ending.for_run(3600.0, press_factor=0.0)) > 1.2 * now
    assert life(ending.for_run(3600.0)) > life(quiet.for_run(3600.0))
    # the 2 + 2 GPUs it leaves free on its hosts fill with cross-host jobs at once: more contention
    busy = Outlook(remaining={"x": math.inf}, cross_share=1.0, slice_gpus=2.0, pressure_gbps=140.0)
    assert LifetimePredictor(fab, st, busy.for_run(3600.0)).predict(cand).value[0] < 0.9 * now
    # a host-local candidate meets no NIC contention, now or later
    local = mask(spec, {2: 4})[None, :]
    solo = ContentionPredictor(fab, st).predict(local).value[0]
    assert LifetimePredictor(fab, st, busy.for_run(3600.0)).predict(local).value[0] == pytest.approx(solo)


def test_lifetime_pricing_keeps_a_gang_off_hosts_that_will_fill_with_cross_host_jobs(fab):
    """8 GPUs, no host has 8 free. Hosts 0+1 have 4 free each beside a 2+2 cross-host job that
    ends in 5 minutes and long single-host jobs; hosts 2+3 are quiet now but would keep 3 free
    GPUs each that the queue's cross-host jobs take. Priced now, 2+3 wins (no co-tenant today);
    priced over a 10 h run, 0+1 (4 GPUs turn over there, 6 on 2+3)."""
    spec = fab.spec
    st = state_with(spec, [("x", mask(spec, {0: 2, 1: 2}), 70.0), ("a", mask(spec, {0: 2}, 2), 0.0),
                           ("b", mask(spec, {1: 2}, 2), 0.0), ("c", mask(spec, {2: 1}), 0.0), ("d", mask(spec, {3: 1}), 0.0)])
    out = Outlook(remaining={"x": 300.0}, cross_share=0.8, slice_gpus=2.0, pressure_gbps=140.0)
    now = Dispatcher(fab).select(8, st)
    later = Dispatcher(fab, pricing="lifetime").select(8, State(spec, st.free, st.jobs, outlook=out.for_run(36000.0)))
    hosts = lambda sel: sorted({g.rpartition(":")[0] for g in sel.gpus})  # noqa: E731
    assert hosts(now) == [spec.hosts[2].name, spec.hosts[3].name]
    assert hosts(later) == [spec.hosts[0].name, spec.hosts[1].name]
    # the selection reports what it is predicted to get now (the lifetime price only chose it)
    assert later.predicted_gbps == pytest.approx(Dispatcher(fab).predict(later.gpus, st)["predicted_gbps"])


def test_among_near_equal_hosts_the_choice_leaves_the_next_gang_a_whole_host(fab):
    """A 4-GPU job fits host 0 (4 free, the other 4 held by a job ending in 10 min) or host 3
    (6 free, beside a job that never ends). The tightest fit is host 0, but then the pending 8-GPU
    gang behind it can only start spread over two hosts; on host 3 it gets host 0 whole once the
    short job ends. The lookahead over the gang's start picks host 3."""
    spec = fab.spec
    st = state_with(spec, [("soon", mask(spec, {0: 4}), 0.0), ("b", mask(spec, {1: 8}), 0.0),
                           ("c", mask(spec, {2: 8}), 0.0), ("long", mask(spec, {3: 2}), 0.0)])
    out = Outlook(remaining={"soon": 600.0, "b": 7200.0, "c": 7200.0}, queue=(("me", 4), ("gang", 8)))
    view = State(spec, st.free, st.jobs, outlook=out.for_run(3600.0, "me"))
    host = lambda sel: {g.rpartition(":")[0] for g in sel.gpus}  # noqa: E731
    assert host(Dispatcher(fab, pricing="lifetime-queue").select(4, view)) == {spec.hosts[3].name}
    # without the gang behind it, or without the lookahead, the tightest fit stands
    alone = State(spec, st.free, st.jobs, outlook=Outlook(remaining=out.remaining).for_run(3600.0, "me"))
    assert host(Dispatcher(fab, pricing="lifetime-queue").select(4, alone)) == {spec.hosts[0].name}
    assert host(Dispatcher(fab, pricing="lifetime").select(4, view)) == {spec.hosts[0].name}
