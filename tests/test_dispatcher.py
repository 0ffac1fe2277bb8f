"""Dispatcher API: every algorithm returns k distinct free GPUs, errors, constraints, determinism, CLI."""

from __future__ import annotations

import json
from pathlib import Path
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.topology.cluster import load_cluster
from bandpilot.dispatch.dispatcher import ALGORITHMS, Dispatcher, PlacementError, Selection
from bandpilot.fabric.emulator import make_fabric
from bandpilot.dispatch.state import State

H100 = make_fabric(load_cluster("params/clusters/h100.yaml"))
HET = make_fabric(load_cluster("params/clusters/het4mix.yaml"))


class Noisy:
    """A fabric with deterministic multiplicative noise on cross-host predictions ("model error")."""

    def __init__(self, fabric, sigma=0.05):
        self.fabric, self.spec, self.stage1, self.sigma = fabric, fabric.spec, fabric.stage1, sigma

    def predict_masks(self, masks):
        masks = np.atleast_2d(masks)
        truth = self.fabric.predict_masks(masks)
        z = np.array([np.random.default_rng(zlib.crc32(r.tobytes())).standard_normal() for r in masks])
        cross = (masks != 0).sum(axis=1) >= 2
        return np.where(cross, truth * np.exp(self.sigma * z), truth)


@st.composite
def states(draw, fab):
    """Random valid states: each GPU free, unavailable or in one of a few jobs (some cross-host)."""
    spec = fab.spec
    n_jobs = draw(st.integers(0, 5))
    status = draw(st.lists(st.integers(-2, n_jobs - 1), min_size=spec.n_gpus, max_size=spec.n_gpus))
    free = [g for g, s in zip(spec.gpu_ids, status) if s == -1]
    jobs = []
    for j in range(n_jobs):
        gpus = [g for g, s in zip(spec.gpu_ids, status) if s == j]
        if gpus:
            d = draw(st.floats(0, 300, allow_nan=False))
            jobs.append({"id": f"j{j}", "gpus": gpus, "demand_gbps": d})
    return {"free": free, "jobs": jobs}


def check(sel: Selection, k: int, st_: State):
    assert isinstance(sel, Selection)
    assert len(sel.gpus) == k == len(set(sel.gpus))
    assert set(sel.gpus) <= set(st_.free_gpus)  # never a busy or unavailable GPU
    order = [st_.spec.gpu_ids.index(g) for g in sel.gpus]
    assert order == sorted(order)  # host/index order
    assert sel.predicted_gbps <= sel.standalone_gbps + 1e-9
    assert sel.evaluations >= 1 and sel.search_ms >= 0


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_algorithm_returns_k_distinct_free_gpus(data):
    fab = data.draw(st.sampled_from([H100, HET]))
    doc = data.draw(states(fab))
    st_ = State.from_dict(fab.spec, doc)
    if st_.n_free == 0:
        return
    k = data.draw(st.integers(1, st_.n_free))
    d = Dispatcher(Noisy(fab), seed=data.draw(st.integers(0, 3)))
    for algo in ALGORITHMS:
        sel = d.select(k, doc if algo == "random" else st_, algo, fabric=fab)
        check(sel, k, st_)
        assert sel.algorithm == algo


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_ideal_is_never_below_other_algorithms_in_truth(data):
    doc = data.draw(states(HET))
    st_ = State.from_dict(HET.spec, doc)
    if st_.n_free == 0:
        return
    k = data.draw(st.integers(1, st_.n_free))
    d = Dispatcher(HET)
    best = d.select(k, st_, "exact", fabric=HET).predicted_gbps
    assert d.select(k, st_, "ideal", fabric=HET).predicted_gbps == pytest.approx(best, rel=1e-9, abs=1e-12)
    for algo in ("eha", "pts", "topo", "default", "random"):
        assert d.select(k, st_, algo).predicted_gbps <= best * (1 + 1e-9) + 1e-12


