"""Stage 5a, scoring: seeded scenarios, the dispatcher and baselines against the exact optimum on a
true fabric, reports and figures, and the promotion gate that moves registry aliases."""
