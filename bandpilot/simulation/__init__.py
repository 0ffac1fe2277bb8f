"""Stage 6, simulation: job completion time under queue policies and placement algorithms. Traces
(parsed and generated), a discrete-event simulator over the real queue store and dispatcher with
the true contention-degraded bandwidth, the entropy-guided utility loop, reports and sweeps."""
