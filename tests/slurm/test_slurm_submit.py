"""Jobs on BandPilot's GPUs through real Slurm daemons: `bandpilot slurm submit` (exact nodes, per-node
counts and, with per-index gres types, indices; the rank map in every task), the job_submit.lua path
with its fall-through, and `queue show -f slurm` accepted by sbatch as printed."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest
from harness import SlurmCluster, free_ports

from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.integrations.slurm.service import Placer, Service, lua_script
from bandpilot.integrations.slurm.submit import read_live, submit

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

ROOT = Path(__file__).resolve().parents[2]
TASK = re.compile(r"TASK node=(\S+) rank=(\S*) procid=(\d+) local=(\S*) cvd=(\S*)")
BODY = """srun bash -c 'echo "TASK node=$SLURMD_NODENAME rank=$RANK procid=$SLURM_PROCID local=$LOCAL_RANK cvd=$CUDA_VISIBLE_DEVICES"'
sleep 2
"""


@pytest.fixture(scope="module")
def typed(slurm_available, tmp_path_factory):
    """4 x 8 GPUs with one gres type per GPU index (the harness runs backfill, which starts
    heterogeneous jobs, every 2 s) and job_submit.lua asking an endpoint on a free port."""
    work = tmp_path_factory.mktemp("slurm-typed")
    port = free_ports(1)[0]
    (work / "etc").mkdir()
    (work / "etc" / "job_submit.lua").write_text(lua_script(f"http://127.0.0.1:{port}", 1.0))
    c = SlurmCluster(work, ROOT / "params" / "clusters" / "h100.yaml", gpu_type="{gpu}_{index}",
                     extra_conf="JobSubmitPlugins=lua")
    c.lua_port = port
    with c:
        yield c


@pytest.fixture
def clean(typed):
    typed.cancel_all()
    yield typed
    typed.cancel_all()


def _tasks(c, job_id: str, out: Path, timeout: float = 60.0) -> list[tuple[str, int, int, int, list[int]]]:
    """(node, RANK, SLURM_PROCID, LOCAL_RANK, CUDA_VISIBLE_DEVICES) of every task once the job ended."""
    end = time.monotonic() + timeout
    while c.run(["squeue", "-h", "-j", job_id], check=False).stdout.strip() and time.monotonic() < end:
        time.sleep(0.3)
    rows = []
    for m in TASK.finditer(out.read_text()):
        node, rank, procid, local, cvd = m.groups()
        rows.append((node, int(rank), int(procid), int(local), [int(x) for x in cvd.split(",") if x]))
    return rows


def _check_tasks(rows, ranks: list[str]) -> None:
    """Every rank ran once, on its node, with its GPU at CUDA_VISIBLE_DEVICES[LOCAL_RANK]."""
    assert sorted(r[1] for r in rows) == list(range(len(ranks))), rows
    for node, rank, _procid, local, cvd in rows:
        want_node, _, want_gpu = ranks[rank].rpartition(":")
        assert node == want_node and cvd[local] == int(want_gpu), (rank, node, cvd, ranks)


def test_uneven_split_gets_exact_nodes_counts_and_indices(clean, tmp_path):
    c = clean
    held = c.hold({c.nodes[0]: 3, c.nodes[1]: 5, c.nodes[2]: 8, c.nodes[3]: 8})
    c.wait_running(held)
    busy = set(read_live(c.spec, c.env).snapshot.allocated()[c.nodes[0]])
    sub = submit(Dispatcher(make_fabric(c.spec)), c.spec, 8, BODY, options=[f"--output={tmp_path}/%j.out"],
                 env=c.env, wait=60)
    counts = {n: sum(g.startswith(n + ":") for g in sub.ranks) for n in c.nodes[:2]}
    assert counts == {c.nodes[0]: 5, c.nodes[1]: 3} and not sub.single_job and sub.indices_pinned
    assert not {int(g.rpartition(":")[2]) for g in sub.ranks if g.startswith(c.nodes[0] + ":")} & busy
    assert sub.verdict() == {"nodes": True, "counts": True, "indices": True}, (sub.grant, sub.ranks)
    assert sub.granted_gbps == pytest.approx(sub.predicted_gbps)
    _check_tasks(_tasks(c, sub.job_id, tmp_path / f"{sub.job_id}.out"), sub.ranks)


@pytest.mark.parametrize("k,shape,hold", [(12, "tp=4,dp=3", {0: 2, 2: 4}), (6, None, {0: 6, 1: 1, 2: 7, 3: 2}),
                                          (16, "tp=8,dp=2", {})])
def test_submissions_follow_bandpilot_on_busy_clusters(clean, tmp_path, k, shape, hold):
    c = clean
    if hold:
        h = c.hold({c.nodes[i]: n for i, n in hold.items()})
        c.wait_running(h)
    before = read_live(c.spec, c.env).snapshot
    busy = {f"{n}:{i}" for n, idx in before.allocated().items() for i in idx}
    sub = submit(Dispatcher(make_fabric(c.spec)), c.spec, k, BODY, options=[f"--output={tmp_path}/%j.out"],
                 shape=shape, env=c.env, wait=60)
    assert not set(sub.ranks) & busy  # never a busy GPU
    assert sub.verdict() == {"nodes": True, "counts": True, "indices": True}, (sub.grant, sub.ranks)
    _check_tasks(_tasks(c, sub.job_id, tmp_path / f"{sub.job_id}.out"), sub.ranks)


def test_untyped_cluster_pins_counts_and_names_the_granted_indices(slurm_clean, tmp_path):
    c = slurm_clean  # gres.conf without per-index types: Slurm picks the indices
    h = c.hold({c.nodes[0]: 3, c.nodes[1]: 5, c.nodes[2]: 8, c.nodes[3]: 8})
    c.wait_running(h)
    sub = submit(Dispatcher(make_fabric(c.spec)), c.spec, 8, BODY, options=[f"--output={tmp_path}/%j.out"],
                 env=c.env, wait=90)
    assert not sub.indices_pinned and "--gres=gpu:5" in sub.script and "--gres=gpu:3" in sub.script
    v = sub.verdict()
    assert v["nodes"] and v["counts"], (sub.grant, sub.ranks)
    rows = _tasks(c, sub.job_id, tmp_path / f"{sub.job_id}.out", timeout=90)
    for node, rank, _p, local, cvd in rows:  # each task's device is one Slurm granted its node
        assert node == sub.ranks[rank].rpartition(":")[0] and cvd[local] in sub.grant.gpus[node]


def test_cli_submit_reports_and_bad_input_is_one_line(clean, tmp_path, monkeypatch, capsys):
    from bandpilot.cli.main import main

    c = clean
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/%j.out\n{BODY.replace('sleep 2', 'sleep 30')}")
    spec = str(ROOT / "params" / "clusters" / "h100.yaml")
    assert main(["slurm", "submit", "-k", "4", "--cluster", spec, "--time=5", str(script)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"submitted job \d+ .* asked h100-\d:[\d,]+ - [\d.]+ GB/s predicted", out), out
    assert "granted" in out and "as asked" in out, out
    jid = re.search(r"submitted job (\d+)", out).group(1)
    assert main(["slurm", "check", jid, "--cluster", spec]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"job {jid} .* asked h100-\d:[\d,]+ - [\d.]+ GB/s predicted", out) and "as asked" in out, out
    other = c.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 30"]).stdout.strip()
    assert main(["slurm", "check", other, "--cluster", spec]) == 2
    assert "not submitted by BandPilot" in capsys.readouterr().err
    bad = [
        (["-k", "4", "--cluster", spec, "--allowed-hosts", "nope-7", str(script)], "nope-7"),
        (["-k", "4", "--cluster", spec, "--partition=nosuch", str(script)], "nosuch"),
        (["-k", "4", "--cluster", spec, "--nodes=2", str(script)], "--nodes"),
        (["-k", "99", "--cluster", spec, str(script)], "99 GPUs"),
        (["-k", "4", "--cluster", spec, str(tmp_path / "missing.sh")], "missing.sh"),
    ]
    n_jobs = len(c.job_ids())
    for args, word in bad:
        assert main(["slurm", "submit", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error:") and word in err and err.count("\n") == 1, err
    assert len(c.job_ids()) == n_jobs  # nothing (half-)submitted
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm clients
    assert main(["slurm", "submit", "-k", "4", "--cluster", spec, str(script)]) == 2
    assert "not found on PATH" in capsys.readouterr().err


def test_job_submit_lua_places_plain_gpu_jobs_and_falls_through(clean):
    c = clean
    h = c.hold({c.nodes[0]: 5, c.nodes[2]: 2})
    c.wait_running(h)
    svc = Service(Placer(Dispatcher(make_fabric(c.spec)), c.spec, env=c.env, refresh=0.5), port=c.lua_port).start()
    try:
        got = []
        for n in (2, 8, 12):
            jid = c.run(["sbatch", "--parsable", f"--gpus={n}", "-o", "/dev/null", "--wrap", "sleep 30"]).stdout.strip()
            c.wait_running(jid)
            detail = c.run(["scontrol", "-o", "show", "job", "-d", jid]).stdout
            answer = svc.placer.answers[-1]
            want = {}
            for g in answer["gpus"].split(","):
                node, _, i = g.rpartition(":")
                want.setdefault(node, set()).add(int(i))
            granted = {m.group(1): m.group(2) for m in re.finditer(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", detail)}
            nodes = set()
            for expr in granted:
                from bandpilot.integrations.slurm.hostlist import expand

                nodes |= set(expand(expr))
            assert nodes == set(want), (detail, answer)
            got.append(answer["exact"])
        assert "indices" in got
    finally:
        svc.stop()
    # BandPilot stopped: the job still runs where Slurm puts it, and the log says why
    jid = c.run(["sbatch", "--parsable", "--gpus=2", "-o", "/dev/null", "--wrap", "sleep 5"]).stdout.strip()
    c.wait_running(jid)
    assert re.search(r"bandpilot: job wrap \(--gpus=2\): no answer within 1 s.*Slurm chooses", c.log())
    # an endpoint that accepts but never answers: the time limit holds, the job still runs
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    silent.bind(("127.0.0.1", c.lua_port))
    silent.listen(8)
    try:
        t0 = time.monotonic()
        jid = c.run(["sbatch", "--parsable", "--gpus=1", "-o", "/dev/null", "--wrap", "sleep 5"]).stdout.strip()
        assert time.monotonic() - t0 < 5
        c.wait_running(jid)
    finally:
        silent.close()
    assert re.search(r"bandpilot: job wrap \(--gpus=1\): no answer within 1 s.*Slurm chooses", c.log())


def test_queue_show_slurm_script_is_accepted_as_printed(slurm_clean, tmp_path, capsys):
    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.cli.main import main

    c = slurm_clean
    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(c.spec)
    q.submit(store, [{"id": "warm", "k": 3, "tenant": "t"}, {"id": "big", "k": 11, "tenant": "t", "shape": "tp=1,dp=11"}])
    sched.run_batch(store, Dispatcher(make_fabric(c.spec)), "recommended")
    capsys.readouterr()
    assert main(["queue", "show", "big", "--format", "slurm", "--store", url]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash\n")
    jid = c.run(["sbatch", "--parsable", "-o", "/dev/null"], input=script).stdout.strip()  # as printed
    assert jid.isdigit()
    c.cancel_all()
    out = tmp_path / "run.out"
    runnable = script.replace("srun --ntasks=11 YOUR_PROGRAM", BODY)
    jid = c.run(["sbatch", "--parsable", "-o", str(out)], input=runnable).stdout.strip()
    ranks = q.assignment(store, "big")["ranks"]
    rows = _tasks(c, jid, out, timeout=90)
    assert sorted(r[1] for r in rows) == list(range(11)), out.read_text()
    for node, rank, _p, _local, _cvd in rows:
        assert node == ranks[rank].rpartition(":")[0]


def test_cli_serve_answers_and_lua_is_written(clean, tmp_path):
    import subprocess
    import sys
    import urllib.request

    c = clean
    port = free_ports(1)[0]
    spec = str(ROOT / "params" / "clusters" / "h100.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "bandpilot", "slurm", "serve", "--port", str(port), "--cluster", spec],
                            env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "place?gpus=N" in proc.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/place?gpus=4", timeout=10) as r:
            reply = dict(line.split("=", 1) for line in r.read().decode().splitlines())
        assert len(reply["gpus"].split(",")) == 4 and reply["req_nodes"] in c.nodes and reply["exact"] == "indices"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/place?gpus=x", timeout=10)
            raise AssertionError("gpus=x answered")
        except urllib.error.HTTPError as exc:
            assert exc.code == 409 and "positive integer" in exc.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    out = tmp_path / "job_submit.lua"
    r = subprocess.run([sys.executable, "-m", "bandpilot", "slurm", "lua", "-o", str(out), "--url", f"http://127.0.0.1:{port}"],
                       env=c.env, capture_output=True, text=True)
    assert r.returncode == 0 and f'"http://127.0.0.1:{port}"' in out.read_text() and out.stat().st_mode & 0o044
    r = subprocess.run([sys.executable, "-m", "bandpilot", "slurm", "lua", "-o", str(out), "--url", "gopher://x"],
                       env=c.env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "gopher" in r.stderr


def test_interleaved_rank_map_across_components_reaches_every_task(clean, tmp_path):
    """Uneven counts with a node's ranks not contiguous: SLURM_PROCID goes component by component,
    RANK (from the task prolog) is BandPilot's, and each task's device is its rank's GPU."""
    from bandpilot.integrations.slurm.submit import node_types
    from bandpilot.queue.launch_slurm import batch_script

    c = clean
    a, b = c.nodes[1], c.nodes[2]
    ranks = [f"{a}:6", f"{b}:1", f"{a}:0", f"{b}:4", f"{a}:3"]
    types = node_types(c.run(["scontrol", "-o", "show", "node", "-d"]).stdout)
    script = batch_script(ranks, BODY, types=types, extra=[f"--output={tmp_path}/%j.out"])
    assert "#SBATCH hetjob" in script
    jid = c.run(["sbatch", "--parsable"], input=script).stdout.strip()
    rows = _tasks(c, jid, tmp_path / f"{jid}.out")
    _check_tasks(rows, ranks)
    assert any(rank != procid for _n, rank, procid, _l, _c in rows)  # the map is not Slurm's numbering
