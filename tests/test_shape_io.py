"""Shapes at the edges (issue 23): the CLI, the queue and its store, the launcher formats that carry
the rank map, and the benchmark harness's states and measured-table rows. The parser and the
search are in test_shape.py (its fixtures are shared from there)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.dispatch.shape import Shape
from tests.test_shape import H100, NVL, _state
from bandpilot.scheduling.profile import SchedulerProfile


@pytest.mark.slow
def test_cli_select_shape(tmp_path, capsys):
    from bandpilot.cli.main import main

    p = tmp_path / "state.json"
    p.write_text(json.dumps(_state(H100, {0: 6, 1: 6, 2: 4, 3: 8}).to_dict()))
    base = ["select", "16", "--cluster", "params/clusters/h100.yaml", "--state", str(p)]
    assert main(base + ["--shape", "tp=4,dp=4", "--traffic", "tp=1GiB,dp=512MiB", "--compute-ms", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["ranks"]) == 16 and out["compute_ms"] == 5.0 and out["shape"]["traffic"]["tp"] == 2.0**30
    assert out["step_ms"] == pytest.approx(5 + sum(out["comm_ms"].values()), rel=1e-6)
    assert main(base + ["--shape", "tp=4,dp=4", "-a", "segment"]) == 0
    assert "step" in capsys.readouterr().out
    assert main(base + ["--shape", "tp=4,dp=5"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "but k=16" in err
    assert main(base + ["--traffic", "tp=1"]) == 2
    assert "need --shape" in capsys.readouterr().err


# ---- launcher formats carry the rank map -----------------------------------------------------
def _assignment(sel):
    hosts: dict[str, list[int]] = {}
    for g in sel.ranks:
        h, _, i = g.rpartition(":")
        hosts.setdefault(h, []).append(int(i))
    return {"id": "j1", "gpus": sel.gpus, "ranks": sel.ranks, "hosts": hosts}


def test_launch_formats_follow_rank_map():
    from bandpilot.queue.launch import FORMATS, render

    sel = Dispatcher(H100).select(16, _state(H100, {0: 6, 1: 6, 2: 4, 3: 8}), shape="tp=4,dp=4")
    a = _assignment(sel)
    nodes = list(a["hosts"])
    assert nodes[0] == sel.ranks[0].rpartition(":")[0]
    hf = render(a, "hostfile").split("\n")
    assert hf == [f"{h} slots={len(v)}" for h, v in a["hosts"].items()]
    # expanding the hostfile in order (mpirun --map-by slot) gives every rank its node
    assert [h for h, v in a["hosts"].items() for _ in v] == [g.rpartition(":")[0] for g in sel.ranks]
    env = render(a, "env")
    assert f"MASTER_ADDR={nodes[0]}" in env and f"BANDPILOT_RANKS={','.join(sel.ranks)}" in env
    tr = render(a, "torchrun").split("\n")
    assert "WARNING" not in "\n".join(tr)
    for n, h in enumerate(nodes):
        line = next(x for x in tr if x.startswith(f"{h}:"))
        dev = ",".join(str(i) for i in a["hosts"][h])
        assert f"--node-rank={n}" in line and f"CUDA_VISIBLE_DEVICES={dev}" in line and f"--master-addr={nodes[0]}" in line
    sl = render(a, "slurm")
    assert sl.startswith("#!/bin/bash\n") and f"export BANDPILOT_RANKS={','.join(sel.ranks)}" in sl
    counts = {h: len(v) for h, v in a["hosts"].items()}
    if len(set(counts.values())) > 1:  # uneven: one heterogeneous component per node, in rank order
        comps = [ln for ln in sl.split("\n") if ln.startswith("#SBATCH --nodes=1 ")]
        assert comps == [f"#SBATCH --nodes=1 --nodelist={h} --ntasks={c} --gres=gpu:{c}" for h, c in counts.items()]
        assert sl.count("#SBATCH hetjob") == len(nodes) - 1 and f"--het-group=0-{len(nodes) - 1}" in sl
    else:
        body = sl.split("<<'BANDPILOT_HOSTS'\n")[1].split("\nBANDPILOT_HOSTS")[0].split("\n")
        assert body == [g.rpartition(":")[0] for g in sel.ranks] and "SLURM_DISTRIBUTION=arbitrary" in sl
    k8s = json.loads(render(a, "k8s"))["metadata"]["annotations"]
    assert k8s["bandpilot.io/ranks"] == ",".join(sel.ranks) and k8s[f"bandpilot.io/node-rank.{nodes[1]}"] == "1"
    assert json.loads(render(a, "json"))["ranks"] == sel.ranks
    assert set(FORMATS) >= {"json", "slurm", "hostfile", "env", "torchrun", "k8s"}


def test_launch_torchrun_warns_on_interleaved_ranks():
    from bandpilot.queue.launch import render

    ranks = ["h100-0:0", "h100-1:0", "h100-0:1", "h100-1:1"]
    a = {"id": "j", "gpus": sorted(ranks), "ranks": ranks, "hosts": {"h100-0": [0, 1], "h100-1": [0, 1]}}
    assert "WARNING" in render(a, "torchrun")
    sl = render(a, "slurm")
    assert sl.split("<<'BANDPILOT_HOSTS'\n")[1].split("\nBANDPILOT_HOSTS")[0].split("\n") == ["h100-0", "h100-1", "h100-0", "h100-1"]
    assert "#SBATCH --nodes=2 --nodelist=h100-0,h100-1 --ntasks=4 --ntasks-per-node=2 --gres=gpu:2" in sl


# ---- queue: shape in the request, rank map in the assignment (schema v8) ----------------------
def test_queue_shape_request_to_launch(tmp_path):
    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.errors import RequestError
    from bandpilot.queue.launch import render

    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(H100.spec)
    q.submit(store, [{"id": "blocker", "k": 6, "tenant": "t", "constraints": {"single_host": True}}])
    sched.run_batch(store, Dispatcher(H100), SchedulerProfile("test"))
    q.submit(store, [{"id": "mp", "k": 16, "tenant": "t", "shape": {"tp": 4, "pp": 2, "dp": 2}},
                     {"id": "plain", "k": 2, "tenant": "t"}])
    sched.run_batch(store, Dispatcher(H100), SchedulerProfile("test"))
    a = q.assignment(store, "mp")
    assert a["shape"]["tp"] == 4 and len(a["ranks"]) == 16 and set(a["ranks"]) == set(a["gpus"])
    assert set(a["axis_gbps"]) == {"tp", "pp", "dp"} and a["step_ms"] > 0
    hosts = [g.rpartition(":")[0] for g in a["ranks"]]
    assert all(len(set(hosts[i:i + 4])) == 1 for i in range(0, 16, 4))
    assert render(a, "hostfile").split("\n") == [f"{h} slots={len(v)}" for h, v in a["hosts"].items()]
    assert q.assignment(store, "plain")["ranks"] == q.assignment(store, "plain")["gpus"]
    for bad, msg in (({"tp": 4, "dp": 2}, "but k=16"), ("tp=4,zz=1", "unknown key"), ({"tp": "x"}, "must be an integer")):
        with pytest.raises(RequestError) as e:
            q.submit(store, [{"id": "bad", "k": 16, "tenant": "t", "shape": bad}])
        assert msg in str(e.value) and "'bad'" in str(e.value) and "\n" not in str(e.value)
    store.close()


def test_store_migration_8_adds_shape_columns(tmp_path):
    import sqlalchemy as sa

    from bandpilot import queue as q

    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = q.Store(url)
    s.init_cluster(H100.spec)
    s.close()
    eng = sa.create_engine(url)
    with eng.begin() as conn:  # roll the store back to v7: no shape / rank-map columns
        conn.exec_driver_sql("ALTER TABLE bp_requests DROP COLUMN shape")
        conn.exec_driver_sql("ALTER TABLE bp_assignments DROP COLUMN ranks")
        conn.exec_driver_sql("ALTER TABLE bp_assignments DROP COLUMN placement")
        conn.exec_driver_sql("DELETE FROM bp_schema WHERE version = 8")
    eng.dispose()
    again = q.Store(url)
    assert again.migrate() == q.schema_version() >= 8  # later migrations ride along
    with again.read() as conn:
        cols = {c["name"] for c in sa.inspect(conn).get_columns("bp_requests")}
        acols = {c["name"] for c in sa.inspect(conn).get_columns("bp_assignments")}
    assert "shape" in cols and {"ranks", "placement"} <= acols
    q.submit(again, [{"id": "mp", "k": 8, "tenant": "t", "shape": "tp=8"}])
    again.close()


@pytest.mark.slow
def test_queue_submit_shape_flags(tmp_path, capsys):
    import sqlalchemy as sa

    from bandpilot import queue as q
    from bandpilot.cli.main import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(H100.spec)
    store.close()
    base = ["queue", "submit", "--store", url]
    assert main(base + ["--id", "s1", "--shape", "tp=4,pp=2,dp=2", "--traffic", "tp=1GiB", "--compute-ms", "20"]) == 0
    assert main(base + ["--id", "s2", "-k", "8", "--shape", "tp=4,dp=2"]) == 0
    capsys.readouterr()
    for bad, msg in ((["-k", "6", "--shape", "tp=4,dp=2"], "but k=6"), (["--shape", "tp=4,dp=2,xx=1"], "unknown key"),
                     (["-k", "8", "--traffic", "tp=1GiB"], "need --shape")):
        assert main(base + bad) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    store = q.Store(url)
    with store.read() as conn:
        rows = {r[0]: (r[1], json.loads(r[2])) for r in conn.execute(sa.select(q.T_REQ.c.id, q.T_REQ.c.k, q.T_REQ.c.shape))}
    store.close()
    assert set(rows) == {"s1", "s2"}  # the bad submissions stored nothing
    k, doc = rows["s1"]
    assert k == 16 and Shape.parse(doc) == Shape.parse({"tp": 4, "pp": 2, "dp": 2, "traffic": {"tp": 2.0**30}, "compute_ms": 20.0})
    assert rows["s2"][0] == 8 and Shape.parse(rows["s2"][1]).tp == 4


def test_bench_fragmented_state_is_single_host_small_tenants():
    """The benchmark's frag profile: 35-50 % busy, tenants of 1-3 GPUs inside one host each."""
    from benchmarks.bench_shape import fragmented_state

    spec = NVL.spec
    st_ = fragmented_state(spec, NVL, np.random.default_rng(5))
    busy = spec.n_gpus - st_.n_free
    assert 0.35 * spec.n_gpus <= busy <= 0.5 * spec.n_gpus + 3
    assert all(1 <= len(j.gpus) <= 3 and len({g.rpartition(":")[0] for g in j.gpus}) == 1 for j in st_.jobs)
    assert sum(len(j.gpus) for j in st_.jobs) == busy


