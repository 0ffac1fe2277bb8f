"""Pairwise verification never calls a crashed, cut short, empty or missing run healthy: such pairs
are counted, reported ``failed`` / ``missing`` with the run named, drawn in the heatmap and gated.
Logs are written the way nccl-tests writes them (``Test NCCL failure common.cu:...`` after the
column header, a row cut by a killed job, an empty file, only the launcher's error)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bandpilot.errors import DataError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.health.pairwise import analyze
from bandpilot.health.sweeps import PairRun, emulate_sweep, read_sweep, write_sweep_logs
from test_pairwise import _cli, _spec, gate_sweep


@pytest.fixture(scope="module")
def runs8():
    return emulate_sweep(EmulatorFabric(_spec(8), seed=5), seed=5)


def _fail(runs, pair, gpn, coll, failure):
    return [PairRun(r.collective, r.gpn, r.nodes, r.busbw, r.repeat, failure=failure)
            if (r.nodes, r.gpn, r.collective) == (pair, gpn, coll) else r for r in runs]


def _link(rep, a, b):
    return next(lk for lk in rep.links if lk.nodes == (a, b))


def test_a_crashed_sendrecv_after_a_normal_alltoall_is_failed(runs8, tmp_path):
    write_sweep_logs(_fail(runs8, ("h100-1", "h100-3"), 8, "sendrecv_perf", "crashed"), tmp_path)
    text = (tmp_path / "nccl_N2_G8_h100-1_h100-3.log").read_text()
    assert "h100-1: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / '" in text
    assert " .. h100-1 pid 4000: Test failure common.cu:401" in text
    sweep = read_sweep(tmp_path)
    assert len(sweep.failures) == 1 and sweep.failures[0].failure == "crashed" and not sweep.skipped
    rep = analyze(sweep, source=str(tmp_path))
    lk = _link(rep, "h100-1", "h100-3")
    assert lk.status == "failed" and "sendrecv x8: crashed" in lk.evidence_text
    assert lk.problems[0].detail == ("h100-1: Test NCCL failure common.cu:1279 'remote process exited or there was a "
                                     "network error / '")
    assert rep.counts() == {"expected": 28, "measured": 27, "failed": 1, "missing": 0}
    assert [x.nodes for x in rep.links if x.status != "healthy"] == [("h100-1", "h100-3")]
    assert all(v.status == "healthy" for v in rep.nodes.values()) and rep.exit_code == 3
    md = rep.markdown()
    assert "Pairs: 28 expected (every pair of 8 nodes at 1, 2, 4, 8 GPUs per node): 27 measured, 1 failed" in md
    assert "| h100-1 - h100-3 | failed | - | " in md and "sendrecv x8: crashed" in md
    out = rep.to_json()
    assert out["pairs"]["failed"] == 1 and len(out["links"]) == 28
    j = next(x for x in out["links"] if x["nodes"] == ["h100-1", "h100-3"])
    assert j["problems"][0]["what"] == "crashed" and j["problems"][0]["log"].endswith("nccl_N2_G8_h100-1_h100-3.log:35")


@pytest.mark.parametrize("kind", ["truncated", "wrong data", "no output", "empty log"])
def test_every_kind_of_failed_log_is_failed_and_named(runs8, tmp_path, kind):
    write_sweep_logs(_fail(runs8, ("h100-0", "h100-6"), 4, "alltoall_perf", kind), tmp_path)
    rep = analyze(read_sweep(tmp_path))
    lk = _link(rep, "h100-0", "h100-6")
    want = "run x4: empty log" if kind == "empty log" else "alltoall x4: " + kind
    assert lk.status == "failed" and want in lk.evidence_text, lk.evidence_text
    assert rep.counts()["failed"] == 1 and rep.counts()["expected"] == 28
    assert sum(x.status != "healthy" for x in rep.links) == 1 and rep.exit_code == 3


def test_launcher_noise_in_a_complete_log_is_no_failure(runs8, tmp_path):
    write_sweep_logs(runs8, tmp_path)
    p = tmp_path / "nccl_N2_G4_h100-0_h100-6.log"
    p.write_text(p.read_text() + "srun: error: h100-6: task 3: Killed\n")
    rep = analyze(read_sweep(tmp_path))
    assert rep.healthy and rep.counts()["measured"] == 28


def test_missing_logs_and_listed_nodes_without_any_log(runs8, tmp_path):
    write_sweep_logs(runs8, tmp_path)
    (tmp_path / "nccl_N2_G2_h100-2_h100-7.log").unlink()
    rep = analyze(read_sweep(tmp_path))
    lk = _link(rep, "h100-2", "h100-7")
    assert lk.status == "missing" and "alltoall x2: no log; sendrecv x2: no log" in lk.evidence_text
    assert rep.counts() == {"expected": 28, "measured": 27, "failed": 0, "missing": 1} and rep.exit_code == 3
    # the operator's node list: a node that left no log at all fails, and each of its pairs is missing
    rep = analyze(read_sweep(tmp_path), nodes=[f"h100-{i}" for i in range(10)])
    assert rep.counts() == {"expected": 45, "measured": 27, "failed": 0, "missing": 18}
    for n in ("h100-8", "h100-9"):
        v = rep.nodes[n]
        assert (v.status, v.fault, v.failed_peers) == ("failed", "no runs", (9, 9))
    assert rep.nodes["h100-2"].status == "healthy"  # one missing pair of 9 is no node verdict
    assert rep.host_verdicts()["h100-9"]["status"] == "failed"


def test_a_node_failing_with_many_peers_is_failed(runs8, tmp_path):
    runs = runs8
    for peer in ("h100-0", "h100-1", "h100-2", "h100-6"):
        runs = _fail(runs, tuple(sorted(("h100-5", peer))), 8, "alltoall_perf", "crashed")
    write_sweep_logs(runs, tmp_path)
    rep = analyze(read_sweep(tmp_path))
    v = rep.nodes["h100-5"]
    assert (v.status, v.fault, v.failed_peers) == ("failed", "crashed", (4, 7))
    assert {n for n, x in rep.nodes.items() if x.status != "healthy"} == {"h100-5"}
    assert rep.to_json()["nodes"]["h100-5"]["failed_peers"] == "4/7"
    assert rep.host_verdicts()["h100-5"]["status"] == "failed" and rep.counts()["failed"] == 4
    # failures spread over the cluster are the links', not a node's
    spread = _fail(_fail(runs8, ("h100-0", "h100-1"), 8, "alltoall_perf", "crashed"), ("h100-2", "h100-3"), 4,
                   "sendrecv_perf", "truncated")
    d = tmp_path / "spread"
    write_sweep_logs(spread, d)
    rep = analyze(read_sweep(d))
    assert all(x.status == "healthy" for x in rep.nodes.values()) and rep.counts()["failed"] == 2


def test_a_test_that_died_before_its_device_table_is_attributed_by_file_name(runs8, tmp_path):
    write_sweep_logs(runs8, tmp_path)
    p = tmp_path / "nccl_N2_G1_h100-4_h100-5.log"
    p.write_text("# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807\n"
                 "# Collective test starting: alltoall_perf\n"
                 "# nThread 1 nGpus 1 minBytes 33554432 maxBytes 1073741824 step: 2(factor) warmup iters: 5 "
                 "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n"
                 "h100-4: Test CUDA failure common.cu:1030 'invalid device ordinal'\n"
                 " .. h100-4 pid 4242: Test failure common.cu:1161\n"
                 "--------------------------------------------------------------------------\n"
                 "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n")
    rep = analyze(read_sweep(tmp_path))
    lk = _link(rep, "h100-4", "h100-5")
    assert lk.status == "failed" and "alltoall x1: crashed" in lk.evidence_text
    assert "sendrecv x1: no log" in lk.evidence_text  # the wrapper never got to it
    assert "MPI_ABORT was invoked" in lk.problems[0].detail


def test_duplicated_logs_keep_each_pair_once(runs8, tmp_path):
    write_sweep_logs(runs8, tmp_path)
    (tmp_path / "again").mkdir()
    for p in sorted(tmp_path.glob("*G8*"))[:5]:
        shutil.copy(p, tmp_path / "again" / p.name)
    rep = analyze(read_sweep(tmp_path))
    assert rep.healthy and len(rep.links) == 28 and len({lk.nodes for lk in rep.links}) == 28


def test_heatmap_marks_failed_and_missing_cells(runs8, tmp_path):
    from bandpilot.health.pairwise_report import _marks

    write_sweep_logs(_fail(runs8, ("h100-1", "h100-3"), 8, "sendrecv_perf", "crashed"), tmp_path / "s")
    (tmp_path / "s" / "nccl_N2_G2_h100-2_h100-7.log").unlink()
    rep = analyze(read_sweep(tmp_path / "s"))
    assert _marks(rep) == {("sendrecv_perf", 8): {("h100-1", "h100-3"): "failed"},
                           ("alltoall_perf", 2): {("h100-2", "h100-7"): "missing"},
                           ("sendrecv_perf", 2): {("h100-2", "h100-7"): "missing"}}
    rep.write(tmp_path / "out")
    assert (tmp_path / "out" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert "Runs without a result:" in (tmp_path / "out" / "verify.md").read_text()


# ------------------------------------------------------------------------------------------
# property: nothing vanishes


NODES6 = ["h100-1", "h100-2", "h100-3", "h100-9", "h100-10", "h100-11"]  # natural order is not sorted order
EDITS = ["keep", "crashed", "truncated", "empty log", "no output", "delete", "duplicate", "repeat rows"]


@pytest.fixture(scope="module")
def runs6():
    return emulate_sweep(EmulatorFabric(_spec(12), seed=11), NODES6, seed=11, gpn=(1, 8))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_crashed_truncated_empty_and_duplicated_logs_never_vanish(runs6, tmp_path_factory, data):
    """Every expected pair appears exactly once with a status; a pair whose log was damaged is
    failed or missing; a sweep whose logs were only duplicated raises no alarm."""
    d = tmp_path_factory.mktemp("sweep")
    files = sorted({(r.nodes, r.gpn) for r in runs6})
    edits = {f: data.draw(st.sampled_from(EDITS), label=f"{f}") for f in files}
    runs = []
    for r in runs6:
        e = edits[(r.nodes, r.gpn)]
        fail = e in ("crashed", "truncated", "empty log", "no output") and (
            e in ("empty log", "no output") or r.collective == "sendrecv_perf")
        runs.append(PairRun(r.collective, r.gpn, r.nodes, r.busbw, r.repeat, failure=e if fail else ""))
    write_sweep_logs(runs, d)
    for (pair, g), e in edits.items():
        p = d / f"nccl_N2_G{g}_{pair[0]}_{pair[1]}.log"
        if e == "delete":
            p.unlink()
        elif e == "duplicate":
            (d / "rerun").mkdir(exist_ok=True)
            shutil.copy(p, d / "rerun" / p.name)
        elif e == "repeat rows":  # a tee artefact: every data row twice
            p.write_text("".join(ln + (ln if ln[:1] == " " else "") for ln in p.read_text().splitlines(True)))
    damaged = {frozenset(pair) for (pair, _), e in edits.items() if e not in ("keep", "duplicate", "repeat rows")}
    try:
        sweep = read_sweep(d)
    except DataError:  # only when nothing at all is left to read
        assert all(e == "delete" for e in edits.values())
        return
    rep = analyze(sweep, nodes=NODES6)
    # a node none of whose 8-GPU logs is left is taken to have fewer GPUs (and a note says so)
    short = {n for n in NODES6 if all(e == "delete" for (pair, g), e in edits.items() if g == 8 and n in pair)
             and any(e != "delete" for (pair, g), e in edits.items() if g == 1 and n in pair)}
    for n in short:
        assert any("never ran at 8 GPUs per node" in x and n in x for x in rep.notes), rep.notes
    damaged -= {pair for pair in damaged if pair & short
                and all(e in ("keep", "duplicate", "repeat rows") for (p, g), e in edits.items() if frozenset(p) == pair and g == 1)}
    pairs = [lk.nodes for lk in rep.links]
    assert sorted(pairs) == sorted(combinations(NODES6, 2)), "every expected pair exactly once"
    c = rep.counts()
    assert c["expected"] == 15 == c["measured"] + c["failed"] + c["missing"]
    for lk in rep.links:
        assert lk.status in ("healthy", "degraded", "failed", "missing")
        if frozenset(lk.nodes) in damaged:
            assert lk.status in ("failed", "missing") and lk.problems, (lk.nodes, lk.status, lk.evidence_text)
        else:
            assert lk.status == "healthy" and not lk.problems, (lk.nodes, lk.evidence_text)
    kinds = {(pair, g): e for (pair, g), e in edits.items()}
    for lk in rep.links:
        mine = {e for (pair, _), e in kinds.items() if frozenset(pair) == frozenset(lk.nodes)}
        if mine & {"crashed", "truncated", "empty log", "no output"}:
            assert lk.status == "failed"
    if not damaged:
        assert rep.healthy and rep.exit_code == 0, rep.markdown()


def test_a_run_that_dies_after_some_rows_is_crashed(runs8, tmp_path):
    write_sweep_logs(runs8, tmp_path)
    p = tmp_path / "nccl_N2_G4_h100-0_h100-6.log"
    lines = p.read_text().split("\n")
    at = next(i for i, ln in enumerate(lines) if ln.startswith("#") and "(B)" in ln) + 3  # after 2 rows
    lines[at:] = ["h100-6: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / '",
                  " .. h100-6 pid 4017: Test failure common.cu:401", ""]
    p.write_text("\n".join(lines))
    rep = analyze(read_sweep(tmp_path))
    lk = _link(rep, "h100-0", "h100-6")
    assert lk.status == "failed" and "alltoall x4: crashed" in lk.evidence_text
    assert "sendrecv x4: no log" in lk.evidence_text and rep.counts()["failed"] == 1


# ------------------------------------------------------------------------------------------
# command line


@pytest.mark.slow
def test_cli_nodes_list_json_and_gate(runs8, tmp_path, capsys):
    d = tmp_path / "sweep"
    runs = runs8
    for peer in ("h100-0", "h100-1", "h100-2", "h100-6"):
        runs = _fail(runs, tuple(sorted(("h100-5", peer))), 8, "alltoall_perf", "crashed")
    write_sweep_logs(runs, d)
    names = tmp_path / "nodes.txt"
    names.write_text("# the rack\n" + "\n".join(f"h100-{i}" for i in range(9)) + "\n")
    assert _cli(["verify", "--pairwise", str(d), "--nodes", str(names), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["pairs"] == {"expected": 36, "measured": 24, "failed": 4, "missing": 8}
    assert out["nodes"]["h100-8"]["status"] == "failed" and out["nodes"]["h100-5"]["failed_peers"] == "5/8"
    assert _cli(["verify", "--pairwise", str(d), "--nodes", "h100-0,h100-1,h100-2,h100-3,h100-4,h100-5,h100-6,h100-7",
                 "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["pairs"] == {"expected": 28, "measured": 24, "failed": 4, "missing": 0}
    for args, msg in ([["--nodes", "h100-0"], "at least 2 nodes"], [["--nodes", str(tmp_path / "no.txt")], "no such file"]):
        assert _cli(["verify", "--pairwise", str(d), *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and "Traceback" not in err
    # --gate: the failed node leaves the pool, a failed link is recorded on both hosts
    rows = gate_sweep(d, tmp_path, capsys)
    assert rows["h100-5"]["status"] == "failed" and rows["h100-5"]["gated_gpus"] == 8
    assert rows["h100-0"]["status"] == "healthy" and rows["h100-0"]["links"] == ["h100-0<->h100-5"]
    assert rows["h100-0"]["gated_gpus"] == 0 and rows["h100-3"]["links"] == []


@pytest.mark.slow
def test_the_guide_example_runs_as_written(tmp_path):
    """docs/guide/verify.md: its example runs from a project root and says what the guide says it says."""
    import os
    import re
    import subprocess
    import sys

    from test_pairwise import ROOT

    guide = (ROOT / "docs" / "guide" / "verify.md").read_text()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", guide, re.S)
    assert [b[0] for b in blocks] == ["bash"]
    (tmp_path / "params").symlink_to(ROOT / "params")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", blocks[0][1]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("112 logs written") and p.stdout.count("exit status 3") == 2
    for row in re.findall(r"^\| h100-\d - h100-\d \|.*$", guide, re.M):
        assert row in p.stdout, row
    assert "1 failed, 1 missing" in p.stdout and (tmp_path / "report" / "heatmap.png").is_file()
    v = json.loads((tmp_path / "verdicts.json").read_text())
    assert v["pairs"] == {"expected": 36, "measured": 26, "failed": 1, "missing": 9}
    assert '"pairs": {"expected": 36, "measured": 26, "failed": 1,\n"missing": 9}' in guide
    assert v["nodes"]["h100-8"]["status"] == "failed" and v["nodes"]["h100-8"]["fault"] == "no runs"


def test_a_log_whose_every_run_crashed_is_not_dropped(runs8, tmp_path):
    """Every run of the file without a row: the parser's strict reading rejects the whole file."""
    runs = _fail(_fail(runs8, ("h100-2", "h100-4"), 8, "alltoall_perf", "crashed"), ("h100-2", "h100-4"), 8,
                 "sendrecv_perf", "crashed")
    write_sweep_logs(runs, tmp_path)
    rep = analyze(read_sweep(tmp_path))
    lk = _link(rep, "h100-2", "h100-4")
    assert lk.status == "failed" and lk.evidence_text.endswith("alltoall x8: crashed; sendrecv x8: crashed")
    assert rep.counts() == {"expected": 28, "measured": 27, "failed": 1, "missing": 0}
