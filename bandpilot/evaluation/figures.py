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
    for key, name, draw in (("gbe_vs_k", "fig6_gbe_vs_k.png", _fig_gbe_vs_k), ("loss", "fig7_loss.png", _fig_loss),
                            ("ablation", "fig9_ablation.png", _fig_ablation), ("latency", "fig8_latency.png", _fig_latency)):
        fig = draw(plt, res)
        if fig is None:
            continue
        fig.tight_layout()
        figs[key] = out / name
        fig.savefig(figs[key], dpi=110)
        plt.close(fig)
    return figs


def _curve(ax: Any, gk: Any, p: str, names: Sequence[str], zoom: bool = False) -> None:
    """Mean GBE against k for ``names`` under profile ``p``."""
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


def _fig_gbe_vs_k(plt: Any, res: Any) -> Any:
    """Fig. 6: per profile, BandPilot vs baselines and BandPilot vs Ideal-BP."""
    gk, algs, profs = res.gbe_by_k(), res.algorithms, res.profiles
    base = [a for a in ("bandpilot", "topo", "default", "random") if a in algs]
    ideal = [a for a in ("bandpilot", "ideal") if a in algs]
    fig, axes = plt.subplots(len(profs), 2, figsize=(11, 3.2 * len(profs)), squeeze=False)
    for i, p in enumerate(profs):
        _curve(axes[i][0], gk, p, base)
        axes[i][0].set_title(f"{res.cluster}, τ = {p}: vs baselines")
        _curve(axes[i][1], gk, p, ideal, zoom=True)
        axes[i][1].set_title(f"{res.cluster}, τ = {p}: vs Ideal-BP")
        axes[i][0].legend(fontsize=8, loc="lower left")
        axes[i][1].legend(fontsize=8, loc="lower left")
    return fig


def _fig_loss(plt: Any, res: Any) -> Any:
    """Fig. 7: bandwidth loss bars."""
    loss, profs = res.loss_table(), res.profiles
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
    return fig


def _fig_ablation(plt: Any, res: Any) -> Any:
    """Fig. 9: hybrid-search ablation (only when at least two of EHA, PTS, BandPilot ran)."""
    abl = [a for a in ("eha", "pts", "bandpilot") if a in res.algorithms]
    if len(abl) < 2:
        return None
    gk, profs = res.gbe_by_k(), res.profiles
    fig, axes = plt.subplots(1, len(profs), figsize=(4.2 * len(profs), 3.4), squeeze=False)
    for i, p in enumerate(profs):
        _curve(axes[0][i], gk, p, abl)
        axes[0][i].set_title(f"{res.cluster}, τ = {p}: EHA / PTS / hybrid")
        axes[0][i].legend(fontsize=8, loc="lower left")
    return fig


def _fig_latency(plt: Any, res: Any) -> Any:
    """Fig. 8: search latency by k, and prediction vs search logic per request."""
    f, algs = res.rows, res.algorithms
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
    return fig
