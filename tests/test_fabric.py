"""Fabrics (emulator + trace oracle) and calibration of the emulator against measured tables.

Property tests run on the committed emulated specs; the trace round-trip and the calibration
targets use the real tables in ../shared/data and skip where that folder is absent.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.topology.cluster import load_cluster, popcount, spec_from_dict
from bandpilot.fabric.tables import intra_lookup, read_inter_table, read_intra_table
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric, make_fabric
from bandpilot.fabric.trace import TraceFabric

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params" / "clusters"
DATA = Path(__file__).parents[1].parent / "shared" / "data"
MEAS = DATA / "measurements"
needs_data = pytest.mark.skipif(not MEAS.is_dir(), reason="../shared/data is not present")

FABRICS = {name: make_fabric(load_cluster(PARAMS / f"{name}.yaml")) for name in ("h100", "het4mix")}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _allocation(fab) -> st.SearchStrategy:
    return st.lists(st.sampled_from(fab.spec.gpu_ids), unique=True, max_size=min(40, fab.spec.n_gpus))


allocations = st.sampled_from(sorted(FABRICS)).flatmap(lambda n: st.tuples(st.just(n), _allocation(FABRICS[n])))


# ------------------------------------------------------------------------------------------
# Properties of every fabric
@SETTINGS
@given(allocations, st.randoms(use_true_random=False))
def test_bandwidth_properties(case, rnd):
    name, gpus = case
    fab = FABRICS[name]
    b = fab.bandwidth([gpus])[0]
    if len(gpus) <= 1:
        assert b == 0.0
    else:
        assert np.isfinite(b) and b > 0
    shuffled = list(gpus)
    rnd.shuffle(shuffled)
    assert fab.bandwidth([shuffled])[0] == b  # GPU-id order does not matter
    masks = fab.spec.to_masks([gpus])
    assert b <= fab.cap_masks(masks)[0] * (1 + 1e-9)  # never above the physical caps


@SETTINGS
@given(st.sampled_from(sorted(FABRICS)).flatmap(lambda n: st.tuples(st.just(n), st.lists(_allocation(FABRICS[n]), min_size=1, max_size=12))))
def test_vectorised_equals_row_by_row(case):
    name, allocs = case
    fab = FABRICS[name]
    whole = fab.bandwidth(allocs)
    rows = np.array([fab.bandwidth([a])[0] for a in allocs])
    np.testing.assert_array_equal(whole, rows)
    np.testing.assert_array_equal(fab.predict_masks(fab.spec.to_masks(allocs)), whole)


@SETTINGS
@given(allocations)
def test_cross_host_is_min_of_network_and_stage1(case):
    """The hierarchy the dispatcher relies on: B = min(network(counts), stage-1 of hosts with >= 2 GPUs)."""
    name, gpus = case
    fab = FABRICS[name]
    masks = fab.spec.to_masks([gpus])
    counts = popcount(masks)
    if (counts > 0).sum() < 2:
        return
    intra = [fab.stage1[h, masks[0, h]] for h in range(fab.spec.n_hosts) if counts[0, h] >= 2]
    expect = min([float(fab.network(counts)[0]), *intra])
    assert fab.bandwidth_masks(masks)[0] == pytest.approx(expect, rel=1e-12)


def test_measure_is_seeded_and_noise_free_at_zero():
    spec = load_cluster(PARAMS / "het4mix.yaml")
    rng = np.random.default_rng(3)
    masks = rng.integers(0, 256, size=(50, spec.n_hosts))
    noisy = EmulatorFabric(spec)
    a, b = noisy.measure(masks, seed=5), noisy.measure(masks, seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, noisy.measure(masks, seed=6))
    assert not np.array_equal(a, noisy.measure(masks, seed=5, repeat=1))
    truth = noisy.bandwidth_masks(masks)
    live = truth > 0
    assert np.all(np.abs(np.log(a[live] / truth[live])) < 0.2)  # 2 % log-normal noise
    np.testing.assert_array_equal(EmulatorFabric(spec, noise=0).measure(masks, seed=5), truth)
    np.testing.assert_array_equal(EmulatorFabric(spec, seed=1).measure(masks), EmulatorFabric(spec, seed=1).measure(masks))


def test_emulated_stage1_shape_and_physics():
    h100 = FABRICS["h100"].stage1[0]
    assert h100[0b11] == pytest.approx(205, rel=0.05)  # 2 GPUs
    assert h100[0b1111] == pytest.approx(243, rel=0.05)  # 4 GPUs
    assert h100[0xFF] == pytest.approx(235, rel=0.05)  # 8 GPUs
    het = FABRICS["het4mix"]
    names = [h.gpu for h in het.spec.hosts]
    t4090 = het.stage1[names.index("RTX4090")]
    assert t4090[0b10001] > t4090[0b11]  # anti-locality: a SYS pair beats a PXB pair (no P2P)
    v100 = het.stage1[names.index("V100")]
    assert v100[0b101] > v100[0b11] > v100[0b10001]  # NV2 > NV1 > SYS
    a6000 = het.stage1[names.index("A6000")]
    assert a6000[0b11] > a6000[0b101] > a6000[0b10001]  # NV4 > PXB > SYS


def test_domains_penalise_cross_rack():
    fab = make_fabric(load_cluster(PARAMS / "h100-64.yaml"))
    assert len({h.domain for h in fab.spec.hosts}) == 4
    same = np.zeros((1, 64), dtype=np.int64)
    same[0, [0, 1, 2]] = 0xFF  # three hosts of rack 0
    cross = np.zeros((1, 64), dtype=np.int64)
    cross[0, [0, 1, 16]] = 0xFF  # rack 0 and rack 1
    assert fab.bandwidth_masks(cross)[0] < fab.bandwidth_masks(same)[0]


@pytest.mark.parametrize("name, hosts", [("h100-64", 64), ("h100-128", 128)])
def test_large_specs_evaluate_fast(name, hosts):
    t0 = time.perf_counter()
    spec = load_cluster(PARAMS / f"{name}.yaml")
    fab = make_fabric(spec)
    assert spec.n_hosts == hosts and spec.n_gpus == 8 * hosts
    rng = np.random.default_rng(0)
    masks = rng.integers(0, 256, size=(10_000, hosts))
    masks[rng.random(masks.shape) < 1 - 4 / hosts] = 0  # ~4 hosts per allocation
    out = fab.bandwidth_masks(masks)
    elapsed = time.perf_counter() - t0
    assert out.shape == (10_000,) and np.all(np.isfinite(out)) and np.all(out >= 0)
    assert elapsed < 10.0, f"{name}: 10k allocations took {elapsed:.1f}s"


def test_large_host_is_sampled_not_enumerated():
    """Hosts above 8 GPUs use a few sampled rings per subset; still every subset gets a value."""
    n = 10
    rows = [" ".join("X" if i == j else ("NV4" if i // 5 == j // 5 else "SYS") for j in range(n)) for i in range(n)]
    spec = spec_from_dict({"name": "ten", "hosts": [{"name": "a", "gpu": "X1", "topology": rows},
                                                     {"name": "b", "gpu": "X1", "topology": rows}]})
    fab = make_fabric(spec)
    t = fab.stage1[0, : 1 << n]
    pc = np.bitwise_count(np.arange(1 << n))
    assert np.all(t[pc >= 2] > 0) and np.all(t[pc <= 1] == 0)


def test_bad_emulator_params_are_spec_errors():
    doc = yaml.safe_load((PARAMS / "h100.yaml").read_text())
    doc["emulator"]["gpus"]["H100"]["bogus"] = 1
    with pytest.raises(SpecError, match="bogus"):
        EmulatorFabric(spec_from_dict(doc, PARAMS))
    doc = yaml.safe_load((PARAMS / "h100.yaml").read_text())
    doc["emulator"]["network"]["warp_factor"] = 9
    with pytest.raises(SpecError, match="warp_factor"):
        EmulatorFabric(spec_from_dict(doc, PARAMS))


# ------------------------------------------------------------------------------------------
# Trace oracle
def _pattern(counts) -> tuple[int, ...]:
    return tuple(sorted((int(c) for c in counts if c), reverse=True))


@needs_data
@pytest.mark.parametrize("cluster", ["h100-16m", "het4mix-16m"])
def test_trace_returns_every_measured_value(cluster):
    spec = load_cluster(MEAS / cluster)
    fab = make_fabric(spec)
    assert isinstance(fab, TraceFabric)
    n = int(spec.gpus_per_host.max())
    intra = [intra_lookup(read_intra_table(h.intra, n), n, "") for h in spec.hosts]
    # every intra row comes back (mean of repeats) as a single-host allocation
    for h, table in enumerate(intra):
        masks = np.zeros((1 << n, spec.n_hosts), dtype=np.int64)
        masks[:, h] = np.arange(1 << n)
        np.testing.assert_allclose(fab.bandwidth_masks(masks), table, rtol=1e-12)
    # every cross-host row: min(scale * mean of its pattern, intra of hosts with >= 2 GPUs)
    rows = [r for r in read_inter_table(spec.inter.table, spec.n_hosts, n) if sum(1 for m in r.masks if m) >= 2]
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[_pattern(popcount(np.array(r.masks)))].append(r.busbw)
    masks = np.array([r.masks for r in rows], dtype=np.int64)
    expect = []
    for r in rows:
        v = spec.inter.scale * float(np.mean(groups[_pattern(popcount(np.array(r.masks)))]))
        for h, m in enumerate(r.masks):
            if bin(m).count("1") >= 2:
                v = min(v, float(intra[h][m]))
        expect.append(v)
    np.testing.assert_allclose(fab.bandwidth_masks(masks), expect, rtol=1e-12)
    if cluster == "het4mix-16m":
        assert spec.inter.scale == 0.25


def _write_trace(tmp: Path, inter_rows: list[tuple[list[list[int]], float]]) -> Path:
    topo = ["X NV2", "NV2 X"]
    doc = {"name": "tiny", "collective": "all_reduce_perf", "gpus_per_host": 2,
           "hosts": [{"name": f"n{i}", "gpu": "H100", "topology": topo, "intra": f"intra/n{i}.csv"} for i in range(3)],
           "inter": {"table": "inter.csv", "scale": 1.0, "combine": "min_intra"}}
    (tmp / "intra").mkdir(parents=True)
    for i in range(3):
        (tmp / "intra" / f"n{i}.csv").write_text(
            "OP,GPU_num,GPU_used,data_size(B),Bandwidth(GB/s)\n"
            "all_reduce_perf,1,0,16777216,0.00\nall_reduce_perf,1,1,16777216,0.00\n"
            f"all_reduce_perf,2,01,16777216,{100 + i}.0\n")
    lines = ["OP,Total_GPU_Count,GPU_Mapping_Across_Nodes,data_size(B),Bandwidth(GB/s)"]
    for mapping, bw in inter_rows:
        lines.append(f'all_reduce_perf,{sum(map(len, mapping))},"{json.dumps(mapping)}",16777216,{bw}')
    (tmp / "inter.csv").write_text("\n".join(lines) + "\n")
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp


def test_trace_names_the_missing_pattern(tmp_path):
    d = _write_trace(tmp_path, [([[0], [0], []], 30.0), ([[0], [1], []], 32.0), ([[0, 1], [0, 1], []], 60.0)])
    fab = make_fabric(load_cluster(d))
    assert isinstance(fab, TraceFabric)
    got = fab.bandwidth([["n0:0", "n2:1"], ["n1:0", "n1:1", "n2:0", "n2:1"]])
    np.testing.assert_allclose(got, [31.0, 60.0])  # mean of the two 1+1 rows; 2+2 capped by intra >= 101
    with pytest.raises(DataError, match=r"2\+1"):
        fab.bandwidth([["n0:0", "n0:1", "n1:0"]])
    with pytest.raises(DataError, match=r"1\+1\+1"):
        fab.bandwidth([["n0:0", "n1:0", "n2:0"]])


# ------------------------------------------------------------------------------------------
# Calibration
A6000_ROWS = yaml.safe_load((PARAMS / "het4mix.yaml").read_text())["hosts"][2]["topology"]
KNOWN = {
    "link": {"NV": 12.0, "PXB": 18.0, "SYS": 11.0},
    "pcie": 22.0, "uplink": 30.0, "sys": 14.0, "p2p": True,
    "cap": 60.0, "sharpness": 6.0, "hop_penalty": 0.3,
    "ring_eff": [1.0, 0.97, 0.95, 0.93, 0.92, 0.9, 0.9],
}
KNOWN_NET = {"rail_efficiency": 0.7, "switch_base": 1.3, "switch_peer": 1.2, "count_gain": 0.15, "imbalance": 0.1, "sharpness": 10.0}


def _synthetic_dir(tmp: Path, n_hosts: int = 3, rows=A6000_ROWS, gpu: str = "SYNTH", inter: bool = True,
                   params: dict | None = None) -> Path:
    """A measurement directory generated by the emulator with known parameters (0.2 % noise)."""
    n = len(rows)
    hosts = [{"name": f"s{i}", "gpu": gpu, "topology": rows} for i in range(n_hosts)]
    doc = {"name": "synthetic", "collective": "all_reduce_perf", "gpus_per_host": n, "hosts": hosts,
           "network": {"nic_gbps": 50, "rails_per_host": n},
           "emulator": {"noise": 0.002, "seed": 3, "gpus": {gpu: params or KNOWN}, "network": KNOWN_NET}}
    fab = EmulatorFabric(spec_from_dict(doc))
    (tmp / "intra").mkdir(parents=True)
    head = "OP,GPU_num,GPU_used,data_size(B),Bandwidth(GB/s)\n"
    for h in range(n_hosts):
        masks = np.zeros((1 << n, n_hosts), dtype=np.int64)
        masks[:, h] = np.arange(1 << n)
        vals = fab.measure(masks[1:])
        lines = [f"all_reduce_perf,{bin(m).count('1')},{''.join(str(i) for i in range(n) if m >> i & 1)},16777216,{v:.2f}"
                 for m, v in zip(range(1, 1 << n), vals)]
        (tmp / "intra" / f"s{h}.csv").write_text(head + "\n".join(lines) + "\n")
        hosts[h]["intra"] = f"intra/s{h}.csv"
    if inter:
        lines = ["OP,Total_GPU_Count,GPU_Mapping_Across_Nodes,data_size(B),Bandwidth(GB/s)"]
        for counts in itertools.product(range(n + 1), repeat=n_hosts):
            if sum(1 for c in counts if c) < 2:
                continue
            masks = np.array([[(1 << c) - 1 for c in counts]], dtype=np.int64)
            v = float(fab.measure(masks)[0])
            mapping = [list(range(c)) for c in counts]
            lines.append(f'all_reduce_perf,{sum(counts)},"{json.dumps(mapping)}",16777216,{v:.2f}')
        (tmp / "inter.csv").write_text("\n".join(lines) + "\n")
        doc["inter"] = {"table": "inter.csv", "scale": 1.0, "combine": "min_intra"}
    del doc["emulator"]
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp


@pytest.mark.slow
def test_calibration_recovers_a_synthetic_cluster(tmp_path):
    from bandpilot.fabric.calibration import calibrate

    res = calibrate(_synthetic_dir(tmp_path))
    assert res.seconds < 60
    assert {t.kind for t in res.tables} == {"intra", "inter"}
    for t in res.tables:
        assert t.spearman >= 0.95, t
        assert t.mape <= 10.0, t
    assert res.gpus["SYNTH"]["p2p"] is True
    assert res.network["rail_efficiency"] == pytest.approx(0.7, rel=0.15)
    # the YAML block is a working emulator: plugging it in reproduces the reported fit
    block = yaml.safe_load(res.to_yaml())
    assert set(block) == {"emulator"}
    doc = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    doc.pop("inter")
    doc["emulator"] = block["emulator"]
    fab = EmulatorFabric(spec_from_dict(doc, tmp_path), noise=0)
    from bandpilot.fabric.calibration import spearman

    measured = intra_lookup(read_intra_table(tmp_path / "intra" / "s0.csv", 8), 8, "")
    sel = np.bitwise_count(np.arange(256)) >= 2
    assert spearman(fab.stage1[0][sel], measured[sel]) == pytest.approx(res.table("s0").spearman, abs=1e-9)


@pytest.mark.slow
def test_calibration_detects_staged_pcie(tmp_path):
    """Anti-locality (PXB pairs slower than SYS pairs) is fitted as no GPU peer-to-peer."""
    from bandpilot.fabric.calibration import calibrate

    rows = yaml.safe_load((PARAMS / "het4mix.yaml").read_text())["hosts"][0]["topology"]  # RTX 4090 host
    staged = {"link": {"PIX": 8.0, "PXB": 9.0, "SYS": 11.0}, "pcie": 11.0, "uplink": 14.0, "sys": 20.0, "p2p": False,
              "cap": 30.0, "sharpness": 8.0, "hop_penalty": 0.1, "ring_eff": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9]}
    d = _synthetic_dir(tmp_path, n_hosts=1, rows=rows, inter=False, params=staged)
    res = calibrate(d)
    assert res.gpus["SYNTH"]["p2p"] is False
    assert res.network is None
    fit = res.tables[0]
    assert fit.spearman >= 0.9 and fit.mape <= 5.0, fit  # many near-ties: 0.2 % noise reorders them


@pytest.mark.slow
def test_calibrate_cli_writes_yaml_atomically(tmp_path):
    from bandpilot.cli.main import main

    rows = ["X NV2 SYS SYS", "NV2 X SYS SYS", "SYS SYS X NV2", "SYS SYS NV2 X"]
    d = _synthetic_dir(tmp_path / "m", n_hosts=2, rows=rows)
    out = tmp_path / "out" / "emulator.yaml"
    assert main(["calibrate", str(d), "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert "SYNTH" in doc["emulator"]["gpus"] and "rail_efficiency" in doc["emulator"]["network"]
    assert [p.name for p in out.parent.iterdir()] == ["emulator.yaml"]  # no temp files left
    assert main(["calibrate", str(tmp_path / "nowhere")]) == 2


@pytest.fixture(scope="module")
def real_fits():
    if not MEAS.is_dir():
        pytest.skip("../shared/data is not present")
    from bandpilot.fabric.calibration import calibrate

    return {c: calibrate(MEAS / c) for c in ("h100-16m", "het4mix-16m")}


@pytest.mark.slow
@needs_data
def test_calibration_targets_on_real_tables(real_fits):
    h100 = real_fits["h100-16m"]
    inter = h100.table("inter.csv")
    assert inter.mape <= 15.0 and inter.spearman >= 0.9, inter
    for t in h100.tables:
        if t.kind == "intra":
            assert t.mape <= 5.0, t
    het = real_fits["het4mix-16m"]
    hosts = [t for t in het.tables if t.kind == "intra"]
    assert {t.gpu for t in hosts} == {"RTX4090", "V100", "A6000", "A800"}
    for t in hosts:
        assert t.spearman >= 0.8, t
    assert het.gpus["RTX4090"]["p2p"] is False and het.gpus["A6000"]["p2p"] is True
    assert h100.seconds + het.seconds < 60


@needs_data
def test_committed_specs_carry_the_calibration():
    """params/clusters/*.yaml reproduce the targets without re-fitting."""
    from bandpilot.fabric.calibration import spearman

    het = make_fabric(load_cluster(PARAMS / "het4mix.yaml"))
    meas = load_cluster(MEAS / "het4mix-16m")
    sel = np.bitwise_count(np.arange(256)) >= 2
    for h, host in enumerate(meas.hosts):
        assert het.spec.hosts[h].gpu == host.gpu
        y = intra_lookup(read_intra_table(host.intra, 8), 8, "")
        assert spearman(het.stage1[h][sel], y[sel]) >= 0.8, host.name
    h100 = make_fabric(load_cluster(PARAMS / "h100.yaml"))
    spec = load_cluster(MEAS / "h100-16m")
    rows = [r for r in read_inter_table(spec.inter.table, 4, 8) if sum(1 for m in r.masks if m) >= 2]
    groups: dict[tuple, list[float]] = defaultdict(list)
    pred: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        masks = np.array([r.masks], dtype=np.int64)
        key = _pattern(popcount(masks)[0])
        groups[key].append(r.busbw)
        pred[key].append(float(h100.bandwidth_masks(masks)[0]))
    y = np.array([np.mean(groups[k]) for k in sorted(groups)])
    p = np.array([np.mean(pred[k]) for k in sorted(groups)])
    assert np.mean(np.abs(p - y) / y) <= 0.15
    assert spearman(p, y) >= 0.9


def test_emulator_constants_come_from_params_and_bad_files_are_one_line_errors(tmp_path):
    from bandpilot.errors import SpecError
    from bandpilot.fabric import emulator as emu

    doc = emu.load_constants()
    assert emu.CONSTANTS_FILE.name == "emulator.yaml" and emu.CONSTANTS_FILE.parent.name == "params"
    assert emu.DEFAULT_GPU_PARAMS["H100"]["cap"] == doc["gpu"]["H100"]["cap"] == 239.9
    assert emu.DEFAULT_NETWORK["rail_efficiency"] == doc["network"]["rail_efficiency"]
    assert "k0" not in emu.DEFAULT_GPU_PARAMS["H100"] and emu.DEFAULT_GPU_PARAMS["H100"]["link"]["PIX"] == 20.0
    text = emu.CONSTANTS_FILE.read_text()
    for bad, match in [(text.replace("count_gain_max: 8", ""), "sections"),
                       (text.replace("    hop_penalty: 0.3901", "    hop_penalty: 0.3901\n    warp: 2"), "gpu.H100"),
                       ("gpu: [", "invalid YAML")]:
        p = tmp_path / "emulator.yaml"
        p.write_text(bad)
        with pytest.raises(SpecError, match=match) as exc:
            emu.load_constants(p)
        assert "\n" not in str(exc.value)
    with pytest.raises(SpecError, match="not found"):
        emu.load_constants(tmp_path / "nope.yaml")
