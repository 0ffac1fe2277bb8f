"""What an evaluation may be asked to run, and with which defaults: the traffic profiles and
algorithms, and ``params/evaluate.yaml`` (or another ``params/*.yaml``) over the built-ins."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from bandpilot.dispatch import strategies
from bandpilot.errors import BandPilotError, SpecError

PROFILES = ("idle", "moderate", "heavy")
#: Every algorithm an evaluation can run, in report order (the strategies registered for ``evaluate``).
ALGORITHMS = strategies.names(default_for="evaluate")
LABELS = {name: strategies.label(name) for name in strategies.names()}
#: Algorithms that ignore the traffic profile (the baselines): one selection per scenario, scored under each profile.
PROFILE_BLIND = frozenset(strategies.names(strategies.BASELINE))
#: Algorithms that search with the TRUE bandwidth (the truth fabric) instead of the evaluated model.
ORACLE = frozenset(strategies.names(strategies.ORACLE))


class EvaluationError(BandPilotError):
    """An evaluation cannot run as asked (no scenarios, unknown profile, cluster mismatch)."""


def _params_dirs() -> list[Path]:
    from bandpilot.config import SOURCE_ROOT, project_root

    out = [project_root() / "params", SOURCE_ROOT / "params"]
    return [p for i, p in enumerate(out) if p not in out[:i]]


def load_params(name: str = "evaluate.yaml", path: str | Path | None = None) -> dict[str, Any]:
    """A YAML params file (``params/evaluate.yaml`` by default); a missing default file is ``{}``."""
    import yaml

    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SpecError(f"params file not found: {p}")
        cands = [p]
    else:
        cands = [d / name for d in _params_dirs() if (d / name).is_file()]
        if not cands:
            return {}
    try:
        doc = yaml.safe_load(cands[0].read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{cands[0]}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{cands[0]}: expected a mapping")
    return doc


def evaluate_defaults() -> dict[str, Any]:
    """``profiles``, ``repeats``, ``seed``, ``workers`` from ``params/evaluate.yaml`` over built-ins."""
    base = {"profiles": list(PROFILES), "repeats": 50, "seed": 0, "workers": 0, "algorithms": list(ALGORITHMS)}
    doc = load_params("evaluate.yaml")
    unknown = set(doc) - set(base)
    if unknown:
        raise SpecError(f"params/evaluate.yaml: unknown keys {sorted(unknown)}")
    base.update({k: v for k, v in doc.items() if v is not None})
    return base


def check_profiles(profiles: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(profiles, str):
        profiles = [p.strip() for p in profiles.split(",") if p.strip()]
    out = tuple(dict.fromkeys(profiles))
    if not out:
        raise EvaluationError("no traffic profiles to evaluate (choose from idle, moderate, heavy)")
    bad = [p for p in out if p not in PROFILES]
    if bad:
        raise EvaluationError(f"unknown traffic profile(s) {bad}; choose from {list(PROFILES)}")
    return out


def check_algorithms(algorithms: Iterable[str] | str | None) -> tuple[str, ...]:
    if algorithms is None:
        return ALGORITHMS
    if isinstance(algorithms, str):
        algorithms = [a.strip() for a in algorithms.split(",") if a.strip()]
    out = tuple(dict.fromkeys(a.lower() for a in algorithms))
    bad = [a for a in out if a not in ALGORITHMS]
    if bad or not out:
        raise EvaluationError(f"unknown algorithm(s) {bad}; choose from {list(ALGORITHMS)}")
    return out
