"""What the promotion gate decides and why: the policy of ``params/promotion.yaml``, the checks it
applies to both sides' figures and the decision record (pure: no registry, no evaluation).

Policy checks (GBE = BandPilot's mean GBE per profile, a fraction of the exact optimum):

* ``min_gbe[profile]``: candidate GBE >= threshold, for every evaluated profile;
* ``max_mape``: candidate MAPE (%) <= threshold: on the held-out cross-host rows with ``holdout``,
  else the model's pattern-grouped cross-validated MAPE (recorded at training);
* against the champion, for every profile: candidate GBE >= champion GBE − allowed drop, where the
  allowed drop is the measured noise of the comparison (``noise_z`` standard errors of the paired
  per-scenario GBE difference: both sides run on the same scenarios), at most ``tolerance``;
* ``mape_tolerance``: candidate MAPE <= champion MAPE + allowed rise, the same way: ``noise_z``
  standard errors of the MAPE difference (paired over the held-out rows, else from the per-fold
  cross-validated MAPEs), at most ``mape_tolerance`` points (null disables the check).

The absolute floors (``min_gbe``, ``max_mape``) judge a first model; once there is a champion the
relative checks are the tight ones (measured models reach 99.6-100 % GBE, far above any floor).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from bandpilot.config import portable
from bandpilot.dispatch import strategies
from bandpilot.errors import BandPilotError, SpecError
from bandpilot.evaluation.params import PROFILES, check_algorithms, check_profiles, load_params

CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS = "previous"
TAG_PREFIX = "bandpilot.promotion."  # stored tag keys: unchanged since 0.1
#: What the gate runs by default: the gated dispatcher, the oracle and the baselines (the EHA/PTS
#: ablation is for ``bandpilot evaluate``; PTS is the slowest search and does not decide anything).
GATE_ALGORITHMS = strategies.names(default_for="gate")


class PromotionError(BandPilotError):
    """The gate cannot run or an approval is not allowed (nothing was changed)."""


@dataclass
class PromotionPolicy:
    """Thresholds of the gate and the evaluation it runs (``params/promotion.yaml``)."""

    min_gbe: dict[str, float] = field(default_factory=lambda: {p: 0.98 for p in PROFILES})
    max_mape: float | None = 10.0
    tolerance: float = 0.01
    mape_tolerance: float | None = 1.0
    noise_z: float = 2.0
    profiles: tuple[str, ...] = PROFILES
    algorithms: tuple[str, ...] = GATE_ALGORITHMS
    repeats: int = 20
    seed: int = 20240601
    workers: int = 0

    KEYS = ("min_gbe", "max_mape", "tolerance", "mape_tolerance", "noise_z", "evaluation")
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
        for key in ("max_mape", "tolerance", "mape_tolerance", "noise_z"):
            if key in doc:
                v = doc[key]
                if v is None and key not in ("tolerance", "noise_z"):
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
            "noise_z": self.noise_z,
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
    mape_source: str | None = None  # "held-out" dataset or "cross-validated" (the model's own CV figures)
    truth: str | None = None  # which fabric scored the GBE (measured tables or the emulator)

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
    noise: dict[str, float] = field(default_factory=dict)  # SE of candidate - champion per profile, "mape"

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
            "noise": self.noise,
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
        if self.candidate.truth:
            lines += ["", f"GBE scored on: {self.candidate.truth}"]
        if self.candidate.mape_source:
            lines.append(f"MAPE: {self.candidate.mape_source}")
        lines += ["", "Checks:"]
        for c in self.checks:
            lines.append(f"- {'✅' if c.passed else '❌'} {c.detail}")
        lines += ["", f"Report: `{portable(self.report_dir)}`" + (f" (artifacts: `{self.artifact_uri}`)" if self.artifact_uri else "")]
        return "\n".join(lines)

    def tags(self) -> dict[str, str]:
        t = {
            "passed": str(self.passed).lower(),
            "action": self.action,
            "decided_at": self.decided_at,
            "report_dir": portable(self.report_dir),
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
            t["mape_source"] = self.candidate.mape_source or "held-out"
        if self.candidate.truth:
            t["truth"] = self.candidate.truth[:250]
        if self.champion and self.champion.mape is not None:
            t["champion_mape"] = f"{self.champion.mape:.4f}"
        return {TAG_PREFIX + k: v for k, v in t.items()}


def allowed_gap(cap: float, z: float, se: float | None) -> float:
    """How far a challenger may fall behind the champion: ``z`` standard errors of the measured
    difference, never more than ``cap``; without a noise figure, ``cap``."""
    if se is None or not math.isfinite(se):
        return cap
    return min(cap, z * max(se, 0.0))


def apply_policy(policy: PromotionPolicy, cand: Side, champ: Side | None, profiles: Iterable[str],
                 noise: Mapping[str, float] | None = None) -> list[Check]:
    """The checks of the gate (pure: no I/O). ``noise``: standard error of the candidate-minus-
    champion difference per profile (GBE fraction) and under ``"mape"`` (% points)."""
    noise = noise or {}
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
                            f"{cand.mape_source or 'held-out'} MAPE {cand.mape:.2f} % {'<=' if ok else '>'} maximum {policy.max_mape:.2f} %"))
    if champ is not None:
        for p in profiles:
            gap = allowed_gap(policy.tolerance, policy.noise_z, noise.get(p))
            floor = champ.gbe[p] - gap
            v = cand.gbe[p]
            ok = bool(v >= floor - 1e-12)
            checks.append(Check(
                f"vs_champion_{p}", v, floor, ok,
                f"GBE {p} {100 * v:.2f} % vs champion v{champ.version} {100 * champ.gbe[p]:.2f} % "
                f"({100 * (v - champ.gbe[p]):+.2f} pts, allowed -{100 * gap:.2f}{_why(p, noise, policy, 100)})",
            ))
        if policy.mape_tolerance is not None and cand.mape is not None and champ.mape is not None:
            gap = allowed_gap(policy.mape_tolerance, policy.noise_z, noise.get("mape"))
            ceil = champ.mape + gap
            ok = bool(cand.mape <= ceil + 1e-12)
            checks.append(Check("mape_vs_champion", cand.mape, ceil, ok,
                                f"{cand.mape_source or 'held-out'} MAPE {cand.mape:.2f} % vs champion {champ.mape:.2f} % "
                                f"(allowed +{gap:.2f} pts{_why('mape', noise, policy, 1)})"))
    return checks


def _why(key: str, noise: Mapping[str, float], policy: PromotionPolicy, scale: float) -> str:
    se = noise.get(key)
    cap = policy.mape_tolerance if key == "mape" else policy.tolerance
    if se is None or not math.isfinite(se):
        return ": tolerance, no noise figure"
    return f": {policy.noise_z:g} x noise SE {scale * se:.3f}, at most {scale * float(cap or 0):.2f}"


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
    "apply_policy",
]
