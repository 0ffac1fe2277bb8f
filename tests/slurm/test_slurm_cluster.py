"""slurmctld and slurmd start with the configuration BandPilot generates, and Slurm reads it as meant."""

from __future__ import annotations

import re

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
