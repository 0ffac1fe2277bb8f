"""Stage 5a, scoring: seeded scenarios, the dispatcher and baselines against the exact optimum on a
true fabric (``runner.evaluate``). Hands on a report directory with figures and MLflow metrics, and
the promotion gate's decision (``gate.promote`` / ``approve``) that moves the registry aliases."""
