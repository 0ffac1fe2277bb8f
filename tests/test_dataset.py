"""Ingestion of measurement directories (CSV tables and raw nccl-tests logs) into the dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.topology.cluster import load_cluster, spec_from_dict
from bandpilot.data.dataset import (
    DATASET_FILE,
    dataset_hash,
    load_dataset,
)
from bandpilot.data.ingest import ingest
from bandpilot.fabric.tables import parse_mapping
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.trace import TraceFabric

TOPO4 = ["X NV2 PXB PXB", "NV2 X PXB PXB", "PXB PXB X NV2", "PXB PXB NV2 X"]
TINY = {
    "name": "tiny",
    "collective": "all_gather_perf",
    "message_bytes": 16777216,
    "gpus_per_host": 4,
    "hosts": [
        {"name": "t0", "gpu": "A100", "topology": TOPO4},
        {"name": "t1", "gpu": "A100", "topology": TOPO4},
        {"name": "t2", "gpu": "V100", "topology": TOPO4},
    ],
    "network": {"nic_gbps": 200, "rails_per_host": 4},
    "emulator": {"seed": 3, "noise": 0.02},
}
# Cross-host allocations of the synthetic inter table: one per count pattern (so TraceFabric,
# which averages per pattern, and the per-row dataset agree exactly).
CROSS = [
    [[0], [1], []],
    [[0, 1], [2, 3], []],
    [[0, 2, 3], [1], []],
    [[1], [0], [3]],
    [[0, 1], [0, 1], [2, 3]],
    [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]],
    [[3], [], [0, 1]],
]


def _binary(mapping: list[list[int]], n: int = 4) -> list[list[int]]:
    return [[1 if i in host else 0 for i in range(n)] for host in mapping]


def write_intra_tables(d: Path, fab: EmulatorFabric) -> dict:
    """Every host's intra table (all 15 subsets, values from ``fab``) under ``d/intra``; returns a
    copy of the tiny cluster's document pointing at them."""
    (d / "intra").mkdir(parents=True)
    doc = json.loads(json.dumps(TINY))
    for h, host in enumerate(doc["hosts"]):
        lines = ["OP,GPU_num,GPU_used,data_size(B),Bandwidth(GB/s)"]
        for mask in range(1, 16):
            m = np.zeros((1, 3), dtype=np.int64)
            m[0, h] = mask
            digits = "".join(str(i) for i in range(4) if mask >> i & 1)
            lines.append(f"all_gather_perf,{len(digits)},{digits},16777216,{fab.measure(m)[0]:.2f}")
        (d / "intra" / f"{host['name']}.csv").write_text("\n".join(lines) + "\n")
        host["intra"] = f"intra/{host['name']}.csv"
    return doc


