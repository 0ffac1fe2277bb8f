"""Stage 3, dataset -> surrogate: the hierarchical bandwidth networks, Lightning training,
fine-tuning and Optuna sweeps, the MLflow registry. Hands the dispatcher a
:class:`~bandpilot.model.surrogate.Surrogate` that predicts ``B(S)`` for batches of allocations."""
