"""The real Slurm cluster the tests in this directory share (tests/slurm/harness.py starts it).

Tests that use ``slurm_cluster`` are marked ``xdist_group("slurm")`` so one worker runs them all
and one cluster is up at a time; they skip (with the reason printed) only where Slurm is not
installed and apt-get cannot install it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import SlurmCluster, ensure_slurm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_available() -> None:
    reason = ensure_slurm()
    if reason:
        print(f"skipping the real-Slurm tests: {reason}", file=sys.stderr)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster(slurm_available, tmp_path_factory):
    """4 nodes x 8 GPUs (params/clusters/h100.yaml) under Slurm, configured by `bandpilot slurm conf`'s
    generator; jobs are cancelled after each test module that uses it (see ``slurm_clean``)."""
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), ROOT / "params" / "clusters" / "h100.yaml") as c:
        yield c


@pytest.fixture
def slurm_clean(slurm_cluster):
    """The shared cluster with no jobs and every node resumed, before and after the test."""
    def reset() -> None:
        slurm_cluster.cancel_all()
        slurm_cluster.run(["scontrol", "update", f"NodeName={','.join(slurm_cluster.nodes)}", "State=RESUME"],
                          check=False)

    reset()
    yield slurm_cluster
    reset()
