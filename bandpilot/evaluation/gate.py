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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from bandpilot.config import model_name
from bandpilot.errors import ModelError
from bandpilot.evaluation.comparison import comparison_figure, cv_mape, gbe_noise, holdout_metrics, mape_noise
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


@dataclass(frozen=True)
class GateOptions:
    """How :func:`promote` runs. Scenario settings left ``None`` come from the policy's
    ``evaluation`` block; ``policy`` is a :class:`PromotionPolicy`, a mapping or a YAML path."""

    policy: PromotionPolicy | Mapping[str, Any] | str | Path | None = None
    truth: Any = None
    cluster: Any = None
    holdout: Any = None
    profiles: Iterable[str] | str | None = None
    algorithms: Iterable[str] | str | None = None
    repeats: int | None = None
    seed: int | None = None
    workers: int | None = None
    ks: Iterable[int] | None = None
    manual: bool = False
    out_dir: str | Path | None = None
    progress: bool = False
    tracking_uri: str | None = None
    log_artifacts: bool = True
    figures: bool = True


@dataclass
class _Plan:
    """Everything resolved and loaded before any evaluation: bad input fails here."""

    policy: PromotionPolicy
    profiles: tuple[str, ...]
    algorithms: tuple[str, ...]
    repeats: int
    seed: int
    workers: int
    name: str
    version: str
    run_id: str | None
    cand_model: Any
    fabric: Any
    champ_version: str | None
    champ_model: Any
    holdout: Any
    out: Path


def promote(candidate_uri: str, options: GateOptions | None = None, **overrides: Any) -> PromotionDecision:
    """Gate ``candidate_uri`` (a registered version of ``bandpilot-<cluster>``) against the champion.

    ``overrides`` are :class:`GateOptions` fields (``promote(uri, repeats=5, manual=True)``). Raises
    :class:`~bandpilot.errors.BandPilotError` subclasses on bad input, before any alias moves.
    """
    opts = replace(options or GateOptions(), **overrides)
    reg = _registry()
    if hasattr(reg, "tracking_setup"):
        reg.tracking_setup(opts.tracking_uri)
    plan = _plan(candidate_uri, opts)
    cand_res, champ_res = _evaluate_sides(plan, opts)
    cand, champ = _sides(plan, cand_res, champ_res)
    noise = _noise(plan, cand, champ, cand_res, champ_res)
    checks = apply_policy(plan.policy, cand, champ, plan.profiles, noise)
    passed = all(c.passed for c in checks)
    action, aliases = _action(passed, opts.manual, plan.version, plan.champ_version)
    dec = PromotionDecision(
        name=plan.name, candidate=cand, champion=champ, passed=passed, manual=opts.manual, action=action,
        checks=checks, report_dir=plan.out, aliases=aliases,
        policy=plan.policy.to_dict() | {"evaluation": {"profiles": list(plan.profiles), "algorithms": list(plan.algorithms),
                                                       "repeats": plan.repeats, "seed": plan.seed, "workers": plan.workers}},
        scenarios=cand_res.n_scenarios, decided_at=_now(), noise=noise,
    )
    title = f"{plan.name}: candidate v{plan.version}" + (f" vs champion v{plan.champ_version}" if plan.champ_version else "")
    fig = comparison_figure(cand_res, champ_res, plan.out, title)
    _write_decision(dec, cand_res, champ_res, fig)
    if opts.log_artifacts and plan.run_id:
        dec.artifact_uri = _log_run(plan.run_id, dec, cand_res, plan.out)
        (plan.out / DECISION_FILE).write_text(json.dumps(dec.to_dict(), indent=1, default=str))
    _describe(plan.name, plan.version, dec.description())
    _set_tags(plan.name, plan.version, dec.tags())
    _move_aliases(plan.name, plan.version, aliases)
    return dec


def _plan(candidate_uri: str, opts: GateOptions) -> _Plan:
    """1. resolve and load everything that can fail on bad input - before any evaluation."""
    from bandpilot.model.surrogate import Surrogate

    pol = opts.policy if isinstance(opts.policy, PromotionPolicy) else (
        PromotionPolicy.from_dict(opts.policy) if isinstance(opts.policy, Mapping) else PromotionPolicy.load(opts.policy)
    )
    profs = check_profiles(opts.profiles) if opts.profiles is not None else pol.profiles
    algs = check_algorithms(opts.algorithms) if opts.algorithms is not None else pol.algorithms
    if "bandpilot" not in algs:
        algs = ("bandpilot", *algs)
    reps = pol.repeats if opts.repeats is None else int(opts.repeats)
    if reps < 1:
        raise PromotionError(f"zero scenarios: repeats must be >= 1 (got {reps}); nothing was promoted")
    name, version, run_id = _resolve(candidate_uri)
    if version is None:
        raise PromotionError(f"{candidate_uri} is not a registered model version (use models:/NAME/VERSION or models:/NAME@alias)")
    cand_model = Surrogate.load(f"models:/{name}/{version}")
    fabric = resolve_truth(cand_model.spec, truth=opts.truth, cluster=opts.cluster)
    expected = model_name(cand_model.spec.name)
    if name != expected and name != model_name(fabric.spec.name):
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
    if opts.holdout is not None:
        from bandpilot.data.dataset import load_dataset

        ho = load_dataset(opts.holdout)
        check_same_cluster(cand_model.spec, ho.spec, "held-out dataset of cluster")
    out = Path(opts.out_dir) if opts.out_dir else _default_out(name, version)
    out.mkdir(parents=True, exist_ok=True)
    return _Plan(pol, profs, algs, reps, pol.seed if opts.seed is None else int(opts.seed),
                 pol.workers if opts.workers is None else int(opts.workers), name, version, run_id, cand_model, fabric,
                 champ_version, champ_model, ho, out)


