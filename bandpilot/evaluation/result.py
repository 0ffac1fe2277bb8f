"""What an evaluation found: one row per scenario x profile x algorithm and the summaries built
from them (GBE, loss and latency tables, flat metrics); results of the same scenarios rebased or
merged."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bandpilot.evaluation.params import PROFILE_BLIND, EvaluationError
from bandpilot.evaluation.report import write_report
from bandpilot.evaluation.scenarios import Scenario
from bandpilot.evaluation.tracking import log_to_mlflow


@dataclass
class EvaluationResult:
    """Rows (one per scenario x profile x algorithm, plus ``exact`` reference rows) and summaries."""

    cluster: str
    fingerprint: str
    model_uri: str | None
    model_name: str | None
    model_version: str | None
    truth: str
    profiles: tuple[str, ...]
    algorithms: tuple[str, ...]
    repeats: int
    seed: int
    scenarios: list[Scenario]
    rows: Any  # pandas.DataFrame
    elapsed_s: float
    workers: int
    out_dir: Path | None = None
    notes: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU seconds of the scenario kernels summed over workers (load-independent cost)

    # -- summaries ---------------------------------------------------------------------------
    @property
    def frame(self) -> Any:
        """Rows of the evaluated algorithms (without the ``exact`` reference rows)."""
        return self.rows[self.rows["algorithm"] != "exact"]

    @property
    def n_scenarios(self) -> int:
        return len(self.scenarios)

    def reference_counts(self) -> dict[str, int]:
        """How many (scenario, profile) references are exact / best-found / k=1."""
        ref = self.rows.drop_duplicates(["scenario", "profile"])["reference"]
        return {str(k): int(v) for k, v in ref.value_counts().items()}

    @property
    def exact_everywhere(self) -> bool:
        return "best-found" not in self.reference_counts()

    def gbe_table(self) -> Any:
        """Mean GBE (%) with algorithms as rows and profiles as columns (paper Table II)."""
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="gbe", aggfunc="mean") * 100.0
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def gbe(self, profile: str, algorithm: str = "bandpilot") -> float:
        f = self.frame
        sel = f[(f["profile"] == profile) & (f["algorithm"] == algorithm)]["gbe"]
        return float(sel.mean()) if len(sel) else math.nan

    def gbe_by_k(self) -> Any:
        """Mean GBE (%) per (profile, k) with algorithms as columns (data behind Fig. 6 / Fig. 9)."""
        f = self.frame
        t = f.pivot_table(index=["profile", "k"], columns="algorithm", values="gbe", aggfunc="mean") * 100.0
        t = t.reindex(columns=[a for a in self.algorithms if a in t.columns])
        return t.reindex(index=[(p, k) for p in self.profiles for k in sorted(f["k"].unique())])

    def by_k(self) -> Any:
        """Long table: mean GBE, loss, latency and model evaluations per (profile, k, algorithm)."""
        f = self.rows
        g = f.groupby(["profile", "k", "algorithm"], sort=False).agg(
            requests=("gbe", "size"), gbe=("gbe", "mean"), gbe_min=("gbe", "min"), b_tau=("b_tau", "mean"),
            loss=("loss", "mean"), search_ms=("search_ms", "mean"), evaluations=("evaluations", "mean"),
        ).reset_index()
        order = {a: i for i, a in enumerate([*self.algorithms, "exact"])}
        porder = {p: i for i, p in enumerate(self.profiles)}
        g = g.sort_values(["profile", "k", "algorithm"], key=lambda c: c.map(porder) if c.name == "profile" else (
            c.map(order) if c.name == "algorithm" else c)).reset_index(drop=True)
        return g

    def min_gbe_table(self) -> Any:
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="gbe", aggfunc="min") * 100.0
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def loss_table(self) -> Any:
        """Mean bandwidth loss L(S, τ) in GB/s (paper Fig. 7)."""
        f = self.frame
        t = f.pivot_table(index="algorithm", columns="profile", values="loss", aggfunc="mean")
        return t.reindex(index=[a for a in self.algorithms if a in t.index], columns=list(self.profiles))

    def latency_table(self) -> Any:
        """Search latency (ms: mean, p50, p95, max) and model evaluations per request, per algorithm."""
        import pandas as pd

        f = self.rows
        out = []
        for alg in [*self.algorithms, "exact"]:
            s = f[f["algorithm"] == alg]
            if alg in PROFILE_BLIND:
                s = s.drop_duplicates("scenario")
            if not len(s):
                continue
            ms = s["search_ms"].to_numpy(dtype=float)
            out.append(
                {
                    "algorithm": alg,
                    "requests": int(len(s)),
                    "mean_ms": float(np.nanmean(ms)),
                    "predict_ms": float(np.nanmean(s["predict_ms"])) if s["predict_ms"].notna().any() else math.nan,
                    "p50_ms": float(np.nanpercentile(ms, 50)),
                    "p95_ms": float(np.nanpercentile(ms, 95)),
                    "max_ms": float(np.nanmax(ms)),
                    "mean_evaluations": float(s["evaluations"].mean()),
                    "max_evaluations": int(s["evaluations"].max()),
                }
            )
        return pd.DataFrame(out).set_index("algorithm")

    def metrics(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``gbe_<profile>`` is BandPilot's mean GBE (fraction)."""
        out: dict[str, float] = {}
        g = self.gbe_table() / 100.0
        lo = self.loss_table()
        for p in self.profiles:
            for a in g.index:
                v = g.loc[a, p]
                if not math.isnan(v):
                    out[f"gbe_{p}" if a == "bandpilot" else f"gbe_{p}_{a}"] = float(v)
                lv = lo.loc[a, p]
                if not math.isnan(lv):
                    out[f"loss_{p}" if a == "bandpilot" else f"loss_{p}_{a}"] = float(lv)
            if "bandpilot" in g.index and "ideal" in g.index:
                out[f"gbe_gap_ideal_{p}"] = float(g.loc["ideal", p] - g.loc["bandpilot", p])
        lat = self.latency_table()
        for a in lat.index:
            suffix = "" if a == "bandpilot" else f"_{a}"
            out[f"search_ms_mean{suffix}"] = float(lat.loc[a, "mean_ms"])
            out[f"search_ms_p95{suffix}"] = float(lat.loc[a, "p95_ms"])
            out[f"evaluations_mean{suffix}"] = float(lat.loc[a, "mean_evaluations"])
        if "bandpilot" in self.algorithms:
            out["gbe_mean"] = float(np.nanmean([g.loc["bandpilot", p] for p in self.profiles]))
        refs = self.reference_counts()
        total = max(sum(refs.values()), 1)
        out["reference_exact_fraction"] = (refs.get("exact", 0) + refs.get("k=1", 0)) / total
        out["n_scenarios"] = float(self.n_scenarios)
        out["evaluation_seconds"] = float(self.elapsed_s)
        out["evaluation_cpu_seconds"] = float(self.cpu_s)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "fingerprint": self.fingerprint,
            "model_uri": self.model_uri,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "truth": self.truth,
            "profiles": list(self.profiles),
            "algorithms": list(self.algorithms),
            "repeats": self.repeats,
            "seed": self.seed,
            "scenarios": self.n_scenarios,
            "ks": sorted({s.k for s in self.scenarios}),
            "references": self.reference_counts(),
            "elapsed_s": round(self.elapsed_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "workers": self.workers,
            "notes": self.notes,
            "gbe": {p: self.gbe(p) for p in self.profiles} if "bandpilot" in self.algorithms else {},
        }

    # -- outputs -----------------------------------------------------------------------------
    def write(self, out_dir: str | Path, *, figures: bool = True) -> Path:
        """Report directory: Markdown, CSV tables, scenarios.jsonl, figures, evaluation.json."""
        return write_report(self, out_dir, figures=figures)

    def log_to_mlflow(self, run_id: str | None = None, *, artifact_path: str | None = None,
                      experiment: str = "bandpilot-evaluation") -> str:
        return log_to_mlflow(self, run_id, artifact_path=artifact_path, experiment=experiment)


