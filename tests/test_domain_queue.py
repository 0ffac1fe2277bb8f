"""Issue 13: the batch queue on a cluster of NVLink domains - whole_domains, segment, single_domain,
bad input naming the request, and the domain fragmentation metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.fragmentation import fragmentation_metrics
from bandpilot.dispatch.state import State
from bandpilot.errors import RequestError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.topology.cluster import load_cluster, popcount, spec_from_dict
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parents[1]
TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]


def nvl(domains: int = 4, trays: int = 4):
    return spec_from_dict({"name": "nvl-q", "gpus_per_host": 4, "network": {"nic_gbps": 400, "rails_per_host": 4},
                           "host_groups": [{"prefix": "t", "count": domains * trays, "gpu": "GB200", "topology": TRAY,
                                            "nvlink_domain_size": trays}]})


@pytest.fixture()
def store(tmp_path):
    s = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    s.init_cluster(nvl())
    return s


def doms(spec, gpus):
    return [spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain for g in gpus]


def test_domain_constraints_through_the_batch(store):
    spec = store.spec
    d = Dispatcher(make_fabric(spec))
    q.submit(store, [
        {"id": "small", "k": 3},
        {"id": "whole", "k": 20, "constraints": {"whole_domains": True}},  # 2 whole domains (16 GPUs each)
        {"id": "seg", "k": 12, "constraints": {"segment": 4}},
        {"id": "one", "k": 8, "constraints": {"single_domain": True}},
    ])
    rep = sched.run_batch(store, d, SchedulerProfile("test"))
    got = {o.request_id: o for o in rep.outcomes}
    assert all(o.status == "assigned" for o in got.values()), [(o.request_id, o.detail) for o in rep.outcomes]
    w = doms(spec, got["whole"].gpus)
    assert len(set(w)) == 2  # 20 GPUs over two wholly free domains of 16
    assert len(set(doms(spec, got["small"].gpus)) & set(w)) == 0  # never a domain someone else uses
    seg = doms(spec, got["seg"].gpus)
    assert all(seg.count(x) % 4 == 0 for x in set(seg))
    assert len(set(doms(spec, got["one"].gpus))) == 1
    # no wholly free domain is left for another whole-domain gang: deferred, not rejected
    q.submit(store, [{"id": "whole2", "k": 16, "constraints": {"whole_domains": True}}])
    o = sched.run_batch(store, d, SchedulerProfile("test")).outcomes[0]
    assert o.status == "deferred" and o.reason == "constraint_unmet"
    assert q.check_invariants(store) == []


@pytest.mark.parametrize("doc, msg", [
    ({"id": "bad-seg", "k": 12, "constraints": {"segment": 5}}, "request 'bad-seg': segment 5 does not divide k=12"),
    ({"id": "big-seg", "k": 32, "constraints": {"segment": 32}}, "request 'big-seg': segment 32 is larger than any domain"),
    ({"id": "too-big", "k": 64, "constraints": {"whole_domains": True, "allowed_hosts": ["t0", "t1", "t2", "t3"]}},
     "request 'too-big': k=64 exceeds|request 'too-big': k=64 but the constraints allow only 16"),
    ({"id": "neg", "k": 4, "constraints": {"segment": 0}}, "request 'neg'.*'segment' must be a positive integer"),
])
def test_bad_domain_requests_name_the_request(store, doc, msg):
    with pytest.raises(RequestError, match=msg):
        q.submit(store, [doc])
    assert q.list_requests(store) == []  # nothing half-written


def test_whole_domains_larger_than_the_cluster_and_segment_without_domains(tmp_path, store):
    with pytest.raises(RequestError, match="request 'w': whole_domains request k=20 is larger than the 1 whole domains"):
        q.submit(store, [{"id": "w", "k": 20, "constraints": {"whole_domains": True,
                                                           "allowed_hosts": ["t0", "t1", "t2", "t3", "t4"]}}])
    plain = q.Store(f"sqlite:///{tmp_path / 'p.db'}")
    plain.init_cluster(load_cluster(ROOT / "params/clusters/h100.yaml"))
    with pytest.raises(RequestError, match="request 's': constraint 'segment' needs NVLink domains"):
        q.submit(plain, [{"id": "s", "k": 8, "constraints": {"segment": 4}}])


def test_fragmentation_metrics():
    spec = nvl()
    free = spec.full_masks.copy()
    free[0] = 0b0011  # domain 0: a partly used tray (2 free), 3 whole trays
    free[4:8] = 0  # domain 1 fully busy
    m = fragmentation_metrics(spec, free)
    assert m["free"] == 2 + 12 + 32
    assert m["stranded_gpus"] == 14 and m["stranded_tray_gpus"] == 2
    assert m["largest_placeable"] == 16 and m["whole_free_domains"] == 2
    assert [x["occupancy"] for x in m["domains"]] == [pytest.approx(2 / 16), 1.0, 0.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=16, max_size=16))
def test_fragmentation_metrics_invariants(masks):
    spec = nvl()
    m = fragmentation_metrics(spec, np.array(masks, dtype=np.int64))
    per = [d["free"] for d in m["domains"]]
    assert sum(per) == m["free"] == int(popcount(np.array(masks)).sum())
    assert 0 <= m["stranded_gpus"] <= m["free"] and m["largest_placeable"] == max(per)
    assert m["stranded_gpus"] + 16 * m["whole_free_domains"] == m["free"]


@pytest.mark.slow
def test_cli_submit_segment_flag_and_bad_segment(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BANDPILOT_HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
           "BANDPILOT_STORE": f"sqlite:///{tmp_path / 'c.db'}"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "bandpilot", *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)

    assert run("cluster", "init", "--cluster", str(ROOT / "params/clusters/nvl72x16.yaml")).returncode == 0
    r = run("queue", "submit", "--id", "x", "--k", "12", "--segment", "5")
    assert r.returncode == 2 and "request 'x': segment 5 does not divide k=12" in r.stderr
    r = run("queue", "submit", "--id", "y", "--k", "144", "--whole-domains")
    assert r.returncode == 0, r.stderr
    r = run("cluster", "topology", "--format", "slurm-block")  # from the store's cluster
    assert r.returncode == 0 and r.stdout.count("BlockName=") == 16
    # the plain slurm format writes blocks only for a Slurm that has topology/block (23.11+)
    from bandpilot.integrations.slurm.commands import installed_version

    found = installed_version()
    r = run("cluster", "topology", "--format", "slurm")
    assert r.returncode == 0
    if found is not None and found.has_block:
        assert r.stdout.count("BlockName=") == 16
    else:
        assert "topology/tree" in r.stdout and "SwitchName=" in r.stdout and "BlockName=" not in r.stdout


@pytest.mark.slow
def test_batch_places_gangs_in_one_domain_on_nvl72x16(tmp_path):
    spec = load_cluster(ROOT / "params/clusters/nvl72x16.yaml")
    s = q.Store(f"sqlite:///{tmp_path / 'n.db'}")
    s.init_cluster(spec)
    rng = np.random.default_rng(1)
    ks = rng.choice([1, 2, 4, 8, 16, 32, 72], size=40)
    q.submit(s, [{"id": f"r{i}", "k": int(k)} for i, k in enumerate(ks)])
    rep = sched.run_batch(s, Dispatcher(make_fabric(spec)), SchedulerProfile("test"))
    assert rep.counts()["assigned"] == 40
    for o in rep.outcomes:
        assert len(set(doms(spec, o.gpus))) == 1
    st_ = q.current_state(s)
    assert isinstance(st_, State) and fragmentation_metrics(spec, st_.free)["free"] == spec.n_gpus - int(ks.sum())


def test_migrations_fill_gaps_in_any_merge_order(tmp_path, monkeypatch):
    """Version numbers are reserved across parallel branches: a store migrated by a branch with a
    higher version still gets a lower one merged in later - once."""
    import sqlalchemy as sa

    from bandpilot.queue import schema as q_schema

    url = f"sqlite:///{tmp_path / 'g.db'}"
    q.Store(url)
    calls = []
    base = list(q_schema.MIGRATIONS)
    a, b = base[-1][0] + 1, base[-1][0] + 2  # two versions reserved by two branches; b merges first
    monkeypatch.setattr(q_schema, "MIGRATIONS", base + [(b, "branch b", lambda c: calls.append(b))])
    q.Store(url)
    monkeypatch.setattr(q_schema, "MIGRATIONS", base + [(a, "branch a", lambda c: calls.append(a)),
                                                       (b, "branch b", lambda c: calls.append(b))])
    s = q.Store(url)
    q.Store(url)
    assert calls == [b, a]
    with s.read() as conn:
        assert sorted(r.version for r in conn.execute(sa.select(q.T_SCHEMA)).all()) == [v for v, _, _ in base] + [a, b]
