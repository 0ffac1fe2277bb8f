"""Model-free verification from pairwise node sweeps (logs -> matrices -> verdicts -> gate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.faults import Fault, FaultyFabric, parse_faults, random_fault
from bandpilot.health.pairwise import Matrix, analyze, analyze_matrix
from bandpilot.health.sweeps import PairRun, Sweep, emulate_sweep, read_sweep, write_sweep_logs
from bandpilot.topology.cluster import spec_from_dict

ROOT = Path(__file__).resolve().parent.parent


def _spec(n: int = 8, racks: int | None = None):
    d = yaml.safe_load((ROOT / "params" / "clusters" / "h100-64.yaml").read_text())
    d["host_groups"][0]["count"] = n
    if racks is not None:
        d["host_groups"][0]["domain_size"] = n // racks
    d["name"] = f"h100-{n}"
    return spec_from_dict(d)


@pytest.fixture(scope="module")
def spec8():
    return _spec(8)


FAULTS = [Fault("slow_host", "h100-2"), Fault("host_link", "h100-4", factor=0.6, peer_host="h100-6"),
          Fault("nic_rail", "h100-5", gpu=3)]


@pytest.fixture(scope="module")
def faulty_logs(spec8, tmp_path_factory):
    runs = emulate_sweep(FaultyFabric(EmulatorFabric(spec8, seed=4), FAULTS), seed=4)
    d = tmp_path_factory.mktemp("sweep")
    write_sweep_logs(runs, d)
    return d, runs


def test_faults_are_told_apart_from_logs(faulty_logs):
    d, runs = faulty_logs
    sweep = read_sweep(d)
    assert sweep.files == 28 * 4 and len(sweep.runs) == len(runs) == 28 * 4 * 2 and not sweep.skipped
    # every value survives the trip through nccl-tests logs (2 decimals)
    got = {(r.collective, r.gpn, r.nodes): r.busbw for r in sweep.runs}
    assert all(got[(r.collective, r.gpn, r.nodes)] == pytest.approx(r.busbw, abs=0.006) for r in runs)
    rep = analyze(sweep, source=str(d))
    v = rep.nodes
    assert v["h100-2"].status == "degraded" and v["h100-2"].fault == "node" and v["h100-2"].ratio == pytest.approx(0.7, abs=0.05)
    # rail 3 is used from 4 GPUs per node on: the 2-GPU runs were fine, so rails 2..3 are suspect
    assert v["h100-5"].fault == "rails" and v["h100-5"].gpn == [4, 8] and v["h100-5"].rails == [2, 3]
    assert {n for n, x in v.items() if x.status != "healthy"} == {"h100-2", "h100-5"}
    bad = [lk for lk in rep.links if lk.status != "healthy"]
    assert [lk.nodes for lk in bad] == [("h100-4", "h100-6")] and bad[0].ratio == pytest.approx(0.6, abs=0.05)
    assert rep.exit_code == 3
    gate = rep.host_verdicts()
    assert gate["h100-5"]["links"] == ["h100-5:nic-rail2", "h100-5:nic-rail3"]
    assert gate["h100-4"] == {"status": "healthy", "gpus": [], "links": ["h100-4<->h100-6"], "ratio": v["h100-4"].ratio}


def test_noise_only_sweeps_are_healthy(spec8):
    for seed in range(5):
        runs = emulate_sweep(EmulatorFabric(spec8, seed=seed), seed=seed, glitch=0.02)
        rep = analyze(Sweep(runs))
        assert rep.healthy and rep.exit_code == 0, rep.markdown()


def test_a_transient_dip_needs_agreement(spec8):
    runs = emulate_sweep(EmulatorFabric(spec8, seed=1), seed=1)
    dip = [PairRun(r.collective, r.gpn, r.nodes, r.busbw * (0.4 if (r.nodes, r.gpn, r.collective) ==
                                                             (("h100-0", "h100-1"), 4, "alltoall_perf") else 1.0))
           for r in runs]
    rep = analyze(Sweep(dip))
    link = next(lk for lk in rep.links if lk.nodes == ("h100-0", "h100-1"))
    assert rep.healthy and link.evidence == 1
    # the same dip in the other collective at the same GPU count is a fault
    both = [PairRun(r.collective, r.gpn, r.nodes, r.busbw * (0.4 if (r.nodes, r.gpn) == (("h100-0", "h100-1"), 4) else 1.0))
            for r in runs]
    rep = analyze(Sweep(both))
    link = next(lk for lk in rep.links if lk.nodes == ("h100-0", "h100-1"))
    assert link.status == "degraded" and link.gpn == [4] and not any(v.status != "healthy" for v in rep.nodes.values())


def test_slow_at_one_gpu_count_only_and_min_drop(spec8):
    """A real sweep's pattern: one node at 0.7x at 4 GPUs per node only (both collectives)."""
    runs = emulate_sweep(EmulatorFabric(spec8, seed=6), seed=6)
    odd = [PairRun(r.collective, r.gpn, r.nodes, r.busbw * (0.7 if r.gpn == 4 and "h100-6" in r.nodes else 1.0)) for r in runs]
    v = analyze(Sweep(odd)).nodes["h100-6"]
    assert (v.status, v.fault, v.gpn, v.rails) == ("degraded", "partial", [4], [])
    mild = [PairRun(r.collective, r.gpn, r.nodes, r.busbw * (0.88 if "h100-6" in r.nodes else 1.0)) for r in runs]
    assert analyze(Sweep(mild)).healthy
    v = analyze(Sweep(mild), min_drop=0.08).nodes["h100-6"]
    assert v.fault == "node" and v.ratio == pytest.approx(0.88, abs=0.02)


