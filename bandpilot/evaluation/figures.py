"""What the paper's figures show for one evaluation: GBE vs k (Fig. 6), bandwidth loss (Fig. 7),
search latency (Fig. 8) and the hybrid-search ablation (Fig. 9), as PNGs.

``res`` is an ``EvaluationResult``, typed ``Any``: result.py imports the report, which imports this.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bandpilot.evaluation.params import LABELS


_COLORS = {"bandpilot": "#d62728", "ideal": "#2ca02c", "eha": "#ff7f0e", "pts": "#9467bd", "topo": "#1f77b4",
           "default": "#8c564b", "random": "#7f7f7f", "exact": "#000000"}
_MARKERS = {"bandpilot": "o", "ideal": "s", "eha": "^", "pts": "v", "topo": "D", "default": "x", "random": "+"}


def make_figures(res: Any, out_dir: str | Path) -> dict[str, Path]:
    """Fig. 6 (GBE vs k, baselines and Ideal-BP), Fig. 7 (loss bars), Fig. 9 (ablation), Fig. 8 (latency)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs: dict[str, Path] = {}
    gk = res.gbe_by_k()
    algs = res.algorithms
    profs = res.profiles

    def curve(ax: Any, p: str, names: Sequence[str], zoom: bool = False) -> None:
        sub = gk.loc[p]
        names = [a for a in names if a in sub.columns]
        for a in names:
            ax.plot(sub.index, sub[a], label=LABELS[a], color=_COLORS[a], marker=_MARKERS.get(a), ms=3, lw=1.2)
        ax.set_xlabel("request size k (GPUs)")
        ax.set_ylabel("mean GBE (%)")
        ax.grid(alpha=0.3)
        lo = float(np.nanmin(sub[names].values)) if names else 0.0
        if zoom:  # BandPilot vs Ideal-BP: the gap is model error, usually a fraction of a point
            ax.set_ylim(bottom=max(0.0, math.floor(lo) - 1.0), top=100.5)
        else:
            ax.set_ylim(bottom=max(0.0, min(40.0, lo - 5)), top=102)

    # Fig. 6: per profile, BandPilot vs baselines and BandPilot vs Ideal-BP
    base = [a for a in ("bandpilot", "topo", "default", "random") if a in algs]
    ideal = [a for a in ("bandpilot", "ideal") if a in algs]
    fig, axes = plt.subplots(len(profs), 2, figsize=(11, 3.2 * len(profs)), squeeze=False)
    for i, p in enumerate(profs):
        curve(axes[i][0], p, base)
        axes[i][0].set_title(f"{res.cluster}, τ = {p}: vs baselines")
        curve(axes[i][1], p, ideal, zoom=True)
        axes[i][1].set_title(f"{res.cluster}, τ = {p}: vs Ideal-BP")
        axes[i][0].legend(fontsize=8, loc="lower left")
        axes[i][1].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    figs["gbe_vs_k"] = out / "fig6_gbe_vs_k.png"
    fig.savefig(figs["gbe_vs_k"], dpi=110)
    plt.close(fig)

    # Fig. 7: bandwidth loss bars
    loss = res.loss_table()
    fig, ax = plt.subplots(figsize=(min(10, 2.6 + 2.4 * len(profs)), 3.6))
    w = 0.8 / max(len(loss.index), 1)
    x = np.arange(len(profs))
    for i, a in enumerate(loss.index):
        ax.bar(x + (i - (len(loss.index) - 1) / 2) * w, loss.loc[a].to_numpy(dtype=float), w, label=LABELS[a], color=_COLORS[a])
    ax.set_xticks(x, list(profs))
    ax.set_ylabel("mean loss L(S, τ) (GB/s)")
    ax.set_title(f"{res.cluster}: bandwidth loss to contention")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    figs["loss"] = out / "fig7_loss.png"
    fig.savefig(figs["loss"], dpi=110)
    plt.close(fig)

    # Fig. 9: hybrid-search ablation
    abl = [a for a in ("eha", "pts", "bandpilot") if a in algs]
    if len(abl) >= 2:
        fig, axes = plt.subplots(1, len(profs), figsize=(4.2 * len(profs), 3.4), squeeze=False)
        for i, p in enumerate(profs):
            curve(axes[0][i], p, abl)
            axes[0][i].set_title(f"{res.cluster}, τ = {p}: EHA / PTS / hybrid")
            axes[0][i].legend(fontsize=8, loc="lower left")
        fig.tight_layout()
        figs["ablation"] = out / "fig9_ablation.png"
        fig.savefig(figs["ablation"], dpi=110)
        plt.close(fig)

    # Fig. 8: latency
    f = res.rows
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    for a in [*algs, "exact"]:
        s = f[f["algorithm"] == a]
        if len(s):
            m = s.groupby("k")["search_ms"].mean()
            ax.plot(m.index, m.values, label=LABELS[a], color=_COLORS[a], marker=_MARKERS.get(a), ms=3, lw=1.1)
    ax.set_yscale("log")
    ax.set_xlabel("request size k (GPUs)")
    ax.set_ylabel("mean search time (ms)")
    ax.set_title(f"{res.cluster}: search latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    comp = [a for a in ("eha", "pts", "bandpilot") if a in algs]
    if comp:
        pred = np.array([np.nanmean(f.loc[f["algorithm"] == a, "predict_ms"]) for a in comp])
        tot = np.array([np.nanmean(f.loc[f["algorithm"] == a, "search_ms"]) for a in comp])
        pred = np.nan_to_num(pred)
        xs = np.arange(len(comp))
        ax.bar(xs, pred, 0.6, label="model prediction", color="#d62728")
        ax.bar(xs, np.maximum(tot - pred, 0), 0.6, bottom=pred, label="search logic", color="#1f77b4")
        ax.set_xticks(xs, [LABELS[a] for a in comp])
        ax.set_ylabel("mean time per request (ms)")
        ax.set_title(f"{res.cluster}: search time breakdown")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    figs["latency"] = out / "fig8_latency.png"
    fig.savefig(figs["latency"], dpi=110)
    plt.close(fig)
    return figs
