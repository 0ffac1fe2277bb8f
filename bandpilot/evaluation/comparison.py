"""What the promotion gate measures on both sides: accuracy on a held-out dataset or the model's own
cross-validated figures, the noise of the candidate-minus-champion difference the gate tolerates, and
the comparison figure (no registry access, no decision)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from bandpilot.config import portable
from bandpilot.evaluation.decision import PromotionError
from bandpilot.evaluation.result import EvaluationResult
from bandpilot.evaluation.truth import check_same_cluster


def holdout_metrics(model: Any, holdout: Any) -> dict[str, Any]:
    """Accuracy of ``model`` on a held-out dataset: cross-host rows (stage 1 is a lookup), repeats averaged."""
    from bandpilot.data.dataset import Dataset, load_dataset
    from bandpilot.model.metrics import evaluate_predictions

    ds = holdout if isinstance(holdout, Dataset) else load_dataset(holdout)
    check_same_cluster(model.spec, ds.spec, "held-out dataset of cluster")
    use, cross = _holdout_use(ds)
    y = use.busbw()
    yhat = np.asarray(model.predict_masks(use.masks()), dtype=float)
    ev = evaluate_predictions(y, yhat, n_hosts=use.frame["n_hosts"].to_numpy())
    ev["rows"] = "cross-host" if cross else "all"
    ev["dataset"] = portable(ds.path) if ds.path else None
    return ev


def _holdout_use(ds: Any) -> tuple[Any, bool]:
    """The rows a held-out dataset scores: cross-host ones (stage 1 is a lookup), else all."""
    agg = ds.aggregated()
    cross = agg.cross_host()
    use = cross if len(cross) else agg
    if len(use) == 0:
        raise PromotionError(f"held-out dataset {ds.path} has no rows")
    return use, bool(len(cross))


def _holdout_rows(ds: Any) -> tuple[Any, Any]:
    use, _ = _holdout_use(ds)
    return np.asarray(use.busbw(), dtype=float), use.masks()


def cv_mape(model: Any) -> float | None:
    """The pattern-grouped cross-validated MAPE stored in a model fit by ``bandpilot train`` (None for
    models trained on a split, whose test rows were not measurements the registered model left out)."""
    m = (getattr(model, "meta", None) or {}).get("metrics") or {}
    v = m.get("cv_mape")
    return float(v) if v is not None and np.isfinite(v) else None


def paired_se(diff: Any) -> float | None:
    """Standard error of the mean of paired differences (None below two pairs)."""
    d = np.asarray(diff, dtype=float)
    d = d[np.isfinite(d)]
    return float(d.std(ddof=1) / math.sqrt(d.size)) if d.size >= 2 else None


def gbe_noise(cand: EvaluationResult, champ: EvaluationResult, profiles: Iterable[str]) -> dict[str, float]:
    """Per profile: SE of the candidate-minus-champion GBE, paired on the shared scenarios."""
    out: dict[str, float] = {}
    for p in profiles:
        sides = [r.frame[(r.frame["profile"] == p) & (r.frame["algorithm"] == "bandpilot")].set_index("scenario")["gbe"]
                 for r in (cand, champ)]
        se = paired_se((sides[0] - sides[1]).dropna())
        if se is not None:
            out[p] = se
    return out


def mape_noise(cand_model: Any, champ_model: Any, holdout: Any = None) -> float | None:
    """SE of the candidate-minus-champion MAPE (% points): paired over the held-out cross-host rows,
    else from each model's per-fold cross-validated MAPEs (different data: independent errors)."""
    if holdout is not None:
        y, masks = _holdout_rows(holdout)
        ape = [100 * np.abs(np.asarray(m.predict_masks(masks), dtype=float) - y) / y for m in (cand_model, champ_model)]
        return paired_se(ape[0] - ape[1])
    var = 0.0
    for m in (cand_model, champ_model):
        metrics = (getattr(m, "meta", None) or {}).get("metrics") or {}
        folds = [float(v) for k, v in metrics.items() if k.startswith("cv_fold") and k.endswith("_mape")]
        se = float(np.std(folds, ddof=1) / math.sqrt(len(folds))) if len(folds) >= 2 else None
        if se is None or not math.isfinite(se):
            return None
        var += se * se
    return math.sqrt(var)


def comparison_figure(cand: EvaluationResult, champ: EvaluationResult | None, out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    profs = list(cand.profiles)
    fig, axes = plt.subplots(1, len(profs), figsize=(4.4 * len(profs), 3.5), squeeze=False)
    ck = cand.gbe_by_k()
    hk = champ.gbe_by_k() if champ is not None else None
    for i, p in enumerate(profs):
        ax = axes[0][i]
        sub = ck.loc[p]
        ax.plot(sub.index, sub["bandpilot"], color="#d62728", marker="o", ms=3, label=f"candidate v{cand.model_version}")
        if hk is not None and champ is not None:
            hs = hk.loc[p]
            ax.plot(hs.index, hs["bandpilot"], color="#1f77b4", marker="s", ms=3, label=f"champion v{champ.model_version}")
        if "ideal" in sub.columns:
            ax.plot(sub.index, sub["ideal"], color="#2ca02c", lw=1, ls="--", label="Ideal-BP")
        ax.set_title(f"τ = {p}")
        ax.set_xlabel("request size k (GPUs)")
        ax.set_ylabel("mean GBE (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    fig.suptitle(title)
    fig.tight_layout()
    path = out / "comparison_gbe_vs_k.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
