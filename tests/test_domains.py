"""Issue 13: multi-node NVLink domains in the spec, the Slurm topology/block export and its CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.errors import SpecError
from bandpilot.topology.cluster import load_cluster, spec_from_dict
from bandpilot.topology.domains import hostlist, slurm_topology

ROOT = Path(__file__).resolve().parents[1]
NVL = ROOT / "params" / "clusters" / "nvl72x16.yaml"
TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]
PAIR = ["X NV4", "NV4 X"]


def tray(name, gpu="GB200", topo=TRAY, **kw):
    return {"name": name, "gpu": gpu, "topology": topo, **kw}


def test_nvl72x16_spec_shape():
    spec = load_cluster(NVL)
    assert (spec.n_gpus, spec.n_hosts, len(spec.nvlink_domains)) == (1152, 288, 16)
    doms = [h.domain for h in spec.hosts]
    assert all(doms.count(d) == 18 for d in spec.nvlink_domains)
    assert doms[0] == doms[17] == "gb200-nvl0" and doms[18] == "gb200-nvl1"
    assert spec.rails_per_host == 4 and set(spec.gpus_per_host.tolist()) == {4}
    # the embedded form (model artifacts, the queue store) round-trips with the same fingerprint
    again = spec_from_dict(spec.to_dict())
    assert again.nvlink_domains == spec.nvlink_domains and again.fingerprint() == spec.fingerprint()


def test_existing_specs_have_no_nvlink_domains_and_stable_fingerprints():
    # fingerprints pinned from before NVLink domains existed: stored models and queues stay valid
    pinned = {"h100": "966b0f582358f928", "h100-64": "0ac57bc0e47498e2", "h100-128": "0f25d310d76f8b14",
              "het4mix": "8dcf4764b6531ca0"}
    for name, fp in pinned.items():
        spec = load_cluster(ROOT / "params" / "clusters" / f"{name}.yaml")
        assert spec.nvlink_domains == () and spec.fingerprint() == fp
        assert "nvlink_domains" not in spec.to_dict()


def test_explicit_nvlink_domains():
    doc = {"name": "x", "hosts": [tray("a"), tray("b"), tray("c", domain="r1"), tray("d", domain="r1")],
           "nvlink_domains": [{"name": "n0", "hosts": ["a", "b"]}, "r1"]}
    spec = spec_from_dict(doc)
    assert spec.nvlink_domains == ("n0", "r1")
    assert [h.domain for h in spec.hosts] == ["n0", "n0", "r1", "r1"]


def _spec_file(tmp_path, doc) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _line_of(p: Path, needle: str) -> int:
    return next(i for i, line in enumerate(p.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize("case, hosts, domains, msg, at", [
    ("mixed gpu", [tray("a"), tray("b", gpu="H100")], [{"name": "n0", "hosts": ["a", "b"]}],
     r"nvlink_domains\[0\]: NVLink domain 'n0' mixes GPU types \['GB200', 'H100'\]", "name: n0"),
    ("mixed size", [tray("a"), tray("b", topo=PAIR)], [{"name": "n0", "hosts": ["a", "b"]}],
     r"NVLink domain 'n0' mixes tray sizes \[2, 4\] GPUs", "name: n0"),
    ("two domains", [tray("a"), tray("b")], [{"name": "n0", "hosts": ["a", "b"]}, {"name": "n1", "hosts": ["b"]}],
     r"nvlink_domains\[1\]\.hosts\[0\]: tray 'b' is in two NVLink domains: 'n0' .* and 'n1'", "name: n1"),
    ("unknown tray", [tray("a")], [{"name": "n0", "hosts": ["zz"]}], r"unknown tray 'zz'", "name: n0"),
    ("label conflict", [tray("a", domain="r9")], [{"name": "n0", "hosts": ["a"]}],
     r"tray 'a' is labelled domain 'r9' but listed in NVLink domain 'n0'", "name: n0"),
    ("no such label", [tray("a")], ["ghost"], r"no host has domain 'ghost'", "ghost"),
])
def test_bad_nvlink_domains_name_file_line_and_key(tmp_path, case, hosts, domains, msg, at):
    p = _spec_file(tmp_path, {"name": "bad", "hosts": hosts, "nvlink_domains": domains})
    with pytest.raises(SpecError, match=msg) as e:
        load_cluster(p)
    # the error names the file and a line at or after the offending entry
    m = re.match(rf"{re.escape(str(p))}:(\d+): nvlink_domains", str(e.value))
    assert m, str(e.value)
    assert int(m.group(1)) >= _line_of(p, at) - 1


def test_bad_nvlink_domain_size(tmp_path):
    doc = {"name": "bad", "host_groups": [{"prefix": "t", "count": 4, "gpu": "GB200", "topology": TRAY,
                                          "nvlink_domain_size": 0}]}
    with pytest.raises(SpecError, match=r"c\.yaml:\d+: host_groups\[0\]\.nvlink_domain_size: must be a positive integer"):
        load_cluster(_spec_file(tmp_path, doc))
    doc["host_groups"][0].update(nvlink_domain_size=2, domain_size=2)
    with pytest.raises(SpecError, match="not both"):
        load_cluster(_spec_file(tmp_path, doc))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=3), st.integers(), st.none(),
                          st.fixed_dictionaries({"name": st.sampled_from(["n0", "n1", "", 3])},
                                                optional={"hosts": st.lists(st.sampled_from(["a", "b", "c", 1]), max_size=4),
                                                          "extra": st.just(1)})),
                max_size=4))
def test_nvlink_domains_fuzz_only_raises_spec_error(entries):
    doc = {"name": "f", "hosts": [tray("a"), tray("b", gpu="H100"), tray("c", domain="n1")], "nvlink_domains": entries}
    try:
        spec = spec_from_dict(doc)
    except SpecError:
        return
    for d in spec.nvlink_domains:  # whatever was accepted is consistent
        assert len({h.gpu for h in spec.hosts if h.domain == d}) == 1


# ---- Slurm export -------------------------------------------------------------------------------
def _expand(expr: str) -> list[str]:
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", expr):
        m = re.fullmatch(r"(.*)\[(.*)\]", part)
        if not m:
            out.append(part)
            continue
        for run in m.group(2).split(","):
            lo, _, hi = run.partition("-")
            w = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            out.extend(f"{m.group(1)}{i:0{w}d}" for i in range(int(lo), int(hi or lo) + 1))
    return out


@given(st.lists(st.one_of(st.integers(0, 40).map(lambda i: f"gb-{i}"), st.integers(0, 30).map(lambda i: f"n{i:03d}"),
                          st.sampled_from(["login", "x-a"])), min_size=1, max_size=30, unique=True))
def test_hostlist_round_trips(names):
    assert sorted(_expand(hostlist(names))) == sorted(names)


def test_slurm_topology_conf_for_nvl72x16():
    text = slurm_topology(load_cluster(NVL))
    blocks = [line for line in text.splitlines() if line.startswith("BlockName=")]
    assert len(blocks) == 16
    assert blocks[0] == "BlockName=gb200-nvl0 Nodes=gb200-[0-17]"
    assert blocks[15] == "BlockName=gb200-nvl15 Nodes=gb200-[270-287]"
    assert text.splitlines()[-1] == "BlockSizes=18"
    nodes = [n for b in blocks for n in _expand(b.split("Nodes=")[1])]
    assert sorted(nodes) == sorted(load_cluster(NVL).host_names)  # every tray in exactly one block


def test_slurm_topology_rack_domains_and_errors():
    text = slurm_topology(load_cluster(ROOT / "params" / "clusters" / "h100-64.yaml"))
    assert "BlockName=h100-d0 Nodes=h100-[0-15]" in text and "BlockSizes=16" in text
    with pytest.raises(SpecError, match="declares no domains"):
        slurm_topology(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))


def _cli(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BANDPILOT_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bandpilot", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_cluster_topology_slurm(tmp_path):
    out = tmp_path / "topology.conf"
    r = _cli(["cluster", "topology", "--cluster", str(NVL), "--format", "slurm-block", "--output", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == slurm_topology(load_cluster(NVL))
    # the plain slurm format: blocks only for a Slurm that has topology/block (23.11+), else a switch tree
    from bandpilot.integrations.slurm.commands import installed_version
    from bandpilot.topology.domains import slurm_tree

    found = installed_version()
    r = _cli(["cluster", "topology", "--cluster", str(NVL), "--format", "slurm", "--output", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    want = slurm_topology if found is not None and found.has_block else slurm_tree
    assert out.read_text() == want(load_cluster(NVL))
    r = _cli(["cluster", "topology", "--cluster", str(ROOT / "params/clusters/h100.yaml"), "--format", "slurm",
              "--output", str(tmp_path / "none.conf")], tmp_path)
    # no domains: Slurm's topology/tree (one switch) instead of a refusal (issue 26)
    assert r.returncode == 0, r.stderr
    assert "SwitchName=h100 Nodes=h100-[0-3]" in (tmp_path / "none.conf").read_text()
    r = _cli(["cluster", "topology", "--cluster", str(NVL), "--format", "yaml"], tmp_path)
    assert r.returncode == 2 and "unknown --format 'yaml'" in r.stderr


# ---- emulator ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nvl():
    from bandpilot.fabric.emulator import make_fabric

    return make_fabric(load_cluster(NVL))


def _alloc(spec, parts):
    import numpy as np

    m = np.zeros(spec.n_hosts, dtype=np.int64)
    for h, c in parts:
        m[h] = (1 << c) - 1
    return m


def test_emulator_cliff_at_the_domain_boundary(nvl):
    import numpy as np

    s = nvl.spec
    rows = np.array([
        _alloc(s, [(0, 4), (1, 4)]),  # two trays, one domain: NVLink switches
        _alloc(s, [(0, 4), (18, 4)]),  # two trays, two domains: NIC rails
        _alloc(s, [(i, 4) for i in range(18)]),  # a whole domain
        _alloc(s, [(i, 4) for i in range(9)] + [(18 + i, 4) for i in range(9)]),  # 72 over two domains
        _alloc(s, [(0, 1), (1, 1)]),
        _alloc(s, [(0, 1), (18, 1)]),
    ])
    b = nvl.bandwidth_masks(rows)
    assert b[0] > 2.5 * b[1] and b[2] > 2.5 * b[3] and b[4] > 8 * b[5]
    assert b[0] == pytest.approx(b[2], rel=0.05)  # non-blocking switches: trays barely matter
    # the in-domain value depends only on per-tray counts: any 2 trays of any domain are alike
    same = np.array([_alloc(s, [(3, 4), (17, 4)]), _alloc(s, [(200, 4), (201, 4)])])
    assert np.allclose(nvl.bandwidth_masks(same), b[0])
    assert (nvl.cap_masks(rows) >= b).all()


def test_emulator_faults_follow_the_nvlink_domain(nvl):
    import numpy as np

    from bandpilot.fabric.faults import Fault, FaultyFabric

    s = nvl.spec
    rows = np.array([_alloc(s, [(0, 1), (1, 1)]), _alloc(s, [(0, 1), (18, 1)]), _alloc(s, [(2, 1), (3, 1)])])
    base = nvl.bandwidth_masks(rows)
    rail = FaultyFabric(nvl, [Fault("nic_rail", "gb200-0", 0, factor=0.5)]).bandwidth_masks(rows)
    assert rail[0] == pytest.approx(base[0])  # in-domain traffic never touches the NIC
    assert rail[1] == pytest.approx(0.5 * base[1]) and rail[2] == pytest.approx(base[2])
    narrow = FaultyFabric(nvl, [Fault("nvlink_width", "gb200-0", 0, factor=0.5)]).bandwidth_masks(rows)
    assert narrow[0] == pytest.approx(0.5 * base[0])  # a lone GPU's NVLink carries cross-tray traffic
    assert narrow[1] == pytest.approx(base[1]) and narrow[2] == pytest.approx(base[2])
    # measurement noise still wraps the faulty truth
    m = FaultyFabric(nvl, [Fault("slow_host", "gb200-0")]).measure(rows, seed=1)
    assert np.all(m > 0) and not np.allclose(m, base)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 287), st.integers(1, 15)), min_size=1, max_size=12, unique_by=lambda t: t[0]),
       st.integers(0, 17))
def test_emulator_is_hierarchical_over_trays(nvl, parts, shift):
    """Rotating trays inside their domains keeps per-tray masks and per-domain counts: same bandwidth."""
    import numpy as np

    s = nvl.spec
    m = np.zeros(s.n_hosts, dtype=np.int64)
    r = np.zeros(s.n_hosts, dtype=np.int64)
    for h, bits in parts:
        m[h] = bits
        r[(h // 18) * 18 + (h % 18 + shift) % 18] = bits
    b = nvl.bandwidth_masks(np.array([m, r]))
    assert b[0] == pytest.approx(b[1]) and b[0] <= nvl.cap_masks(m[None, :])[0] + 1e-9


# ---- profiling plan -----------------------------------------------------------------------------
@pytest.mark.slow
def test_domain_plan_three_stages():
    import numpy as np

    from bandpilot.data.domain_planning import partitions, plan_domains

    spec = load_cluster(NVL)
    p = plan_domains(spec, domain_samples=120, cross_domain_samples=60, seed=3)
    unit = spec.units[0]
    strata = [m.stratum for m in p]
    assert sum(s.startswith("1h:") for s in strata) == 288 * 15  # every subset of every tray
    in_dom = [m for m in p if m.stratum.startswith("1d:")]
    assert 100 <= len(in_dom) <= 120
    for m in in_dom:  # one domain, >= 2 trays, the stratum is the per-tray count pattern
        used = np.flatnonzero(np.array(m.masks))
        assert len(set(unit[used].tolist())) == 1 and used.size >= 2
        assert m.stratum == "1d:" + "+".join(map(str, sorted(m.counts, reverse=True)))
    assert len({tuple(sorted(m.counts)) for m in in_dom}) == len(in_dom)  # each pattern once: shared by domains
    assert len({int(unit[np.flatnonzero(np.array(m.masks))[0]]) for m in in_dom}) == 16  # rotating over domains
    cross = [m for m in p if m.stratum[0].isdigit() and "d:" in m.stratum and not m.stratum.startswith("1d")]
    assert len(cross) >= 55 and all(len(set(unit[np.flatnonzero(np.array(m.masks))].tolist())) >= 2 for m in cross)
    assert len({m.masks for m in p}) == len(p)  # no allocation twice
    assert plan_domains(spec, domain_samples=120, cross_domain_samples=60, seed=3) == p  # deterministic
    assert len(partitions(8, 18, 4)) == 15  # partitions of 8 into 2..18 parts of <= 4
    small = spec_from_dict({"name": "s", "gpus_per_host": 4, "host_groups": [
        {"prefix": "t", "count": 4, "gpu": "GB200", "topology": TRAY, "nvlink_domain_size": 2}]})
    pats = [m.stratum for m in plan_domains(small, cross_domain_samples=0) if m.stratum.startswith("1d")]
    assert sorted(pats) == sorted("1d:" + "+".join(map(str, q)) for t in range(2, 9) for q in partitions(t, 2, 4))
    with pytest.raises(SpecError, match="no NVLink domains"):
        plan_domains(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))


@pytest.mark.slow
def test_cli_select_with_domain_constraints(tmp_path):
    import json

    from bandpilot.dispatch.state import State

    spec = load_cluster(NVL)
    st = tmp_path / "state.json"
    st.write_text(json.dumps(State.idle(spec).to_dict()))
    r = _cli(["select", "96", "-s", str(st), "-c", str(NVL), "--segment", "24", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    per = {}
    for g in gpus:
        d = spec.hosts[spec.host_index[g.rpartition(":")[0]]].domain
        per[d] = per.get(d, 0) + 1
    assert len(gpus) == 96 and all(v % 24 == 0 for v in per.values())
    r = _cli(["select", "96", "-s", str(st), "-c", str(NVL), "--segment", "7"], tmp_path)
    assert r.returncode == 2 and "segment 7 does not divide k=96" in r.stderr