def _measured_dir(d, inter_scale: float = 1.0):
    """A complete measured-table directory for the tiny 3 x 4 cluster of test_dataset: every intra
    subset and every cross-host count pattern (values from the emulator; the inter table times
    ``inter_scale``), so the measured-truth scoring can price any group."""
    import itertools
    import json

    import yaml

    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.topology.cluster import spec_from_dict
    from tests.test_dataset import TINY, write_intra_tables

    fab = EmulatorFabric(spec_from_dict(TINY))
    doc = write_intra_tables(d, fab)
    lines = ['"OP","Total_GPU_Count","GPU_Mapping_Across_Nodes","data_size(B)","Bandwidth(GB/s)"']
    for counts in itertools.product(range(5), repeat=3):
        if sum(c > 0 for c in counts) < 2:
            continue
        bw = fab.network(np.array([counts], dtype=np.int64))[0] * inter_scale
        mapping = json.dumps([list(range(c)) for c in counts], separators=(",", ":"))
        lines.append(f'"all_gather_perf",{sum(counts)},"{mapping}",16777216,{bw:.2f}')
    (d / "inter.csv").write_text("\n".join(lines) + "\n")
    doc["inter"] = {"table": "inter.csv", "scale": 1.0, "combine": "min_intra"}
    (d / "cluster.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


@pytest.mark.slow
def test_bench_measured_rows_score_on_the_tables(tmp_path):
    """The benchmark's measured rows place and score on the measured tables: every algorithm gets a
    finite true step time, and halving the inter table's values slows the cross-host axes' truth."""
    from benchmarks.bench_shape import run_measured

    shapes = [(2, 1, 2), (2, 1, 4), (4, 1, 2)]
    rows = run_measured(_measured_dir(tmp_path / "a"), busy=1, seed=0, shapes=shapes)
    slow = run_measured(_measured_dir(tmp_path / "b", 0.5), busy=1, seed=0, shapes=shapes)
    assert rows and all(r["cluster"] == "tiny (measured)" for r in rows)
    assert {r["state"] for r in rows} == {"idle", "busy0"}
    assert all(np.isfinite(r[a]["true"]) and r[a]["true"] > 0 for r in rows for a in ("shape", "blind", "segment", "bandpilot"))
    # idle, k = 8 on 3 x 4 GPUs: the job spans hosts, so its DP rings cross the (halved) network
    a = next(r for r in rows if r["state"] == "idle" and r["k"] == 8)
    b = next(r for r in slow if r["state"] == "idle" and r["name"] == a["name"])
    assert b["shape"]["true"] > a["shape"]["true"]


def test_bench_measured_rows_need_tables():
    from benchmarks.bench_shape import ROOT, run_measured

    with pytest.raises(SystemExit, match="no measured tables"):
        run_measured(ROOT / "params" / "clusters" / "h100.yaml", busy=0, seed=0)


@pytest.mark.slow
def test_bench_measured_rows_on_the_real_h100_tables(shared_data):
    """On the real h100-16m tables (skips without ../shared/data): every count pattern a placement
    or tenant uses is priced from the tables, idle and busy."""
    from benchmarks.bench_shape import run_measured

    rows = run_measured(shared_data / "h100-16m", busy=1, seed=0, shapes=[(8, 1, 4), (4, 2, 2), (2, 1, 4)])
    assert {r["state"] for r in rows} == {"idle", "busy0"} and rows[0]["cluster"] == "h100-16m (measured)"
    assert all(np.isfinite(r[a]["true"]) and r[a]["true"] > 0 for r in rows for a in ("shape", "blind", "segment", "bandpilot"))
    # 100 % TP groups in one host where the free GPUs have room (the rule)
    assert all(r["tp_in"] == r["tp_n"] for r in rows if r["room"])