def rebase(results: Sequence[EvaluationResult]) -> None:
    """Share one reference across results on the SAME scenarios (in place).

    Exact references are identical already; best-found references become the max over every
    result's allocations, so no side is scored against a weaker reference than the other.
    """
    import pandas as pd

    if len(results) < 2:
        return
    keys = ["scenario", "profile"]
    allrows = pd.concat([r.rows[keys + ["b_tau", "best_gbps"]] for r in results])
    best = allrows.groupby(keys).agg(top=("b_tau", "max"), ref=("best_gbps", "max")).reset_index()
    best["best"] = np.maximum(best["top"], best["ref"])
    for r in results:
        f = r.rows.drop(columns=["best_gbps"]).merge(best[keys + ["best"]], on=keys, how="left")
        f = f.rename(columns={"best": "best_gbps"})
        bf = f["reference"] == "best-found"
        f.loc[bf, "gbe"] = np.where(f.loc[bf, "best_gbps"] > 0, f.loc[bf, "b_tau"] / f.loc[bf, "best_gbps"], 1.0)
        keep = ~bf
        f.loc[keep, "best_gbps"] = r.rows.loc[keep.values, "best_gbps"].values
        r.rows = f


def merge_results(results: Sequence[EvaluationResult]) -> EvaluationResult:
    """One result from evaluations of disjoint scenario subsets (e.g. k-chunks run as separate
    Prefect/Dask tasks) of the same model, truth, profiles and seed."""
    import pandas as pd

    if not results:
        raise EvaluationError("nothing to merge: no evaluation results")
    first = results[0]
    for r in results[1:]:
        same = (r.cluster, r.fingerprint, r.profiles, r.algorithms, r.seed, r.repeats, r.truth)
        if same != (first.cluster, first.fingerprint, first.profiles, first.algorithms, first.seed, first.repeats, first.truth):
            raise EvaluationError("cannot merge evaluations of different models, truths or settings")
    # Scenario ids are per-run counters; (k, repeat) is the identity (the seed derives from it).
    keys = [(sc.k, sc.repeat) for r in results for sc in r.scenarios]
    if len(keys) != len(set(keys)):
        raise EvaluationError("cannot merge evaluations that share scenarios")
    new_id = {key: i for i, key in enumerate(sorted(keys))}
    frames: list[Any] = []  # pandas.DataFrame
    scen: list[Scenario] = []
    for r in results:
        remap = {sc.id: new_id[(sc.k, sc.repeat)] for sc in r.scenarios}
        f = r.rows.copy()
        f["scenario"] = f["scenario"].map(remap)
        frames.append(f)
        scen.extend(dataclasses.replace(sc, id=remap[sc.id]) for sc in r.scenarios)
    scen.sort(key=lambda sc: sc.id)
    return EvaluationResult(
        cluster=first.cluster, fingerprint=first.fingerprint, model_uri=first.model_uri,
        model_name=first.model_name, model_version=first.model_version, truth=first.truth,
        profiles=first.profiles, algorithms=first.algorithms, repeats=first.repeats, seed=first.seed,
        scenarios=scen, rows=pd.concat(frames, ignore_index=True),
        elapsed_s=max(r.elapsed_s for r in results), workers=sum(r.workers for r in results),
        notes=sorted({n for r in results for n in r.notes}), cpu_s=sum(r.cpu_s for r in results),
    )
