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

Policy checks (GBE = BandPilot's mean GBE per profile, a fraction of the exact optimum):

* ``min_gbe[profile]``: candidate GBE >= threshold, for every evaluated profile;
* ``max_mape``: candidate MAPE (%) on the held-out cross-host rows <= threshold (with ``holdout``);
* ``tolerance``: candidate GBE >= champion GBE − tolerance, for every profile;
* ``mape_tolerance`` (optional): candidate MAPE <= champion MAPE + tolerance.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from bandpilot.errors import BandPilotError, ModelError, SpecError
from bandpilot.evaluation.core import (
    PROFILES,
    EvaluationResult,
    LABELS,
    check_algorithms,
    check_profiles,
    check_same_cluster,
    evaluate,
    load_params,
    markdown_table,
    rebase,
    resolve_truth,
)

CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS = "previous"
DECISION_FILE = "decision.json"
PROMOTION_REPORT = "promotion.md"
TAG_PREFIX = "bandpilot.evaluation.gate."
#: What the gate runs by default: the gated dispatcher, the oracle and the baselines (the EHA/PTS
#: ablation is for ``bandpilot evaluate``; PTS is the slowest search and does not decide anything).
GATE_ALGORITHMS = ("bandpilot", "ideal", "topo", "default", "random")


class PromotionError(BandPilotError):
    """The gate cannot run or an approval is not allowed (nothing was changed)."""


# ------------------------------------------------------------------------------------------
@dataclass
class PromotionPolicy:
    """Thresholds of the gate and the evaluation it runs (``params/promotion.yaml``)."""

    min_gbe: dict[str, float] = field(default_factory=lambda: {p: 0.95 for p in PROFILES})
    max_mape: float | None = 10.0
    tolerance: float = 0.01
    mape_tolerance: float | None = None
    profiles: tuple[str, ...] = PROFILES
    algorithms: tuple[str, ...] = GATE_ALGORITHMS
    repeats: int = 20
    seed: int = 20240601
    workers: int = 0

    KEYS = ("min_gbe", "max_mape", "tolerance", "mape_tolerance", "evaluation")
    EVAL_KEYS = ("profiles", "algorithms", "repeats", "seed", "workers")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None, source: str = "promotion policy") -> "PromotionPolicy":
        doc = dict(doc or {})
        unknown = set(doc) - set(cls.KEYS)
        if unknown:
            raise SpecError(f"{source}: unknown keys {sorted(unknown)}; known: {list(cls.KEYS)}")
        pol = cls()
        ev = dict(doc.get("evaluation") or {})
        bad = set(ev) - set(cls.EVAL_KEYS)
        if bad:
            raise SpecError(f"{source}: unknown evaluation keys {sorted(bad)}; known: {list(cls.EVAL_KEYS)}")
        try:
            if "profiles" in ev:
                pol.profiles = check_profiles(ev["profiles"])
            if "algorithms" in ev:
                pol.algorithms = check_algorithms(ev["algorithms"])
        except BandPilotError as exc:
            raise SpecError(f"{source}: {exc}") from None
        if "bandpilot" not in pol.algorithms:
            raise SpecError(f"{source}: evaluation.algorithms must include bandpilot (the gated dispatcher)")
        for key in ("repeats", "seed", "workers"):
            if key in ev:
                v = ev[key]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (key == "repeats" and v < 1):
                    raise SpecError(f"{source}: evaluation.{key} must be a {'positive' if key == 'repeats' else 'non-negative'} integer, got {v!r}")
                setattr(pol, key, v)
        if "min_gbe" in doc:
            mg = doc["min_gbe"]
            if isinstance(mg, (int, float)) and not isinstance(mg, bool):
                pol.min_gbe = {p: float(mg) for p in PROFILES}
            elif isinstance(mg, Mapping):
                badp = [p for p in mg if p not in PROFILES]
                if badp:
                    raise SpecError(f"{source}: min_gbe names unknown profile(s) {badp}")
                pol.min_gbe = {p: float(mg.get(p, 0.0)) for p in PROFILES}
            else:
                raise SpecError(f"{source}: min_gbe must be a number or a mapping profile -> number")
            for p, v in pol.min_gbe.items():
                if not 0.0 <= v <= 1.0:
                    raise SpecError(f"{source}: min_gbe.{p} = {v} must be a fraction in [0, 1]")
        for key in ("max_mape", "tolerance", "mape_tolerance"):
            if key in doc:
                v = doc[key]
                if v is None and key != "tolerance":
                    setattr(pol, key, None)
                    continue
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise SpecError(f"{source}: {key} must be a non-negative number, got {v!r}")
                setattr(pol, key, float(v))
        if pol.tolerance > 1:
            raise SpecError(f"{source}: tolerance is a GBE fraction (0.01 = 1 point), got {pol.tolerance}")
        return pol

    @classmethod
    def load(cls, path: str | Path | None = None) -> "PromotionPolicy":
        """``path``, else ``params/promotion.yaml`` (project, then repository), else built-ins."""
        doc = load_params("promotion.yaml", path)
        return cls.from_dict(doc, str(path or "params/promotion.yaml"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_gbe": dict(self.min_gbe),
            "max_mape": self.max_mape,
            "tolerance": self.tolerance,
            "mape_tolerance": self.mape_tolerance,
            "evaluation": {"profiles": list(self.profiles), "algorithms": list(self.algorithms),
                           "repeats": self.repeats, "seed": self.seed, "workers": self.workers},
        }


@dataclass
class Check:
    name: str
    value: float | None
    threshold: float | None
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Side:
    """One model's figures in the comparison."""

    version: str | None
    uri: str | None
    gbe: dict[str, float]
    mape: float | None = None
    holdout: dict[str, Any] | None = None
    report_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromotionDecision:
    """Outcome of :func:`promote` (also written to ``decision.json``)."""

    name: str
    candidate: Side
    champion: Side | None
    passed: bool
    manual: bool
    action: str  # promoted | challenger | awaiting_approval
    checks: list[Check]
    report_dir: Path
    aliases: dict[str, str]  # alias -> version set by this decision
    policy: dict[str, Any]
    scenarios: int
    decided_at: str
    artifact_uri: str | None = None

    @property
    def reasons(self) -> list[str]:
        return [c.detail for c in self.checks if not c.passed]

    @property
    def version(self) -> str:
        return str(self.candidate.version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "candidate": self.candidate.to_dict(),
            "champion": self.champion.to_dict() if self.champion else None,
            "passed": self.passed,
            "manual": self.manual,
            "action": self.action,
            "reasons": self.reasons,
            "checks": [c.to_dict() for c in self.checks],
            "report_dir": str(self.report_dir),
            "aliases": self.aliases,
            "policy": self.policy,
            "scenarios": self.scenarios,
            "decided_at": self.decided_at,
            "artifact_uri": self.artifact_uri,
        }

    def headline(self) -> str:
        v = self.candidate.version
        if self.action == "promoted":
            prev = f" (previous champion v{self.champion.version} -> '{PREVIOUS}')" if self.champion else " (first champion)"
            return f"PASS: {self.name} v{v} is now '{CHAMPION}'{prev}"
        if self.action == "awaiting_approval":
            return f"PASS (manual): {self.name} v{v} is '{CHALLENGER}', awaiting approval (bandpilot promote --approve {v} --name {self.name})"
        r = self.reasons
        more = f" (+{len(r) - 1} more failed check{'s' if len(r) > 2 else ''})" if len(r) > 1 else ""
        head = f"FAIL: {self.name} v{v} is '{CHALLENGER}': {r[0] if r else 'failed'}{more}"
        return head + (" - manual mode" if self.manual else "")

    def description(self) -> str:
        """Markdown for the model version's description."""
        lines = [f"**Promotion gate {self.decided_at}: {self.headline()}**", ""]
        profs = list(self.candidate.gbe)
        head = "| | " + " | ".join(f"GBE {p}" for p in profs) + " | MAPE |"
        lines += [head, "|---|" + "---:|" * (len(profs) + 1)]

        def row(label: str, s: Side) -> str:
            g = " | ".join(f"{100 * s.gbe[p]:.2f} %" for p in profs)
            m = "–" if s.mape is None else f"{s.mape:.2f} %"
            return f"| {label} | {g} | {m} |"

        lines.append(row(f"candidate v{self.candidate.version}", self.candidate))
        if self.champion:
            lines.append(row(f"champion v{self.champion.version}", self.champion))
        lines += ["", "Checks:"]
        for c in self.checks:
            lines.append(f"- {'✅' if c.passed else '❌'} {c.detail}")
        lines += ["", f"Report: `{self.report_dir}`" + (f" (artifacts: `{self.artifact_uri}`)" if self.artifact_uri else "")]
        return "\n".join(lines)

    def tags(self) -> dict[str, str]:
        t = {
            "passed": str(self.passed).lower(),
            "action": self.action,
            "decided_at": self.decided_at,
            "report_dir": str(self.report_dir),
            "reasons": "; ".join(self.reasons)[:4000] or "none",
            "champion_version": str(self.champion.version) if self.champion else "none",
            "scenarios": str(self.scenarios),
        }
        if self.artifact_uri:
            t["artifacts"] = self.artifact_uri
        for p, v in self.candidate.gbe.items():
            t[f"gbe_{p}"] = f"{v:.5f}"
            if self.champion:
                t[f"champion_gbe_{p}"] = f"{self.champion.gbe[p]:.5f}"
        if self.candidate.mape is not None:
            t["mape"] = f"{self.candidate.mape:.4f}"
        if self.champion and self.champion.mape is not None:
            t["champion_mape"] = f"{self.champion.mape:.4f}"
        return {TAG_PREFIX + k: v for k, v in t.items()}


# ------------------------------------------------------------------------------------------
def apply_policy(policy: PromotionPolicy, cand: Side, champ: Side | None, profiles: Iterable[str]) -> list[Check]:
    """The checks of the gate (pure: no I/O)."""
    checks: list[Check] = []
    for p in profiles:
        thr = float(policy.min_gbe.get(p, 0.0))
        v = cand.gbe[p]
        ok = bool(v >= thr)
        checks.append(Check(f"min_gbe_{p}", v, thr, ok,
                            f"GBE {p} {100 * v:.2f} % {'>=' if ok else '<'} minimum {100 * thr:.2f} %"))
    if cand.mape is not None and policy.max_mape is not None:
        ok = bool(cand.mape <= policy.max_mape)
        checks.append(Check("max_mape", cand.mape, policy.max_mape, ok,
                            f"held-out MAPE {cand.mape:.2f} % {'<=' if ok else '>'} maximum {policy.max_mape:.2f} %"))
    if champ is not None:
        for p in profiles:
            floor = champ.gbe[p] - policy.tolerance
            v = cand.gbe[p]
            ok = bool(v >= floor - 1e-12)
            checks.append(Check(
                f"vs_champion_{p}", v, floor, ok,
                f"GBE {p} {100 * v:.2f} % vs champion v{champ.version} {100 * champ.gbe[p]:.2f} % "
                f"({100 * (v - champ.gbe[p]):+.2f} pts, tolerance {100 * policy.tolerance:.2f})",
            ))
        if policy.mape_tolerance is not None and cand.mape is not None and champ.mape is not None:
            ceil = champ.mape + policy.mape_tolerance
            ok = bool(cand.mape <= ceil)
            checks.append(Check("mape_vs_champion", cand.mape, ceil, ok,
                                f"held-out MAPE {cand.mape:.2f} % vs champion {champ.mape:.2f} % (tolerance {policy.mape_tolerance:.2f} pts)"))
    return checks


def holdout_metrics(model: Any, holdout: Any) -> dict[str, Any]:
    """Accuracy of ``model`` on a held-out dataset: cross-host rows (stage 1 is a lookup), repeats averaged."""
    from bandpilot.data.dataset import Dataset, load_dataset
    from bandpilot.model.metrics import evaluate_predictions

    ds = holdout if isinstance(holdout, Dataset) else load_dataset(holdout)
    check_same_cluster(model.spec, ds.spec, "held-out dataset of cluster")
    agg = ds.aggregated()
    cross = agg.cross_host()
    use = cross if len(cross) else agg
    if len(use) == 0:
        raise PromotionError(f"held-out dataset {ds.path} has no rows")
    y = use.busbw()
    yhat = np.asarray(model.predict_masks(use.masks()), dtype=float)
    ev = evaluate_predictions(y, yhat, n_hosts=use.frame["n_hosts"].to_numpy())
    ev["rows"] = "cross-host" if len(cross) else "all"
    ev["dataset"] = str(ds.path) if ds.path else None
    return ev


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
        cand.mape, cand.holdout = float(cm["mape"]), cm
        if champ is not None and champ_model is not None:
            hm = holdout_metrics(champ_model, ho)
            champ.mape, champ.holdout = float(hm["mape"]), hm

    # 3. decide, write everything
    checks = apply_policy(pol, cand, champ, profs)
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
        scenarios=cand_res.n_scenarios, decided_at=_now(),
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
    run = client.get_run(run_id)
    return f"{run.info.artifact_uri.rstrip('/')}/{dest}"


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


def rich_decision(dec: PromotionDecision) -> Any:
    """Terminal view of a decision (rich table)."""
    from rich.table import Table

    t = Table(title=dec.headline())
    t.add_column("")
    profs = list(dec.candidate.gbe)
    for p in profs:
        t.add_column(f"GBE {p} (%)", justify="right")
    t.add_column("MAPE (%)", justify="right")

    def row(label: str, s: Side) -> list[str]:
        return [label, *[f"{100 * s.gbe[p]:.2f}" for p in profs], "–" if s.mape is None else f"{s.mape:.2f}"]

    t.add_row(*row(f"candidate v{dec.candidate.version}", dec.candidate), style="bold")
    if dec.champion:
        t.add_row(*row(f"champion v{dec.champion.version}", dec.champion))
    return t


__all__ = [
    "PromotionPolicy",
    "PromotionDecision",
    "PromotionError",
    "Check",
    "Side",
    "promote",
    "approve",
    "apply_policy",
    "holdout_metrics",
    "resolve_truth",
    "LABELS",
]
