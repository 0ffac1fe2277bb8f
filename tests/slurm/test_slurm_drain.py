"""A verify verdict drains a node in a real Slurm (sinfo -R shows the reason); a passing re-check
resumes it; bad input is one line and changes nothing."""

from __future__ import annotations

import io
import json

import pytest

from bandpilot.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


def reasons(c) -> dict[str, str]:
    """node -> drain reason, from ``sinfo -R``."""
    out = c.run(["sinfo", "-R", "-h", "-N", "-o", "%N|%E"]).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def states(c) -> dict[str, str]:
    out = c.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def settle(c, node: str, want: str, timeout: float = 60.0) -> None:
    import time

    end = time.monotonic() + timeout
    while states(c)[node] != want:
        assert time.monotonic() < end, f"{node} is {states(c)[node]}, not {want}"
        time.sleep(0.5)


@pytest.fixture
def in_cluster(slurm_clean, monkeypatch):
    for k, v in slurm_clean.env.items():
        monkeypatch.setenv(k, v)
    return slurm_clean


@pytest.fixture(scope="module")
def pairwise_report(tmp_path_factory):
    """A real ``bandpilot verify --pairwise --json`` report of the test cluster's 4 nodes with
    h100-2 slowed down in the emulated sweep."""
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.fabric.faults import Fault, FaultyFabric
    from bandpilot.health.sweeps import emulate_sweep, write_sweep_logs
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster("params/clusters/h100.yaml")
    d = tmp_path_factory.mktemp("sweep")
    write_sweep_logs(emulate_sweep(FaultyFabric(EmulatorFabric(spec, seed=4), [Fault("slow_host", "h100-2")]), seed=4), d)
    return d


def verify_json(d, tmp_path, capsys) -> "Path":  # noqa: F821
    assert main(["verify", "--pairwise", str(d), "--json"]) in (0, 3)
    path = tmp_path / "verify.json"
    path.write_text(capsys.readouterr().out)
    return path


def test_a_verify_verdict_drains_and_a_passing_recheck_resumes(in_cluster, pairwise_report, tmp_path, capsys,
                                                                monkeypatch):
    c = in_cluster
    rep = verify_json(pairwise_report, tmp_path, capsys)
    doc = json.loads(rep.read_text())
    assert doc["nodes"]["h100-2"]["status"] in ("degraded", "failed"), doc
    assert main(["slurm", "drain", "--from-verify", str(rep)]) == 0
    assert "drain: h100-2" in capsys.readouterr().out
    why = reasons(c)
    assert set(why) == {"h100-2"} and why["h100-2"].startswith("bandpilot verify: ")
    assert states(c)["h100-2"] in ("drain", "drng")
    # an operator's own drain is never resumed by a verdict
    c.run(["scontrol", "update", "NodeName=h100-0", "State=DRAIN", "Reason=cabling"])
    healthy = {"hosts": {n: {"status": "healthy", "gpus": [], "links": [], "ratio": 1.0} for n in c.nodes}}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(healthy)))
    assert main(["slurm", "drain", "--from-verify", "-"]) == 0  # `verify --json | slurm drain --from-verify -`
    assert "resume: h100-2" in capsys.readouterr().out
    assert reasons(c) == {"h100-0": "cabling"}
    settle(c, "h100-2", "idle")  # a resumed node is "idle*" (not responding) until slurmctld's next ping


def test_drain_and_undrain_by_name(in_cluster, capsys):
    c = in_cluster
    assert main(["slurm", "drain", "h100-1", "h100-3", "--reason", "NVLink errors in dmesg"]) == 0
    assert reasons(c) == {"h100-1": "bandpilot: NVLink errors in dmesg", "h100-3": "bandpilot: NVLink errors in dmesg"}
    assert main(["slurm", "undrain", "h100-1"]) == 0
    assert "resumed h100-1" in capsys.readouterr().out
    assert set(reasons(c)) == {"h100-3"}


def test_bad_input_is_one_line_and_changes_nothing(in_cluster, tmp_path, capsys):
    c = in_cluster
    assert main(["slurm", "drain", "h100-1", "nosuch-7", "--reason", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: node 'nosuch-7' is not known to Slurm (it has 4 nodes)", err
    assert reasons(c) == {}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hosts": {"h100-1": {"status": "slow"}}}))
    assert main(["slurm", "drain", "--from-verify", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "hosts.h100-1.status must be one of healthy" in err and "\n" not in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"hosts": {"h100-1": {"status": "failed"}, "gpu-99": {"status": "failed"}}}))
    assert main(["slurm", "drain", "--from-verify", str(unknown)]) == 2
    assert "node 'gpu-99' is not known to Slurm" in capsys.readouterr().err
    assert reasons(c) == {}
    assert main(["slurm", "drain", "h100-1"]) == 2
    assert "--reason is required" in capsys.readouterr().err


def test_slurm_missing_or_not_answering_is_one_line(in_cluster, tmp_path, monkeypatch, capsys):
    c = in_cluster
    conf = tmp_path / "slurm.conf"
    from harness import free_ports

    text = (c.conf_dir / "slurm.conf").read_text()
    port = free_ports(1)[0]
    conf.write_text("\n".join(f"SlurmctldPort={port}" if ln.startswith("SlurmctldPort=") else ln
                              for ln in text.splitlines()) + "\nMessageTimeout=2\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert main(["slurm", "state", "--cluster", "params/clusters/h100.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: scontrol -o show node -d: slurm_load_node error: Unable to contact slurm controller "
                   "(connect failure)"), err
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["slurm", "undrain", "h100-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Slurm command 'scontrol' not found on PATH") and "\n" not in err, err