def test_one_collective_agrees_across_gpu_counts_and_failed_runs(spec8):
    fab = FaultyFabric(EmulatorFabric(spec8, seed=2), [Fault("host_link", "h100-1", factor=0.0, peer_host="h100-3")])
    rep = analyze(Sweep(emulate_sweep(fab, collectives=["sendrecv_perf"], seed=2)))
    assert not rep.per_gpn and any("across GPU counts" in n for n in rep.notes)
    link = next(lk for lk in rep.links if lk.nodes == ("h100-1", "h100-3"))
    assert link.status == "failed" and link.ratio < 0.1
    assert all(v.status == "healthy" for v in rep.nodes.values())


def test_reader_skips_what_is_not_a_pair(tmp_path, faulty_logs):
    import shutil

    from test_nccl import ALL_REDUCE_PLAIN

    d, _ = faulty_logs
    for p in sorted(d.glob("*G8*"))[:6]:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "single.log").write_text(ALL_REDUCE_PLAIN)
    (tmp_path / "junk.txt").write_text("nothing here\n")
    (tmp_path / "notes.md").write_text("ignored: not a log suffix")
    sweep = read_sweep(tmp_path)
    assert sweep.files == 8 and len(sweep.runs) == 12
    assert any("single.log" in s and "not a node pair (1 hosts)" in s for s in sweep.skipped)
    assert any(s.startswith(f"{tmp_path / 'junk.txt'}:") for s in sweep.skipped)
    with pytest.raises(DataError, match=r"no pairwise nccl-tests runs in 1 log files"):
        (tmp_path / "x").mkdir(), (tmp_path / "x" / "a.log").write_text("hello\n"), read_sweep(tmp_path / "x")
    with pytest.raises(DataError, match="not a directory"):
        read_sweep(tmp_path / "missing")


def test_model_expectation_removes_rack_structure():
    """Two racks behind 2:1 uplinks: every cross-rack pair is slow by design. Peers alone cannot tell
    that from faults; the model's expectation can."""
    from bandpilot.health.pairwise_model import model_expectation

    spec = _spec(12, racks=2)
    fab = EmulatorFabric(spec, seed=3)  # a perfect model: the emulator's own expectation
    faults = [Fault("slow_host", "h100-7"), Fault("host_link", "h100-1", factor=0.6, peer_host="h100-3")]
    runs = emulate_sweep(FaultyFabric(fab, faults), seed=3, gpn=(8,))
    alone, with_model = analyze(Sweep(runs)), analyze(Sweep(runs), expect=model_expectation(fab))
    assert [lk.nodes for lk in alone.links if lk.status != "healthy"] == []  # lost in the rack structure
    assert [lk.nodes for lk in with_model.links if lk.status != "healthy"] == [("h100-1", "h100-3")]
    assert {n for n, v in with_model.nodes.items() if v.status != "healthy"} == {"h100-7"}


def test_host_link_faults_are_validated(spec8):
    ok = parse_faults([{"kind": "host_link", "host": "h100-1", "peer_host": "h100-2", "factor": 0.5}], spec8)
    assert ok == [Fault("host_link", "h100-1", factor=0.5, peer_host="h100-2")]
    for items, msg in [([{"kind": "host_link", "host": "h100-1"}], "needs peer_host"),
                       ([{"kind": "host_link", "host": "h100-1", "peer_host": "h100-1"}], "needs peer_host"),
                       ([{"kind": "slow_host", "host": "h100-1", "peer_host": "h100-2"}], "only host_link")]:
        with pytest.raises(SpecError, match=msg):
            parse_faults(items, spec8, "f.yaml")
    f = random_fault(spec8, "host_link", np.random.default_rng(0))
    assert f.peer_host in spec8.host_index and f.peer_host != f.host


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 1e4), st.just(float("nan"))), min_size=36, max_size=36), st.booleans())
def test_fuzz_matrix_analysis_never_raises(vals, zeros):
    v = np.array(vals).reshape(6, 6)
    v = np.triu(v, 1)
    v = v + v.T
    v[np.tril_indices(6)] = np.where(np.isnan(v.T[np.tril_indices(6)]), np.nan, v[np.tril_indices(6)])
    np.fill_diagonal(v, np.nan)
    if zeros:
        v = np.where(v > 5e3, 0.0, v)
    if not np.isfinite(v).any():
        return
    m = analyze_matrix(Matrix("sendrecv_perf", 1, 0, v))
    assert m.node_low.shape == (6,) and m.link_low.shape == (6, 6)


