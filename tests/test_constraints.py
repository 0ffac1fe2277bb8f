"""One Constraints type: parse once (API body, JSONL, stored JSON, dispatcher), one set of rules,
one filter and one selection check shared by the dispatcher and the placer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.constraints import Constraints, ConstraintRule, constraint_keys, register_constraint
from bandpilot.dispatch.constraints import _RULES
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.state import State
from bandpilot.errors import PlacementError, RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.requests import Request
from bandpilot.topology.cluster import load_cluster
from bandpilot.topology.domains import domain_index

SPEC = load_cluster("params/clusters/h100.yaml")
D = Dispatcher(make_fabric(SPEC))


@pytest.mark.parametrize("doc", [
    {"min_gbps": 0}, {"min_gbps": -1.0}, {"min_gbps": float("nan")}, {"min_gbps": True},
    {"allowed_hosts": []}, {"allowed_hosts": ["a", "a"]}, {"allowed_hosts": [1]},
    {"single_host": "yes"}, {"segment": 0}, {"segment": 2.0}, {"hosts": ["x"]},
])
def test_one_set_of_rules_for_queue_and_dispatcher(doc):
    with pytest.raises(PlacementError) as exc:
        Constraints.parse(doc)
    assert exc.value.reason == exc.value.code == "invalid_request"
    with pytest.raises(RequestError):  # the queue: the same rule, the request named
        Request.from_dict({"id": "r", "k": 1, "constraints": doc})
    state = State.idle(SPEC)
    with pytest.raises(PlacementError, match="constraint|unknown"):  # the dispatcher: the same rule
        D.select(1, state, constraints=doc)


def test_comma_separated_hosts_everywhere_and_stored_form_round_trips():
    hosts = [h.name for h in SPEC.hosts[:2]]
    c = Constraints.parse({"allowed_hosts": ",".join(hosts), "min_gbps": 5})
    assert c.allowed_hosts == tuple(hosts) and c.min_gbps == 5.0
    stored = json.dumps(c.to_dict())  # what the store keeps
    assert Constraints.parse(json.loads(stored)) == c
    sel = D.select(2, State.idle(SPEC), constraints={"allowed_hosts": ",".join(hosts[1:])})
    assert {g.rpartition(":")[0] for g in sel.gpus} == {hosts[1]}


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(list(constraint_keys()) + ["bogus"]),
                           st.one_of(st.none(), st.booleans(), st.integers(-3, 9), st.floats(allow_nan=True),
                                     st.text(max_size=12), st.lists(st.text(max_size=8), max_size=3))))
@pytest.mark.slow
def test_parse_fuzz_one_line_error_or_round_trip(doc):
    try:
        c = Constraints.parse(doc)
    except PlacementError as exc:
        assert exc.reason == "invalid_request" and "\n" not in str(exc)
        return
    assert Constraints.parse(json.loads(json.dumps(c.to_dict()))) == c


def test_filter_and_check_selection_name_what_fails():
    dom = domain_index(SPEC.hosts)[0]
    free = State.idle(SPEC).free.copy()
    free[1:] = 0b1  # one free GPU on every other host
    c = Constraints(single_host=True)
    assert c.filter(SPEC, free, 4, dom).short is None
    assert c.filter(SPEC, free, 12, dom).short == "allowed"
    free[0] = 0b11
    assert c.filter(SPEC, free, 3, dom).short == "single_host"
    elig = c.filter(SPEC, free, 2, dom).eligible
    assert c.check_selection(SPEC, [f"{SPEC.hosts[0].name}:0", f"{SPEC.hosts[0].name}:1"], elig, 2, dom) is None
    two_hosts = [f"{SPEC.hosts[0].name}:0", f"{SPEC.hosts[1].name}:0"]
    assert "several hosts" in c.check_selection(SPEC, two_hosts, elig, 2, dom)
    assert "not free" in c.check_selection(SPEC, [f"{SPEC.hosts[0].name}:5"], elig, 1, dom)
    assert "distinct" in c.check_selection(SPEC, two_hosts[:1] * 2, elig, 2, dom)


def test_allowed_gpus_reach_the_dispatcher():
    gpus = [f"{SPEC.hosts[2].name}:{i}" for i in (1, 3, 5)]
    sel = D.select(3, State.idle(SPEC), constraints={"allowed_gpus": gpus})
    assert sel.gpus == gpus


def test_a_registered_constraint_is_parsed_stored_filtered_and_checked():
    class AvoidHost(ConstraintRule):
        key, help = "avoid_host", "never this host"

        def parse(self, value, where):
            if not isinstance(value, str):
                raise PlacementError("invalid_request", f"{where}: constraint 'avoid_host' must be a host name")
            return value

        def filter(self, value, spec, free, k):
            return np.where(np.arange(spec.n_hosts) == spec.host_index[value], 0, free)

    register_constraint(AvoidHost())
    try:
        h0 = SPEC.hosts[0].name
        c = Constraints.parse({"avoid_host": h0, "single_host": True})
        assert c.to_dict() == {"single_host": True, "avoid_host": h0}
        sel = D.select(8, State.idle(SPEC), constraints=c)
        assert not any(g.startswith(h0 + ":") for g in sel.gpus)
        with pytest.raises(RequestError, match="avoid_host"):
            Request.from_dict({"id": "r", "k": 1, "constraints": {"avoid_host": 3}})
    finally:
        _RULES.pop("avoid_host", None)
