"""Logs with several runs (wrapper scripts), repeated rows, N/A fields, per-collective sizes: parse
picks one run or refuses to guess; parse_all returns every run; fuzzed for one-line errors only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nccl_multi_logs import FIVE_COLLECTIVES
from test_nccl import ALL_GATHER_MPI_TAGGED, ALL_REDUCE_PLAIN, BROADCAST_LEGACY, line_of

from bandpilot.topology.nccl_log import NcclParseError, parse, parse_all, same_collective

NAMES = ["all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf", "sendrecv_perf"]


def test_parse_all_splits_five_collectives() -> None:
    runs = parse_all(FIVE_COLLECTIVES, "multi.log")
    assert [r.collective for r in runs] == NAMES
    assert all(r.ok and r.nranks == 6 and len(r.rows) == 6 for r in runs)
    assert [r.line for r in runs] == [line_of(FIVE_COLLECTIVES, "# nccl-tests version")] + [
        r.line for r in runs[1:]]
    # each run starts before its own banner and ends after the previous run's "concluded" line
    for prev, run in zip(runs, runs[1:]):
        concluded = line_of(FIVE_COLLECTIVES, f"concluded: {prev.collective}")
        starting = line_of(FIVE_COLLECTIVES, f"starting: {run.collective}")
        assert concluded < run.line < starting
    assert {d.host for d in runs[0].devices} == {"gpu-a01", "gpu-a02", "gpu-a03"}


def test_repeated_rows_are_kept_once() -> None:
    runs = {r.collective: r for r in parse_all(FIVE_COLLECTIVES, "multi.log")}
    ar = runs["all_reduce_perf"]
    assert ar.duplicates == 5 and runs["sendrecv_perf"].duplicates == 0
    assert list(ar.sizes) == [2**k for k in range(20, 26)]
    assert ar.busbw_at(33554432) == 99.78 and ar.avg_busbw == pytest.approx(58.6458)


def test_na_in_place_wrong_and_adjusted_sizes() -> None:
    a2a = parse(FIVE_COLLECTIVES, "multi.log", collective="alltoall")
    assert a2a.ok and a2a.collective == "alltoall_perf"
    assert all(row.out_of_place.wrong == 0 and row.in_place is not None and row.in_place.wrong is None for row in a2a.rows)
    # 32 MiB on 6 ranks: whole 16-byte chunks per rank, as nccl-tests prints it
    assert a2a.sizes[-1] == 33554400 and a2a.rows[-1].count == 1398100
    ag = parse(FIVE_COLLECTIVES, "multi.log", collective="all_gather_perf_mpi")
    assert ag.sizes[0] == 1048512 and ag.busbw_at(33554400) == 81.46


def test_parse_picks_the_named_collective() -> None:
    for name in NAMES:
        r = parse(FIVE_COLLECTIVES, "multi.log", collective=name.removesuffix("_perf"))
        assert r.collective == name
    assert parse(FIVE_COLLECTIVES, "m.log", collective="/opt/build/sendrecv_perf_mpi").busbw_at(33554432) == 39.03


def test_several_runs_and_none_named_is_a_one_line_error() -> None:
    with pytest.raises(NcclParseError) as exc:
        parse(FIVE_COLLECTIVES, "multi.log")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("multi.log:")
    assert "5 runs" in msg and all(n in msg for n in NAMES)
    with pytest.raises(NcclParseError, match=r"^multi\.log:1: no broadcast_perf run among the 5 runs .*alltoall_perf"):
        parse(FIVE_COLLECTIVES, "multi.log", collective="broadcast_perf")


def test_single_run_logs_keep_working() -> None:
    assert parse(ALL_REDUCE_PLAIN, "ar.log", collective="all_reduce").collective == "all_reduce_perf"
    with pytest.raises(NcclParseError, match=r"^ag\.log:1: log is all_gather_perf, not all_reduce_perf$"):
        parse(ALL_GATHER_MPI_TAGGED, "ag.log", collective="all_reduce_perf")
    # a log that does not name its binary cannot contradict the caller
    assert len(parse(BROADCAST_LEGACY, "b.log", collective="broadcast").rows) == 5
    assert len(parse_all(ALL_REDUCE_PLAIN, "ar.log")) == 1


def test_repeated_collective_needs_parse_all() -> None:
    twice = ALL_GATHER_MPI_TAGGED + ALL_GATHER_MPI_TAGGED
    assert [r.collective for r in parse_all(twice, "x.log")] == ["all_gather_perf"] * 2
    with pytest.raises(NcclParseError, match=r"^x\.log:\d+: log holds 2 runs of all_gather_perf"):
        parse(twice, "x.log", collective="all_gather")


def test_old_logs_split_at_nthread_headers() -> None:
    text = ALL_REDUCE_PLAIN + BROADCAST_LEGACY
    runs = parse_all(text, "old.log")
    assert [r.collective for r in runs] == ["all_reduce_perf", None]
    assert [len(r.rows) for r in runs] == [7, 5]
    assert runs[1].line == line_of(text, "# Avg bus bandwidth    : 59.2371") + 1


def test_a_failed_run_fails_only_itself() -> None:
    broken = FIVE_COLLECTIVES.replace(
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 20.4442",
        "gpu-a02: Test NCCL failure common.cu:1285 'remote process exited or there was a network error'\n"
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 20.4442", 1)
    assert broken != FIVE_COLLECTIVES
    runs = parse_all(broken, "b.log", strict=False)
    assert [r.collective for r in runs if not r.ok] == ["alltoall_perf"]
    assert parse(broken, "b.log", collective="sendrecv").ok
    with pytest.raises(NcclParseError, match=r"^b\.log:\d+: failure reported: gpu-a02: Test NCCL failure"):
        parse(broken, "b.log", collective="alltoall")
    with pytest.raises(NcclParseError, match="failure reported"):
        parse_all(broken, "b.log")


def test_a_run_that_died_before_its_rows() -> None:
    died = ALL_REDUCE_PLAIN.split("           8             2")[0] + FIVE_COLLECTIVES
    runs = parse_all(died, "d.log", strict=False)
    assert runs[0].rows == () and not runs[0].ok and "no data rows" in runs[0].problems[0]
    assert [r.collective for r in runs[1:]] == NAMES
    with pytest.raises(NcclParseError, match=r"^d\.log:\d+: column header but no data rows follow$"):
        parse_all(died, "d.log")


def test_same_collective() -> None:
    assert same_collective("all_reduce", "/x/all_reduce_perf_mpi")
    assert same_collective("AllReduce", "all_reduce_perf")
    assert not same_collective("all_gather", "all_reduce")


_LINES = FIVE_COLLECTIVES.split("\n") + ["1048576 262144 float sum -1 N/A N/A N/A 0 1.0 1.0 1.0 N/A", "# Collective test starting:"]


@settings(max_examples=250, deadline=None)
@given(
    text=st.one_of(
        st.lists(st.sampled_from(_LINES), max_size=80).map("\n".join),
        st.lists(st.one_of(st.sampled_from(_LINES), st.text(max_size=30)), max_size=50).map("\n".join),
    ),
    strict=st.booleans(),
    collective=st.one_of(st.none(), st.sampled_from(["all_reduce", "alltoall_perf", "sendrecv", "bogus", "", " "])),
)
@pytest.mark.slow
def test_fuzz_multi_run_errors_are_one_line(text: str, strict: bool, collective: str | None) -> None:
    for call in (lambda: parse(text, "f.log", strict=strict, collective=collective),
                 lambda: parse_all(text, "f.log", strict=strict)):
        try:
            out = call()
        except NcclParseError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("f.log:")
            continue
        for r in out if isinstance(out, list) else [out]:
            assert r.ok == (not r.problems)
            assert r.rows or not strict
