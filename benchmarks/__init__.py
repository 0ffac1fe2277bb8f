"""Speed and accuracy benchmarks. Run all: ``python -m benchmarks``; one: ``python -m benchmarks.bench_dispatch``."""
