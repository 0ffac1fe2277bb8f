"""Tests for bandpilot.topology.nccl_format: the nccl-tests writer, and the writer/parser round trip (property)."""

from __future__ import annotations

import string
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import bandpilot  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bandpilot.topology.nccl_format import busbw_factor, format_log, make_row, time_for
from bandpilot.topology.nccl_log import NcclDevice, NcclMeasure, NcclParseError, NcclResult, parse

# ------------------------------------------------------------------------------------------------
# writer, helpers


def test_busbw_factor_and_time_for() -> None:
    assert busbw_factor("all_reduce_perf", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather_perf_mpi", 4) == pytest.approx(0.75)
    assert busbw_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert busbw_factor("alltoall_perf", 2) == pytest.approx(0.5)
    assert busbw_factor("broadcast_perf", 16) == 1.0
    assert busbw_factor("sendrecv_perf", 2) == 1.0
    assert busbw_factor("reduce_perf", 2) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("frobnicate_perf", 2)
    with pytest.raises(ValueError):
        busbw_factor("all_reduce_perf", 0)
    # 134217728 B all_reduce on 8 ranks at 208.12 GB/s busbw: the real log row says 1128.6 us.
    t = time_for(134217728, 208.12, "all_reduce_perf", 8)
    assert t == pytest.approx(1128.6, rel=1e-3)
    alg = 134217728 / (t * 1e3)
    assert alg * busbw_factor("all_reduce_perf", 8) == pytest.approx(208.12)
    with pytest.raises(ValueError):
        time_for(1024, 1.0, "all_gather_perf", 1)  # busbw is always 0 on one rank


def test_format_log_matches_nccl_tests_widths() -> None:
    row = make_row(1024, 16, "float", "none", -1, 40.78, 0.03, 0.02, in_place=NcclMeasure(30.98, 0.03, 0.03, None))
    dev = NcclDevice(0, "R6KD-GPU-14", 12812, 0, "0000:06:00", "NVIDIA H100 80GB HBM3")
    text = format_log([row], [dev], "alltoall_perf")
    lines = text.split("\n")
    # Both lines copied from a real alltoall_perf log (nccl-tests 2.18.3).
    assert "        1024            16     float    none      -1    40.78    0.03    0.02       0    30.98    0.03    0.03    N/A" in lines
    assert "#  Rank  0 Group  0 Pid  12812 on R6KD-GPU-14 device  0 [0000:06:00] NVIDIA H100 80GB HBM3" in lines
    assert "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong" in lines
    assert lines[0].startswith("# nccl-tests version ") and "nccl-library=22105" in lines[0]
    assert lines[2].startswith("# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 2(factor) warmup iters: 5")
    assert "# Out of bounds values : 0 OK" in lines
    assert "# Avg bus bandwidth    : 0.025 " in lines
    assert lines[-4:] == ["# Collective test concluded: alltoall_perf", "#", "", ""]


def test_format_log_tagged_reports_wrong_and_reparses() -> None:
    rows = [make_row(2**k, 2**k // 4, "float", "sum", -1, 10.0 + k, 1.0, 1.75) for k in range(10, 14)]
    bad = make_row(2**14, 2**12, "float", "sum", -1, 30.0, 1.0, 1.75, wrong=3)
    devs = [NcclDevice(i, "h1", 100 + i, i, f"0x{i:02x}", "GPU") for i in range(8)]
    text = format_log(rows + [bad], devs, "all_reduce", tag_output=True)
    assert all(line.startswith("[1,0]<stdout>:") for line in text.split("\n")[:-1])
    assert "# Out of bounds values : 2 FAILED" in text  # out-of-place and (duplicated) in-place
    r = parse(text, "emu.log", strict=False)
    assert not r.ok and r.collective == "all_reduce_perf" and r.out_of_bounds == 2
    with pytest.raises(NcclParseError):
        parse(text, "emu.log")


def test_format_log_rejects_unprintable_input() -> None:
    row = make_row(8, 2, "float", "sum", -1, 1.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        format_log([], [], "all_reduce_perf")
    with pytest.raises(ValueError):
        format_log([row], [NcclDevice(0, "bad host", 1, 0, "0x01", "GPU")])
    with pytest.raises(ValueError):
        format_log([make_row(8, 2, "fl oat", "sum", -1, 1.0, 0.0, 0.0)], [])


def test_parse_is_fast() -> None:
    devs = [NcclDevice(i, f"node-{i // 8}", 1000 + i, i % 8, f"0000:{i:02x}:00", "NVIDIA H100 80GB HBM3") for i in range(16)]
    rows = [make_row(2**k, 2**k // 4, "float", "sum", -1, 5.0 + k, 1.0, 1.5) for k in range(3, 34)]
    text = format_log(rows, devs, "all_reduce_perf", tag_output=True)
    noise = "\n".join(f"node-0:1:{i} [0] NCCL INFO Channel {i:02d}/0 : 0[0] -> 1[1] via P2P/IPC" for i in range(130))
    text = noise + "\n" + text
    assert 190 <= text.count("\n") <= 220
    # Speed is measured in benchmarks/, not asserted here: a 200-line noisy log must parse.
    assert len(parse(text).rows) == len(rows)


# ------------------------------------------------------------------------------------------------
# properties

_HOST = st.text(alphabet=string.ascii_lowercase + string.digits + "-.", min_size=1, max_size=24)
_NAME = st.text(alphabet=string.ascii_letters + string.digits + " -", min_size=1, max_size=30).map(str.strip).filter(bool)
_BUS = st.one_of(
    st.integers(0, 255).map(lambda b: f"0x{b:02x}"),
    st.tuples(st.integers(0, 0xFFFF), st.integers(0, 255)).map(lambda t: f"{t[0]:04x}:{t[1]:02x}:00"),
)
_CENTI = st.integers(0, 2_000_000).map(lambda c: c / 100)  # 2-decimal bandwidths up to 20 TB/s
_TIME = st.floats(0.01, 9_000_000.0, allow_nan=False)


@st.composite
def _devices(draw: st.DrawFn) -> list[NcclDevice]:
    n = draw(st.integers(0, 12))
    return [
        NcclDevice(
            rank=i,
            host=draw(_HOST),
            pid=draw(st.one_of(st.none(), st.integers(1, 4_000_000))),
            device=draw(st.integers(0, 15)),
            bus_id=draw(_BUS),
            name=draw(_NAME),
        )
        for i in range(n)
    ]


@st.composite
def _rows(draw: st.DrawFn) -> list:
    sizes = draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=25, unique=True))
    wrong = draw(st.sampled_from([0, None]))
    out = []
    for size in sizes:
        inp = NcclMeasure(draw(_TIME), draw(_CENTI), draw(_CENTI), wrong)
        out.append(
            make_row(
                size,
                size // 4,
                draw(st.sampled_from(["float", "half", "bfloat16", "int8", "double"])),
                draw(st.sampled_from(["sum", "none", "max", "avg"])),
                draw(st.integers(-1, 15)),
                draw(_TIME),
                draw(_CENTI),
                draw(_CENTI),
                wrong=wrong,
                in_place=draw(st.one_of(st.none(), st.just(inp))),
            )
        )
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=_rows(),
    devices=_devices(),
    collective=st.sampled_from(["all_gather_perf", "all_reduce_perf", "broadcast_perf_mpi", "sendrecv", "alltoall_perf"]),
    in_place=st.booleans(),
    tag_output=st.booleans(),
)
@pytest.mark.slow
def test_round_trip(rows: list, devices: list[NcclDevice], collective: str, in_place: bool, tag_output: bool) -> None:
    text = format_log(rows, devices, collective, in_place=in_place, tag_output=tag_output)
    r = parse(text, "rt.log")
    assert isinstance(r, NcclResult) and r.ok
    assert [x.size for x in r.rows] == [x.size for x in rows]
    assert r.devices == tuple(devices)
    assert r.nranks == (len(devices) or None)
    expect_coll = collective.removesuffix("_mpi")
    assert r.collective == (expect_coll if expect_coll.endswith("_perf") else expect_coll + "_perf")
    busbws = []
    for got, want in zip(r.rows, rows):
        assert (got.count, got.type, got.redop, got.root) == (want.count, want.type, want.redop, want.root)
        assert r.busbw_at(want.size) == round(want.out_of_place.busbw, 2)
        assert got.out_of_place.algbw == round(want.out_of_place.algbw, 2)
        assert abs(got.out_of_place.time_us - want.out_of_place.time_us) <= 0.5
        assert got.out_of_place.wrong == want.out_of_place.wrong
        if in_place:
            want_in = want.in_place or want.out_of_place
            assert got.in_place is not None and got.in_place.busbw == round(want_in.busbw, 2)
            busbws += [want.out_of_place.busbw, want_in.busbw]
        else:
            assert got.in_place is None
            busbws.append(want.out_of_place.busbw)
    assert r.avg_busbw == pytest.approx(sum(busbws) / len(busbws), rel=1e-5, abs=1e-6)


