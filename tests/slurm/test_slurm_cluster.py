"""slurmctld and slurmd start with the configuration BandPilot generates, and Slurm reads it as meant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def test_cluster_starts_with_the_generated_configuration(slurm_cluster):
    c = slurm_cluster
    assert len(c.nodes) >= 4
    out = c.run(["scontrol", "show", "node", "-d"]).stdout
    for name in c.nodes:
        block = out.split(f"NodeName={name} ")[1].split("NodeName=")[0]
        assert "Gres=gpu:8" in block, block
        assert re.search(r"State=IDLE", block), block
    conf = c.run(["scontrol", "show", "config"]).stdout
    assert re.search(r"TopologyPlugin\s*=\s*topology/tree", conf)
    assert re.search(r"SelectType\s*=\s*select/cons_tres", conf)


def test_topology_conf_parses(slurm_cluster):
    out = slurm_cluster.run(["scontrol", "show", "topology"]).stdout
    assert "SwitchName=h100" in out, out
    assert "Nodes=h100-[0-3]" in out or all(n in out for n in slurm_cluster.nodes), out


def test_a_gpu_job_runs_on_the_cluster(slurm_clean):
    c = slurm_clean
    jid = c.hold({c.nodes[1]: 3}, seconds=120)
    c.wait_running(jid)
    detail = c.run(["scontrol", "show", "job", "-d", jid]).stdout
    assert re.search(rf"Nodes={c.nodes[1]} .*GRES=gpu(:\w+)?:3\(IDX:[0-9,-]+\)", detail), detail


@pytest.fixture(scope="module")
def het_cluster(slurm_available, tmp_path_factory):
    """het4mix (four GPU models, two sockets each, uneven intra-host bandwidth) with a gres type per
    GPU index: a second cluster, started after the shared one's tests in this module."""
    from harness import SlurmCluster

    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(Path(__file__).resolve().parents[2] / "params" / "clusters" / "het4mix.yaml")
    with SlurmCluster(tmp_path_factory.mktemp("het"), spec, gpu_type="{gpu}_{index}") as c:
        yield c


def job_gpus(c, job_id: str) -> list[int]:
    text = c.run(["scontrol", "-o", "show", "job", "-d", job_id]).stdout
    from bandpilot.integrations.slurm.hostlist import expand_indices

    return sorted(i for m in re.finditer(r"\(IDX:([^)]*)\)", text) for i in expand_indices(m.group(1)))


def het_links(c, host: str):
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.integrations.slurm.config import link_counts, pair_bandwidth

    return link_counts(pair_bandwidth(make_fabric(c.spec), c.spec.host_index[host]))


def test_slurm_picks_follow_the_generated_sockets(het_cluster):
    """With GPU 0 of the V100 host busy, Slurm's own pick of 2 GPUs (no BandPilot involved) comes
    from the idle socket (Cores= from the spec's numa) - not first-fit 1,2."""
    c = het_cluster
    links = het_links(c, "v100")
    held = c.hold({"v100": 1}, 300)
    c.wait_running(held)
    assert job_gpus(c, held) == [0]
    for opt in ("--gres=gpu:2", "--gpus=2"):
        jid = c.run(["sbatch", "--parsable", "-o", "/dev/null", "-w", "v100", opt, "--wrap", "sleep 300"]).stdout.strip()
        c.wait_running(jid)
        a, b = job_gpus(c, jid)
        assert a >= 4 and b >= 4, (opt, a, b)  # the idle socket (GPUs 4-7)
        assert links[a, b] == links[4:, 4:].max() > links[1, 2], (opt, a, b, links)
        c.run(["scancel", jid])
    c.cancel_all()


def test_slurm_job_level_gpu_picks_follow_the_generated_links(het_cluster):
    """A6000 with GPUs 0 and 4 busy: each socket has three free GPUs, one measured-fast pair among
    them (2-3, 6-7) and a slow first-fit pair (1-2, 5-6). Slurm 22.05 picks the fast pair for a
    job-level --gpus=2; per-node --gres=gpu:2 stays first-fit inside the socket."""
    c = het_cluster
    links = het_links(c, "a6000")
    assert links[2, 3] == links[6, 7] == 16 and links[1, 2] < 16 and links[5, 6] < 16, links
    held = c.run(["sbatch", "--parsable", "-o", "/dev/null", "-w", "a6000", "--gres=gpu:a6000_0:1,gpu:a6000_4:1",
                  "--wrap", "sleep 300"]).stdout.strip()
    c.wait_running(held)
    jid = c.run(["sbatch", "--parsable", "-o", "/dev/null", "-w", "a6000", "--gpus=2", "--wrap", "sleep 300"]).stdout.strip()
    c.wait_running(jid)
    assert job_gpus(c, jid) in ([2, 3], [6, 7])
    c.cancel_all()


def test_per_index_gres_types_pin_gpu_indices(het_cluster):
    c = het_cluster
    jid = c.run(["sbatch", "--parsable", "-o", "/dev/null", "-w", "a6000",
                 "--gres=gpu:a6000_2:1,gpu:a6000_5:1,gpu:a6000_7:1", "--wrap", "sleep 300"]).stdout.strip()
    c.wait_running(jid)
    assert job_gpus(c, jid) == [2, 5, 7]
    from bandpilot.integrations.slurm.state import read_state

    assert read_state(c.spec, env=c.env).allocated()["a6000"] == [2, 5, 7]
    c.cancel_all()
