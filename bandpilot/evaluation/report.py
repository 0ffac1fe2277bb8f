"""What an evaluation's report directory holds: Markdown, CSV tables, ``scenarios.jsonl``, figures
and ``evaluation.json``; and the Table II view for the terminal.

``res`` is an ``EvaluationResult``, typed ``Any``: result.py imports this module (``write``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bandpilot.evaluation.figures import make_figures
from bandpilot.evaluation.params import LABELS
from bandpilot.evaluation.scenarios import (
    MAX_JOB_GPUS,
    RHO_RANGE,
    SCENARIOS_FILE,
    SPAN_PROBABILITY,
    save_scenarios,
)

RESULTS_FILE = "results.csv"
REPORT_FILE = "report.md"
META_FILE = "evaluation.json"


def _fmt(v: Any, digits: int = 1) -> str:
    if isinstance(v, (float, np.floating)):
        return "–" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def markdown_table(df: Any, digits: int = 1, index_label: str | None = None, labels: bool = True) -> str:
    """A DataFrame (or a flat mapping: key | value) as a GitHub Markdown table (no tabulate dependency)."""
    if isinstance(df, Mapping):
        lines = [f"| {index_label or 'key'} | value |", "|---|---|"]
        for key, val in df.items():
            text = json.dumps(val, default=str) if isinstance(val, (dict, list, tuple)) else _fmt(val, digits + 2)
            lines.append(f"| {key} | {text.replace('|', '/')} |")
        return "\n".join(lines)
    idx_name = index_label or (df.index.name or "")
    cols = [str(c) for c in df.columns]
    head = "| " + " | ".join([idx_name, *cols]) + " |"
    sep = "|" + "|".join(["---"] + ["---:"] * len(cols)) + "|"
    lines = [head, sep]
    for idx, row in df.iterrows():
        name = LABELS.get(idx, idx) if labels and isinstance(idx, str) else (" / ".join(map(str, idx)) if isinstance(idx, tuple) else str(idx))
        lines.append("| " + " | ".join([str(name), *[_fmt(v, digits) for v in row.tolist()]]) + " |")
    return "\n".join(lines)


def write_report(res: Any, out_dir: str | Path, *, figures: bool = True) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cluster": res.cluster,
        "fingerprint": res.fingerprint,
        "seed": res.seed,
        "repeats": res.repeats,
        "profiles": list(res.profiles),
        "rho_range": list(RHO_RANGE),
        "max_job_gpus": MAX_JOB_GPUS,
        "span_probability": SPAN_PROBABILITY,
    }
    save_scenarios(res.scenarios, out / SCENARIOS_FILE, meta)
    res.rows.to_csv(out / RESULTS_FILE, index=False)
    gbe = res.gbe_table()
    gbe_k = res.gbe_by_k()
    loss = res.loss_table()
    lat = res.latency_table()
    mins = res.min_gbe_table()
    gbe.rename(index=LABELS).to_csv(out / "gbe_table.csv", float_format="%.3f")
    gbe_k.rename(columns=LABELS).to_csv(out / "gbe_by_k.csv", float_format="%.3f")
    res.by_k().to_csv(out / "by_k.csv", index=False, float_format="%.4f")
    loss.rename(index=LABELS).to_csv(out / "loss_table.csv", float_format="%.3f")
    lat.rename(index=LABELS).to_csv(out / "latency_table.csv", float_format="%.3f")
    figs: dict[str, Path] = {}
    if figures:
        figs = make_figures(res, out / "figures")
    summary = res.summary()
    summary["metrics"] = res.metrics()
    summary["figures"] = {k: str(v.relative_to(out)) for k, v in figs.items()}
    (out / META_FILE).write_text(json.dumps(summary, indent=1, default=str))
    (out / REPORT_FILE).write_text(_markdown(res, gbe, gbe_k, loss, lat, mins, figs, out))
    res.out_dir = out
    return out


def _markdown(res: Any, gbe: Any, gbe_k: Any, loss: Any, lat: Any, mins: Any, figs: dict[str, Path], out: Path) -> str:
    refs = res.reference_counts()
    ref_line = ", ".join(f"{k}: {v}" for k, v in sorted(refs.items()))
    ks = sorted({s.k for s in res.scenarios})
    k_range = f"{ks[0]}..{ks[-1]}" if ks == list(range(ks[0], ks[-1] + 1)) else ",".join(map(str, ks))
    lines = [
        f"# Dispatching evaluation: {res.cluster}",
        "",
        f"- model: `{res.model_uri or '(in-memory)'}`"
        + (f" ({res.model_name} v{res.model_version})" if res.model_version else ""),
        f"- ground truth: {res.truth}",
        f"- scenarios: {res.n_scenarios} (k = {k_range}, {res.repeats} per k, seed {res.seed}) - `{SCENARIOS_FILE}`",
        f"- profiles: {', '.join(res.profiles)}; algorithms: {', '.join(LABELS[a] for a in res.algorithms)}",
        f"- reference B*: {ref_line}"
        + ("" if res.exact_everywhere else "  **(best-found fallback used: GBE there is conservative)**"),
        f"- wall time: {res.elapsed_s:.1f} s on {res.workers} worker(s) ({res.cpu_s:.0f} CPU-s in the scenario kernels)",
        "",
        "GBE = B(S, τ) / B*(A, k, τ) with the TRUE contention-degraded bandwidth (contention formula on the "
        "truth fabric); B* is the exact optimum of the same objective (dispatcher `exact` on the truth fabric), "
        "computed once per scenario and profile. k = 1 has B* = 0 (no collective bandwidth on one GPU): "
        "GBE := 1 for every algorithm, and k = 1 is included in the means. "
        "Demands: idle d=0, moderate d=ρ·B(S_j) with ρ~U[0.25,0.75], heavy d=B(S_j).",
        "",
    ]
    for n in res.notes:
        lines.append(f"> note: {n}")
    if res.notes:
        lines.append("")
    lines += ["## Mean GBE (%) (Table II)", "", markdown_table(gbe), "", "## Worst-case GBE (%)", "", markdown_table(mins), ""]
    lines += ["## Mean bandwidth loss L(S, τ) = B(S) − B(S, τ) (GB/s) (Fig. 7)", "", markdown_table(loss, 2), ""]
    lines += ["## Search latency and model evaluations per request (Fig. 8)", "",
              markdown_table(lat.drop(columns=["requests"]), 2), ""]
    if figs:
        lines += ["## Figures", ""]
        for key, p in figs.items():
            lines.append(f"![{key}]({p.relative_to(out)})")
            lines.append("")
    lines += ["## Mean GBE (%) per request size k (Fig. 6 / Fig. 9)", ""]
    for p in res.profiles:
        sub = gbe_k.loc[p].rename(columns=LABELS)
        sub.index.name = "k"
        lines += [f"### {p}", "", markdown_table(sub, labels=False), ""]
    lines += ["## Files", "", f"- `{RESULTS_FILE}`: one row per scenario x profile x algorithm (+ `exact` reference rows)",
              "- `gbe_table.csv`, `gbe_by_k.csv`, `loss_table.csv`, `latency_table.csv`; `by_k.csv`: GBE, loss, "
              "latency and model evaluations per profile, k and algorithm",
              f"- `{SCENARIOS_FILE}`: the scenarios (first line: generator settings) - replay with "
              "`bandpilot evaluate --scenarios`", f"- `{META_FILE}`: settings and flat metrics", ""]
    return "\n".join(lines)


def rich_table(res: Any, title: str | None = None) -> Any:
    """The Table II view for the terminal (rich)."""
    from rich.table import Table

    gbe = res.gbe_table()
    loss = res.loss_table()
    t = Table(title=title or f"Mean GBE (%) - {res.cluster} ({res.n_scenarios} scenarios)")
    t.add_column("Algorithm")
    for p in res.profiles:
        t.add_column(f"τ_{p}", justify="right")
    for p in res.profiles:
        t.add_column(f"loss {p} (GB/s)", justify="right")
    for a in gbe.index:
        style = "bold" if a == "bandpilot" else None
        t.add_row(LABELS[a], *[_fmt(gbe.loc[a, p]) for p in res.profiles],
                  *[_fmt(loss.loc[a, p], 2) for p in res.profiles], style=style)
    return t
