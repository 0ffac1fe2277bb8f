"""Ingestion of raw nccl-tests log directories (manifest + logs, as `bandpilot profile` writes them) into the dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bandpilot.data.dataset import DATASET_FILE, load_dataset
from bandpilot.data.ingest import ingest
from bandpilot.errors import DataError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.topology.cluster import spec_from_dict
from tests.test_dataset import TINY



@pytest.fixture(scope="module")
def _profiled(tmp_path_factory) -> Path:
    from bandpilot.data import planning, profiling

    spec = spec_from_dict(TINY)
    root = tmp_path_factory.mktemp("prof")
    plan = planning.plan(spec, cross_host_samples=6, seed=1)
    profiling.run(spec, root, measurements=plan, progress=False, jobs=1, do_ingest=False)
    return root / "data" / "tiny"


@pytest.fixture
def log_dir(_profiled, tmp_path) -> Path:
    import shutil

    d = tmp_path / "tiny"
    shutil.copytree(_profiled, d)
    return d


def _entries(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]


def _write_entries(d: Path, entries: list[dict]) -> None:
    (d / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


def _entry(d: Path, pred) -> tuple[int, dict]:
    return next((i, e) for i, e in enumerate(_entries(d)) if pred(e))


def _set_entry(d: Path, i: int, **changes) -> None:
    es = _entries(d)
    es[i].update(changes)
    _write_entries(d, es)


def _edit_log(d: Path, pred, fn) -> Path:
    _, e = _entry(d, pred)
    p = d / e["log"]
    p.write_text(fn(p.read_text()))
    return p


def _three_gpus(e: dict) -> bool:
    return len(e["gpus"]) == 3 and len(e["hosts"]) == 1


def _cross(e: dict) -> bool:
    return len(e["hosts"]) >= 2


def test_ingest_logs(log_dir, tmp_path):
    rep = ingest(log_dir, tmp_path / "ds")
    assert rep.form == "logs"
    assert (rep.single_host, rep.cross_host) == (45, 6)
    ds = load_dataset(tmp_path / "ds")
    spec = spec_from_dict(TINY)
    fab = EmulatorFabric(spec)
    # the dataset keeps the 16 MiB value of each log: the fabric's noisy measurement (2 decimals)
    assert np.allclose(ds.busbw(), fab.measure(ds.masks()), atol=0.006)
    assert np.allclose(ds.stage1_tables(), fab.stage1, rtol=0.1)
    assert set(ds.frame["source"].str.slice(0, 4)) == {"raw/"}


def test_ingest_reads_the_planned_collective_of_a_multi_run_log(log_dir, tmp_path):
    """Wrapper scripts run several collectives into one log: ingest reads the one the plan names."""
    before = ingest(log_dir, tmp_path / "one")
    other = (log_dir / _entry(log_dir, _three_gpus)[1]["log"]).read_text()
    for e in _entries(log_dir):
        p = log_dir / e["log"]
        # the same ranks and sizes, other collectives, before and after the planned run
        fake = other.replace("all_gather_perf", "all_reduce_perf").replace("  none  ", "   sum  ")
        p.write_text(fake + "\n" + p.read_text() + "\n" + other.replace("all_gather_perf", "sendrecv_perf"))
    rep = ingest(log_dir, tmp_path / "multi")
    assert rep.rows == before.rows
    a, b = load_dataset(tmp_path / "one"), load_dataset(tmp_path / "multi")
    assert np.array_equal(a.busbw(), b.busbw()) and np.array_equal(a.masks(), b.masks())
    _set_entry(log_dir, 0, collective="alltoall_perf")
    with pytest.raises(DataError, match=r"no alltoall_perf run among the 3 runs of the log \(all_reduce_perf, "
                                        r"all_gather_perf, sendrecv_perf\) \(.*manifest\.jsonl:1\)"):
        ingest(log_dir, tmp_path / "bad")


def test_pending_and_failed_entries_are_skipped(log_dir, tmp_path):
    es = _entries(log_dir)
    es[3]["status"] = "planned"
    es[4]["status"] = "failed"
    _write_entries(log_dir, es)
    rep = ingest(log_dir, tmp_path / "ds")
    assert rep.rows == len(es) - 2 and rep.skipped == {"planned": 1, "failed": 1}


def _truncate(text: str) -> str:
    lines = text.splitlines()
    last = max(i for i, s in enumerate(lines) if s.strip()[:1].isdigit())
    return "\n".join(lines[:last] + [lines[last][:40]]) + "\n"


def _drop_device_line(text: str) -> str:
    lines = text.splitlines()
    i = next(i for i, s in enumerate(lines) if "Rank  2" in s)
    return "\n".join(lines[:i] + lines[i + 1 :]) + "\n"


def _busbw_token(value: str):
    def fn(text: str) -> str:
        out = []
        for s in text.splitlines():
            if s.strip().startswith("167772"):
                tok = s.split()
                tok[7] = value
                s = "  ".join(tok)
            out.append(s)
        return "\n".join(out) + "\n"

    return fn


LOG_BAD = {
    "truncated log": (
        lambda d: _edit_log(d, _three_gpus, _truncate),
        r"raw/t\d-\d+\.log:\d+: truncated log",
    ),
    "empty log": (
        lambda d: _edit_log(d, _three_gpus, lambda t: ""),
        r"raw/t\d-\d+\.log:1: empty log",
    ),
    "non-numeric busbw in log": (
        lambda d: _edit_log(d, _three_gpus, _busbw_token("12.x4")),
        r"raw/t\d-\d+\.log:\d+: non-numeric busbw value '12\.x4'",
    ),
    "negative busbw in log": (
        lambda d: _edit_log(d, _three_gpus, _busbw_token("-4.20")),
        r"raw/t\d-\d+\.log:\d+: negative busbw value -4\.20",
    ),
    "fewer ranks than planned": (
        lambda d: _edit_log(d, _three_gpus, _drop_device_line),
        r"raw/t\d-\d+\.log:\d+: device table lists 2 ranks, the plan has 3 GPUs \(.*manifest\.jsonl:\d+\)",
    ),
    "more GPUs planned than ranks": (
        lambda d: _set_entry(d, _entry(d, _three_gpus)[0], gpus=[*_entry(d, _three_gpus)[1]["gpus"],
                                                              _entry(d, _three_gpus)[1]["gpus"][0].split(":")[0] + ":9"]),
        r"manifest\.jsonl:\d+: unknown GPU index '9' on host 't\d'",
    ),
    "ranks on another host": (
        lambda d: _edit_log(d, _cross, lambda t: re.sub(r" on +t(\d) device", " on   t9 device", t, count=1)),
        r"raw/x-.*\.log:\d+: ranks run on .*t9:1.*, the plan puts them on",
    ),
    "no device table": (
        lambda d: _edit_log(d, _three_gpus, lambda t: "\n".join(s for s in t.splitlines() if "Rank" not in s)),
        r"raw/t\d-\d+\.log:1: no '# Using devices' table",
    ),
    "wrong collective": (
        lambda d: _edit_log(d, _three_gpus, lambda t: t.replace("all_gather_perf", "all_reduce_perf")),
        r"raw/t\d-\d+\.log:\d+: log is all_reduce_perf, not all_gather_perf \(.*manifest\.jsonl:\d+\)",
    ),
    "data validation failed": (
        lambda d: _edit_log(d, _three_gpus, lambda t: re.sub(r"(\s)0(\s+\S+\s+\S+\s+\S+\s+0\s*)$", r"\g<1>7\2", t, count=1, flags=re.M)),
        r"raw/t\d-\d+\.log:\d+: 7 wrong elements",
    ),
    "message size missing": (
        lambda d: _edit_log(d, _three_gpus, lambda t: "\n".join(s for s in t.splitlines() if not s.strip().startswith("167772"))),
        r"raw/t\d-\d+\.log: no data row with size 16777216",
    ),
    "unknown host in manifest": (
        lambda d: _set_entry(d, 2, gpus=["zz:0"], hosts=["zz"]),
        r"manifest\.jsonl:3: unknown host 'zz'",
    ),
    "hosts disagree with gpus": (
        lambda d: _set_entry(d, 2, hosts=["t1"]),
        r"manifest\.jsonl:3: hosts \['t1'\] disagree",
    ),
    "log of a done entry missing": (
        lambda d: (d / _entries(d)[5]["log"]).unlink(),
        r"manifest\.jsonl:6: log raw/\S+\.log of a done measurement not found",
    ),
    "manifest line not json": (
        lambda d: (d / "manifest.jsonl").write_text(
            "\n".join((d / "manifest.jsonl").read_text().splitlines()[:2] + ["{not json"]) + "\n"
        ),
        r"manifest\.jsonl:3: not a JSON object",
    ),
    "manifest entry lacks a key": (
        lambda d: _write_entries(d, [{k: v for k, v in e.items() if k != "gpus"} for e in _entries(d)]),
        r"manifest\.jsonl:1: manifest entry lacks \['gpus'\]",
    ),
    "empty manifest": (
        lambda d: (d / "manifest.jsonl").write_text("\n"),
        r"manifest\.jsonl: empty manifest",
    ),
    "nothing measured": (
        lambda d: _write_entries(d, [{**e, "status": "planned"} for e in _entries(d)]),
        r"manifest\.jsonl: no completed measurements \(\d+ planned, 0 done\)",
    ),
    "manifest without spec": (
        lambda d: (d / "cluster.yaml").unlink(),
        r"manifest\.jsonl without the cluster\.yaml",
    ),
}


@pytest.mark.parametrize("case", sorted(LOG_BAD))
def test_bad_log_directory_is_rejected_and_nothing_is_written(log_dir, tmp_path, case):
    mutate, pattern = LOG_BAD[case]
    mutate(log_dir)
    out = tmp_path / "ds"
    with pytest.raises(DataError, match=pattern) as info:
        ingest(log_dir, out)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_failed_log_ingest_keeps_the_previous_dataset(log_dir):
    ingest(log_dir, log_dir)  # the profile layout: dataset next to the logs
    before = (log_dir / DATASET_FILE).read_bytes()
    _edit_log(log_dir, _three_gpus, _drop_device_line)
    with pytest.raises(DataError):
        ingest(log_dir, log_dir)
    assert (log_dir / DATASET_FILE).read_bytes() == before
    assert not list(log_dir.glob(".*.tmp"))
