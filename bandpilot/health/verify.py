"""Does the fabric deliver what the model expects? Run the probe plan (or read a measurement
directory), compare every run with the model and give a verdict per host.

The expectation is the model's own ``B̂(S)``: the stage-1 table inside a host, the surrogate across
hosts. The tolerance comes from the repeat noise of the model's training data (``noise_sigma``) and,
across hosts, from its cross-validated error.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bandpilot.errors import BandPilotError, DataError
from bandpilot.health.diagnosis import HostVerdict, Tolerance, diagnose
from bandpilot.health.probes import Probe, plan_probes
from bandpilot.topology.cluster import ClusterSpec

EXIT_UNHEALTHY = 3


@dataclass
class VerifyReport:
    cluster: str
    source: str  # what was measured: "probes (emulator)", "probes (ssh)", "measurements DIR"
    hosts: dict[str, HostVerdict]
    tolerance: Tolerance
    runs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return all(v.status == "healthy" for v in self.hosts.values())

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else EXIT_UNHEALTHY

    def to_json(self) -> dict[str, Any]:
        return {"hosts": {h: v.to_json() for h, v in self.hosts.items()}}

    def markdown(self) -> str:
        n_hosts = max(len(self.hosts), 1)
        lines = [f"# Verify {self.cluster}: {'all healthy' if self.healthy else 'PROBLEMS FOUND'}", "",
                 f"Source: {self.source}; {len(self.runs)} runs ({len(self.runs) / n_hosts:.1f} per host), "
                 f"{self.seconds:.1f} s. Tolerance (log): noise sigma {self.tolerance.sigma:.4f} x {self.tolerance.z:g} "
                 f"(floor {self.tolerance.floor:g}), + {self.tolerance.cross_error:.3f} across hosts.", "",
                 "| host | status | suspect GPUs | suspect links | measured/expected | low runs |", "|---|---|---|---|---:|---:|"]
        for h, v in self.hosts.items():
            lines.append(f"| {h} | {v.status} | {', '.join(v.gpus) or '-'} | {', '.join(v.links) or '-'} | "
                         f"{v.ratio:.3f} | {v.low_runs}/{v.runs} |")
        return "\n".join(lines) + "\n"

    def write(self, out: str | Path) -> Path:
        from bandpilot.io import write_json_atomic, write_text_atomic

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "verify.md", self.markdown())
        write_json_atomic(out / "verify.json", {**self.to_json(), "runs": self.runs, "source": self.source,
                                                "tolerance": self.tolerance.to_dict()})
        return out


def tolerance_for(model: Any, z: float = 4.0) -> Tolerance:
    """From the model's training data: repeat noise, and its cross-validated MAPE across hosts."""
    meta = getattr(model, "meta", None) or {}
    sigma = (meta.get("data") or {}).get("noise_sigma")
    cv = (meta.get("metrics") or {}).get("cv_mape")
    cross = min(max(0.05, 2.0 * float(cv) / 100.0), 0.3) if cv is not None and np.isfinite(cv) else 0.1
    return Tolerance(sigma=float(sigma) if sigma else 0.02, z=z, cross_error=cross)


def _check_model(model: Any, spec: ClusterSpec) -> None:
    if model.spec.fingerprint() != spec.fingerprint():
        raise DataError(f"verify: the model is for cluster {model.spec.name!r}, the measurements for {spec.name!r}")


def run_probes(probes: list[Probe], spec: ClusterSpec, runner: Any) -> np.ndarray:
    """busbw of each probe through a runner (nccl-tests stdout, parsed and checked); a failed run is 0."""
    from bandpilot.data.ingest import check_log
    from bandpilot.data.runners import RunFailed

    if hasattr(runner, "prepare"):
        runner.prepare([p.measurement for p in probes])
    out = np.zeros(len(probes))
    for i, p in enumerate(probes):
        m = p.measurement
        try:
            text = runner(m)
            _, out[i] = check_log(text, m.id, m.entry("verify"), spec)
        except (RunFailed, DataError):
            out[i] = 0.0  # a crashed or unreadable run: the strongest evidence of a fault
    return out


