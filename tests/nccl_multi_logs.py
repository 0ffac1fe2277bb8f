"""Multi-run nccl-tests logs for the parser tests, written by hand in the nccl-tests 2.17 layout.

``FIVE_COLLECTIVES``: what cluster-validation wrapper scripts produce - all_reduce, all_gather,
reduce_scatter, alltoall and sendrecv back to back in one log (3 nodes x 2 GPUs = 6 ranks), each run
in its own "Collective test starting/concluded" block. The all_reduce and alltoall runs repeat their
first five data rows (what `tee` into the same file leaves behind); alltoall prints N/A in the
in-place #wrong column; all_gather, reduce_scatter and alltoall print sizes rounded down to whole
16-byte chunks per rank (33554400 for 32 MiB on 6 ranks), as nccl-tests 2.17 does.
"""

FIVE_COLLECTIVES = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51201 on    gpu-a01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51202 on    gpu-a01 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  38890 on    gpu-a02 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  38891 on    gpu-a02 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  40012 on    gpu-a03 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  40013 on    gpu-a03 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048576        262144     float     sum      -1    99.17   10.57   17.62       0    99.74   10.51   17.52       0
     2097152        524288     float     sum      -1   114.09   18.38   30.64       0   113.42   18.49   30.82       0
     4194304       1048576     float     sum      -1   144.02   29.12   48.54       0   144.89   28.95   48.25       0
     8388608       2097152     float     sum      -1   203.80   41.16   68.60       0   202.59   41.41   69.01       0
    16777216       4194304     float     sum      -1   323.00   51.94   86.57       0   324.89   51.64   86.07       0
     1048576        262144     float     sum      -1    99.17   10.57   17.62       0    99.74   10.51   17.52       0
     2097152        524288     float     sum      -1   114.09   18.38   30.64       0   113.42   18.49   30.82       0
     4194304       1048576     float     sum      -1   144.02   29.12   48.54       0   144.89   28.95   48.25       0
     8388608       2097152     float     sum      -1   203.80   41.16   68.60       0   202.59   41.41   69.01       0
    16777216       4194304     float     sum      -1   323.00   51.94   86.57       0   324.89   51.64   86.07       0
    33554432       8388608     float     sum      -1   560.47   59.87   99.78       0   557.39   60.20  100.33       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 58.6458 
#
# Collective test concluded: all_reduce_perf
#

# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: all_gather_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51208 on    gpu-a01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51209 on    gpu-a01 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  38897 on    gpu-a02 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  38898 on    gpu-a02 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  40019 on    gpu-a03 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  40020 on    gpu-a03 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048512         43688     float    none      -1    61.09   17.16   14.30       0    61.19   17.14   14.28       0
     2097120         87380     float    none      -1    70.38   29.80   24.83       0    70.22   29.87   24.89       0
     4194240        174760     float    none      -1    88.80   47.23   39.36       0    89.08   47.09   39.24       0
     8388576        349524     float    none      -1   125.39   66.90   55.75       0   124.92   67.15   55.96       0
    16777152        699048     float    none      -1   198.20   84.65   70.54       0   199.07   84.28   70.23       0
    33554400       1398100     float    none      -1   343.26   97.75   81.46       0   341.57   98.24   81.86       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 47.725 
#
# Collective test concluded: all_gather_perf
#

+ mpirun -np 6 --host gpu-a01:2,gpu-a02:2,gpu-a03:2 /opt/nccl-tests/build/reduce_scatter_perf -b 1M -e 32M -f 2 -g 1
[gpu-a01:51190] 5 more processes have sent help message help-mpi-btl-base.txt / btl:no-nics
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: reduce_scatter_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51215 on    gpu-a01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51216 on    gpu-a01 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  38904 on    gpu-a02 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  38905 on    gpu-a02 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  40026 on    gpu-a03 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  40027 on    gpu-a03 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048512         43688     float     sum      -1    62.63   16.74   13.95       0    62.38   16.81   14.01       0
     2097120         87380     float     sum      -1    72.06   29.10   24.25       0    72.31   29.00   24.17       0
     4194240        174760     float     sum      -1    90.69   46.25   38.54       0    90.45   46.37   38.64       0
     8388576        349524     float     sum      -1   127.74   65.67   54.72       0   127.98   65.55   54.62       0
    16777152        699048     float     sum      -1   201.65   83.20   69.33       0   201.44   83.29   69.41       0
    33554400       1398100     float     sum      -1   349.43   96.03   80.02       0   349.50   96.01   80.01       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 46.8058 
#
# Collective test concluded: reduce_scatter_perf
#

# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: alltoall_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51222 on    gpu-a01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51223 on    gpu-a01 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  38911 on    gpu-a02 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  38912 on    gpu-a02 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  40033 on    gpu-a03 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  40034 on    gpu-a03 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048512         43688     float    none      -1   143.83    7.29    6.07       0   142.98    7.33    6.11    N/A
     2097120         87380     float    none      -1   165.05   12.71   10.59       0   166.04   12.63   10.53    N/A
     4194240        174760     float    none      -1   207.26   20.24   16.86       0   206.04   20.36   16.96    N/A
     8388576        349524     float    none      -1   291.76   28.75   23.96       0   293.46   28.59   23.82    N/A
    16777152        699048     float    none      -1   461.15   36.38   30.32       0   458.61   36.58   30.49    N/A
     1048512         43688     float    none      -1   143.83    7.29    6.07       0   142.98    7.33    6.11    N/A
     2097120         87380     float    none      -1   165.05   12.71   10.59       0   166.04   12.63   10.53    N/A
     4194240        174760     float    none      -1   207.26   20.24   16.86       0   206.04   20.36   16.96    N/A
     8388576        349524     float    none      -1   291.76   28.75   23.96       0   293.46   28.59   23.82    N/A
    16777152        699048     float    none      -1   461.15   36.38   30.32       0   458.61   36.58   30.49    N/A
    33554400       1398100     float    none      -1   801.14   41.88   34.90       0   805.28   41.67   34.72    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 20.4442 
#
# Collective test concluded: alltoall_perf
#

# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: sendrecv_perf
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 33554432 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  51229 on    gpu-a01 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  51230 on    gpu-a01 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  38918 on    gpu-a02 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  38919 on    gpu-a02 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  4 Group  0 Pid  40040 on    gpu-a03 device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  5 Group  0 Pid  40041 on    gpu-a03 device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
     1048576        262144     float     sum      -1   153.53    6.83    6.83       0   153.17    6.85    6.85       0
     2097152        524288     float     sum      -1   175.88   11.92   11.92       0   176.43   11.89   11.89       0
     4194304       1048576     float     sum      -1   220.91   18.99   18.99       0   220.08   19.06   19.06       0
     8388608       2097152     float     sum      -1   311.55   26.93   26.93       0   312.93   26.81   26.81       0
    16777216       4194304     float     sum      -1   493.76   33.98   33.98       0   491.33   34.15   34.15       0
    33554432       8388608     float     sum      -1   859.64   39.03   39.03       0   864.28   38.82   38.82       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 22.9383 
#
# Collective test concluded: sendrecv_perf
#
"""
