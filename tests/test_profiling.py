"""Profiling: plan, command lines, emulated and scripted runs, resume, CLI and DVC tracking."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bandpilot.data import planning, profiling, runners
from bandpilot.topology.cluster import load_cluster, spec_from_dict
from bandpilot.data.dataset import DATASET_FILE, dataset_hash, load_dataset
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.topology.nccl_log import parse

ROOT = Path(__file__).resolve().parents[1]
HET4MIX = ROOT / "params" / "clusters" / "het4mix.yaml"
MIB16 = 16 * 1024 * 1024

TOPO4 = ["X NV2 PXB PXB", "NV2 X PXB PXB", "PXB PXB X NV2", "PXB PXB NV2 X"]
TINY = {
    "name": "tiny",
    "collective": "all_gather_perf",
    "message_bytes": MIB16,
    "hosts": [
        {"name": "t0", "gpu": "A100", "topology": TOPO4},
        {"name": "t1", "gpu": "A100", "topology": TOPO4},
        {"name": "t2", "gpu": "V100", "topology": ["X NV1", "NV1 X"]},
    ],
    "network": {"nic_gbps": 200, "rails_per_host": 4},
    "emulator": {"seed": 3, "noise": 0.02},
}


@pytest.fixture(scope="module")
def het4mix():
    return load_cluster(HET4MIX)


@pytest.fixture(scope="module")
def tiny():
    return spec_from_dict(TINY)


class Counting:
    """Wraps a runner; records what ran (thread-safe)."""

    def __init__(self, inner):
        self.inner = inner
        self.ids: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, m):
        with self._lock:
            self.ids.append(m.id)
        return self.inner(m)


# ------------------------------------------------------------------------------------------
# plan


def test_plan_covers_every_intra_subset_and_samples_cross_host(het4mix):
    plan = planning.plan(het4mix, cross_host_samples=60, seed=5)
    intra = [m for m in plan if not m.cross_host]
    cross = [m for m in plan if m.cross_host]
    assert len(intra) == 4 * 255
    for h, host in enumerate(het4mix.hosts):
        masks = sorted(m.masks[h] for m in intra if m.hosts == (host.name,))
        assert masks == list(range(1, 256))
    assert len(cross) == 60
    assert len({m.masks for m in plan}) == len(plan)  # no allocation twice
    assert len({m.id for m in plan}) == len(plan)
    # stratified: the host levels 2, 3, 4 share the sample evenly, patterns spread within a level
    levels = Counter(len(m.hosts) for m in cross)
    assert levels == {2: 20, 3: 20, 4: 20}
    assert len({m.stratum for m in cross}) == 60  # fewer samples than strata: all distinct
    for m in cross:
        k, pat = m.stratum.split(":")
        assert int(k[:-1]) == len(m.hosts)
        assert sorted(m.counts, reverse=True) == [int(c) for c in pat.split("+")]
        assert len(m.gpus) == sum(m.counts)


def test_plan_is_deterministic_by_seed(het4mix):
    a = planning.plan(het4mix, cross_host_samples=30, seed=1)
    b = planning.plan(het4mix, cross_host_samples=30, seed=1)
    c = planning.plan(het4mix, cross_host_samples=30, seed=2)
    assert [m.id for m in a] == [m.id for m in b]
    assert [m.id for m in a] != [m.id for m in c]


def test_plan_covers_all_strata_when_the_sample_is_large(tiny):
    plan = planning.plan(tiny, cross_host_samples=120, seed=0)
    cross = [m for m in plan if m.cross_host]
    # 2 hosts: patterns over {1..4}x{1..4} feasible with one 2-GPU host; 3 hosts: one count <= 2
    strata = {m.stratum for m in cross}
    assert "2h:1+1" in strata and "2h:4+4" in strata and "2h:4+2" in strata and "3h:4+4+2" in strata
    assert "2h:3+3" in strata and "3h:3+3+3" not in strata  # infeasible: t2 has 2 GPUs
    assert len(cross) == 120 and len({m.masks for m in cross}) == 120
    assert sum(not m.cross_host for m in plan) == 15 + 15 + 3


def test_plan_argument_checks(tiny):
    with pytest.raises(SpecError, match="must include the cluster's message size"):
        planning.plan(tiny, sizes=[1 << 20])
    with pytest.raises(SpecError, match="factor-2 ladder"):
        planning.plan(tiny, sizes=[MIB16, 3 * MIB16])
    with pytest.raises(SpecError, match="cross_host_samples"):
        planning.plan(tiny, cross_host_samples=-1)


def test_repeats_get_their_own_ids(tiny):
    plan = planning.plan(tiny, cross_host_samples=2, repeats=2)
    assert len(plan) == 2 * (33 + 2)
    assert sum(m.id.endswith("@r1") for m in plan) == 35


# ------------------------------------------------------------------------------------------
# command lines


def _find(plan, gpus):
    return next(m for m in plan if m.gpus == tuple(gpus))


def test_command_lines(het4mix):
    plan = planning.plan(het4mix, cross_host_samples=0, sizes=[MIB16])
    m = _find(plan, ["v100:0", "v100:1", "v100:3"])
    assert runners.command_lines(m, het4mix) == ["CUDA_VISIBLE_DEVICES=0,1,3 all_gather_perf -b 16M -e 16M -f 2 -g 3"]
    masks = het4mix.to_mask(["v100:0", "v100:3", "a800:5"])
    cross = planning.planned_measurement(het4mix, masks, (MIB16 // 2, MIB16, MIB16 * 2), "2h:2+1", 0)
    assert isinstance(cross, planning.PlannedMeasurement) and cross.id == "x-v100-03+a800-5"
    (line,) = runners.command_lines(cross, het4mix, mpirun="/opt/ompi/bin/mpirun")
    assert line == (
        "/opt/ompi/bin/mpirun --tag-output "
        "-np 2 -H v100:2 -x CUDA_VISIBLE_DEVICES=0,3 all_gather_perf_mpi -b 8M -e 32M -f 2 -g 1 : "
        "-np 1 -H a800:1 -x CUDA_VISIBLE_DEVICES=5 all_gather_perf_mpi -b 8M -e 32M -f 2 -g 1"
    )
    assert runners.command_lines(m, het4mix, binary="/nccl-tests/build/all_gather_perf")[0].startswith(
        "CUDA_VISIBLE_DEVICES=0,1,3 /nccl-tests/build/all_gather_perf "
    )


# ------------------------------------------------------------------------------------------
# emulator runner: nccl-tests logs that the parser reads back


def test_emulated_logs_parse_back(het4mix):
    fab = EmulatorFabric(het4mix)
    run = runners.EmulatorRunner(het4mix, fab)
    plan = planning.plan(het4mix, cross_host_samples=12, seed=3)
    for m in [plan[0], _find(plan, ["a6000:0", "a6000:1", "a6000:5"]), *[p for p in plan if p.cross_host][:6]]:
        text = run(m)
        res = parse(text, source=m.log)
        assert res.ok and res.collective == "all_gather_perf"
        assert len(res.devices) == m.n_gpus
        assert Counter(d.host for d in res.devices) == Counter(g.split(":")[0] for g in m.gpus)
        assert len(res.rows) == 3 and "NCCL INFO" in text
        assert ("<stdout>:" in text) == m.cross_host
        row = min(res.rows, key=lambda r: abs(r.size - MIB16))
        assert 0 <= MIB16 - row.size < 8 * m.n_gpus
        want = fab.measure(np.array([m.masks]))[0]
        assert row.out_of_place.busbw == pytest.approx(want, abs=0.006)
        # physical GPUs show up as bus ids, devices are renumbered from 0 per host
        host = m.hosts[0]
        local = [d for d in res.devices if d.host == host]
        assert [d.device for d in local] == list(range(len(local)))


# ------------------------------------------------------------------------------------------
# profile run on the emulated het4mix


@pytest.fixture(scope="module")
def het4mix_profile(het4mix, tmp_path_factory):
    out = tmp_path_factory.mktemp("het4mix")
    counting = Counting(runners.EmulatorRunner(het4mix))
    t0 = time.perf_counter()
    rep = profiling.run(het4mix, out, runner=counting, cross_host_samples=8, seed=0, progress=False)
    return out, rep, counting, time.perf_counter() - t0


@pytest.mark.slow
def test_profile_het4mix(het4mix, het4mix_profile):
    out, rep, counting, secs = het4mix_profile
    d = out / "data" / "het4mix"
    assert rep.dataset_dir == d
    assert (rep.planned, rep.measured, rep.skipped, rep.failed) == (1028, 1028, 0, 0)
    assert len(counting.ids) == 1028
    assert {p.name for p in d.iterdir()} >= {"raw", "manifest.jsonl", "measurements.parquet", "cluster.yaml"}
    assert len(list((d / "raw").glob("*.log"))) == 1028
    ds = load_dataset(d)
    assert len(ds.single_host()) == 4 * 255 and len(ds.cross_host()) == 8
    assert rep.ingest is not None and rep.ingest.rows == 1028
    fab = EmulatorFabric(het4mix)
    assert np.allclose(ds.stage1_tables(), fab.stage1, rtol=0.12)
    entries = [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]
    assert len(entries) == 1028 and {e["status"] for e in entries} == {"done"}
    assert all(e["command"] and e["log"].startswith("raw/") for e in entries)
    assert load_cluster(d).fingerprint() == het4mix.fingerprint()
    assert secs < 30


@pytest.mark.slow
def test_resume_does_no_work_and_remeasures_a_deleted_log(het4mix, het4mix_profile, tmp_path):
    src, _, _, _ = het4mix_profile
    shutil.copytree(src / "data", tmp_path / "data")
    plan = planning.plan(het4mix, cross_host_samples=8, seed=0)
    counting = Counting(runners.EmulatorRunner(het4mix))
    rep = profiling.run(het4mix, tmp_path, runner=counting, measurements=plan, progress=False, do_ingest=False)
    assert counting.ids == [] and (rep.measured, rep.skipped) == (0, 1028)

    d = tmp_path / "data" / "het4mix"
    victim = plan[300]
    (d / victim.log).unlink()
    rep = profiling.run(het4mix, tmp_path, runner=counting, measurements=plan, progress=False)
    assert counting.ids == [victim.id] and (rep.measured, rep.skipped) == (1, 1027)
    assert (d / victim.log).is_file() and len(load_dataset(d)) == 1028


def test_log_written_before_an_interruption_is_recovered(tiny, tmp_path):
    plan = planning.plan(tiny, cross_host_samples=3)
    profiling.run(tiny, tmp_path, measurements=plan, progress=False, do_ingest=False, jobs=1)
    d = tmp_path / "data" / "tiny"
    entries = [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]
    entries[4]["status"] = "planned"  # the log landed, the manifest update did not
    entries[5]["status"] = "planned"
    (d / entries[5]["log"]).write_text("garbage\n")  # half a log cannot happen, but a bad one may
    (d / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    counting = Counting(runners.EmulatorRunner(tiny))
    rep = profiling.run(tiny, tmp_path, runner=counting, measurements=plan, progress=False, do_ingest=False)
    assert counting.ids == [entries[5]["id"]] and rep.skipped == len(plan) - 1


def test_resume_refuses_a_different_cluster(tiny, tmp_path):
    profiling.run(tiny, tmp_path, cross_host_samples=1, progress=False, do_ingest=False, jobs=1)
    other = dict(TINY, hosts=[dict(h, gpu="H100") for h in TINY["hosts"]])
    with pytest.raises(DataError, match="different cluster spec"):
        profiling.run(spec_from_dict(other), tmp_path, cross_host_samples=1, progress=False)


def test_parallel_runs_never_share_a_host(tiny, tmp_path):
    active: Counter = Counter()
    lock = threading.Lock()
    peak = [0]
    inner = runners.EmulatorRunner(tiny)

    def runner(m):
        with lock:
            for h in m.hosts:
                assert active[h] == 0, f"host {h} used twice at once"
                active[h] += 1
            peak[0] = max(peak[0], sum(active.values()))
        time.sleep(0.002)
        with lock:
            for h in m.hosts:
                active[h] -= 1
        return inner(m)

    rep = profiling.run(tiny, tmp_path, runner=runner, cross_host_samples=10, jobs=3, progress=False)
    assert rep.failed == 0 and rep.measured == 33 + 10
    assert peak[0] >= 2  # hosts really work concurrently


def test_failed_runs_are_recorded_and_retried(tiny, tmp_path):
    inner = runners.EmulatorRunner(tiny)
    plan = planning.plan(tiny, cross_host_samples=2)
    bad_exit, bad_log = plan[7].id, plan[9].id

    def flaky(m):
        if m.id == bad_exit:
            raise runners.RunFailed(f"{m.id}: exit status 1: NCCL error")
        text = inner(m)
        if m.id == bad_log:  # a rank missing from the output
            text = "\n".join(s for s in text.splitlines() if "Rank  1 " not in s)
        return text

    rep = profiling.run(tiny, tmp_path, runner=flaky, measurements=plan, progress=False, jobs=1)
    assert rep.failed == 2 and rep.measured == len(plan) - 2
    errors = dict(rep.failures)
    assert "exit status 1" in errors[bad_exit]
    assert "device table lists" in errors[bad_log]
    d = tmp_path / "data" / "tiny"
    assert (d / f"raw/{bad_log}.log.failed").is_file() and not (d / f"raw/{bad_log}.log").exists()
    assert rep.ingest is not None and rep.ingest.rows == len(plan) - 2
    assert rep.ingest.skipped == {"failed": 2}
    counting = Counting(inner)
    rep = profiling.run(tiny, tmp_path, runner=counting, measurements=plan, progress=False)
    assert sorted(counting.ids) == sorted([bad_exit, bad_log]) and rep.failed == 0
    assert rep.ingest.rows == len(plan)


def test_ssh_runner_runs_the_command_lines(tiny, tmp_path):
    """The real path with stand-ins for ssh and mpirun that print prepared nccl-tests output."""
    plan = planning.plan(tiny, cross_host_samples=1)
    single = next(m for m in plan if m.n_gpus == 3)
    cross = next(m for m in plan if m.cross_host)
    emu = runners.EmulatorRunner(tiny)
    seen = tmp_path / "argv.txt"
    fake = tmp_path / "fake.py"
    fake.write_text(
        "import sys, pathlib\n"
        f"pathlib.Path({str(seen)!r}).open('a').write(repr(sys.argv[1:]) + '\\n')\n"
        "line = ' '.join(sys.argv[1:])\n"
        f"name = {single.id!r} if 'CUDA_VISIBLE_DEVICES=' in line and '--tag-output' not in line else {cross.id!r}\n"
        f"sys.stdout.write(pathlib.Path({str(tmp_path)!r}, name + '.out').read_text())\n"
    )
    for m in (single, cross):
        (tmp_path / f"{m.id}.out").write_text(emu(m))
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    mpirun.chmod(0o755)
    ssh = runners.SshRunner(tiny, ssh=(sys.executable, str(fake)), mpirun=str(mpirun))
    rep = profiling.run(tiny, tmp_path / "out", runner=ssh, measurements=[single, cross], progress=False, jobs=1)
    assert rep.failed == 0 and rep.ingest.rows == 2
    calls = seen.read_text().splitlines()
    assert "'t" in calls[0] and "CUDA_VISIBLE_DEVICES=" in calls[0]  # ssh <host> <line>
    assert "'--tag-output'" in calls[1] and "'-H'" in calls[1]

    broken = runners.SshRunner(tiny, ssh=("sh", "-c", "echo boom >&2; exit 3", "sh"))
    rep = profiling.run(tiny, tmp_path / "out2", runner=broken, measurements=[single], progress=False)
    assert rep.failed == 1 and "exit status 3: boom" in rep.failures[0][1] and rep.ingest is None


# ------------------------------------------------------------------------------------------
# CLI


def test_cli_dry_run_prints_commands_only(tmp_path, capsys):
    from bandpilot.cli.main import main

    code = main(["profile", "--cluster", str(HET4MIX), "--out", str(tmp_path / "o"), "--dry-run", "--samples", "5"])
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "plan: 1025 measurements (1020 single-host, 5 cross-host) on 4 hosts of het4mix"
    assert len(out) == 1026
    assert sum(s.startswith("launcher$ mpirun --tag-output -np ") for s in out) == 5
    assert any(re.fullmatch(r"v100\$ CUDA_VISIBLE_DEVICES=0,1,3 all_gather_perf -b 8M -e 32M -f 2 -g 3", s) for s in out)
    assert all("all_gather_perf_mpi" in s and "-g 1" in s for s in out if "mpirun" in s)
    assert not (tmp_path / "o").exists()


def test_cli_profile_and_errors(tmp_path, capsys):
    import yaml

    from bandpilot.cli.main import main

    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "o"
    code = main(["profile", "-c", str(spec), "--out", str(out), "--samples", "3", "--no-track", "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "tiny: 36 planned, 36 measured" in text and "33 single-host, 3 cross-host" in text
    assert (out / "data" / "tiny" / DATASET_FILE).is_file() and not (out / ".dvc").exists()

    assert main(["profile", "-c", str(spec), "--out", str(out), "--runner", "slurm", "--no-track"]) == 2
    assert "error: unknown runner 'slurm'" in capsys.readouterr().err
    assert main(["profile", "-c", str(tmp_path / "none.yaml"), "--out", str(out)]) == 2
    assert "error: cluster spec not found" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# DVC


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ci@example.com")
    _git(repo, "config", "user.name", "CI")
    (repo / ".gitignore").write_text("/data/\n")
    return repo


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_dvc_tracking_is_idempotent(tiny, tmp_path):
    from bandpilot.data import dvc

    repo = _git_repo(tmp_path)
    profiling.run(tiny, repo, cross_host_samples=2, progress=False, jobs=1)

    md5 = dvc.track("data", repo)
    assert md5.endswith(".dir")
    assert dvc.read_md5(repo / "data.dvc") == md5
    cfg = (repo / ".dvc" / "config").read_text()
    assert "autostage = True" in cfg and "analytics = False" in cfg and "url = ../.dvc-remote" in cfg
    staged = _git(repo, "diff", "--cached", "--name-only").split()
    assert {"data.dvc", ".dvc/config"} <= set(staged)
    _git(repo, "commit", "-qm", "data v1")

    assert dvc.track("data", repo) == md5  # unchanged data: no new version
    assert _git(repo, "status", "--porcelain") == ""
    assert dvc.push(repo) > 0 and any((repo / ".dvc-remote").rglob("*"))
    ds = repo / "data" / "tiny"
    assert dataset_hash(ds) == md5  # tracked and current: the DVC version

    profiling.run(tiny, repo, cross_host_samples=4, progress=False, jobs=1)  # more data
    assert dataset_hash(ds) != md5  # stale DVC record: falls back to the file's own md5
    md5b = dvc.track("data", repo)
    assert md5b != md5 and dataset_hash(ds) == md5b
    assert _git(repo, "status", "--porcelain").split() == ["M", "data.dvc"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_scheduled_tracking_leaves_git_alone_or_commits_the_version(tiny, tmp_path):
    from bandpilot.data import dvc

    repo = _git_repo(tmp_path)
    (repo / "notes.txt").write_text("operator's own work\n")
    _git(repo, "add", "notes.txt")  # staged by the operator: must stay staged, never committed by us
    profiling.run(tiny, repo, cross_host_samples=2, progress=False, jobs=1)

    md5 = dvc.track("data", repo, git="leave")
    assert _git(repo, "diff", "--cached", "--name-only").split() == ["notes.txt"]  # index untouched
    assert (repo / "data.dvc").is_file()
    with pytest.raises(DataError, match="unknown git mode 'push'"):
        dvc.track("data", repo, git="push")

    assert dvc.track("data", repo, git="commit") == md5
    log = _git(repo, "log", "--format=%s", "--name-only")
    assert f"data: dataset version {md5}" in log and "data.dvc" in log and "notes.txt" not in log
    assert _git(repo, "diff", "--cached", "--name-only").split() == ["notes.txt"]
    head = _git(repo, "rev-parse", "HEAD")
    assert dvc.track("data", repo, git="commit") == md5 and _git(repo, "rev-parse", "HEAD") == head  # same version: no commit

    profiling.run(tiny, repo, cross_host_samples=4, progress=False, jobs=1)
    md5b = dvc.track("data", repo, git="commit")
    assert md5b != md5 and _git(repo, "log", "-1", "--format=%s").strip() == f"data: dataset version {md5b} (data)"
