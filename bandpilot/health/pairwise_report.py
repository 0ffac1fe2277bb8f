"""How does a pairwise verify read? The verdict table (Markdown), the JSON, and the heatmap figure:
one node x node panel per (collective, GPUs per node), suspects marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# The report object is bandpilot.health.pairwise.PairwiseReport, which renders itself through this
# module; typed loosely so the two do not import each other.
PairwiseReport = Any


STATUS_ORDER = {"failed": 0, "missing": 1, "degraded": 2, "healthy": 3}


def _sweep_line(rep: PairwiseReport) -> str:
    colls = sorted({m.collective for m in rep.matrices})
    gpn = sorted({m.gpn for m in rep.matrices})
    reps = max((m.repeat for m in rep.matrices), default=0) + 1
    return (f"{rep.sweep.files} log files, {len(rep.sweep.runs)} pair runs with a result, "
            f"{len(rep.sweep.failures)} without, {len(rep.sweep.skipped)} not from a node pair; "
            f"{len(rep.nodes)} nodes; {len(rep.matrices)} matrices: {', '.join(colls) or 'none'} at {gpn} GPUs per node"
            f"{f', up to {reps} repeats' if reps > 1 else ''}. A fault needs {rep.need} agreeing matrices"
            f"{' at the same GPUs per node' if rep.per_gpn else ''}.")


def _pairs_line(rep: PairwiseReport) -> str:
    c = rep.counts()
    st = rep.status
    scope = (f" (every pair of {len(st.nodes)} nodes at {', '.join(map(str, st.gpn))} GPUs per node)"
             if st is not None else "")
    return (f"Pairs: {c['expected']} expected{scope}: {c['measured']} measured, {c['failed']} failed "
            f"(a run crashed, was cut short or reported wrong data), {c['missing']} missing "
            f"(no result for a run the sweep implies).")


def _ratio(x: float) -> str:
    return f"{x:.3f}" if np.isfinite(x) else "-"


def _failed_runs(rep: PairwiseReport, limit: int = 40) -> list[str]:
    """One row per run without a result: where to look."""
    rows = [(lk.nodes, p) for lk in rep.links for p in lk.problems]
    if not rows:
        return []
    lines = ["Runs without a result:", "", "| pair | run | status | what the log says | log |", "|---|---|---|---|---|"]
    for (a, b), p in rows[:limit]:
        detail = (p.detail or "-").replace("|", "/")
        lines.append(f"| {a} - {b} | {p.short} | {p.status} | {detail} | {p.source or '-'} |")
    if len(rows) > limit:
        lines.append(f"| ... {len(rows) - limit} more in verify.json | | | | |")
    return lines + [""]


def markdown(rep: PairwiseReport) -> str:
    bad_nodes = [v for v in rep.nodes.values() if v.status != "healthy"]
    bad_links = [lk for lk in rep.links if lk.status != "healthy"]
    lines = [f"# Pairwise verify {rep.source}: {'all healthy' if rep.healthy else 'PROBLEMS FOUND'}", "",
             _sweep_line(rep), "", _pairs_line(rep), *[f"Note: {n}." for n in rep.notes], ""]
    lines += ["| node | status | fault | slow at GPUs/node | suspect rails | ratio vs peers | evidence |",
              "|---|---|---|---|---|---:|---:|"]
    order = sorted(rep.nodes.values(), key=lambda v: (STATUS_ORDER.get(v.status, 9), v.ratio))
    for v in order:
        if v.status == "healthy" and len(rep.nodes) > 12 and v not in order[:3]:
            continue
        peers = f"; failed with {v.failed_peers[0]} of {v.failed_peers[1]} peers" if v.failed_peers else ""
        lines.append(f"| {v.node} | {v.status} | {v.fault} | {', '.join(map(str, v.gpn)) or '-'} | "
                     f"{', '.join(map(str, v.rails)) or '-'} | {_ratio(v.ratio)} | {v.evidence}/{v.matrices}{peers} |")
    if len(rep.nodes) > 12:
        lines.append(f"| ... {len(rep.nodes) - len(bad_nodes)} healthy nodes in all | | | | | | |")
    by = {s: sum(lk.status == s for lk in bad_links) for s in ("degraded", "failed", "missing")}
    lines += ["", f"{len(bad_links)} of {len(rep.links)} pairs not healthy"
              + (f" ({', '.join(f'{n} {s}' for s, n in by.items() if n)}; ratio: the link against what its two "
                 "nodes predict, evidence: matrices that flag it, then the runs without a result):" if bad_links else "."), ""]
    if bad_links:
        lines += ["| link | status | slow at GPUs/node | ratio | evidence |", "|---|---|---|---:|---|"]
        for lk in sorted(bad_links, key=lambda x: (STATUS_ORDER[x.status], np.nan_to_num(x.ratio, nan=-1.0))):
            lines.append(f"| {lk.nodes[0]} - {lk.nodes[1]} | {lk.status} | {', '.join(map(str, lk.gpn)) or '-'} | "
                         f"{_ratio(lk.ratio)} | {lk.evidence_text} |")
        lines.append("")
    lines += _failed_runs(rep)
    lines += ["| matrix | pairs | median busbw (GB/s) | min | flagged nodes | flagged links |", "|---|---:|---:|---:|---:|---:|"]
    for m in rep.matrices:
        cells = m.values[np.triu(np.isfinite(m.values), 1)]
        lines.append(f"| {m.label} | {cells.size} | {np.median(cells):.2f} | {cells.min():.2f} | "
                     f"{int(m.node_low.sum())} | {int(np.triu(m.link_low, 1).sum())} |")
    return "\n".join(lines) + "\n"


def _marks(rep: PairwiseReport) -> dict[tuple[str, int], dict[tuple[str, str], str]]:
    """Per panel (collective, GPUs per node): the pairs whose run there failed or is missing."""
    colls = rep.status.collectives if rep.status is not None else {}
    out: dict[tuple[str, int], dict[tuple[str, str], str]] = {}
    for lk in rep.links:
        for p in lk.problems:
            for c in ([p.collective] if p.collective else colls.get(p.gpn, [])):
                cell = out.setdefault((c, p.gpn), {})
                if cell.get(lk.nodes) != "failed":
                    cell[lk.nodes] = p.status
    return out


def _panel(ax, fig, m, names, rep, marks, bad_links) -> None:
    import matplotlib.pyplot as plt

    n = len(names)
    at = {x: i for i, x in enumerate(names)}
    cmap = plt.get_cmap("viridis").with_extremes(bad="#eeeeee")
    values = m.values if m is not None else np.full((n, n), np.nan)
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, interpolation="nearest")
    if m is not None:
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="busbw (GB/s)")
    ticks = range(n) if n <= 40 else []
    ax.set_xticks(list(ticks), [names[i] for i in ticks], rotation=90, fontsize=6)
    ax.set_yticks(list(ticks), [names[i] for i in ticks], fontsize=6)
    for lab in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
        if rep.nodes[lab.get_text()].status != "healthy":
            lab.set_color("red")
    for (a, b), what in marks.items():
        for i, j in ((at[a], at[b]), (at[b], at[a])):
            style = FAILED_STYLE if what == "failed" else MISSING_STYLE
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, **style))
    for a, b in bad_links:
        for i, j in ((at[a], at[b]), (at[b], at[a])):
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))


FAILED_STYLE = {"facecolor": "#d62728", "edgecolor": "black", "hatch": "xx", "linewidth": 0.3}
MISSING_STYLE = {"facecolor": "white", "edgecolor": "#888888", "hatch": "//", "linewidth": 0.3}


def heatmap(rep: PairwiseReport, path: str | Path) -> Path:
    """A PNG: one panel per (collective, GPUs per node) (first repeat), busbw colour per pair, slow
    and failed nodes' names in red, suspect links boxed, failed runs red and cross-hatched, missing
    runs white and hatched (legend below)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ms = {(m.collective, m.gpn): m for m in rep.matrices if m.repeat == 0}
    marks = _marks(rep)
    keys = set(ms) | set(marks)
    colls = sorted({c for c, _ in keys})
    gpns = sorted({g for _, g in keys})
    names = list(rep.nodes)
    side = min(2.2 + 0.18 * len(names), 9.0)
    fig, axes = plt.subplots(len(colls), len(gpns), figsize=(side * len(gpns), side * len(colls) + 0.6), squeeze=False)
    slow = {lk.nodes: set(lk.gpn) for lk in rep.links if lk.status in ("degraded", "failed") and lk.gpn}
    for r, coll in enumerate(colls):
        for c, g in enumerate(gpns):
            ax = axes[r][c]
            if (coll, g) not in keys:
                ax.axis("off")
                continue
            _panel(ax, fig, ms.get((coll, g)), names, rep, marks.get((coll, g), {}),
                   [pair for pair, at in slow.items() if g in at])
            ax.set_title(f"{coll} {g} GPU/node", fontsize=9)
    legend = [Patch(label="failed run (crashed, cut short, wrong data)", **FAILED_STYLE),
              Patch(label="missing run (no result)", **MISSING_STYLE),
              Patch(facecolor="none", edgecolor="red", linewidth=1.5, label="slow link"),
              Patch(facecolor="#eeeeee", label="not expected")]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"Pairwise sweep {rep.source}: {'all healthy' if rep.healthy else 'suspects in red'}", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def write(rep: PairwiseReport, out: str | Path) -> Path:
    """``verify.md``, ``verify.json`` (verdicts, matrices, skipped runs) and ``heatmap.png`` in ``out``."""
    from bandpilot.io import write_json_atomic, write_text_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "verify.md", markdown(rep))
    mats = [{"collective": m.collective, "gpus_per_node": m.gpn, "repeat": m.repeat,
             "busbw": [[None if not np.isfinite(x) else float(x) for x in row] for row in m.values]}
            for m in rep.matrices]
    write_json_atomic(out / "verify.json", {**rep.to_json(), "node_order": list(rep.nodes), "matrices": mats,
                                            "skipped": rep.sweep.skipped, "source": rep.source})
    heatmap(rep, out / "heatmap.png")
    return out
