"""``python -m benchmarks NAME --FLAG ...`` passes the flags to the named benchmark (the README's
``python -m benchmarks jct --only seed001`` used to fail with "unknown benchmark(s) ['bench_--only', ...]")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import split_args

ROOT = Path(__file__).resolve().parents[1]


def test_split_args_keeps_names_before_the_first_flag():
    assert split_args(["jct", "--only", "seed001"]) == (["jct"], ["--only", "seed001"])
    assert split_args(["jct", "dispatch"]) == (["jct", "dispatch"], [])
    assert split_args(["--help"]) == ([], ["--help"])
    assert split_args([]) == ([], [])


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_flags_reach_the_named_benchmark():
    out = _run("jct", "--help")
    assert out.returncode == 0, out.stderr
    assert "--first-seed" in out.stdout  # bench_jct's own argparse help, not the runner's error


@pytest.mark.slow
def test_flags_without_a_name_and_unknown_names_are_one_line_errors():
    out = _run("--only", "seed001")
    assert out.returncode == 2 and "need a benchmark name" in out.stderr and out.stdout.count("\n") <= 1
    out = _run("nosuch")
    assert out.returncode == 2 and "unknown benchmark(s) ['bench_nosuch']" in out.stderr
