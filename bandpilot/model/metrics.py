"""How good are the predictions? Error metrics (overall, by #hosts and count pattern) and
predicted-vs-measured plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def evaluate_predictions(y_true: np.ndarray, y_pred: np.ndarray, patterns: np.ndarray | None = None,
                         n_hosts: np.ndarray | None = None) -> dict[str, Any]:
    """R², MAPE (%), max abs error (GB/s), max relative error (%), Spearman; by #hosts and pattern."""
    from scipy.stats import spearmanr

    y = np.asarray(y_true, dtype=float)
    yh = np.asarray(y_pred, dtype=float)
    if y.size == 0:
        return {"n": 0}
    err = yh - y
    rel = np.abs(err) / np.maximum(np.abs(y), 1e-9)
    ss_res = float((err**2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out: dict[str, Any] = {
        "n": int(y.size),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "mape": 100.0 * float(rel.mean()),
        "max_err": float(np.abs(err).max()),
        "max_rel_err": 100.0 * float(rel.max()),
        "spearman": float(spearmanr(y, yh).statistic) if y.size > 2 and np.ptp(y) > 0 else float("nan"),
    }
    if n_hosts is not None:
        out["by_hosts"] = {
            int(h): {"n": int((n_hosts == h).sum()), "mape": 100.0 * float(rel[n_hosts == h].mean()),
                     "max_rel_err": 100.0 * float(rel[n_hosts == h].max())}
            for h in np.unique(n_hosts)
        }
    if patterns is not None:
        out["by_pattern"] = {
            str(k): {"n": int((patterns == k).sum()), "mape": 100.0 * float(rel[patterns == k].mean())}
            for k in np.unique(patterns)
        }
    return out


def make_plots(y: np.ndarray, yhat: np.ndarray, n_hosts: np.ndarray, out_dir: Path, title: str) -> dict[str, Path]:
    """Predicted-vs-measured scatter and residual plot (PNG, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    sc = ax.scatter(y, yhat, c=n_hosts, s=12, cmap="viridis", alpha=0.8)
    lo, hi = float(min(y.min(), yhat.min())), float(max(y.max(), yhat.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xlabel("measured busbw (GB/s)")
    ax.set_ylabel("predicted busbw (GB/s)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(sc, ax=ax, label="hosts")
    fig.tight_layout()
    paths["scatter"] = out_dir / "pred_vs_measured.png"
    fig.savefig(paths["scatter"])
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.scatter(y, 100 * (yhat - y) / y, c=n_hosts, s=12, cmap="viridis", alpha=0.8)
    ax.axhline(0, color="k", lw=1)
    ax.set_xlabel("measured busbw (GB/s)")
    ax.set_ylabel("relative error (%)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    paths["residuals"] = out_dir / "residuals.png"
    fig.savefig(paths["residuals"])
    plt.close(fig)
    return paths