def test_selection_to_dict_and_fields():
    st_ = State.idle(H100.spec)
    sel = Dispatcher(H100).select(10, st_)
    d = sel.to_dict()
    json.dumps(d)
    assert d["algorithm"] == "bandpilot" and d["k"] == 10 and len(d["gpus"]) == 10
    assert sorted(d["hosts"]) == sorted({g.split(":")[0] for g in sel.gpus})
    assert {"predicted_gbps", "standalone_gbps", "search_ms", "evaluations"} <= set(d)
    # paper Fig. 1: 10 GPUs on an idle H100 cluster -> balanced 5 + 5, not compact 8 + 2
    assert sorted(len([g for g in sel.gpus if g.startswith(h + ":")]) for h in sel.hosts) == [5, 5]
    topo = Dispatcher(H100).select(10, st_, "topo")
    assert sorted(len([g for g in topo.gpus if g.startswith(h + ":")]) for h in topo.hosts) == [2, 8]
    assert sel.predicted_gbps > 1.5 * topo.predicted_gbps


@pytest.mark.parametrize(
    "k, state, algo, reason",
    [
        (0, None, "bandpilot", "invalid_request"),
        (-3, None, "eha", "invalid_request"),
        (True, None, "bandpilot", "invalid_request"),
        ("4", None, "bandpilot", "invalid_request"),
        (2.0, None, "bandpilot", "invalid_request"),
        (33, None, "bandpilot", "insufficient_gpus"),
        (4, None, "nope", "invalid_request"),
        (4, {"free": ["h100-0:9"]}, "bandpilot", "invalid_request"),
        (4, {"free": ["h100-0:1"], "jobs": [{"id": "a", "gpus": ["h100-0:1"]}]}, "bandpilot", "invalid_request"),
        (4, {"free": [], "jobs": [], "extra": 1}, "bandpilot", "invalid_request"),
        (4, [1, 2], "bandpilot", "invalid_request"),
        (4, {"free": ["h100-0:0", "h100-0:1"]}, "topo", "insufficient_gpus"),
    ],
)
def test_bad_input(k, state, algo, reason):
    st_ = State.idle(H100.spec) if state is None else state
    with pytest.raises(PlacementError) as exc:
        Dispatcher(H100).select(k, st_, algo)
    assert exc.value.reason == reason
    assert "\n" not in str(exc.value) and str(exc.value)


def test_oracles_need_a_fabric():
    d = Dispatcher(Noisy(H100))
    with pytest.raises(PlacementError) as exc:
        d.select(4, State.idle(H100.spec), "exact")
    assert exc.value.reason == "invalid_request" and "fabric" in str(exc.value)
    with pytest.raises(PlacementError):
        d.select(4, State.idle(H100.spec), "ideal", fabric=HET)  # other cluster
    with pytest.raises(PlacementError):
        d.select(4, State.idle(HET.spec), "bandpilot")  # state of another cluster


def test_constraints():
    st_ = State.idle(H100.spec)
    d = Dispatcher(H100)
    for algo in ALGORITHMS:
        sel = d.select(6, st_, algo, fabric=H100, constraints={"allowed_hosts": ["h100-1", "h100-3"]})
        assert {g.split(":")[0] for g in sel.gpus} <= {"h100-1", "h100-3"}
        sel = d.select(5, st_, algo, fabric=H100, constraints={"single_host": True})
        assert len(sel.hosts) == 1
    # only host h100-2 fits 6 after others are busy
    busy = [f"h100-{h}:{i}" for h in (0, 1, 3) for i in range(4)]
    doc = {"free": [g for g in H100.spec.gpu_ids if g not in busy]}
    for algo in ALGORITHMS:
        sel = d.select(6, doc, algo, fabric=H100, constraints={"single_host": True})
        assert sel.hosts == ["h100-2"]

    def reason(k, cons, state=st_):
        with pytest.raises(PlacementError) as exc:
            d.select(k, state, "bandpilot", constraints=cons)
        return exc.value.reason

    assert reason(9, {"single_host": True}) == "constraint_unmet"
    assert reason(17, {"allowed_hosts": ["h100-0", "h100-1"]}) == "constraint_unmet"
    assert reason(4, {"min_gbps": 1e6}) == "constraint_unmet"
    assert reason(4, {"allowed_hosts": ["nope"]}) == "invalid_request"
    assert reason(4, {"gpu_type": "H100"}) == "invalid_request"
    assert reason(4, {"single_host": "yes"}) == "invalid_request"
    assert reason(4, {"min_gbps": -1}) == "invalid_request"
    assert reason(33, {"single_host": True}) == "insufficient_gpus"
    assert d.select(4, st_, constraints={"min_gbps": 100.0}).predicted_gbps >= 100.0


