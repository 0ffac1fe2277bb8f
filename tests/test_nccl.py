"""Tests for bandpilot.topology.nccl_log: realistic nccl-tests logs, failure verdicts, one-line errors, fuzzing (the writer: test_nccl_format.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    import bandpilot  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bandpilot.topology.nccl_log import (
    NcclDevice,
    NcclMeasure,
    NcclParseError,
    parse,
)

# ------------------------------------------------------------------------------------------------
# fixtures: logs in the shapes real nccl-tests runs produce

ALL_REDUCE_PLAIN = """\
$ ./build/all_reduce_perf -b 8 -e 128M -f 2 -g 8
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41233 on dgx-a100-07 device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  41233 on dgx-a100-07 device  1 [0x0f] NVIDIA A100-SXM4-80GB
#  Rank  2 Group  0 Pid  41233 on dgx-a100-07 device  2 [0x47] NVIDIA A100-SXM4-80GB
#  Rank  3 Group  0 Pid  41233 on dgx-a100-07 device  3 [0x4e] NVIDIA A100-SXM4-80GB
#  Rank  4 Group  0 Pid  41233 on dgx-a100-07 device  4 [0x87] NVIDIA A100-SXM4-80GB
#  Rank  5 Group  0 Pid  41233 on dgx-a100-07 device  5 [0x90] NVIDIA A100-SXM4-80GB
#  Rank  6 Group  0 Pid  41233 on dgx-a100-07 device  6 [0xb7] NVIDIA A100-SXM4-80GB
#  Rank  7 Group  0 Pid  41233 on dgx-a100-07 device  7 [0xbd] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2     float     sum      -1    10.93    0.00    0.00      0    10.88    0.00    0.00      0
          16             4     float     sum      -1    10.71    0.00    0.00      0    10.66    0.00    0.00      0
        1024           256     float     sum      -1    14.12    0.07    0.13      0    14.05    0.07    0.13      0
       65536         16384     float     sum      -1    19.87    3.30    5.77      0    19.77    3.31    5.80      0
     1048576        262144     float     sum      -1    41.32   25.38   44.41      0    41.11   25.50   44.63      0
    16777216       4194304     float     sum      -1    183.4   91.48  160.09      0    182.5   91.94  160.89      0
   134217728      33554432     float     sum      -1   1128.6  118.92  208.12      0   1123.0  119.52  209.16      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 59.2371 
#