def _evaluate_sides(plan: _Plan, opts: GateOptions) -> tuple[EvaluationResult, EvaluationResult | None]:
    """2. both sides on the same scenarios (exact optima computed once, shared), reports written."""
    cand_res = evaluate(plan.cand_model, plan.fabric, profiles=plan.profiles, repeats=plan.repeats, seed=plan.seed,
                        workers=plan.workers, ks=opts.ks, algorithms=plan.algorithms, progress=opts.progress, figures=False)
    cand_res.model_uri = f"models:/{plan.name}/{plan.version}"
    cand_res.model_version = plan.version
    champ_res = None
    if plan.champ_model is not None:
        champ_res = evaluate(plan.champ_model, plan.fabric, profiles=plan.profiles, workers=plan.workers,
                             algorithms=("bandpilot",), reference=cand_res, progress=opts.progress, figures=False)
        champ_res.model_uri = f"models:/{plan.name}/{plan.champ_version}"
        champ_res.model_version = plan.champ_version
        rebase([cand_res, champ_res])
    cand_res.write(plan.out / "candidate", figures=opts.figures)
    if champ_res is not None:
        champ_res.write(plan.out / "champion", figures=opts.figures)
    return cand_res, champ_res


def _sides(plan: _Plan, cand_res: EvaluationResult, champ_res: EvaluationResult | None) -> tuple[Side, Side | None]:
    """Both sides' figures: GBE, and MAPE on the holdout, else the model's cross-validated MAPE."""
    cand = _side(cand_res, plan.version, cand_res.model_uri, plan.profiles)
    champ = _side(champ_res, plan.champ_version, champ_res.model_uri, plan.profiles) if champ_res is not None else None
    for side, model in ((cand, plan.cand_model), (champ, plan.champ_model)):
        if side is None:
            continue
        if plan.holdout is not None:
            hm = holdout_metrics(model, plan.holdout)
            side.mape, side.holdout, side.mape_source = float(hm["mape"]), hm, "held-out"
        else:  # no held-out set: the error the model showed on measurements it was not fit on (its CV)
            side.mape, side.mape_source = cv_mape(model), "cross-validated"
    cand.truth = cand_res.truth
    if champ is not None and champ_res is not None:
        champ.truth = champ_res.truth
    return cand, champ


def _noise(plan: _Plan, cand: Side, champ: Side | None, cand_res: EvaluationResult,
           champ_res: EvaluationResult | None) -> dict[str, float]:
    if champ is None or champ_res is None:
        return {}
    noise = gbe_noise(cand_res, champ_res, plan.profiles)
    if cand.mape is not None and champ.mape is not None:
        mn = mape_noise(plan.cand_model, plan.champ_model, plan.holdout)
        if mn is not None:
            noise["mape"] = mn
    return noise


def _action(passed: bool, manual: bool, version: str, champ_version: str | None) -> tuple[str, dict[str, str]]:
    if manual:
        return ("awaiting_approval" if passed else "challenger"), {CHALLENGER: version}
    if not passed:
        return "challenger", {CHALLENGER: version}
    aliases = {CHAMPION: version}
    if champ_version is not None:
        aliases[PREVIOUS] = champ_version
    return "promoted", aliases


def _move_aliases(name: str, version: str, aliases: Mapping[str, str]) -> None:
    """4. only after every number and record: previous before champion, so a failure in between
    leaves the old champion serving."""
    if PREVIOUS in aliases:
        _set_alias(name, PREVIOUS, aliases[PREVIOUS])
    if CHAMPION in aliases:
        _set_alias(name, CHAMPION, aliases[CHAMPION])
        if _get_alias(name, CHALLENGER) == version:
            _delete_alias(name, CHALLENGER)
    if CHALLENGER in aliases:
        _set_alias(name, CHALLENGER, aliases[CHALLENGER])


def _log_run(run_id: str, dec: PromotionDecision, cand: EvaluationResult, out: Path) -> str:
    """Metrics and the whole promotion directory on the candidate version's run."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    ts = int(time.time() * 1000)
    metrics = {k: v for k, v in cand.metrics().items() if math.isfinite(float(v))}
    metrics["promotion_passed"] = 1.0 if dec.passed else 0.0
    if dec.candidate.mape is not None and dec.candidate.mape_source == "held-out":
        metrics["holdout_mape"] = float(dec.candidate.mape)  # a cross-validated MAPE is the run's cv_mape already
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
    "GateOptions",
    "promote",
    "approve",
    "holdout_metrics",
]
