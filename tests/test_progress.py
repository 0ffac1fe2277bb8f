"""Issue 26 item 1: progress on long work. The library reports stages through a small reporter
interface (silent unless a caller installs a reporter); the CLI renders a line per stage with
elapsed time and an estimate (plain lines when no terminal is attached, rich bars on a terminal)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bandpilot import progress
from bandpilot.cli.reporting import LineReporter, RichReporter, make_reporter

ROOT = Path(__file__).resolve().parents[1]


class Recorder(progress.Reporter):
    """A reporter that keeps the events (what an embedding program would feed into its own UI)."""

    def __init__(self):
        self.events = []

    def started(self, st):
        self.events.append(("start", st.name, st.depth, st.total))

    def advanced(self, st):
        self.events.append(("advance", st.name, st.done, st.total))

    def finished(self, st, error):
        self.events.append(("finish", st.name, st.done, error is None))


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_stages_are_silent_without_a_reporter(capsys):
    with progress.stage("work", total=3, unit="steps") as st:
        for _ in range(3):
            st.advance()
    assert capsys.readouterr() == ("", "")


def test_a_reporter_sees_nested_stages_in_order():
    rec = Recorder()
    with progress.use(rec):
        with progress.stage("outer"):
            with progress.stage("inner", total=2) as st:
                st.advance()
                st.advance()
    assert rec.events == [("start", "outer", 0, None), ("start", "inner", 1, 2), ("advance", "inner", 1, 2),
                          ("advance", "inner", 2, 2), ("finish", "inner", 2, True), ("finish", "outer", 0, True)]
    with progress.stage("after"):  # the reporter is gone with its block
        pass
    assert rec.events[-1][1] == "outer"


def test_a_failing_stage_is_reported_as_failed_and_the_error_propagates():
    rec = Recorder()
    with progress.use(rec), pytest.raises(ValueError):
        with progress.stage("boom"):
            raise ValueError("x")
    assert rec.events[-1] == ("finish", "boom", 0, False)


def test_lines_give_elapsed_time_an_estimate_and_stay_quiet(tmp_path):
    out, clock = io.StringIO(), Clock()
    rep = LineReporter(out, clock=clock, interval=30.0, history=tmp_path / "h.json")
    with progress.use(rep):
        with progress.stage("profile h100", total=100, unit="runs") as st:
            for _ in range(100):
                clock.t += 1.0  # 100 s in all, one advance per second
                st.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[ 0:00] profile h100: 100 runs")
    assert lines[-1] == "[ 1:40] profile h100: done in 1:40"
    middle = lines[1:-1]
    assert 2 <= len(middle) <= 4, lines  # one line per 30 s, not per run
    assert middle[0] == "[ 0:30] profile h100: 30/100 runs, 0:30 elapsed, ~1:10 left"


def test_the_next_run_announces_an_estimate_from_the_last(tmp_path):
    hist, clock = tmp_path / "h.json", Clock()
    for _ in range(2):
        out = io.StringIO()
        with progress.use(LineReporter(out, clock=clock, history=hist)):
            with progress.stage("train h100"):
                clock.t += 125.0
    assert json.loads(hist.read_text())["train h100"] == pytest.approx(125.0)
    assert out.getvalue().splitlines()[0] == "[ 0:00] train h100 (~2:05 last run)"


def test_nested_stages_indent_and_failures_say_so(tmp_path):
    out, clock = io.StringIO(), Clock()
    with progress.use(LineReporter(out, clock=clock, history=None)), pytest.raises(RuntimeError):
        with progress.stage("retrain h100"):
            with progress.stage("sweep h100", total=3, unit="trials") as st:
                clock.t += 5
                st.advance()
                raise RuntimeError("boom")
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("[ 0:00]   sweep h100: 3 trials")
    assert lines[-2] == "[ 0:05]   sweep h100: failed after 0:05"
    assert lines[-1] == "[ 0:05] retrain h100: failed after 0:05"


def test_rich_bars_on_a_terminal_end_with_the_same_done_lines(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=100, color_system=None)
    with progress.use(RichReporter(console=con, history=None)):
        with progress.stage("evaluate h100", total=4, unit="scenarios") as st:
            for _ in range(4):
                st.advance()
    text = buf.getvalue()
    assert "evaluate h100: done in" in text


def test_make_reporter_picks_lines_without_a_terminal_and_bars_on_one(monkeypatch, tmp_path):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BANDPILOT_PROGRESS", raising=False)
    assert isinstance(make_reporter(io.StringIO(), history=None), LineReporter)
    assert isinstance(make_reporter(Tty(), history=None), RichReporter)
    monkeypatch.setenv("CI", "true")
    assert isinstance(make_reporter(Tty(), history=None), LineReporter)  # CI logs: plain lines
    monkeypatch.setenv("BANDPILOT_PROGRESS", "off")
    assert make_reporter(Tty(), history=None) is None


# -- the long steps report through the interface ------------------------------------------------
def test_profiling_reports_every_run():
    from bandpilot.data import profiling
    from bandpilot.topology.cluster import spec_from_dict

    from tests.test_profiling import TINY

    spec = spec_from_dict(TINY)
    import tempfile

    rec = Recorder()
    with tempfile.TemporaryDirectory() as d, progress.use(rec):
        rep = profiling.run(spec, d, cross_host_samples=4, progress=False, do_ingest=False, jobs=1)
    starts = [e for e in rec.events if e[0] == "start"]
    assert starts == [("start", "profile tiny", 0, rep.measured)]
    assert rec.events[-1] == ("finish", "profile tiny", rep.measured, True)


def test_evaluation_reports_every_scenario():
    from bandpilot.evaluation.runner import evaluate
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.topology.cluster import load_cluster

    fab = make_fabric(load_cluster(ROOT / "params/clusters/het4mix.yaml"))
    rec = Recorder()
    with progress.use(rec):
        res = evaluate(fab, fab, repeats=1, ks=[2, 3], workers=1, algorithms="bandpilot", figures=False)
    n = len(res.scenarios)
    assert ("start", "evaluate het4mix", 0, n) in rec.events and ("finish", "evaluate het4mix", n, True) in rec.events


def test_training_reports_folds_and_the_final_fit(tmp_path):
    from bandpilot.data.dataset import load_dataset, save_dataset
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.model.crossval import fit
    from bandpilot.topology.cluster import load_cluster

    save_dataset(fabric_dataset(EmulatorFabric(load_cluster(ROOT / "params/clusters/het4mix.yaml")), n_cross=60, seed=2),
                 tmp_path / "ds")
    rec = Recorder()
    with progress.use(rec):
        fit(load_dataset(tmp_path / "ds"), {"epochs": 2, "hidden": 8, "heads": 2, "folds": 2, "threads": 1,
                                            "replay_size": 8}, plots=False)
    assert ("start", "train het4mix", 0, 3) in rec.events  # 2 folds + the final fit
    assert ("finish", "train het4mix", 3, True) in rec.events


@pytest.mark.parametrize("flag", ["--progress", "--no-progress"])
def test_cli_profile_prints_stage_lines_on_stderr_without_a_terminal(tmp_path, capsys, monkeypatch, flag):
    import yaml

    from bandpilot.cli.main import main
    from tests.test_profiling import TINY

    monkeypatch.delenv("BANDPILOT_PROGRESS", raising=False)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    assert main(["profile", "-c", str(spec), "-o", str(tmp_path / "out"), "-n", "4", "--no-track", "-j", "1", flag]) == 0
    cap = capsys.readouterr()
    lines = cap.err.splitlines()
    if flag == "--progress":
        import re

        assert re.fullmatch(r"\[ 0:\d\d\] profile tiny: \d+ runs", lines[0]), lines
        assert lines[-1].startswith("[") and "profile tiny: done in " in lines[-1]
        assert "\r" not in cap.err and "it/s" not in cap.err  # no tqdm bar in a log
    else:
        assert cap.err == ""
    assert "profile tiny" not in cap.out  # progress never mixes into the command's output