def write_csv_dir(d: Path, *, binary: bool = False, combine: str = "min_intra", repeat_first: bool = False) -> Path:
    """A BandPilot CSV measurement directory for the tiny cluster, values from the emulator."""
    spec = spec_from_dict(TINY)
    fab = EmulatorFabric(spec)
    doc = write_intra_tables(d, fab)
    lines = ['"OP","Total_GPU_Count","GPU_Mapping_Across_Nodes","data_size(B)","Bandwidth(GB/s)"']
    # a single-host row, as in the released tables: ignored (intra tables are authoritative)
    lines.append('"all_gather_perf",2,"[[0,1],[],[]]",16777216,99.00')
    for k, mapping in enumerate(CROSS):
        masks = spec.to_mask([f"t{h}:{i}" for h, host in enumerate(mapping) for i in host])
        bw = fab.network(np.bitwise_count(masks)[None, :].astype(np.int64))[0]
        text = json.dumps(_binary(mapping) if binary else mapping, separators=(",", ":"))
        n = sum(len(x) for x in mapping)
        lines.append(f'"all_gather_perf",{n},"{text}",16777216,{bw:.2f}')
        if repeat_first and k == 0:
            lines.append(f'"all_gather_perf",{n},"{text}",16777216,{bw * 1.1:.2f}')
    (d / "inter.csv").write_text("\n".join(lines) + "\n")
    doc["inter"] = {"table": "inter.csv", "scale": 1.0, "combine": combine}
    (d / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


@pytest.fixture
def csv_dir(tmp_path: Path) -> Path:
    return write_csv_dir(tmp_path / "meas")


# ------------------------------------------------------------------------------------------
# CSV form


@pytest.mark.parametrize("binary", [False, True], ids=["lists", "binary-masks"])
def test_ingest_csv_matches_trace_fabric(tmp_path, binary):
    d = write_csv_dir(tmp_path / "meas", binary=binary)
    rep = ingest(d, tmp_path / "ds")
    assert rep.form == "csv" and rep.cluster == "tiny"
    assert (rep.rows, rep.single_host, rep.cross_host) == (3 * 15 + len(CROSS), 45, len(CROSS))
    assert rep.hosts == ("t0", "t1", "t2")
    assert rep.skipped["single-host rows of the inter table"] == 1
    ds = load_dataset(tmp_path / "ds")
    fab = TraceFabric(load_cluster(d))
    assert np.allclose(ds.stage1_tables(), fab.stage1)
    cross = ds.cross_host()
    assert np.allclose(cross.busbw(), fab.bandwidth_masks(cross.masks()))
    assert cross.frame["source"].str.match(r"inter\.csv:\d+$").all()
    assert ds.single_host().frame["source"].iloc[0] == "intra/t0.csv:2"


def test_both_mapping_forms_give_the_same_dataset(tmp_path):
    a = load_dataset(ingest(write_csv_dir(tmp_path / "a"), tmp_path / "da").out).frame
    b = load_dataset(ingest(write_csv_dir(tmp_path / "b", binary=True), tmp_path / "db").out).frame
    cols = ["gpus", "n_gpus", "n_hosts", "busbw", "bytes", "collective"]
    assert a[cols].equals(b[cols])
    for col in ("hosts", "host_masks", "counts"):
        assert a[col].map(tuple).tolist() == b[col].map(tuple).tolist()


def test_repeated_measurements_are_kept_and_averaged_on_load(tmp_path):
    d = write_csv_dir(tmp_path / "meas", repeat_first=True)
    rep = ingest(d, tmp_path / "ds")
    assert rep.cross_host == len(CROSS) + 1
    ds = load_dataset(tmp_path / "ds")
    agg = ds.aggregated()
    assert len(agg) == len(ds) - 1
    row = agg.frame[agg.frame["repeats"] == 2]
    assert len(row) == 1
    vals = ds.frame[ds.frame["gpus"] == row["gpus"].iloc[0]]["busbw"]
    assert row["busbw"].iloc[0] == pytest.approx(vals.mean())


def test_combine_rule_is_applied_to_cross_host_rows(tmp_path):
    d = write_csv_dir(tmp_path / "meas")
    text = (d / "cluster.yaml").read_text().replace("scale: 1.0", "scale: 40.0")
    (d / "cluster.yaml").write_text(text)
    ds = load_dataset(ingest(d, tmp_path / "ds").out)
    cross = ds.cross_host()
    # a huge inter scale leaves the intra bound of hosts with >= 2 GPUs in charge
    assert np.allclose(cross.busbw(), TraceFabric(load_cluster(d)).bandwidth_masks(cross.masks()))


def _replace_line(path: Path, lineno: int, new: str) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = new
    path.write_text("\n".join(lines) + "\n")


def _edit_spec(d: Path, fn) -> None:
    doc = yaml.safe_load((d / "cluster.yaml").read_text())
    fn(doc)
    (d / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


CSV_BAD = {
    "non-numeric bandwidth": (
        lambda d: _replace_line(d / "intra" / "t1.csv", 5, "all_gather_perf,2,01,16777216,fast"),
        DataError, r"intra/t1\.csv:5: bandwidth 'fast' is not a number",
    ),
    "negative bandwidth": (
        lambda d: _replace_line(d / "intra" / "t0.csv", 7, "all_gather_perf,2,12,16777216,-3.5"),
        DataError, r"intra/t0\.csv:7: bandwidth '-3\.5' must be a finite non-negative number",
    ),
    "nan bandwidth": (
        lambda d: _replace_line(d / "inter.csv", 3, '"all_gather_perf",2,"[[0],[1],[]]",16777216,nan'),
        DataError, r"inter\.csv:3: bandwidth 'nan' must be a finite",
    ),
    "unknown intra index": (
        lambda d: _replace_line(d / "intra" / "t2.csv", 4, "all_gather_perf,2,07,16777216,10.0"),
        DataError, r"intra/t2\.csv:4: GPU index 7 out of range \(host has 4 GPUs\)",
    ),
    "unknown host in mapping": (
        lambda d: _replace_line(d / "inter.csv", 3, '"all_gather_perf",2,"[[0],[1],[],[2]]",16777216,5.0'),
        DataError, r"inter\.csv:3: mapping lists 4 hosts, the cluster has 3",
    ),
    "unknown inter index": (
        lambda d: _replace_line(d / "inter.csv", 4, '"all_gather_perf",2,"[[0],[5],[]]",16777216,5.0'),
        DataError, r"inter\.csv:4: GPU index 5 out of range",
    ),
    "count disagrees with mapping": (
        lambda d: _replace_line(d / "inter.csv", 4, '"all_gather_perf",3,"[[0],[1],[]]",16777216,5.0'),
        DataError, r"inter\.csv:4: Total_GPU_Count 3 disagrees",
    ),
    "mapping not json": (
        lambda d: _replace_line(d / "inter.csv", 4, '"all_gather_perf",2,"[[0],[1],",16777216,5.0'),
        DataError, r"inter\.csv:4: GPU_Mapping_Across_Nodes .* is not a list of lists",
    ),
    "missing columns": (
        lambda d: _replace_line(d / "intra" / "t0.csv", 1, "OP,GPU_num,GPU_used,Bandwidth(GB/s)"),
        DataError, r"intra/t0\.csv:1: missing columns \['data_size\(B\)'\]",
    ),
    "missing intra subset": (
        lambda d: (d / "intra" / "t1.csv").write_text(
            "\n".join((d / "intra" / "t1.csv").read_text().splitlines()[:-1]) + "\n"
        ),
        DataError, r"intra/t1\.csv: intra table has no row for GPU subset 0123",
    ),
    "missing table file": (
        lambda d: (d / "intra" / "t2.csv").unlink(),
        DataError, r"measurement table not found: .*intra/t2\.csv",
    ),
    "missing spec key": (
        lambda d: _edit_spec(d, lambda doc: doc.pop("name")),
        SpecError, r"cluster\.yaml: missing required key 'name'",
    ),
    "missing host key": (
        lambda d: _edit_spec(d, lambda doc: doc["hosts"][1].pop("gpu")),
        SpecError, r"cluster\.yaml: hosts\[1\]: missing required key 'gpu'",
    ),
    "host without table": (
        lambda d: _edit_spec(d, lambda doc: doc["hosts"][2].pop("intra")),
        DataError, r"cluster\.yaml: host 't2' \(hosts\[2\]\) has no intra table",
    ),
    "invalid yaml": (
        lambda d: (d / "cluster.yaml").write_text("name: [unclosed\nhosts: 1\n"),
        SpecError, r"cluster\.yaml:\d+: invalid YAML",
    ),
}


@pytest.mark.parametrize("case", sorted(CSV_BAD))
def test_bad_csv_directory_is_rejected_and_nothing_is_written(csv_dir, tmp_path, case):
    mutate, exc, pattern = CSV_BAD[case]
    mutate(csv_dir)
    out = tmp_path / "ds"
    with pytest.raises(exc, match=pattern) as info:
        ingest(csv_dir, out)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_failed_ingest_leaves_an_existing_dataset_unchanged(csv_dir, tmp_path):
    out = tmp_path / "ds"
    ingest(csv_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _replace_line(csv_dir / "intra" / "t1.csv", 5, "all_gather_perf,2,01,16777216,-1")
    with pytest.raises(DataError):
        ingest(csv_dir, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_empty_and_non_measurement_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty.*: empty directory"):
        ingest(tmp_path / "empty", tmp_path / "ds")
    with pytest.raises(DataError, match="measurement directory not found"):
        ingest(tmp_path / "nope", tmp_path / "ds")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"no cluster\.yaml or manifest\.jsonl"):
        ingest(tmp_path / "junk", tmp_path / "ds")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("# nccl-tests\n")
    with pytest.raises(DataError, match=r"without manifest\.jsonl"):
        ingest(tmp_path / "logs", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_ingest_refuses_to_overwrite_the_table_directory(csv_dir):
    spec_before = (csv_dir / "cluster.yaml").read_text()
    with pytest.raises(DataError, match="would replace its cluster.yaml"):
        ingest(csv_dir, csv_dir)
    assert (csv_dir / "cluster.yaml").read_text() == spec_before


# ------------------------------------------------------------------------------------------
# mapping parser fuzz


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=st.one_of(
        st.text(max_size=60),
        st.text(alphabet="[],0123456789- ", max_size=40),
        st.recursive(
            st.integers(-3, 10) | st.booleans() | st.none() | st.floats(allow_nan=True) | st.text(max_size=3),
            lambda c: st.lists(c, max_size=5),
            max_leaves=20,
        ).map(lambda x: json.dumps(x)),
        st.lists(st.lists(st.integers(0, 1), min_size=0, max_size=5), min_size=0, max_size=4).map(json.dumps),
    ),
    n_hosts=st.integers(1, 4),
    n_gpus=st.integers(1, 8),
)
@pytest.mark.slow
def test_mapping_parser_fuzz(raw, n_hosts, n_gpus):
    try:
        masks = parse_mapping(raw, n_hosts, n_gpus, Path("inter.csv"), 7)
    except DataError as exc:
        assert str(exc).startswith("inter.csv:7: ") and "\n" not in str(exc)
        return
    assert isinstance(masks, tuple) and len(masks) == n_hosts
    assert all(isinstance(m, int) and 0 <= m < (1 << n_gpus) for m in masks)


def test_mapping_parser_deep_nesting_is_a_data_error():
    with pytest.raises(DataError, match="not a list of lists"):
        parse_mapping("[" * 100000 + "]" * 100000, 2, 8, Path("inter.csv"), 2)


def test_mapping_forms():
    p = Path("x.csv")
    assert parse_mapping("[[0,1],[0],[]]", 3, 8, p, 2) == (3, 1, 0)
    assert parse_mapping("[[1,1,0,0,0,0,0,0],[1,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0]]", 3, 8, p, 2) == (3, 1, 0)
    assert parse_mapping("[[0,1],[1]]", 2, 2, p, 2) == (3, 2)  # width-2: index form wins


# ------------------------------------------------------------------------------------------
# dataset hash


def test_dataset_hash_is_the_content_md5(csv_dir, tmp_path):
    import hashlib

    ingest(csv_dir, tmp_path / "ds")
    h = dataset_hash(tmp_path / "ds")
    assert h == hashlib.md5((tmp_path / "ds" / DATASET_FILE).read_bytes()).hexdigest()
    assert dataset_hash(tmp_path / "ds" / DATASET_FILE) == h
    with pytest.raises(DataError, match="no dataset"):
        dataset_hash(tmp_path)


# ------------------------------------------------------------------------------------------
# the real measurements (skip without ../shared/data)


@pytest.mark.parametrize("name", ["h100-16m", "het4mix-16m"])
def test_ingest_real_measurements(shared_data, tmp_path, name, capsys):
    from bandpilot.cli.main import main

    src = shared_data / name
    assert main(["ingest", str(src), "--out", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ingested \S+: \d+ rows, 4 hosts .* 1020 single-host, \d+ cross-host", out)
    ds = load_dataset(tmp_path / "ds")
    fab = TraceFabric(load_cluster(src))
    assert len(ds.single_host()) == 4 * 255
    assert np.allclose(ds.stage1_tables(), fab.stage1)
    cross = ds.cross_host()
    masks, _ = fab.measured_masks()
    assert len(cross) == len(masks)
    # per allocation, within the spread of the repeats around the per-pattern mean
    assert np.allclose(cross.busbw(), fab.bandwidth_masks(cross.masks()), rtol=0.2)


def test_ingest_cli_error_exit(tmp_path, capsys):
    from bandpilot.cli.main import main

    (tmp_path / "empty").mkdir()
    assert main(["ingest", str(tmp_path / "empty"), "--out", str(tmp_path / "ds")]) == 2
    assert re.match(r"error: .*empty: empty directory", capsys.readouterr().err)
