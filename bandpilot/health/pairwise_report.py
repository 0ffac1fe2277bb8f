"""How does a pairwise verify read? The verdict table (Markdown), the JSON, and the heatmap figure:
one node x node panel per (collective, GPUs per node), suspects marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# The report object is bandpilot.health.pairwise.PairwiseReport, which renders itself through this
# module; typed loosely so the two do not import each other.
PairwiseReport = Any


def _sweep_line(rep: PairwiseReport) -> str:
    colls = sorted({m.collective for m in rep.matrices})
    gpn = sorted({m.gpn for m in rep.matrices})
    reps = max((m.repeat for m in rep.matrices), default=0) + 1
    return (f"{rep.sweep.files} log files, {len(rep.sweep.runs)} pair runs ({len(rep.sweep.skipped)} skipped), "
            f"{len(rep.nodes)} nodes; {len(rep.matrices)} matrices: {', '.join(colls)} at {gpn} GPUs per node"
            f"{f', up to {reps} repeats' if reps > 1 else ''}. A fault needs {rep.need} agreeing matrices"
            f"{' at the same GPUs per node' if rep.per_gpn else ''}.")


def markdown(rep: PairwiseReport) -> str:
    bad_nodes = [v for v in rep.nodes.values() if v.status != "healthy"]
    bad_links = [lk for lk in rep.links if lk.status != "healthy"]
    lines = [f"# Pairwise verify {rep.source}: {'all healthy' if rep.healthy else 'PROBLEMS FOUND'}", "",
             _sweep_line(rep), *[f"Note: {n}." for n in rep.notes], ""]
    lines += ["| node | status | fault | slow at GPUs/node | suspect rails | ratio vs peers | evidence |",
              "|---|---|---|---|---|---:|---:|"]
    order = sorted(rep.nodes.values(), key=lambda v: (v.status == "healthy", v.ratio))
    for v in order:
        if v.status == "healthy" and len(rep.nodes) > 12 and v not in order[:3]:
            continue
        lines.append(f"| {v.node} | {v.status} | {v.fault} | {', '.join(map(str, v.gpn)) or '-'} | "
                     f"{', '.join(map(str, v.rails)) or '-'} | {v.ratio:.3f} | {v.evidence}/{v.matrices} |")
    if len(rep.nodes) > 12:
        lines.append(f"| ... {len(rep.nodes) - len(bad_nodes)} healthy nodes in all | | | | | | |")
    lines += ["", f"{len(bad_links)} of {len(rep.links)} links suspect"
              + (" (ratio: the link against what its two nodes predict):" if bad_links else "."), ""]
    if bad_links:
        lines += ["| link | status | slow at GPUs/node | ratio | evidence |", "|---|---|---|---:|---:|"]
        for lk in sorted(bad_links, key=lambda x: x.ratio):
            lines.append(f"| {lk.nodes[0]} - {lk.nodes[1]} | {lk.status} | {', '.join(map(str, lk.gpn))} | "
                         f"{lk.ratio:.3f} | {lk.evidence}/{lk.matrices} |")
        lines.append("")
    lines += ["| matrix | pairs | median busbw (GB/s) | min | flagged nodes | flagged links |", "|---|---:|---:|---:|---:|---:|"]
    for m in rep.matrices:
        cells = m.values[np.triu(np.isfinite(m.values), 1)]
        lines.append(f"| {m.label} | {cells.size} | {np.median(cells):.2f} | {cells.min():.2f} | "
                     f"{int(m.node_low.sum())} | {int(np.triu(m.link_low, 1).sum())} |")
    return "\n".join(lines) + "\n"


def heatmap(rep: PairwiseReport, path: str | Path) -> Path:
    """A PNG: one panel per (collective, GPUs per node) (first repeat), busbw colour per pair, slow
    nodes' names in red, suspect links boxed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    ms = [m for m in rep.matrices if m.repeat == 0]
    colls = sorted({m.collective for m in ms})
    gpns = sorted({m.gpn for m in ms})
    names = list(rep.nodes)
    n = len(names)
    side = min(2.2 + 0.18 * n, 9.0)
    fig, axes = plt.subplots(len(colls), len(gpns), figsize=(side * len(gpns), side * len(colls)), squeeze=False)
    bad_links = {lk.nodes for lk in rep.links if lk.status != "healthy"}
    at = {x: i for i, x in enumerate(names)}
    for r, coll in enumerate(colls):
        for c, g in enumerate(gpns):
            ax = axes[r][c]
            m = next((m for m in ms if m.collective == coll and m.gpn == g), None)
            if m is None:
                ax.axis("off")
                continue
            cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
            im = ax.imshow(np.ma.masked_invalid(m.values), cmap=cmap, interpolation="nearest")
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="busbw (GB/s)")
            ax.set_title(f"{coll} {g} GPU/node", fontsize=9)
            ticks = range(n) if n <= 40 else []
            ax.set_xticks(list(ticks), [names[i] for i in ticks], rotation=90, fontsize=6)
            ax.set_yticks(list(ticks), [names[i] for i in ticks], fontsize=6)
            for lab in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
                if rep.nodes[lab.get_text()].status != "healthy":
                    lab.set_color("red")
            for a, b in bad_links:
                for i, j in ((at[a], at[b]), (at[b], at[a])):
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    fig.suptitle(f"Pairwise sweep {rep.source}: {'all healthy' if rep.healthy else 'suspects in red'}", fontsize=10)
    fig.tight_layout()
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