"""

ALL_GATHER_MPI_TAGGED = """\
Warning: Permanently added 'node-b,10.0.0.2' (ECDSA) to the list of known hosts.
[1,2]<stderr>:Authorization required, but no authorization protocol specified
[1,0]<stdout>:# nccl-tests version 2.13.11 nccl-headers=22105 nccl-library=22105
[1,0]<stdout>:# Collective test starting: all_gather_perf_mpi
[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 1048576 maxBytes 67108864 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
[1,0]<stdout>:#
[1,0]<stdout>:# Using devices
[1,0]<stdout>:#  Rank  0 Group  0 Pid  12345 on     node-a device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
[1,0]<stdout>:#  Rank  1 Group  0 Pid  12346 on     node-a device  1 [0000:43:00] NVIDIA H100 80GB HBM3
[1,0]<stdout>:#  Rank  2 Group  0 Pid  20871 on     node-b device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
[1,0]<stdout>:#  Rank  3 Group  0 Pid  20872 on     node-b device  1 [0000:43:00] NVIDIA H100 80GB HBM3
[1,0]<stdout>:node-a:12345:12345 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
[1,0]<stdout>:node-a:12345:12345 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
[1,2]<stdout>:node-b:20871:20871 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.2<0>
[1,0]<stdout>:NCCL version 2.21.5+cuda12.4
[1,1]<stderr>:[node-a:12346] mca_base_component_repository_open: unable to open mca_btl_openib: FAILED
[1,3]<stdout>:node-b:20872:20950 [1] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [send] via NET/IB/0
[1,0]<stdout>:node-a:12345:12420 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129 FAILED
[1,0]<stdout>:#
[1,0]<stdout>:#                                                              out-of-place                       in-place          
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
[1,0]<stdout>:     1048576         65536     float    none      -1    45.12   23.24   17.43      0    45.57   23.01   17.26      0
[1,0]<stdout>:     2097152        131072     float    none      -1    61.87   33.90   25.42      0    62.49   33.56   25.17      0
[1,1]<stdout>:node-a:12346:12421 [1] NCCL INFO comm 0x55d0c8e0 rank 1 nranks 4 cudaDev 1 busId 43000 - Init COMPLETE
[1,0]<stdout>:     4194304        262144     float    none      -1    98.40   42.63   31.97      0    99.38   42.20   31.65      0
[1,2]<stderr>:[node-b:20871] 1 more process has sent help message help-mpi-btl-openib.txt / no active ports found
[1,0]<stdout>:     8388608        524288     float    none      -1    171.3   48.97   36.73      0    173.0   48.49   36.36      0
[1,0]<stdout>:    16777216       1048576     float    none      -1    318.9   52.61   39.46      0    322.1   52.09   39.07      0
[1,0]<stdout>:    33554432       2097152     float    none      -1    612.5   54.78   41.09      0    618.6   54.24   40.68      0
[1,0]<stdout>:    67108864       4194304     float    none      -1   1198.7   55.98   41.99      0   1210.7   55.43   41.57      0
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Avg bus bandwidth    : 33.1707 
[1,0]<stdout>:#
[1,0]<stdout>:# Collective test concluded: all_gather_perf_mpi
[1,0]<stdout>:#
[1,0]<stdout>:
"""

ALLTOALL_SINGLE_GROUP = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: alltoall_perf
# nThread 1 nGpus 1 minBytes 33554432 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid 223120 on cnode2-002 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 223121 on cnode2-002 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)
    33554432       4194304     float    none      -1    512.3   65.50   32.75       0
    67108864       8388608     float    none      -1    993.1   67.58   33.79       0
   134217728      16777216     float    none      -1   1950.2   68.82   34.41       0
   268435456      33554432     float    none      -1   3881.7   69.15   34.58       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 33.8825 
#
# Collective test concluded: alltoall_perf
#
"""

BROADCAST_ROOT = """\
# nThread 1 nGpus 4 minBytes 1024 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   7001 on   gpu-node device  0 [0x18] Tesla V100-SXM2-32GB
#  Rank  1 Group  0 Pid   7001 on   gpu-node device  1 [0x3b] Tesla V100-SXM2-32GB
#  Rank  2 Group  0 Pid   7001 on   gpu-node device  2 [0x86] Tesla V100-SXM2-32GB
#  Rank  3 Group  0 Pid   7001 on   gpu-node device  3 [0xaf] Tesla V100-SXM2-32GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
        1024           256     float    none       2    14.62    0.07    0.07      0    14.55    0.07    0.07      0
        4096          1024     float    none       2    15.01    0.27    0.27      0    15.10    0.27    0.27      0
       16384          4096     float    none       2    17.83    0.92    0.92      0    17.79    0.92    0.92      0
       65536         16384     float    none       2    24.40    2.69    2.69      0    24.38    2.69    2.69      0
      262144         65536     float    none       2    41.95    6.25    6.25      0    41.90    6.26    6.26      0
     1048576        262144     float    none       2    84.77   12.37   12.37      0    84.70   12.38   12.38      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 4.09583 
#
"""

# nccl-tests 2.0-era: old device lines (no Group), no redop column, legacy float "error" column.
BROADCAST_LEGACY = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 65536 step: 8(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  26528 on  dgx-work01 device  0 [0x07] Tesla P100-SXM2-16GB
#   Rank  1 Pid  26528 on  dgx-work01 device  1 [0x0a] Tesla P100-SXM2-16GB
#
#                                             out-of-place                       in-place
#       size         count    type    root     time   algbw   busbw    error     time   algbw   busbw    error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)              (us)  (GB/s)  (GB/s)
           8             2   float       0    12.41    0.00    0.00    0e+00    12.37    0.00    0.00    0e+00
          64            16   float       0    12.52    0.01    0.01    0e+00    12.49    0.01    0.01    0e+00
         512           128   float       0    12.88    0.04    0.04    0e+00    12.80    0.04    0.04    0e+00
        4096          1024   float       0    14.02    0.29    0.29    0e+00    13.97    0.29    0.29    0e+00
       32768          8192   float       0    20.35    1.61    1.61    0e+00    20.31    1.61    1.61    0e+00
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.39 
"""

# -c 0: validation off, nccl-tests prints N/A in #wrong.
ALL_REDUCE_NO_CHECK = """\
# nccl-tests version 2.14.1 nccl-headers=22105 nccl-library=22105
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 1024 maxBytes 8192 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 0 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  31001 on    host-a1 device  0 [0000:18:00] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid  31002 on    host-a1 device  1 [0000:3b:00] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong 
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         
        1024           256     float     sum      -1    95.40    0.01    0.01    N/A    94.33    0.01    0.01    N/A
        2048           512     float     sum      -1    99.47    0.02    0.02    N/A    97.65    0.02    0.02    N/A
        4096          1024     float     sum      -1    103.8    0.04    0.04    N/A    103.9    0.04    0.04    N/A
        8192          2048     float     sum      -1    112.5    0.07    0.07    N/A    109.9    0.07    0.07    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.035 
#
"""


def line_of(text: str, needle: str) -> int:
    """1-based line number of the first line containing ``needle``."""
    for i, line in enumerate(text.split("\n"), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in text")


def assert_one_line_error(exc: pytest.ExceptionInfo[NcclParseError], source: str, line: int | None) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "\r" not in msg
    prefix = f"{source}:{line}:" if line is not None else f"{source}:"
    assert msg.startswith(prefix), msg
    return msg


# ------------------------------------------------------------------------------------------------
# realistic logs


def test_plain_all_reduce_two_groups_with_device_table() -> None:
    r = parse(ALL_REDUCE_PLAIN, "ar.log")
    assert r.ok and r.problems == ()
    assert r.collective == "all_reduce_perf"  # from the command line
    assert r.source == "ar.log"
    assert [row.size for row in r.rows] == [8, 16, 1024, 65536, 1048576, 16777216, 134217728]
    last = r.rows[-1]
    assert (last.count, last.type, last.redop, last.root) == (33554432, "float", "sum", -1)
    assert last.out_of_place == NcclMeasure(1128.6, 118.92, 208.12, 0)
    assert last.in_place == NcclMeasure(1123.0, 119.52, 209.16, 0)
    assert r.busbw_at(16777216) == 160.09
    assert r.avg_busbw == pytest.approx(59.2371)
    assert r.out_of_bounds == 0
    assert r.nranks == 8
    assert r.devices[3] == NcclDevice(3, "dgx-a100-07", 41233, 3, "0x4e", "NVIDIA A100-SXM4-80GB")


def test_mpirun_tag_output_all_gather_two_hosts_with_noise() -> None:
    r = parse(ALL_GATHER_MPI_TAGGED, "ag_mpi.log")
    # FAILED in a stderr line and in an NCCL WARN line are noise, not verdicts.
    assert r.ok, r.problems
    assert r.collective == "all_gather_perf"
    assert r.nranks == 4
    assert {d.host for d in r.devices} == {"node-a", "node-b"}
    assert r.devices[2] == NcclDevice(2, "node-b", 20871, 0, "0000:1b:00", "NVIDIA H100 80GB HBM3")
    assert len(r.rows) == 7
    assert all(row.redop == "none" and row.root == -1 for row in r.rows)
    assert r.busbw_at(4194304) == 31.97
    assert r.rows[-1].in_place is not None and r.rows[-1].in_place.busbw == 41.57
    assert r.avg_busbw == pytest.approx(33.1707)


def test_single_group_layout() -> None:
    r = parse(ALLTOALL_SINGLE_GROUP, "a2a.log")
    assert r.ok
    assert r.collective == "alltoall_perf"
    assert all(len(row.groups) == 1 and row.in_place is None for row in r.rows)
    assert r.busbw_at(268435456) == 34.58
    assert r.rows[0].out_of_place.time_us == 512.3


def test_broadcast_root_column() -> None:
    r = parse(BROADCAST_ROOT, "bcast.log")
    assert r.ok
    assert r.collective is None  # nothing in the log names the binary
    assert all(row.root == 2 and row.redop == "none" for row in r.rows)
    assert r.busbw_at(1048576) == 12.37
    assert r.nranks == 4


def test_legacy_layout_without_redop_and_with_error_column() -> None:
    r = parse(BROADCAST_LEGACY, "old.log")
    assert r.ok
    assert [row.size for row in r.rows] == [8, 64, 512, 4096, 32768]
    assert all(row.redop == "none" and row.root == 0 for row in r.rows)
    assert r.rows[0].out_of_place.wrong is None  # the legacy column is a max error, not a count
    assert r.devices[1] == NcclDevice(1, "dgx-work01", 26528, 1, "0x0a", "Tesla P100-SXM2-16GB")


def test_no_check_gives_wrong_none() -> None:
    r = parse(ALL_REDUCE_NO_CHECK, "c0.log")
    assert r.ok
    assert all(m.wrong is None for row in r.rows for m in row.groups)
    assert r.busbw_at(8192) == 0.07
    assert r.rows[2].out_of_place.time_us == 103.8


def test_srun_label_prefix_and_crlf() -> None:
    text = "\r\n".join("0: " + line for line in ALLTOALL_SINGLE_GROUP.split("\n"))
    r = parse(text, "srun.log")
    assert r.ok and len(r.rows) == 4 and r.nranks == 2


def test_nccl_line_cutting_a_row_in_two() -> None:
    # NCCL writes to the same stdout buffer, so an INFO line can land between the printf calls
    # that make one row.
    text = ALL_REDUCE_PLAIN.replace(
        "     1048576        262144     float     sum      -1    41.32   25.38   44.41      0    41.11   25.50   44.63      0",
        "     1048576        262144     float     sum      -1"
        "dgx-a100-07:41233:41300 [3] NCCL INFO Channel 02/0 : 3[4e000] -> 4[87000] via P2P/IPC\n"
        "dgx-a100-07:41233:41300 [4] NCCL INFO Connected all rings\n"
        "    41.32   25.38   44.41      0"
        "dgx-a100-07:41233:41301 [5] NCCL INFO Connected all trees\n"
        "    41.11   25.50   44.63      0",
    )
    r = parse(text, "cut.log")
    assert r.ok, r.problems
    assert r.busbw_at(1048576) == 44.41
    assert r.rows[4].in_place == NcclMeasure(41.11, 25.50, 44.63, 0)
    assert len(r.rows) == 7


def test_extra_columns_bitdiff_and_timestamp() -> None:
    text = """\
# Collective test starting: reduce_scatter_perf
#       size         count      type   redop    root     time   algbw   busbw  #wrong  #bitdiff     time   algbw   busbw  #wrong  #bitdiff timestamp
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)                      (us)  (GB/s)  (GB/s)                   %Y-%m-%d %H:%M:%S
     1048576         32768     float     sum      -1    30.10   34.84   30.48       0         0    30.02   34.93   30.56       0         0  2025-03-01 10:00:01
     2097152         65536     float     sum      -1    45.77   45.82   40.09       0         0    45.60   45.99   40.24       0         0  2025-03-01 10:00:01
# Out of bounds values : 0 OK
# Bitwise mismatches   : 0 OK
# Avg bus bandwidth    : 35.3425 
"""
    r = parse(text, "rs.log")
    assert r.ok
    assert r.collective == "reduce_scatter_perf"
    assert r.busbw_at(2097152) == 40.09
    assert r.rows[0].in_place == NcclMeasure(30.02, 34.93, 30.56, 0)
    assert r.nranks is None


def test_rows_without_header_are_inferred() -> None:
    rows_only = "\n".join(ln for ln in ALL_REDUCE_PLAIN.split("\n") if ln and not ln.startswith(("#", "$")))
    r = parse(rows_only, "rows.txt")
    assert len(r.rows) == 7 and r.avg_busbw is None and r.busbw_at(1024) == 0.13


# ------------------------------------------------------------------------------------------------
# verdicts and errors


def test_wrong_elements_fail() -> None:
    text = ALL_REDUCE_PLAIN.replace("44.41      0    41.11   25.50   44.63      0", "44.41      0    41.11   25.50   44.63     17")
    ln = line_of(text, "    17")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "wrong.log")
    msg = assert_one_line_error(exc, "wrong.log", ln)
    assert "17 wrong elements" in msg and "in-place" in msg
    r = parse(text, "wrong.log", strict=False)
    assert not r.ok and len(r.problems) == 1 and r.busbw_at(1048576) == 44.41


def test_out_of_bounds_failed() -> None:
    text = BROADCAST_LEGACY.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 2 FAILED")
    ln = line_of(text, "Out of bounds")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "oob.log")
    msg = assert_one_line_error(exc, "oob.log", ln)
    assert "2 out-of-bounds values" in msg
    r = parse(text, "oob.log", strict=False)
    assert not r.ok and r.out_of_bounds == 2 and len(r.problems) == 1


def test_min_bw_check_failed_and_test_failure_lines() -> None:
    text = ALLTOALL_SINGLE_GROUP.replace("33.8825 ", "33.8825 FAILED")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "minbw.log")
    assert "failure reported" in assert_one_line_error(exc, "minbw.log", line_of(text, "Avg bus"))

    crashed = ALL_REDUCE_PLAIN.replace(
        "# Out of bounds values : 0 OK",
        "dgx-a100-07: Test NCCL failure common.cu:1285 'unhandled cuda error'\n"
        " .. dgx-a100-07 pid 41233: Test failure common.cu:1161\n# Out of bounds values : 0 OK",
    )
    with pytest.raises(NcclParseError) as exc:
        parse(crashed, "crash.log")
    msg = assert_one_line_error(exc, "crash.log", line_of(crashed, "Test NCCL failure"))
    assert "(+1 more problems)" in msg
    assert len(parse(crashed, "crash.log", strict=False).problems) == 2


def test_truncated_last_row() -> None:
    text = ALL_REDUCE_PLAIN.split("   134217728")[0] + "   134217728      33554432     float     sum      -1   1128.6  118.92\n"
    ln = line_of(text, "   134217728")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "cut.log")
    msg = assert_one_line_error(exc, "cut.log", ln)
    assert "truncated log" in msg and "7 of 13 fields" in msg
    r = parse(text, "cut.log", strict=False)
    assert not r.ok and len(r.rows) == 6 and r.avg_busbw is None


def test_truncated_row_in_the_middle() -> None:
    text = ALL_REDUCE_PLAIN.replace("      0    10.66    0.00    0.00      0", "")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "mid.log")
    msg = assert_one_line_error(exc, "mid.log", line_of(text, "          16             4"))
    assert "truncated data row: 8 of 13 fields" in msg


def test_negative_nan_and_non_numeric_values() -> None:
    cases = {
        "44.41": ("-44.41", "negative busbw"),
        "25.38": ("nan", "algbw is nan"),
        "41.32": ("4l.32", "non-numeric time"),
        "262144": ("-262144", "negative count"),
    }
    for old, (new, what) in cases.items():
        text = ALL_REDUCE_PLAIN.replace(f" {old} ", f" {new} ", 1)
        with pytest.raises(NcclParseError) as exc:
            parse(text, "bad.log")
        msg = assert_one_line_error(exc, "bad.log", line_of(text, "     1048576    "))
        assert what in msg, msg
        assert not parse(text, "bad.log", strict=False).ok


def test_busbw_at_missing_size() -> None:
    r = parse(ALLTOALL_SINGLE_GROUP, "a2a.log")
    with pytest.raises(NcclParseError) as exc:
        r.busbw_at(12345)
    msg = assert_one_line_error(exc, "a2a.log", None)
    assert "12345" in msg


@pytest.mark.parametrize("strict", [True, False])
def test_empty_text(strict: bool) -> None:
    for text in ("", "  \n\n\t\n"):
        with pytest.raises(NcclParseError) as exc:
            parse(text, "empty.log", strict=strict)
        assert "empty log" in assert_one_line_error(exc, "empty.log", 1)


@pytest.mark.parametrize("strict", [True, False])
def test_no_data_rows(strict: bool) -> None:
    header_only = ALL_REDUCE_PLAIN.split("           8             2")[0]
    with pytest.raises(NcclParseError) as exc:
        parse(header_only, "hdr.log", strict=strict)
    assert "no data rows" in assert_one_line_error(exc, "hdr.log", line_of(header_only, "#       size"))

    noise = "node-a:1:1 [0] NCCL INFO hello\nsome stderr line\n2 more processes have sent help message\n"
    with pytest.raises(NcclParseError) as exc:
        parse(noise, "noise.log", strict=strict)
    assert "no nccl-tests data rows" in assert_one_line_error(exc, "noise.log", 4)


def test_all_rows_bad_raises_even_when_not_strict() -> None:
    text = ALLTOALL_SINGLE_GROUP.replace("       0\n", "\n")
    with pytest.raises(NcclParseError) as exc:
        parse(text, "x.log", strict=False)
    assert "truncated data row" in assert_one_line_error(exc, "x.log", line_of(text, "    33554432"))


def test_source_with_newline_stays_one_line() -> None:
    with pytest.raises(NcclParseError) as exc:
        parse("", "a\nb.log")
    assert "\n" not in str(exc.value)


def test_error_is_a_value_error() -> None:
    assert issubclass(NcclParseError, ValueError)


# ------------------------------------------------------------------------------------------------
# fuzzing

_FRAGMENTS = [
    line
    for text in (ALL_REDUCE_PLAIN, ALL_GATHER_MPI_TAGGED, ALLTOALL_SINGLE_GROUP, BROADCAST_LEGACY, ALL_REDUCE_NO_CHECK)
    for line in text.split("\n")
] + ["1024 256 float sum -1 nan inf -0 N/A", "8", "# Out of bounds values : 99999999999999999999 FAILED", "#  Rank 9"]


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(),
        st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=40)), max_size=40).map("\n".join),
        st.lists(st.sampled_from(_FRAGMENTS), max_size=60).map("\n".join),
    ),
    strict=st.booleans(),
)
@pytest.mark.slow
def test_fuzz_only_nccl_parse_errors(text: str, strict: bool) -> None:
    try:
        r = parse(text, "fuzz.log", strict=strict)
    except NcclParseError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz.log:")
        return
    assert r.rows
    assert r.ok == (not r.problems)
    if strict:
        assert r.ok