# ------------------------------------------------------------------------------------------
# command line


def _cli(args):
    from bandpilot.cli.main import main

    return main(args)


@pytest.mark.slow
def test_cli_pairwise_json_out_and_errors(faulty_logs, tmp_path, capsys):
    d, _ = faulty_logs
    assert _cli(["verify", "--pairwise", str(d), "--json", "--out", str(tmp_path / "rep")]) == 3
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"pairs", "nodes", "links"} and len(out["nodes"]) == 8 and len(out["links"]) == 28
    assert out["pairs"] == {"expected": 28, "measured": 28, "failed": 0, "missing": 0}
    assert out["nodes"]["h100-2"]["status"] == "degraded" and out["nodes"]["h100-0"]["status"] == "healthy"
    assert all(set(lk) >= {"nodes", "status", "ratio"} for lk in out["links"])
    assert [lk["nodes"] for lk in out["links"] if lk["status"] != "healthy"] == [["h100-4", "h100-6"]]
    rep = tmp_path / "rep"
    assert (rep / "heatmap.png").read_bytes()[:4] == b"\x89PNG" and "| h100-2 | degraded | node |" in (rep / "verify.md").read_text()
    assert json.loads((rep / "verify.json").read_text())["nodes"] == out["nodes"]
    for args, msg in [(["--pairwise", str(tmp_path / "nope")], "not a directory"),
                      (["--pairwise", str(d), "--inject", "f.yaml"], "takes no --inject"),
                      ([], "verify needs --model"),
                      (["--pairwise", str(tmp_path / "rep")], "no pairwise nccl-tests runs")]:
        assert _cli(["verify", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and err.count("\n") == 1, err


def gate_sweep(d, tmp_path, capsys, n: int = 8) -> dict:
    """``verify --pairwise d --gate`` on a fresh store of an ``n``-node H100 cluster (exit 3 expected);
    ``cluster health`` rows by host."""
    spec_file = tmp_path / "c.yaml"
    doc = yaml.safe_load((ROOT / "params" / "clusters" / "h100-64.yaml").read_text())
    doc["host_groups"][0]["count"] = n
    doc["name"] = f"h100-{n}"
    spec_file.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert _cli(["cluster", "init", "--cluster", str(spec_file), "--store", url]) == 0
    assert _cli(["verify", "--pairwise", str(d), "--gate", "--store", url]) == 3
    capsys.readouterr()
    assert _cli(["cluster", "health", "--store", url, "--json"]) == 0
    return {r["host"]: r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.slow
def test_cli_pairwise_gate(faulty_logs, spec8, tmp_path, capsys):
    d, _ = faulty_logs
    rows = gate_sweep(d, tmp_path, capsys)
    assert rows["h100-2"]["status"] == "degraded" and rows["h100-2"]["gated_gpus"] == 8
    assert rows["h100-5"]["gated_gpus"] == 2  # the GPUs driving rails 2 and 3
    assert rows["h100-4"]["status"] == "healthy" and rows["h100-4"]["links"] == ["h100-4<->h100-6"]
    assert rows["h100-4"]["gated_gpus"] == 0


_FRAGS = None


def _fragments(faulty_logs) -> list[str]:
    global _FRAGS
    if _FRAGS is None:
        d, _ = faulty_logs
        _FRAGS = [ln for p in sorted(d.glob("*G2*"))[:2] for ln in p.read_text().split("\n")]
    return _FRAGS


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fuzz_sweep_reader_only_data_errors(faulty_logs, tmp_path_factory, data):
    d = tmp_path_factory.mktemp("fuzz")
    frags = _fragments(faulty_logs)
    for i in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()):  # noise built from log lines
            lines = data.draw(st.lists(st.one_of(st.sampled_from(frags), st.text(max_size=30)), max_size=120))
        else:  # a real sweep log with lines dropped, replaced or repeated
            lines = list(frags)
            for _ in range(data.draw(st.integers(0, 6))):
                at = data.draw(st.integers(0, len(lines) - 1))
                op = data.draw(st.sampled_from(["drop", "text", "dup"]))
                lines[at:at + 1] = [] if op == "drop" else [data.draw(st.text(max_size=40))] if op == "text" else [lines[at]] * 2
        (d / f"f{i}.log").write_text("\n".join(lines), errors="replace")
    try:
        sweep = read_sweep(d)
    except DataError as exc:
        assert "\n" not in str(exc)
        return
    rep = analyze(sweep)
    assert set(rep.nodes) == set(sweep.nodes) and all(v.status in ("healthy", "degraded", "failed") for v in rep.nodes.values())
