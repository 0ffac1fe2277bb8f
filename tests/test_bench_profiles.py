"""``python -m benchmarks profiles``: the cross-validation's selection rule on known numbers, the
load scaling, and a real --quick run (tiny traces through the real simulator) whose table has every
cell and candidate."""

from __future__ import annotations

import re

import pytest

from benchmarks.bench_profiles import CANDIDATES, REF, at_load, main, read_saved, select
from bandpilot.simulation.workloads import offered_load, seed001_workload

H = 3600.0


def _cell(mean_h: float, span_h: float) -> dict[str, float]:
    return {"avg_jct_s": mean_h * H, "p95_jct_s": 2 * mean_h * H, "max_jct_s": 3 * mean_h * H,
            "makespan_s": span_h * H, "gpu_utilization": 0.8, "incomplete": 0.0}


def test_the_best_worst_cell_wins_not_the_best_average():
    # "greedy-ish" is far better on average but loses one cell by 20 %; "steady" is 5 % better everywhere
    results = {
        ("a", 0.9): {REF: _cell(10, 100), "greedy-ish": _cell(5, 90), "steady": _cell(9.5, 99)},
        ("b", 0.9): {REF: _cell(4, 50), "greedy-ish": _cell(4.8, 55), "steady": _cell(3.8, 51)},
    }
    v = select(results)
    assert v.winner == "steady"
    assert v.score["greedy-ish"] == pytest.approx(1.2) and v.worst_cell["greedy-ish"] == ("b", 0.9)
    assert v.score["steady"] == pytest.approx(0.95) and v.score[REF] == pytest.approx(1.0)
    assert v.losses["greedy-ish"] == [("b", 0.9, "avg_jct_s", pytest.approx(1.2)), ("b", 0.9, "makespan_s", pytest.approx(1.1))]
    assert v.losses["steady"] == [("b", 0.9, "makespan_s", pytest.approx(1.02))]
    assert v.losses[REF] == []
    # on mean JCT and makespan alike nobody beats the reference everywhere: "steady" loses a makespan by 2 %
    assert v.strict["steady"] == pytest.approx(1.02) and v.strict["greedy-ish"] == pytest.approx(1.2)
    assert v.strict_winner == REF
    # regret (mean JCT over the best in the cell): "greedy-ish" 4.8 / 3.8 in b, "steady" 9.5 / 5 and the reference 10 / 5 in a
    assert v.regret == {REF: pytest.approx(2.0), "greedy-ish": pytest.approx(4.8 / 3.8), "steady": pytest.approx(1.9)}


def test_when_every_candidate_loses_somewhere_the_reference_wins():
    results = {("a", 0.7): {REF: _cell(2, 10), "x": _cell(1, 9)}, ("a", 1.1): {REF: _cell(2, 10), "x": _cell(2.2, 10)}}
    assert select(results).winner == REF


def test_at_load_scales_arrivals_to_the_offered_load_and_keeps_the_jobs():
    jobs = seed001_workload(3)
    for load in (0.7, 1.1):
        out = at_load(jobs, 32, load)
        assert offered_load(out, 32) == pytest.approx(load, rel=1e-4)
        assert [(j.id, j.k, j.compute_s) for j in out] == [(j.id, j.k, j.compute_s) for j in jobs]
        assert out[0].submit_s == jobs[0].submit_s


def test_quick_run_reports_every_cell_and_candidate(capsys, tmp_path):
    saved = tmp_path / "cells.jsonl"
    assert main(["--quick", "--workers", "1", "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    gens = ("mixed", "seed001", "helios")
    for g in gens:
        assert re.search(rf"^  {g} @ load 0.9: 1 seeds x 3 candidates in \d+ s", out, re.M), out
        block = out.split(f"### {g}\n")[1].split("###")[0]
        rows = [line for line in block.splitlines() if line.startswith("| 0.9 |")]
        assert [r.split(" | ")[1].split(" (")[0] for r in rows] == ["recommended", "slurm-like", REF]
        assert all(len(r.split("|")) == 11 for r in rows)
        ref_row = next(r for r in rows if f"| {REF} |" in r)
        assert ref_row.endswith("| +0.0 % | +0.0 % |")
    summary = out.split("### The rule: best on the worst cell")[1]
    assert sum(line.startswith("| ") and "/ 3 |" in line and line.count("|") == 9 for line in summary.splitlines()) == 3
    assert re.search(r"^- stricter rule \(worst of mean JCT and makespan\): \S+ \([+-]\d+\.\d %\)$", summary, re.M)
    winner = re.search(r"^- winner: (\S+)", summary, re.M).group(1)
    assert winner in CANDIDATES
    # the saved cells give the same verdict when rendered again
    results = read_saved(saved)
    assert sorted(results) == [(g, 0.9) for g in sorted(gens)]
    assert select(results).winner == winner
    assert main(["--render", str(saved)]) == 0
    assert f"- winner: {winner}" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(capsys):
    for argv, word in ((["--loads", "0.9,x"], "--loads"), (["--candidates", "nosuch"], "nosuch"), (["--seeds", "0"], "--seeds")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert word in err.splitlines()[-1] and "Traceback" not in err


def test_render_of_a_missing_or_broken_file_is_a_one_line_error(capsys, tmp_path):
    bad = tmp_path / "cells.jsonl"
    bad.write_text("{not json\n")
    for path in (tmp_path / "absent.jsonl", bad):
        assert main(["--render", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: --render {path}:")


def test_the_committed_candidate_file_is_the_candidate_measured():
    from dataclasses import replace
    from pathlib import Path

    from bandpilot.scheduling.profile import load_profile

    path = Path(__file__).resolve().parents[1] / "params" / "profiles" / "recommended-easy.yaml"
    assert load_profile(path) == replace(CANDIDATES["recommended-easy"], name=path.stem)


def test_saved_runs_on_other_seeds_average_and_overlaps_are_refused(tmp_path):
    import json

    def line(seeds, cand, mean_h):
        return json.dumps({"generator": "g", "load": 0.9, "seeds": seeds,
                           "cell": {cand: {**_cell(mean_h, 10), "n_seeds": float(len(seeds))}}})

    path = tmp_path / "cells.jsonl"
    path.write_text("\n".join([line([0, 1], REF, 2), line([0, 1], "x", 1), line([2, 3, 4, 5], REF, 5)]) + "\n")
    cell = read_saved(path)[("g", 0.9)]
    assert cell[REF]["avg_jct_s"] == pytest.approx(4 * H) and cell[REF]["n_seeds"] == 6  # (2 x 2 + 4 x 5) / 6
    assert cell["x"]["avg_jct_s"] == pytest.approx(1 * H) and cell["x"]["n_seeds"] == 2
    path.write_text(line([0, 1], REF, 2) + "\n" + line([1, 2], REF, 3) + "\n")
    with pytest.raises(ValueError, match="overlapping seed sets"):
        read_saved(path)