def verify_probes(model: Any, spec: ClusterSpec, *, runner: str | Callable = "emulator", fabric: Any = None,
                  hosts: list[str] | None = None, tolerance: Tolerance | None = None) -> VerifyReport:
    """Run the probe plan on ``spec`` (``fabric``: the emulator's truth, e.g. with injected faults)."""
    from bandpilot.data.runners import EmulatorRunner, make_runner

    _check_model(model, spec)
    t0 = time.perf_counter()
    probes = plan_probes(spec, hosts)
    if runner == "emulator":
        run = EmulatorRunner(spec, fabric=fabric)
    else:
        run = make_runner(runner, spec)
    measured = run_probes(probes, spec, run)
    masks = np.array([p.masks for p in probes], dtype=np.int64)
    tol = tolerance or tolerance_for(model)
    expected = np.asarray(model.predict_masks(masks), dtype=float)
    verdicts = diagnose(spec, masks, measured, expected, tol, hosts)
    runs = [{"id": p.measurement.id, "kind": p.kind, "gpus": list(p.measurement.gpus), "measured": float(y),
             "expected": float(e)} for p, y, e in zip(probes, measured, expected)]
    src = f"probes ({runner if isinstance(runner, str) else 'custom runner'})"
    return VerifyReport(spec.name, src, verdicts, tol, runs, time.perf_counter() - t0)


def verify_measurements(model: Any, directory: str | Path, *, hosts: list[str] | None = None,
                        tolerance: Tolerance | None = None) -> VerifyReport:
    """Verify an existing measurement directory (what ``bandpilot ingest`` reads) against the model."""
    from bandpilot.data.dataset import load_dataset
    from bandpilot.data.ingest import ingest

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bandpilot-verify-") as tmp:
        ingest(directory, Path(tmp) / "ds")
        ds = load_dataset(Path(tmp) / "ds").aggregated()
    _check_model(model, ds.spec)
    if hosts:
        unknown = [h for h in hosts if h not in ds.spec.host_index]
        if unknown:
            raise BandPilotError(f"verify: hosts {unknown[:3]} are not in cluster {ds.spec.name!r}")
    masks = ds.masks()
    keep = np.bitwise_count(masks).sum(axis=1) >= 2  # 1-GPU rows measure no link
    masks, measured = masks[keep], ds.busbw()[keep]
    tol = tolerance or tolerance_for(model)
    expected = np.asarray(model.predict_masks(masks), dtype=float)
    verdicts = diagnose(ds.spec, masks, measured, expected, tol, hosts)
    runs = [{"gpus": g, "measured": float(y), "expected": float(e)}
            for g, y, e in zip(ds.frame["gpus"][keep], measured, expected)]
    return VerifyReport(ds.spec.name, f"measurements {directory}", verdicts, tol, runs, time.perf_counter() - t0)


def dry_run_plan(spec: ClusterSpec, hosts: list[str] | None = None, model: Any = None) -> dict[str, Any]:
    """The probe plan as the real run would execute it: per run, where it runs and its command line
    (one host: ``ssh HOST ...``, as the ssh runner does; several hosts: the ``mpirun`` line, run from
    here) and the plan's cost. With ``model``, refused where the real run would be (a model of
    another cluster)."""
    import shlex

    if model is not None:
        _check_model(model, spec)
    from bandpilot.data.runners import command_lines

    probes = plan_probes(spec, hosts)
    runs = []
    for p in probes:
        m = p.measurement
        lines = command_lines(m, spec)
        cmds = lines if m.cross_host else [f"ssh {shlex.quote(m.hosts[0])} {line}" for line in lines]
        runs.append({"id": m.id, "kind": p.kind, "hosts": list(m.hosts),
                     "gpus": {spec.hosts[h].name: [g for g in range(spec.hosts[h].n_gpus) if mask >> g & 1]
                              for h, mask in zip(m.used, m.used_masks)},
                     "commands": cmds})
    n_hosts = max(len({h for p in probes for h in p.measurement.hosts}), 1)
    every = sum((1 << h.n_gpus) - h.n_gpus - 1 for h in spec.hosts) // max(spec.n_hosts, 1)
    return {"cluster": spec.name, "runs": runs, "total": len(probes), "per_host": round(len(probes) / n_hosts, 1),
            "all_subsets_per_host": every}


def dry_run_lines(spec: ClusterSpec | None = None, hosts: list[str] | None = None, model: Any = None,
                  plan: dict[str, Any] | None = None) -> list[str]:
    """The plan's command lines, one per line, and a closing line with its cost."""
    plan = plan if plan is not None else dry_run_plan(spec, hosts, model)  # type: ignore[arg-type]
    lines = [c for r in plan["runs"] for c in r["commands"]]
    lines.append(f"# {plan['total']} nccl-tests runs, {plan['per_host']:.1f} per host (all subsets would be "
                 f"{plan['all_subsets_per_host']} per host)")
    return lines


def report_json(report: VerifyReport) -> str:
    return json.dumps(report.to_json(), indent=1)
