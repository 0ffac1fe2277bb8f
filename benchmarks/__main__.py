"""Run every benchmark module in turn and print its Markdown tables (the figures of docs/benchmarks.md).

Usage: ``python -m benchmarks [NAME ...] [--FLAG ...]`` with names like ``dispatch`` or
``bench_surrogate``; everything from the first argument starting with ``-`` on is passed to each named
benchmark (``python -m benchmarks jct --only seed001`` is ``python -m benchmarks.bench_jct --only
seed001``). Each benchmark runs in its own process so one failure does not hide the others.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import time
from pathlib import Path


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(names, flags): the benchmark names, then the first ``-`` argument and everything after it."""
    at = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    return argv[:at], argv[at:]


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    argv, flags = split_args(argv)
    if flags and not argv:
        # flags differ per benchmark: passing them to all of them would fail most
        print(f"error: flags {flags} need a benchmark name before them, e.g. python -m benchmarks jct {' '.join(flags)}",
              file=sys.stderr)
        return 2
    if argv:
        want = {a if a.startswith("bench_") else f"bench_{a}" for a in argv}
        unknown = want - set(names)
        if unknown:
            print(f"error: unknown benchmark(s) {sorted(unknown)}; have {names}", file=sys.stderr)
            return 2
        names = [n for n in names if n in want]
    failed = []
    for name in names:
        print(f"\n## {name}\n", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", f"benchmarks.{name}", *flags])
        print(f"\n({name}: exit {rc}, {time.perf_counter() - t0:.0f} s)", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
