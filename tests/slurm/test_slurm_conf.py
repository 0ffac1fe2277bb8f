"""Slurm configuration from measurements: Links= tiers, per-GPU gres lines, the topology plugin
choice, constraint options and the files `bandpilot slurm conf` writes (no daemons needed; the
real slurmctld reads these files in test_slurm_cluster.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from bandpilot.fabric.emulator import make_fabric
from bandpilot.integrations.slurm.commands import SlurmError, Version, parse_version
from bandpilot.integrations.slurm.config import ConfOptions, gres_conf, link_counts, node_lines
from bandpilot.integrations.slurm.hostlist import expand, expand_indices
from bandpilot.integrations.slurm.topology import choose_plugin, constraint_options, topology_conf
from bandpilot.topology.cluster import load_cluster
from bandpilot.topology.domains import hostlist

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "params" / "clusters" / "h100.yaml"
NVL = ROOT / "params" / "clusters" / "nvl72x16.yaml"


def test_links_follow_bandwidth_tiers():
    nvswitch = np.full((4, 4), 150.0) + np.random.default_rng(0).normal(0, 2, (4, 4))
    nvswitch = (nvswitch + nvswitch.T) / 2
    assert (link_counts(nvswitch)[~np.eye(4, dtype=bool)] == 16).all()  # noise never splits a tier
    bw = np.array([[0, 100, 25, 25], [100, 0, 25, 25], [25, 25, 0, 50], [25, 25, 50, 0]], dtype=float)
    links = link_counts(bw)
    assert links.tolist() == [[-1, 16, 4, 4], [16, -1, 4, 4], [4, 4, -1, 8], [4, 4, 8, -1]]


def test_gres_conf_has_one_line_per_gpu_with_links_and_optional_types():
    spec = load_cluster(H100)
    text = gres_conf(spec, make_fabric(spec))
    lines = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert len(lines) == 8 and lines[0].startswith("NodeName=h100-[0-3] Name=gpu File=/dev/nvidia0 Cores=0-31 Links=-1,16,")
    assert "File=/dev/nvidia5 Cores=32-63 Links=" in lines[5]  # the spec's numa: GPUs 4-7 on the second socket
    assert "AutoDetect=off" in text and "Type=" not in text
    typed = gres_conf(spec, make_fabric(spec), ConfOptions(gpu_type="{gpu}_{index}"))
    assert "Name=gpu Type=h100_3 File=/dev/nvidia3 Cores=0-31 Links=16,16,16,-1," in typed
    assert node_lines(spec, ConfOptions(gpu_type="{gpu}_{index}"))[0].startswith(
        "NodeName=h100-[0-3] CPUs=64 Sockets=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=524288 "
        "Gres=gpu:h100_0:1,gpu:h100_1:1,")
    assert "Gres=gpu:h100:8 " in node_lines(spec, ConfOptions(gpu_type="{gpu}"))[0]


def test_hostlists_round_trip():
    names = ["gb200-1", "gb200-2", "gb200-3", "gb200-7", "n01", "n02", "login"]
    assert expand(hostlist(names)) == names
    assert expand("rack[1-2]-n[01-02],x") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02", "x"]
    assert expand_indices("0-2,5") == [0, 1, 2, 5] and expand_indices("N/A") == []
    with pytest.raises(SlurmError, match="bad range"):
        expand("n[a-b]")


def test_topology_plugin_follows_the_slurm_found():
    spec, nvl = load_cluster(H100), load_cluster(NVL)
    assert parse_version("slurm-wlm 22.05.8") == Version(22, 5, 8) and parse_version("slurm 23.11.4").has_block
    assert choose_plugin(nvl, "auto", Version(22, 5, 8)) == "topology/tree"
    assert choose_plugin(nvl, "auto", None) == "topology/tree"
    assert choose_plugin(nvl, "auto", Version(23, 11)) == "topology/block"
    assert choose_plugin(spec, "auto", Version(24, 5)) == "topology/tree"  # no domains: nothing to block
    assert choose_plugin(nvl, "block", None) == "topology/block"
    with pytest.raises(SlurmError, match="topology/block needs Slurm 23.11 or newer; the Slurm found is 22.05.8"):
        choose_plugin(nvl, "block", Version(22, 5, 8))
    tree = topology_conf(nvl, "topology/tree")
    assert "SwitchName=gb200-nvl0 Nodes=gb200-[0-17]" in tree and "BlockName" not in tree


def test_constraints_map_to_what_the_slurm_supports():
    assert constraint_options({"single_domain": True}, "topology/tree", Version(22, 5), 8) == ["--switches=1"]
    assert constraint_options({"segment": 16}, "topology/block", Version(23, 11), 4) == ["--segment=4"]
    with pytest.raises(SlurmError, match="segment=16 needs topology/block"):
        constraint_options({"segment": 16}, "topology/tree", Version(22, 5, 8), 4)
    with pytest.raises(SlurmError, match="whole_domains needs --exclusive=topo"):
        constraint_options({"whole_domains": True}, "topology/block", Version(23, 11), 4)
    assert constraint_options({"whole_domains": True}, "topology/block", Version(24, 5), 4) == ["--exclusive=topo"]


@pytest.mark.slow
def test_cli_conf_writes_readable_files(tmp_path, capsys):
    from bandpilot.cli.main import main

    old = os.umask(0o022)
    try:
        assert main(["slurm", "conf", "--cluster", str(NVL), "--out", str(tmp_path), "--slurm-version", "22.05"]) == 0
    finally:
        os.umask(old)
    assert "(topology/tree; Slurm 22.05.0)" in capsys.readouterr().out
    for name in ("slurm.bandpilot.conf", "gres.conf", "topology.conf"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    frag = (tmp_path / "slurm.bandpilot.conf").read_text()
    assert "TopologyPlugin=topology/tree" in frag and "NodeName=gb200-[0-287] CPUs=32 Sockets=2 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=262144 Gres=gpu:4" in frag
    assert main(["slurm", "conf", "--cluster", str(NVL), "--out", str(tmp_path), "--topology", "block",
                 "--slurm-version", "22.05.8"]) == 2
    assert "error: topology/block needs Slurm 23.11 or newer" in capsys.readouterr().err
    assert main(["slurm", "conf", "--cluster", str(NVL), "--out", str(tmp_path / "b"), "--slurm-version", "23.11"]) == 0
    assert "TopologyPlugin=topology/block" in (tmp_path / "b" / "slurm.bandpilot.conf").read_text()
    assert (tmp_path / "b" / "topology.conf").read_text().count("BlockName=") == 16


def test_cli_conf_gpu_types(tmp_path, capsys):
    from bandpilot.cli.main import main

    assert main(["slurm", "conf", "--cluster", str(H100), "--out", str(tmp_path), "--gpu-type", "index"]) == 0
    assert "Name=gpu Type=h100_7 File=/dev/nvidia7" in (tmp_path / "gres.conf").read_text()
    assert "Gres=gpu:h100_0:1," in (tmp_path / "slurm.bandpilot.conf").read_text()
    capsys.readouterr()
    assert main(["slurm", "conf", "--cluster", str(H100), "--out", str(tmp_path), "--gpu-type", "per-gpu"]) == 2
    assert "error: unknown --gpu-type 'per-gpu': use one of none, model, index" in capsys.readouterr().err
