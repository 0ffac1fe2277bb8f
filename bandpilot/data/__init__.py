"""Stage 2, measurements -> dataset: profiling plans and runners, ingestion of tables and
nccl-tests logs into one Parquet dataset, DVC versioning. Hands the model stage a
:class:`~bandpilot.data.dataset.Dataset`."""
