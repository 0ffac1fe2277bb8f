"""The dispatcher's state read from a real Slurm: busy GPU indices, jobs, drained nodes, races."""

from __future__ import annotations

import json
import re

import pytest

from bandpilot.dispatch.state import State
from bandpilot.integrations.slurm.hostlist import expand, expand_indices
from bandpilot.integrations.slurm.commands import SlurmError
from bandpilot.integrations.slurm.state import read_job_gpus, read_state

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def granted(c, job_id: str) -> dict[str, list[int]]:
    """node -> GPU indices Slurm says it granted ``job_id`` (every component of a heterogeneous job)."""
    out: dict[str, list[int]] = {}
    text = c.run(["scontrol", "show", "job", "-d", job_id]).stdout
    for m in re.finditer(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=\S*?\(IDX:([^)]*)\)", text):
        for node in expand(m.group(1)):
            out.setdefault(node, []).extend(expand_indices(m.group(2)))
    return {n: sorted(v) for n, v in out.items()}


def test_state_reflects_jobs_holding_gpus_and_drained_nodes(slurm_clean):
    c = slurm_clean
    n0, n1, n2, n3 = c.nodes[:4]
    a = c.hold({n1: 3}, seconds=300)
    b = c.hold({n2: 5, n3: 2}, seconds=300)  # uneven counts: a heterogeneous job
    c.wait_running(a)
    c.wait_running(b)
    c.run(["scontrol", "update", f"NodeName={n0}", "State=DRAIN", "Reason=maintenance window"])
    snap = read_state(c.spec, env=c.env)
    js = read_state(c.spec, env=c.env, form="json")
    assert js.state.to_dict() == snap.state.to_dict() and js.unavailable == snap.unavailable
    truth: dict[str, list[int]] = {}
    for jid in (a, b):
        for node, idx in granted(c, jid).items():
            truth.setdefault(node, []).extend(idx)
    assert sorted(len(v) for v in truth.values()) == [2, 3, 5]
    assert read_job_gpus(b, env=c.env) == {n: tuple(v) for n, v in granted(c, b).items()}  # both components
    alloc = snap.allocated()
    assert n0 not in alloc  # drained: none of its GPUs offered
    for node in (n1, n2, n3):
        assert alloc[node] == sorted(truth[node])
    free = set(snap.state.free_gpus)
    busy = {f"{n}:{i}" for n, idx in truth.items() for i in idx}
    assert not free & busy and not any(g.startswith(f"{n0}:") for g in free)
    assert len(free) == 32 - 8 - 10
    held = {g for j in snap.state.jobs for g in j.gpus}
    assert held == busy and len(snap.state.jobs) == 3  # the heterogeneous job is two Slurm jobs
    assert "maintenance window" in snap.unavailable[n0] and "DRAIN" in snap.unavailable[n0]
    # the document is what `select --state` takes
    again = State.from_dict(c.spec, json.loads(json.dumps(snap.state.to_dict())))
    assert again.free_gpus == snap.state.free_gpus


def test_reading_an_unknown_job_is_one_line(slurm_cluster):
    with pytest.raises(SlurmError, match=r"^scontrol -o show job -d 999999: .*Invalid job id specified"):
        read_job_gpus("999999", env=slurm_cluster.env)


def test_selection_on_the_slurm_state_never_takes_a_busy_gpu(slurm_clean):
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric

    c = slurm_clean
    jobs = [c.hold({c.nodes[0]: 5}, 300), c.hold({c.nodes[1]: 6, c.nodes[2]: 1}, 300)]
    for j in jobs:
        c.wait_running(j)
    snap = read_state(c.spec, env=c.env)
    disp = Dispatcher(make_fabric(c.spec))
    busy = {g for j in snap.state.jobs for g in j.gpus}
    assert len(busy) == 12
    for k in (2, 5, 8, 13, 20):
        picked = disp.select(k, snap.state).gpus
        assert len(picked) == k and not set(picked) & busy


def test_a_read_racing_job_ends_never_fails(slurm_clean):
    """Jobs that start and end while the state is read: every read is a valid state, never an error."""
    import time

    c = slurm_clean
    for i in range(8):
        c.run(["sbatch", "-o", "/dev/null", "-w", c.nodes[i % 4], "--gres=gpu:2", "--wrap", f"sleep {0.5 + i % 3}"])
    counts: list[int] = []
    end = time.monotonic() + 90
    forms = iter(["json", "text"] * 1000)
    while time.monotonic() < end:
        snap = read_state(c.spec, env=c.env, form=next(forms))
        State.from_dict(c.spec, snap.state.to_dict())
        counts.append(len(snap.state.jobs))
        if max(counts) and not c.job_ids():
            break
    assert max(counts) >= 1 and counts[-1] < max(counts), counts  # reads saw jobs come and go


def test_cli_state_prints_and_writes_the_state(slurm_clean, tmp_path, monkeypatch, capsys):
    from bandpilot.cli.main import main

    c = slurm_clean
    j = c.hold({c.nodes[3]: 4}, 300)
    c.wait_running(j)
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)
    spec = str(c.spec.path)
    assert main(["slurm", "state", "--cluster", spec]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert len(doc["free"]) == 28 and [len(jb["gpus"]) for jb in doc["jobs"]] == [4]
    assert "28 free GPUs; 1 jobs hold 4 GPUs" in cap.err
    out = tmp_path / "state.json"
    assert main(["slurm", "state", "--cluster", spec, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == doc
    assert main(["select", "3", "--state", str(out), "--cluster", spec, "--json"]) == 0
