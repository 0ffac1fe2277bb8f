"""Promotion gate: may a newly trained surrogate dispatch production requests?

``promote(candidate_uri)`` evaluates the candidate version of ``bandpilot-<cluster>`` and the
current ``champion`` on the SAME seeded scenarios (and, with ``holdout``, the same held-out
measurements), applies the policy of ``params/promotion.yaml`` and then, only after every number,
report and figure has been computed and written:

* pass          -> ``champion`` moves to the candidate, the old champion gets ``previous``;
* fail          -> the candidate gets ``challenger``; the failed checks are the reasons;
* ``manual``    -> only ``challenger`` is set, for a human to run :func:`approve` (CLI
  ``bandpilot promote --approve VERSION --name bandpilot-<cluster>``).

Either way the decision, both sides' figures and the report location go to the version's
description and tags. No champion yet: the first passing candidate becomes it. Bad input (unknown
URI, truth/holdout for another cluster, zero scenarios) raises before anything is evaluated and a
crash mid-evaluation leaves every alias where it was.

The policy, its checks and the decision record are in :mod:`bandpilot.evaluation.decision`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from bandpilot.config import portable
from bandpilot.errors import ModelError
from bandpilot.evaluation.decision import (
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    TAG_PREFIX,
    PromotionDecision,
    PromotionError,
    PromotionPolicy,
    Side,
    apply_policy,
)
from bandpilot.evaluation.params import check_algorithms, check_profiles
from bandpilot.evaluation.report import markdown_table
from bandpilot.evaluation.result import EvaluationResult, rebase
from bandpilot.evaluation.runner import evaluate
from bandpilot.evaluation.truth import check_same_cluster, resolve_truth

DECISION_FILE = "decision.json"
PROMOTION_REPORT = "promotion.md"


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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_out(name: str, version: str) -> Path:
    from bandpilot.config import project_root

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return project_root() / "reports" / "promotion" / f"{name}-v{version}-{stamp}"


# ------------------------------------------------------------------------------------------
# registry access (kept in one place)
def _registry() -> Any:
    from bandpilot.model import registry

    return registry


def _resolve(uri: str) -> tuple[str, str | None, str | None]:
    from bandpilot.model.artifacts import resolve

    name, version, run_id = resolve(uri)
    return name, (str(version) if version is not None else None), run_id


def _get_alias(name: str, alias: str) -> str | None:
    v = _registry().get_alias(name, alias)
    return None if v is None else str(v)


def _set_alias(name: str, alias: str, version: str) -> None:
    _registry().set_alias(name, alias, version)


def _delete_alias(name: str, alias: str) -> None:
    reg = _registry()
    if hasattr(reg, "delete_alias"):
        reg.delete_alias(name, alias)
        return
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().delete_registered_model_alias(name, alias)
    except Exception:  # the alias may not exist
        pass


def _describe(name: str, version: str, text: str) -> None:
    _registry().describe(name, version, text)


def _set_tags(name: str, version: str, tags: Mapping[str, str]) -> None:
    _registry().set_tags(name, version, dict(tags))


def _version_tags(name: str, version: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    try:
        mv = MlflowClient().get_model_version(name, str(version))
    except Exception as exc:
        raise PromotionError(f"model version {name}/{version} not found ({exc.__class__.__name__})") from None
    return dict(mv.tags or {})


# ------------------------------------------------------------------------------------------
def _side(res: EvaluationResult, version: str | None, uri: str | None, profiles: Iterable[str]) -> Side:
    return Side(version, uri, {p: res.gbe(p) for p in profiles}, report_dir=str(res.out_dir) if res.out_dir else None)


def _comparison_figure(cand: EvaluationResult, champ: EvaluationResult | None, out: Path, title: str) -> Path:
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
        if hk is not None:
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


def _write_decision(dec: PromotionDecision, cand: EvaluationResult, champ: EvaluationResult | None, fig: Path) -> None:
    out = dec.report_dir
    (out / DECISION_FILE).write_text(json.dumps(dec.to_dict(), indent=1, default=str))
    import pandas as pd

    profs = list(cand.profiles)
    rows = {f"candidate v{dec.candidate.version}": [100 * dec.candidate.gbe[p] for p in profs]}
    if dec.champion:
        rows[f"champion v{dec.champion.version}"] = [100 * dec.champion.gbe[p] for p in profs]
    ideal = cand.gbe_table()
    if "ideal" in ideal.index:
        rows["Ideal-BP"] = [float(ideal.loc["ideal", p]) for p in profs]
    table = pd.DataFrame(rows, index=profs).T
    table.index.name = "model"
    lines = [
        f"# Promotion gate: {dec.name} v{dec.candidate.version}",
        "",
        f"**{dec.headline()}**",
        "",
        f"- decided at {dec.decided_at}; manual: {dec.manual}",
        f"- scenarios: {dec.scenarios} (same seeded scenarios for both sides; seed {dec.policy['evaluation']['seed']})",
        f"- ground truth: {cand.truth}",
        f"- policy: `{json.dumps(dec.policy)}`",
        "",
        "## Mean BandPilot GBE (%)",
        "",
        markdown_table(table, 2, labels=False),
        "",
        "## Checks",
        "",
    ]
    lines += [f"- {'PASS' if c.passed else 'FAIL'}: {c.detail}" for c in dec.checks]
    lines += ["", f"![comparison]({fig.name})", "", "## Reports", "", "- candidate: `candidate/report.md`"]
    if champ is not None:
        lines.append("- champion: `champion/report.md`")
    (out / PROMOTION_REPORT).write_text("\n".join(lines) + "\n")


def promote(
    candidate_uri: str,
    *,
    policy: PromotionPolicy | Mapping[str, Any] | str | Path | None = None,
    truth: Any = None,
    cluster: Any = None,
    holdout: Any = None,
    profiles: Iterable[str] | str | None = None,
    algorithms: Iterable[str] | str | None = None,
    repeats: int | None = None,
    seed: int | None = None,
    workers: int | None = None,
    ks: Iterable[int] | None = None,
    manual: bool = False,
    out_dir: str | Path | None = None,
    progress: bool = False,
    tracking_uri: str | None = None,
    log_artifacts: bool = True,
    figures: bool = True,
) -> PromotionDecision:
    """Gate ``candidate_uri`` (a registered version of ``bandpilot-<cluster>``) against the champion.

    Scenario settings default to the policy's ``evaluation`` block. Raises
    :class:`~bandpilot.errors.BandPilotError` subclasses on bad input, before any alias moves.
    """
    from bandpilot.model.surrogate import Surrogate

    reg = _registry()
    if hasattr(reg, "tracking_setup"):
        reg.tracking_setup(tracking_uri)
    pol = policy if isinstance(policy, PromotionPolicy) else (
        PromotionPolicy.from_dict(policy) if isinstance(policy, Mapping) else PromotionPolicy.load(policy)
    )
    profs = check_profiles(profiles) if profiles is not None else pol.profiles
    algs = check_algorithms(algorithms) if algorithms is not None else pol.algorithms
    if "bandpilot" not in algs:
        algs = ("bandpilot", *algs)
    reps = pol.repeats if repeats is None else int(repeats)
    if reps < 1:
        raise PromotionError(f"zero scenarios: repeats must be >= 1 (got {reps}); nothing was promoted")
    sd = pol.seed if seed is None else int(seed)
    wk = pol.workers if workers is None else int(workers)

    # 1. resolve and load everything that can fail on bad input - before any evaluation
    name, version, run_id = _resolve(candidate_uri)
    if version is None:
        raise PromotionError(f"{candidate_uri} is not a registered model version (use models:/NAME/VERSION or models:/NAME@alias)")
    cand_model = Surrogate.load(f"models:/{name}/{version}")
    fabric = resolve_truth(cand_model.spec, truth=truth, cluster=cluster)
    expected = f"bandpilot-{cand_model.spec.name}"
    if name != expected and name != f"bandpilot-{fabric.spec.name}":
        raise PromotionError(f"candidate is registered as {name!r} but its cluster is {cand_model.spec.name!r} (expected {expected!r})")
    champ_version = _get_alias(name, CHAMPION)
    if champ_version == version:
        raise PromotionError(f"{name} v{version} is already '{CHAMPION}'; nothing to decide")
    champ_model = None
    if champ_version is not None:
        champ_model = Surrogate.load(f"models:/{name}/{champ_version}")
        try:
            check_same_cluster(champ_model.spec, fabric.spec, "truth cluster")
        except ModelError as exc:
            raise PromotionError(f"the champion v{champ_version} does not fit the cluster of the candidate: {exc}") from None
    ho = None
    if holdout is not None:
        from bandpilot.data.dataset import load_dataset

        ho = load_dataset(holdout)
        check_same_cluster(cand_model.spec, ho.spec, "held-out dataset of cluster")

    out = Path(out_dir) if out_dir else _default_out(name, version)
    out.mkdir(parents=True, exist_ok=True)

    # 2. evaluate both sides on the same scenarios (exact optima computed once, shared)
    cand_res = evaluate(cand_model, fabric, profiles=profs, repeats=reps, seed=sd, workers=wk, ks=ks,
                        algorithms=algs, progress=progress, figures=False)
    cand_res.model_uri = f"models:/{name}/{version}"
    cand_res.model_version = version
    cand_side_res = cand_res
    champ_res = None
    if champ_model is not None:
        champ_res = evaluate(champ_model, fabric, profiles=profs, workers=wk, algorithms=("bandpilot",),
                             reference=cand_res, progress=progress, figures=False)
        champ_res.model_uri = f"models:/{name}/{champ_version}"
        champ_res.model_version = champ_version
        rebase([cand_res, champ_res])
    cand_res.write(out / "candidate", figures=figures)
    if champ_res is not None:
        champ_res.write(out / "champion", figures=figures)
    cand = _side(cand_side_res, version, cand_res.model_uri, profs)
    champ = _side(champ_res, champ_version, champ_res.model_uri, profs) if champ_res is not None else None
    if ho is not None:
        cm = holdout_metrics(cand_model, ho)
        cand.mape, cand.holdout, cand.mape_source = float(cm["mape"]), cm, "held-out"
        if champ is not None and champ_model is not None:
            hm = holdout_metrics(champ_model, ho)
            champ.mape, champ.holdout, champ.mape_source = float(hm["mape"]), hm, "held-out"
    else:
        # No held-out set: the error the model showed on measurements it was not fit on (its CV).
        cand.mape, cand.mape_source = cv_mape(cand_model), "cross-validated"
        if champ is not None and champ_model is not None:
            champ.mape, champ.mape_source = cv_mape(champ_model), "cross-validated"
    cand.truth = cand_res.truth
    if champ is not None and champ_res is not None:
        champ.truth = champ_res.truth

    # 3. decide, write everything
    noise: dict[str, float] = {}
    if champ_res is not None:
        noise = gbe_noise(cand_res, champ_res, profs)
        mn = mape_noise(cand_model, champ_model, ho) if cand.mape is not None and champ and champ.mape is not None else None
        if mn is not None:
            noise["mape"] = mn
    checks = apply_policy(pol, cand, champ, profs, noise)
    passed = all(c.passed for c in checks)
    if manual:
        action, aliases = ("awaiting_approval" if passed else "challenger"), {CHALLENGER: version}
    elif passed:
        action = "promoted"
        aliases = {CHAMPION: version}
        if champ_version is not None:
            aliases[PREVIOUS] = champ_version
    else:
        action, aliases = "challenger", {CHALLENGER: version}
    dec = PromotionDecision(
        name=name, candidate=cand, champion=champ, passed=passed, manual=manual, action=action, checks=checks,
        report_dir=out, aliases=aliases, policy=pol.to_dict() | {"evaluation": {"profiles": list(profs), "algorithms": list(algs),
                                                                           "repeats": reps, "seed": sd, "workers": wk}},
        scenarios=cand_res.n_scenarios, decided_at=_now(), noise=noise,
    )
    fig = _comparison_figure(cand_res, champ_res, out, f"{name}: candidate v{version}" + (f" vs champion v{champ_version}" if champ_version else ""))
    _write_decision(dec, cand_res, champ_res, fig)
    if log_artifacts and run_id:
        dec.artifact_uri = _log_run(run_id, dec, cand_res, out)
        (out / DECISION_FILE).write_text(json.dumps(dec.to_dict(), indent=1, default=str))
    _describe(name, version, dec.description())
    _set_tags(name, version, dec.tags())

    # 4. only now move aliases (previous before champion: a failure in between leaves the old champion serving)
    if PREVIOUS in aliases:
        _set_alias(name, PREVIOUS, aliases[PREVIOUS])
    if CHAMPION in aliases:
        _set_alias(name, CHAMPION, aliases[CHAMPION])
        if _get_alias(name, CHALLENGER) == version:
            _delete_alias(name, CHALLENGER)
    if CHALLENGER in aliases:
        _set_alias(name, CHALLENGER, aliases[CHALLENGER])
    return dec


def _log_run(run_id: str, dec: PromotionDecision, cand: EvaluationResult, out: Path) -> str:
    """Metrics and the whole promotion directory on the candidate version's run."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    ts = int(time.time() * 1000)
    metrics = {k: v for k, v in cand.metrics().items() if math.isfinite(float(v))}
    metrics["promotion_passed"] = 1.0 if dec.passed else 0.0
    if dec.candidate.mape is not None:
        metrics["holdout_mape"] = float(dec.candidate.mape)
    ms = [Metric(k, float(v), ts, 0) for k, v in metrics.items()]
    for i in range(0, len(ms), 900):
        client.log_batch(run_id, metrics=ms[i : i + 900])
    dest = f"promotion/{out.name}"
    client.log_artifacts(run_id, str(out), dest)
    client.set_tag(run_id, TAG_PREFIX + "report", dest)
    return f"runs:/{run_id}/{dest}"  # portable: MLflow resolves it against the store, not this checkout


