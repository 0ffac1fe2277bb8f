"""Model-free pairwise verification: detection and localization of injected faults, against the targets.

    python -m benchmarks.bench_pairwise [--faults 200] [--nodes 16] [--glitch 0.01] [--logs 5] [--crashes 40]

An emulated cluster of ``--nodes`` H100 hosts (the calibrated H100 emulator, one rack, 8 NIC rails
per host) is swept the way operators do it: every node pair, alltoall and sendrecv, 1, 2, 4 and 8
GPUs per node, with the emulator's measurement noise (2 %) and transient dips (a run slowed x0.5-0.9
with probability ``--glitch``). Per kind, ``--faults`` seeded single faults at random places: slow
node (x0.7), slow link between two nodes (x0.6), slow NIC rail (x0.5, any of the 8 rails), plus as
many fault-free sweeps. No model is used. ``--logs N``: N trials per kind go through real nccl-tests
logs (written, then read back by ``bandpilot verify --pairwise``'s reader).

Detected: the faulty node (slow node, rail) or link is not healthy. Localized: exactly that element
is flagged, as the right kind - a slow node as a node fault, a link as a link between healthy nodes,
a rail as a node slow from the GPU count that first uses the rail (rail 0 is used by every run, so it
reads as a slow node, which counts). False alarms: flagged nodes and links other than the fault, as
a share of the healthy ones. Targets: >= 98 %, >= 95 %, <= 1 %.

Failed runs (``--crashes`` trials, always through log files): a fault-free sweep in which one run of
one random pair - any collective, any GPU count - is written the way nccl-tests fails (NCCL failure
after the column header, a row cut by a killed job, wrong data, only the launcher's error, an empty
log) or its log is deleted. Detected: that pair is ``failed`` (``missing`` for a deleted log);
localized: nothing else is flagged. Target: 100 %, 100 %, 0 false alarms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib

import numpy as np
import yaml

from benchmarks.bench_surrogate import ROOT
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.faults import FaultyFabric, random_fault
from bandpilot.health.pairwise import analyze
from bandpilot.health.sweeps import WRITABLE_FAILURES, PairRun, Sweep, emulate_sweep, read_sweep, write_sweep_logs
from bandpilot.topology.cluster import spec_from_dict

KINDS = {"slow node": "slow_host", "slow link": "host_link", "slow rail": "nic_rail"}


def cluster(n: int):
    doc = yaml.safe_load((ROOT / "params" / "clusters" / "h100-64.yaml").read_text())
    doc["host_groups"][0]["count"] = n
    doc["host_groups"][0]["domain_size"] = max(n, 16)
    doc["name"] = f"h100-{n}"
    return spec_from_dict(doc)


def score(rep, fault) -> tuple[bool, bool, int, int]:
    """(detected, localized, false alarms, healthy elements)."""
    bad_nodes = {n for n, v in rep.nodes.items() if v.status != "healthy"}
    bad_links = {frozenset(lk.nodes) for lk in rep.links if lk.status != "healthy"}
    n_elems = len(rep.nodes) + len(rep.links)
    if fault is None:
        return False, False, len(bad_nodes) + len(bad_links), n_elems
    if fault.kind == "host_link":
        pair = frozenset((fault.host, fault.peer_host))
        det = pair in bad_links
        return det, det and bad_links == {pair} and not bad_nodes, len(bad_nodes) + len(bad_links - {pair}), n_elems - 1
    v = rep.nodes[fault.host]
    det = v.status != "healthy"
    alone = bad_nodes == {fault.host} and not bad_links
    if fault.kind == "slow_host":
        loc = alone and v.fault == "node"
    else:
        loc = alone and (fault.gpu in v.rails or (fault.gpu == 0 and v.fault == "node"))
    return det, loc, len(bad_nodes - {fault.host}) + len(bad_links), n_elems - 1


def trial(spec, fault, seed: int, glitch: float, via_logs: bool):
    rng = np.random.default_rng(seed)
    fab = EmulatorFabric(spec, seed=seed)
    runs = emulate_sweep(FaultyFabric(fab, [fault]) if fault else fab, seed=seed, glitch=glitch, rng=rng)
    if not via_logs:
        return analyze(Sweep(runs)), len(runs)
    with tempfile.TemporaryDirectory(prefix="bench-pairwise-") as tmp:
        write_sweep_logs(runs, tmp)
        return analyze(read_sweep(tmp)), len(runs)


def crash_trial(spec, seed: int, glitch: float) -> tuple[bool, bool, int, int]:
    """One failed (or deleted) run in a fault-free sweep: (detected, localized, false alarms, healthy elements)."""
    rng = np.random.default_rng(seed)
    runs = emulate_sweep(EmulatorFabric(spec, seed=seed), seed=seed, glitch=glitch, rng=rng)
    hit = runs[int(rng.integers(len(runs)))]
    kind = str(rng.choice([*WRITABLE_FAILURES, "deleted log"]))
    if kind != "deleted log":
        runs = [PairRun(r.collective, r.gpn, r.nodes, r.busbw, r.repeat, failure=kind) if r == hit else r for r in runs]
    with tempfile.TemporaryDirectory(prefix="bench-pairwise-") as tmp:
        write_sweep_logs(runs, tmp)
        if kind == "deleted log":
            os.unlink(os.path.join(tmp, f"nccl_N2_G{hit.gpn}_{hit.nodes[0]}_{hit.nodes[1]}.log"))
        rep = analyze(read_sweep(tmp))
    lk = next(x for x in rep.links if set(x.nodes) == set(hit.nodes))
    det = lk.status == ("missing" if kind == "deleted log" else "failed")
    others = sum(x.status != "healthy" for x in rep.links if x is not lk) + sum(v.status != "healthy" for v in rep.nodes.values())
    return det, det and others == 0, others, len(rep.links) - 1 + len(rep.nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", type=int, default=200, help="trials per kind (and fault-free sweeps)")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--glitch", type=float, default=0.01)
    ap.add_argument("--factor", type=float, default=None, help="one severity for every kind (default: per kind)")
    ap.add_argument("--logs", type=int, default=5, help="trials per kind through real log files")
    ap.add_argument("--crashes", type=int, default=40, help="trials with one failed or missing run (through logs)")
    args = ap.parse_args()
    spec = cluster(args.nodes)
    t0 = time.perf_counter()
    lines = [f"Load average at start: {os.getloadavg()[0]:.1f}; {args.nodes} nodes, {args.faults} trials per kind, "
             f"transient dips {100 * args.glitch:g} % of runs, severity "
             f"{'default (node x0.7, link x0.6, rail x0.5)' if args.factor is None else f'x{args.factor:g}'}.", "",
             "| fault | trials | detected % | localized % | false alarms % of healthy nodes+links | runs per node | via logs |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for label, kind in [("none", None), *KINDS.items()] if args.faults else []:
        rng = np.random.default_rng(zlib.crc32(f"pairwise/{label}".encode()))
        det = loc = fa = healthy = 0
        runs = 0
        for t in range(args.faults):
            fault = random_fault(spec, kind, rng, args.factor) if kind else None
            rep, runs = trial(spec, fault, 1 + t + 100_000 * (kind is not None), args.glitch, t < args.logs)
            d, lz, f, h = score(rep, fault)
            det, loc, fa, healthy = det + d, loc + lz, fa + f, healthy + h
        n = args.faults
        dl = "-" if kind is None else f"{100 * det / n:.1f}"
        ll = "-" if kind is None else f"{100 * loc / n:.1f}"
        lines.append(f"| {label} | {n} | {dl} | {ll} | {100 * fa / healthy:.3f} | {2 * runs / args.nodes:.0f} | "
                     f"first {min(args.logs, n)} |")
        print(lines[-1], file=sys.stderr, flush=True)
    if args.crashes:
        det = loc = fa = healthy = 0
        for t in range(args.crashes):
            d, lz, f, h = crash_trial(spec, 200_000 + t, args.glitch)
            det, loc, fa, healthy = det + d, loc + lz, fa + f, healthy + h
        lines.append(f"| failed or missing run | {args.crashes} | {100 * det / args.crashes:.1f} | "
                     f"{100 * loc / args.crashes:.1f} | {100 * fa / healthy:.3f} | - | all |")
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Wall time {time.perf_counter() - t0:.0f} s; load average at end {os.getloadavg()[0]:.1f}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
