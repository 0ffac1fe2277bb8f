"""The scheduler profile: the named profiles, the cross-field rules, YAML files and their errors, and
the commands that take one (``simulate``, ``dispatch``)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from bandpilot.scheduling.profile import (
    FIFO_GREEDY, PROFILES, RECOMMENDED, SLURM_LIKE, ProfileError, SchedulerProfile, get_profile, load_profile,
)
from bandpilot.topology.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]


def test_the_named_profiles():
    assert list(PROFILES) == ["recommended", "slurm-like", "fifo-greedy"]
    assert RECOMMENDED.describe() == "hrrn + bandpilot (locality 0.5) + conservative 2 + start-or-wait"
    assert (SLURM_LIKE.queue_sort, SLURM_LIKE.backfill, SLURM_LIKE.placement) == ("fifo", "easy", "compact")
    assert (FIFO_GREEDY.queue_sort, FIFO_GREEDY.backfill, FIFO_GREEDY.placement) == ("fifo", "greedy", "compact")
    assert not any(p.preempt for p in PROFILES.values())
    assert get_profile("slurm-like") is SLURM_LIKE and get_profile(RECOMMENDED) is RECOMMENDED
    with pytest.raises(dataclasses.FrozenInstanceError):
        RECOMMENDED.queue_sort = "fifo"  # type: ignore[misc]


def test_compact_is_block_on_nvlink_domains_and_topo_elsewhere():
    assert SLURM_LIKE.algorithm_for(load_cluster(ROOT / "params" / "clusters" / "h100.yaml")) == "topo"
    nvl = next(p for p in (ROOT / "params" / "clusters").glob("*.yaml") if load_cluster(p).nvlink_domains)
    assert SLURM_LIKE.algorithm_for(load_cluster(nvl)) == "block"
    assert RECOMMENDED.algorithm_for(load_cluster(nvl)) == "bandpilot"


@pytest.mark.parametrize("fields, message", [
    ({"backfill": "greedy", "start_or_wait": True}, "start_or_wait needs backfill: easy or conservative"),
    ({"backfill": "easy", "reservations": 2}, "reservations: 2 needs backfill: conservative"),
    ({"backfill": "conservative", "reservations": 0}, "reservations must be an integer in [1, 1024]"),
    ({"placement": "topo", "locality": 0.5}, "locality: 0.5 applies to model-guided placement only"),
    ({"locality": 1.0}, "locality must be a number in [0, 1)"),
    ({"queue_sort": "las"}, "queue_sort: unknown value 'las'"),
    ({"backfill": "lazy"}, "backfill: unknown value 'lazy'"),
    ({"placement": "magic"}, "placement: unknown value 'magic'"),
    ({"preempt": "on"}, "preempt must be true or false"),
])
def test_contradictions_are_errors_not_ignored(fields, message):
    with pytest.raises(ProfileError, match=re.escape(message)):
        SchedulerProfile("x", **fields)
    with pytest.raises(ProfileError, match=re.escape(message)):
        dataclasses.replace(FIFO_GREEDY, **{"placement": "bandpilot", **fields})  # a derived profile is checked too


def test_a_profile_has_a_name():
    with pytest.raises(ProfileError, match="name must be a non-empty string"):
        SchedulerProfile("")


def test_a_yaml_profile_starts_from_its_base(tmp_path):
    p = tmp_path / "site.yaml"
    p.write_text("base: slurm-like\nqueue_sort: priority\npreempt: true\n")
    prof = get_profile(str(p))
    assert prof == SchedulerProfile("site", queue_sort="priority", backfill="easy", preempt=True, placement="compact")
    p.write_text("name: ours\nbackfill: easy\nreservations: 1\n")  # base: recommended
    assert load_profile(p) == dataclasses.replace(RECOMMENDED, name="ours", backfill="easy", reservations=1)


@pytest.mark.parametrize("text, message", [
    ("queue_sort: [fifo\n", "not valid YAML at line 2"),
    ("- fifo\n", "expected a mapping of profile fields, got list"),
    ("policy: fifo\n", "unknown field 'policy'"),
    ("base: pbs\n", "field 'base': unknown profile 'pbs'"),
    ("backfill: greedy\n", "reservations: 2 needs backfill: conservative"),
    ("locality: high\n", "locality must be a number in [0, 1), got 'high'"),
])
def test_a_bad_yaml_profile_is_one_line_naming_the_file_and_field(tmp_path, text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ProfileError) as exc:
        get_profile(str(p))
    assert str(exc.value).startswith(f"profile {p}: ") and message in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(ProfileError, match="cannot read it"):
        get_profile(str(tmp_path / "missing.yaml"))
    with pytest.raises(ProfileError, match="unknown profile 'pbs': use one of recommended, slurm-like, fifo-greedy"):
        get_profile("pbs")


def test_the_documented_example_profiles_load(tmp_path):
    doc = (ROOT / "docs" / "guide" / "profiles.md").read_text()
    block = re.search(r"```yaml\n(# my-site\.yaml.*?)```", doc, re.S)
    assert block is not None
    (tmp_path / "my-site.yaml").write_text(block.group(1))
    assert load_profile(tmp_path / "my-site.yaml").describe() == "priority + bandpilot (locality 0.5) + easy + preempt + start-or-wait"
    assert load_profile(ROOT / "params" / "scheduler-utility.yaml").queue_sort == "utility"  # the pipeline's


def test_simulate_help_has_at_most_fifteen_options_and_names_the_profiles():
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "bandpilot", "simulate", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    opts = {m for m in re.findall(r"--[a-z][a-z-]+", out) if m != "--help"}
    long_opts = {o for o in opts if not o.startswith("--no-")}
    assert len(long_opts) <= 15, sorted(long_opts)
    assert "--profile" in opts and "--policy" not in opts and "--baseline" not in opts


def test_dispatch_with_a_bad_profile_is_one_line_and_touches_nothing(tmp_path, capsys):
    from bandpilot.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("base: fifo-greedy\nstart_or_wait: true\n")
    assert main(["dispatch", "--profile", str(bad), "--store", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"profile {bad}: start_or_wait needs backfill" in err
    assert not (tmp_path / "none.db").exists()


def test_a_new_queue_sort_is_one_function_and_one_registration(tmp_path, monkeypatch):
    """A toy QueueSort (last submitted first), registered, named by a profile, then gone again."""
    from bandpilot import queue as q
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.scheduling import batch, policies

    monkeypatch.setattr(policies, "_SORTS", dict(policies._SORTS))  # the registration is undone after the test
    policies.register_queue_sort(policies.QueueSort(
        "lifo", lambda pending, exp, now: sorted(pending, key=lambda p: (-p.submitted_at, -p.seq)), "last submitted first"))
    with pytest.raises(ValueError, match="already registered"):
        policies.register_queue_sort(policies.QueueSort("lifo", lambda *a: [], "again"))
    spec = load_cluster(ROOT / "params" / "clusters" / "h100.yaml")
    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(spec)
    q.submit(store, [{"id": f"r{i}", "k": 16, "submitted": float(i)} for i in range(3)])  # two of three fit
    rep = batch.run_batch(store, Dispatcher(make_fabric(spec)), SchedulerProfile("newest-first", queue_sort="lifo"))
    assert [o.request_id for o in rep.assigned] == ["r2", "r1"] and rep.policy == "lifo"
    assert q.check_invariants(store) == []
    store.close()
    monkeypatch.undo()
    with pytest.raises(ProfileError, match="queue_sort: unknown value 'lifo'"):
        SchedulerProfile("newest-first", queue_sort="lifo")