def approve(name: str, version: str | int, *, force: bool = False, tracking_uri: str | None = None,
            approver: str | None = None) -> dict[str, Any]:
    """A human's approval of a ``--manual`` candidate: ``champion`` -> ``version`` (old one -> ``previous``).

    The version must have a gate decision (``bandpilot promote``) that passed; ``force`` approves
    a failed or never-gated version anyway (recorded in its tags).
    """
    reg = _registry()
    if hasattr(reg, "tracking_setup"):
        reg.tracking_setup(tracking_uri)
    version = str(version)
    rname, rver, _ = _resolve(f"models:/{name}/{version}")
    tags = _version_tags(rname, rver or version)
    gate = tags.get(TAG_PREFIX + "passed")
    if gate is None and not force:
        raise PromotionError(f"{name} v{version} has not been through the gate; run `bandpilot promote --candidate models:/{name}/{version} --manual` first (or --force)")
    if gate == "false" and not force:
        reasons = tags.get(TAG_PREFIX + "reasons", "")
        raise PromotionError(f"{name} v{version} failed the gate ({reasons}); approve with --force to override")
    old = _get_alias(name, CHAMPION)
    if old == version:
        raise PromotionError(f"{name} v{version} is already '{CHAMPION}'")
    who = approver or os.environ.get("USER") or "unknown"
    when = _now()
    note = f"Approved by {who} at {when}" + (" (forced past the gate)" if force and gate != "true" else "") + (
        f"; previous champion v{old}" if old else "; first champion")
    mv_desc = _current_description(rname, version)
    _describe(name, version, (mv_desc + "\n\n" if mv_desc else "") + f"**{note}**")
    _set_tags(name, version, {TAG_PREFIX + "approved_by": who, TAG_PREFIX + "approved_at": when,
                              TAG_PREFIX + "action": "approved" + ("_forced" if force and gate != "true" else "")})
    if old is not None:
        _set_alias(name, PREVIOUS, old)
    _set_alias(name, CHAMPION, version)
    if _get_alias(name, CHALLENGER) == version:
        _delete_alias(name, CHALLENGER)
    return {"name": name, "version": version, "previous": old, "approved_by": who, "approved_at": when, "forced": bool(force and gate != "true")}


def _current_description(name: str, version: str) -> str:
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient().get_model_version(name, str(version)).description or ""
    except Exception:
        return ""


__all__ = [
    "promote",
    "approve",
    "holdout_metrics",
]
