"""The strategy registry: one name -> strategy table read by the dispatcher, the evaluation, the
gate, the simulator and the CLI; a new strategy is one function plus one registration."""

from __future__ import annotations

import pytest

from bandpilot.dispatch import strategies
from bandpilot.dispatch.dispatcher import ALGORITHMS, Dispatcher
from bandpilot.dispatch.state import State
from bandpilot.errors import PlacementError
from bandpilot.evaluation.decision import GATE_ALGORITHMS
from bandpilot.evaluation.params import ALGORITHMS as EVAL_ALGORITHMS, LABELS, ORACLE, PROFILE_BLIND
from bandpilot.fabric.emulator import make_fabric
from bandpilot.simulation.engine import ALGORITHMS as SIM_ALGORITHMS
from bandpilot.topology.cluster import load_cluster

SPEC = load_cluster("params/clusters/het4mix.yaml")
FAB = make_fabric(SPEC)


def test_every_list_of_algorithms_reads_the_registry():
    assert ALGORITHMS == ("bandpilot", "eha", "pts", "topo", "default", "random", "block", "ideal", "exact")
    assert EVAL_ALGORITHMS == ("bandpilot", "eha", "pts", "ideal", "topo", "default", "random")
    assert GATE_ALGORITHMS == ("bandpilot", "ideal", "topo", "default", "random")
    assert SIM_ALGORITHMS == ("bandpilot", "topo", "default", "random", "block")
    assert ORACLE == {"ideal", "exact"} and {"topo", "default", "random"} <= PROFILE_BLIND
    assert LABELS["ideal"] == "Ideal-BP" and LABELS["bandpilot"] == "BandPilot"
    for name in ALGORITHMS:
        s = strategies.get(name)
        assert s.kind in strategies.KINDS and s.help and name in strategies.help_text()


def test_unknown_strategy_is_an_invalid_request():
    with pytest.raises(PlacementError, match="unknown algorithm 'nope'") as exc:
        Dispatcher(FAB).select(2, State.idle(SPEC), "nope")
    assert exc.value.code == "invalid_request"


def fewest_hosts_last(job):
    """Toy baseline: the last free GPUs in host order."""
    ids = job.state.spec.from_mask(job.free)[-job.k:]
    return job.state.spec.to_mask(ids)


def test_a_registered_strategy_is_selectable_and_its_result_checked():
    strategies.register(strategies.Strategy("last", strategies.BASELINE, "the last free GPUs", fewest_hosts_last))
    try:
        assert "last" in strategies.names(strategies.BASELINE) and "last" not in EVAL_ALGORITHMS
        sel = Dispatcher(FAB).select(3, State.idle(SPEC), "last")
        assert sel.gpus == list(SPEC.gpu_ids[-3:]) and sel.algorithm == "last" and sel.predicted_gbps > 0
        with pytest.raises(ValueError, match="already registered"):
            strategies.register(strategies.Strategy("last", strategies.BASELINE, "again", fewest_hosts_last))
        strategies.register(strategies.Strategy("busy", strategies.BASELINE, "hands out a busy GPU",
                                                lambda job: job.state.spec.to_mask(job.state.spec.gpu_ids[:2])))
        st = State.from_dict(SPEC, {"free": list(SPEC.gpu_ids[1:]), "jobs": []})
        with pytest.raises(AssertionError, match="invalid allocation"):  # checked like every strategy
            Dispatcher(FAB).select(2, st, "busy")
    finally:
        strategies._REGISTRY.pop("last", None)
        strategies._REGISTRY.pop("busy", None)


# Selections recorded on main before the registry (ce44e64): the refactor must not move any of them.
RECORDED = [
    ("h100", 4, "bandpilot", None, ["h100-0:2", "h100-0:3", "h100-0:4", "h100-0:5"], 242.696126),
    ("h100", 3, "random", None, ["h100-0:4", "h100-1:7", "h100-2:1"], 39.719342),
    ("het4mix", 6, "topo", None, [f"rtx4090:{i}" for i in range(2, 8)], 3.939233),
    ("het4mix", 6, "bandpilot", None, [f"a800:{i}" for i in range(6)], 74.81377),
    ("het4mix", 3, "bandpilot", {"single_host": True}, ["a800:0", "a800:1", "a800:2"], 99.05628),
    ("het4mix", 5, "eha", None, [f"a800:{i}" for i in range(5)], 77.14073),
    ("het4mix", 5, "pts", None, [f"a800:{i}" for i in range(5)], 77.14073),
    ("het4mix", 4, "default", {"single_host": True}, [f"rtx4090:{i}" for i in range(2, 6)], 7.140053),
    ("nvl72x16", 8, "bandpilot", {"segment": 4}, [f"gb200-{h}:{i}" for h in (1, 2) for i in range(4)], 442.6155),
    ("nvl72x16", 12, "block", None, [f"gb200-{h}:{i}" for h in (1, 2, 3) for i in range(4)], 442.6155),
]


@pytest.mark.parametrize("cluster,k,algorithm,constraints,gpus,gbps", RECORDED)
def test_recorded_selections_are_unchanged(cluster, k, algorithm, constraints, gpus, gbps):
    spec = load_cluster(f"params/clusters/{cluster}.yaml")
    d = Dispatcher(make_fabric(spec), seed=1)
    st = State.from_dict(spec, {"free": list(spec.gpu_ids[2:]),
                                "jobs": [{"id": "j", "gpus": list(spec.gpu_ids[:2]), "demand_gbps": 100.0}]})
    sel = d.select(k, st, algorithm, constraints=constraints)
    assert sel.gpus == gpus and round(sel.predicted_gbps, 6) == gbps


def test_single_domain_holds_for_every_strategy_on_nvlink_domains():
    """Found by the before/after comparison: baselines, EHA and PTS used to spread a single_domain
    request over NVLink domains (an AssertionError in the dispatcher)."""
    spec = load_cluster("params/clusters/nvl72x16.yaml")
    fab = make_fabric(spec)
    d = Dispatcher(fab, seed=2)
    free = [g for i, g in enumerate(spec.gpu_ids) if i % 3]  # every domain partly busy
    st = State.from_dict(spec, {"free": free, "jobs": []})
    doms = {h.name: h.domain for h in spec.hosts}
    for algorithm in ("random", "topo", "default", "block", "eha", "pts", "bandpilot"):
        sel = d.select(8, st, algorithm, constraints={"single_domain": True})
        assert len({doms[g.rpartition(":")[0]] for g in sel.gpus}) == 1, algorithm
