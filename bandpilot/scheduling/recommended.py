"""What does the queue run when nobody says otherwise? The configuration measured best on issue 21's workload.

``python -m benchmarks jct`` (the measured H100 tables, 2 seeds; README "Jobs finish sooner"): on
the 200-job mixed workload (sizes 1-32, time limits off by up to 3x) ``hrrn`` order + EASY backfill +
BandPilot placement with a 0.5 locality margin has the lowest mean and p95 JCT of every
configuration measured, under both demand models (about -37 % mean vs the Slurm-like baseline).
It is not best everywhere: on seed 001's 50-job burst it is ~1.9x FIFO's mean JCT (large jobs start
last, on a fragmented cluster) - there ``--policy utility`` is the one that does not lose - and its
largest JCT is worse than Slurm-like's (a 24 h gang ages up slowly). The live queue (``dispatch
--batch``, the flow, the API's batch loop) and ``bandpilot simulate`` default to it; the baselines
are named flags (``--baseline slurm|greedy|greedy-topo``, or ``--policy fifo --backfill greedy
--locality 0``). :func:`~bandpilot.scheduling.batch.run_batch` itself keeps the neutral mechanism
defaults (fifo, greedy, the dispatcher's locality) for callers that choose explicitly.

Preemption (``--preempt on``, :mod:`bandpilot.scheduling.preemption`) is measured but **off** by
default: on the same workload (2 seeds) it keeps wasted GPU-hours at ~1 % of GPU-hours used and
improves the ``full``-demand mean and p95 (4.64 -> 4.52 h, 20.9 -> 18.0 h), but it does not fix the
largest-JCT miss (86.0 -> 71.4 h vs Slurm-like's 43.0 h) and costs the ``comm``-demand mean (4.54 ->
5.47 h): the starving 24 h gang is kept off the free GPUs by the hrrn leader's EASY reservation
(not by running jobs), and too few preemptible jobs sit where it would fit.
"""

POLICY = "hrrn"
BACKFILL = "easy"
LOCALITY = 0.5
PRICING = "now"
PREEMPT = "off"
START_OR_WAIT = "off"