def test_determinism_per_seed():
    doc = {"free": [g for g in HET.spec.gpu_ids if not g.endswith(":3")],
           "jobs": [{"id": "x", "gpus": ["v100:3", "a800:3"], "demand_gbps": 5.0}]}
    for algo in ALGORITHMS:
        a = Dispatcher(HET, seed=5).select(9, doc, algo, fabric=HET)
        b = Dispatcher(HET, seed=5).select(9, doc, algo, fabric=HET)
        assert a.gpus == b.gpus and a.predicted_gbps == b.predicted_gbps and a.evaluations == b.evaluations
    picks = {tuple(Dispatcher(HET, seed=s).select(9, doc, "random").gpus) for s in range(8)}
    assert len(picks) > 1  # the seed matters for Random


def test_model_error_still_valid_and_close():
    rng = np.random.default_rng(0)
    noisy = Dispatcher(Noisy(HET, 0.05))
    ideal = Dispatcher(HET)
    from bandpilot.dispatch.contention import ContentionPredictor

    ratios = []
    for _ in range(10):
        free = [g for g in HET.spec.gpu_ids if rng.random() < 0.6]
        st_ = State.from_dict(HET.spec, {"free": free})
        for k in range(2, len(free) + 1, 3):
            sel = noisy.select(k, st_)
            truth = ContentionPredictor(HET, st_).predict(sel.mask[None, :]).value[0]
            best = ideal.select(k, st_, "exact").predicted_gbps
            ratios.append(truth / best)
    assert np.mean(ratios) > 0.95


def test_load_uses_surrogate(monkeypatch):
    import sys
    import types

    fake = types.ModuleType("bandpilot.model.surrogate")

    class Surrogate:
        @staticmethod
        def load(uri, located=None):
            assert uri == "models:/bp@prod" and located == found  # what the registry lookup found, not looked up twice
            return H100

    from bandpilot.model import local_registry

    found = (Path("/models/bp/3"), "bp", "3")
    monkeypatch.setattr(local_registry, "lookup", lambda uri: found if uri == "models:/bp@prod" else None)
    fake.Surrogate = Surrogate
    monkeypatch.setitem(sys.modules, "bandpilot.model.surrogate", fake)
    d = Dispatcher.load("models:/bp@prod", seed=3)
    assert d.model is H100 and d.seed == 3


def test_cli_select(tmp_path, capsys):
    from bandpilot.cli.main import main

    busy = ["h100-0:0", "h100-0:1", "h100-1:7"]
    doc = {"free": [g for g in H100.spec.gpu_ids if g not in busy],
           "jobs": [{"id": "j1", "gpus": busy, "demand_gbps": 40.0}]}
    p = tmp_path / "state.json"
    p.write_text(json.dumps(doc))
    assert main(["select", "10", "--cluster", "params/clusters/h100.yaml", "--state", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["gpus"]) == 10 and not set(out["gpus"]) & set(busy)
    assert main(["select", "4", "--cluster", "params/clusters/h100.yaml", "--state", str(p), "-a", "topo"]) == 0
    assert "topo" in capsys.readouterr().out
    assert main(["select", "40", "--cluster", "params/clusters/h100.yaml", "--state", str(p)]) == 2
    assert "error:" in capsys.readouterr().err
