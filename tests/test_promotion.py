"""Promotion gate on a real MLflow registry (temp SQLite store per test).

Models are tiny untrained-head surrogates on the embedded Het-4Mix cluster (the physics prior alone
dispatches near-optimally); a "bad" one carries corrupted stage-1 tables (wrong intra-host lookups,
as from a botched profile), which costs ~15 GBE points there. Scenario sets are small (a few
request sizes, one repeat) to keep the file fast.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bandpilot.errors import BandPilotError, ModelError, SpecError
from bandpilot.evaluation.truth import resolve_cluster
from bandpilot.fabric.emulator import make_fabric
from bandpilot.evaluation.decision import PromotionError, PromotionPolicy, Side, apply_policy
from bandpilot.evaluation.gate import approve, promote

NAME = "bandpilot-het4mix"
FAST = dict(repeats=1, ks=[1, 2, 5, 12, 24], workers=1, figures=False, algorithms=("bandpilot",))


@pytest.fixture(scope="module")
def het():
    return make_fabric(resolve_cluster("het4mix"))


def _surrogate(fabric, stage1=None):
    import torch

    from bandpilot.model.net_kinds import build_net
    from bandpilot.model.surrogate import Surrogate

    torch.manual_seed(0)
    net = build_net("hierarchical", fabric.spec, layers=1, hidden=8, heads=2, head_layers=1)
    with torch.no_grad():
        for p in net.head.parameters():
            p.zero_()
    return Surrogate(fabric.spec, fabric.stage1 if stage1 is None else stage1, net)


def _bad_stage1(fabric):
    return fabric.stage1 * np.random.default_rng(0).uniform(0.2, 5.0, size=fabric.stage1.shape)


def _register(sur) -> str:
    from bandpilot.model import registry
    from bandpilot.model.params import TrainParams
    from bandpilot.model.result import TrainResult

    res = TrainResult(surrogate=sur, metrics={"test_mape": 1.0}, details={}, history=[], plots={},
                      params=TrainParams(), data={"cluster": sur.spec.name, "split": "test"}, train_seconds=0.0)
    return str(registry.log_and_register(res).version)


@pytest.fixture(scope="module")
def _template_db(tmp_path_factory):
    """An empty, migrated MLflow SQLite store, created once (migrations take seconds)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}", registry_uri=f"sqlite:///{db}")
    client.search_experiments()
    client.search_registered_models()
    return db


@pytest.fixture
def reg(_template_db, tmp_path, monkeypatch):
    """A fresh registry per test: a copy of the template store, selected via MLFLOW_TRACKING_URI."""
    import shutil

    from bandpilot.model import registry

    db = tmp_path / "mlflow.db"
    shutil.copy(_template_db, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    registry.tracking_setup(uri)
    yield registry


def _version(name: str, version: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient().get_model_version(name, version)


# ------------------------------------------------------------------------------------------
def test_policy_file_and_validation(tmp_path):
    pol = PromotionPolicy.load()  # params/promotion.yaml
    assert set(pol.min_gbe) == {"idle", "moderate", "heavy"} and 0 < pol.tolerance < 1
    assert pol.repeats >= 1 and pol.max_mape is not None
    assert PromotionPolicy.from_dict({"min_gbe": 0.9}).min_gbe["heavy"] == 0.9
    for bad, match in [({"min_gbe": {"stormy": 0.9}}, "unknown profile"), ({"min_gbe": 1.5}, "fraction"),
                       ({"tolerance": 5}, "fraction"), ({"max_mape": -1}, "non-negative"),
                       ({"nope": 1}, "unknown keys"), ({"evaluation": {"repeats": 0}}, "positive")]:
        with pytest.raises(SpecError, match=match):
            PromotionPolicy.from_dict(bad)
    with pytest.raises(SpecError, match="not found"):
        PromotionPolicy.load(tmp_path / "missing.yaml")


def test_apply_policy_checks():
    pol = PromotionPolicy.from_dict({"min_gbe": 0.9, "max_mape": 5.0, "tolerance": 0.01})
    profs = ("idle", "heavy")
    cand = Side("2", None, {"idle": 0.97, "heavy": 0.95}, mape=4.0)
    assert all(c.passed for c in apply_policy(pol, cand, None, profs))
    champ = Side("1", None, {"idle": 0.975, "heavy": 0.97}, mape=3.0)
    checks = apply_policy(pol, cand, champ, profs)
    failed = [c.name for c in checks if not c.passed]
    assert failed == ["vs_champion_heavy"]  # idle is within the 1-point tolerance, heavy 2 points worse
    worse = Side("3", None, {"idle": 0.85, "heavy": 0.95}, mape=6.0)
    failed = {c.name for c in apply_policy(pol, worse, None, profs) if not c.passed}
    assert failed == {"min_gbe_idle", "max_mape"}


def test_champion_relative_check_allows_only_the_measured_noise():
    pol = PromotionPolicy.from_dict({"min_gbe": 0.9, "tolerance": 0.01, "noise_z": 2, "mape_tolerance": 1.0})
    champ = Side("1", None, {"idle": 0.999, "heavy": 0.998}, mape=5.0)
    cand = Side("2", None, {"idle": 0.994, "heavy": 0.998}, mape=5.4)
    # within the old fixed 1-point tolerance, but 25 standard errors behind on idle: fails
    checks = {c.name: c for c in apply_policy(pol, cand, champ, ("idle", "heavy"), {"idle": 0.0002, "heavy": 0.0, "mape": 0.1})}
    assert not checks["vs_champion_idle"].passed and "noise SE" in checks["vs_champion_idle"].detail
    assert abs(checks["vs_champion_idle"].threshold - (0.999 - 0.0004)) < 1e-12
    assert checks["vs_champion_heavy"].passed  # identical selections: no noise, no drop, passes
    assert not checks["mape_vs_champion"].passed  # +0.4 pts > 2 x 0.1
    # noisy comparison (few scenarios): the allowed drop is capped by the tolerance
    checks = {c.name: c for c in apply_policy(pol, cand, champ, ("idle",), {"idle": 0.05, "mape": 1.0})}
    assert checks["vs_champion_idle"].passed and abs(checks["vs_champion_idle"].threshold - 0.989) < 1e-12
    assert checks["mape_vs_champion"].passed
    assert PromotionPolicy().min_gbe["idle"] >= 0.98 and PromotionPolicy.load().noise_z > 0
    with pytest.raises(SpecError, match="noise_z"):
        PromotionPolicy.from_dict({"noise_z": -1})


@pytest.mark.slow
def test_registry_records_are_portable_and_not_duplicated(reg, het, tmp_path, monkeypatch):
    from flows.retrain import gate_task

    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    v1 = _register(_surrogate(het))
    promote(f"models:/{NAME}/{v1}", out_dir=tmp_path / "reports" / "p1", **FAST)
    v2 = _register(_surrogate(het))
    dec = promote(f"models:/{NAME}/{v2}", out_dir=tmp_path / "reports" / "p2", **FAST)
    assert dec.passed and set(dec.noise) == {"idle", "moderate", "heavy"}  # paired SE, recorded
    assert json.loads((tmp_path / "reports" / "p2" / "decision.json").read_text())["noise"] == dec.noise
    mv = _version(NAME, v2)
    assert mv.tags["bandpilot.promotion.report_dir"] == "reports/p2"
    assert str(tmp_path) not in mv.description and "`reports/p2`" in mv.description
    assert f"runs:/{mv.run_id}/promotion/p2" in mv.description
    assert not any(str(tmp_path) in v for v in mv.tags.values())
    # the retrain flow reuses the gate's own decision and writes no second copy of it
    got = gate_task.fn(NAME, v2, None, "params/promotion.yaml", {}, "reports/x")
    assert got == {"action": "promoted", "reused": True, "passed": True}
    tags = _version(NAME, v2).tags
    assert tags["bandpilot.promotion.passed"] == "true" and not any(k.startswith("promotion.") for k in tags)
    assert not (tmp_path / "reports" / "x").exists()


@pytest.mark.slow
def test_first_candidate_becomes_champion_then_worse_one_is_challenger(reg, het, tmp_path):
    v1 = _register(_surrogate(het))
    dec = promote(f"models:/{NAME}/{v1}", out_dir=tmp_path / "p1", **{**FAST, "figures": True, "algorithms": None})
    assert dec.passed and dec.action == "promoted" and dec.champion is None
    assert reg.get_alias(NAME, "champion") == v1 and reg.get_alias(NAME, "previous") is None
    assert min(dec.candidate.gbe.values()) > 0.95
    mv = _version(NAME, v1)
    assert "PASS" in mv.description and "first champion" in mv.description
    assert mv.tags["bandpilot.promotion.passed"] == "true"
    assert mv.tags["bandpilot.promotion.report_dir"] == str(tmp_path / "p1")  # outside the project: as given
    out = tmp_path / "p1"
    doc = json.loads((out / "decision.json").read_text())
    assert doc["action"] == "promoted" and doc["aliases"] == {"champion": v1}
    assert (out / "promotion.md").is_file() and (out / "candidate" / "report.md").is_file()
    assert (out / "comparison_gbe_vs_k.png").is_file() and (out / "candidate" / "figures" / "fig6_gbe_vs_k.png").is_file()
    # everything is on the version's run in MLflow
    import mlflow

    run = mlflow.get_run(mv.run_id)
    assert 0.95 < run.data.metrics["gbe_heavy"] <= 1 and run.data.metrics["promotion_passed"] == 1.0
    arts = [a.path for a in mlflow.artifacts.list_artifacts(run_id=mv.run_id, artifact_path=f"promotion/{out.name}")]
    assert any(p.endswith("decision.json") for p in arts)

    # a worse candidate: fails against the champion on the SAME scenarios, becomes challenger
    v2 = _register(_surrogate(het, _bad_stage1(het)))
    dec2 = promote(f"models:/{NAME}/{v2}", out_dir=tmp_path / "p2", **FAST)
    assert not dec2.passed and dec2.action == "challenger"
    assert dec2.champion is not None and dec2.champion.version == v1
    assert any("vs champion" in r for r in dec2.reasons) and any("minimum" in r for r in dec2.reasons)
    assert reg.get_alias(NAME, "champion") == v1 and reg.get_alias(NAME, "challenger") == v2
    mv2 = _version(NAME, v2)
    assert "FAIL" in mv2.description and f"champion v{v1}" in mv2.description
    assert mv2.tags["bandpilot.promotion.passed"] == "false" and mv2.tags["bandpilot.promotion.champion_version"] == v1
    assert float(mv2.tags["bandpilot.promotion.champion_gbe_heavy"]) > float(mv2.tags["bandpilot.promotion.gbe_heavy"])
    cand = json.loads((tmp_path / "p2" / "decision.json").read_text())
    assert cand["scenarios"] == dec.scenarios  # same scenario set on both sides
    assert (tmp_path / "p2" / "champion" / "report.md").is_file()

    # an equally good candidate passes: champion moves, the old one becomes 'previous'
    v3 = _register(_surrogate(het))
    dec3 = promote(f"models:/{NAME}/{v3}", out_dir=tmp_path / "p3", **FAST)
    assert dec3.passed and dec3.action == "promoted" and dec3.aliases == {"champion": v3, "previous": v1}
    assert reg.get_alias(NAME, "champion") == v3 and reg.get_alias(NAME, "previous") == v1
    assert reg.get_alias(NAME, "challenger") == v2
    with pytest.raises(PromotionError, match="already 'champion'"):
        promote(f"models:/{NAME}@champion", out_dir=tmp_path / "p4", **FAST)


@pytest.mark.slow
def test_manual_gate_and_approval(reg, het, tmp_path):
    v1 = _register(_surrogate(het))
    dec = promote(f"models:/{NAME}/{v1}", manual=True, out_dir=tmp_path / "m1", **FAST)
    assert dec.passed and dec.action == "awaiting_approval"
    assert reg.get_alias(NAME, "champion") is None and reg.get_alias(NAME, "challenger") == v1
    assert "awaiting approval" in _version(NAME, v1).description
    got = approve(NAME, v1, approver="alice")
    assert got["previous"] is None and reg.get_alias(NAME, "champion") == v1
    assert reg.get_alias(NAME, "challenger") is None
    mv = _version(NAME, v1)
    assert mv.tags["bandpilot.promotion.approved_by"] == "alice" and "Approved by alice" in mv.description

    v2 = _register(_surrogate(het, _bad_stage1(het)))
    promote(f"models:/{NAME}/{v2}", manual=True, out_dir=tmp_path / "m2", **FAST)
    assert reg.get_alias(NAME, "challenger") == v2 and reg.get_alias(NAME, "champion") == v1
    with pytest.raises(PromotionError, match="failed the gate"):
        approve(NAME, v2)
    v3 = _register(_surrogate(het))
    with pytest.raises(PromotionError, match="has not been through the gate"):
        approve(NAME, v3)
    assert reg.get_alias(NAME, "champion") == v1
    got = approve(NAME, v2, force=True, approver="bob")
    assert got["forced"] and reg.get_alias(NAME, "champion") == v2 and reg.get_alias(NAME, "previous") == v1
    with pytest.raises(ModelError):
        approve(NAME, "42")


@pytest.mark.slow
def test_bad_input_and_crashes_move_no_alias(reg, het, tmp_path, monkeypatch):
    import bandpilot.evaluation.runner as ev

    v1 = _register(_surrogate(het))
    promote(f"models:/{NAME}/{v1}", out_dir=tmp_path / "ok", **FAST)
    v2 = _register(_surrogate(het))
    before = {a: reg.get_alias(NAME, a) for a in ("champion", "challenger", "previous")}
    desc = _version(NAME, v2).description

    with pytest.raises(ModelError, match="no version"):
        promote(f"models:/{NAME}/99", out_dir=tmp_path / "x1", **FAST)
    with pytest.raises(ModelError, match="no registered model"):
        promote("models:/bandpilot-nope/1", out_dir=tmp_path / "x2", **FAST)
    with pytest.raises(ModelError, match="does not match the model's cluster"):
        promote(f"models:/{NAME}/{v2}", cluster="h100", out_dir=tmp_path / "x3", **FAST)
    with pytest.raises(BandPilotError, match="zero scenarios"):
        promote(f"models:/{NAME}/{v2}", out_dir=tmp_path / "x4", **{**FAST, "repeats": 0})
    with pytest.raises(PromotionError, match="not a registered model version"):
        promote(str(tmp_path), out_dir=tmp_path / "x5", **FAST)
    # a holdout dataset of another cluster
    from bandpilot.data.dataset import Dataset, frame_from_masks, save_dataset

    h100 = make_fabric(resolve_cluster("h100"))
    masks = np.array([[3, 3, 0, 0], [15, 1, 0, 0]], dtype=np.int64)
    frame = frame_from_masks(h100.spec, masks, h100.bandwidth_masks(masks), collective="all_gather_perf",
                             bytes_=1 << 24, source="test")
    save_dataset(Dataset(h100.spec, frame), tmp_path / "h100-holdout")
    with pytest.raises(ModelError, match="held-out dataset"):
        promote(f"models:/{NAME}/{v2}", holdout=tmp_path / "h100-holdout", out_dir=tmp_path / "x6", **FAST)

    # a crash mid-evaluation (after the candidate was loaded and half the scenarios ran)
    real = ev.evaluate_scenario
    calls = {"n": 0}

    def flaky(ctx, sc):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("worker died")
        return real(ctx, sc)

    monkeypatch.setattr(ev, "evaluate_scenario", flaky)
    with pytest.raises(RuntimeError, match="worker died"):
        promote(f"models:/{NAME}/{v2}", out_dir=tmp_path / "x7", **FAST)
    monkeypatch.setattr(ev, "evaluate_scenario", real)
    assert {a: reg.get_alias(NAME, a) for a in ("champion", "challenger", "previous")} == before
    assert _version(NAME, v2).description == desc
    assert "bandpilot.promotion.passed" not in _version(NAME, v2).tags


@pytest.mark.slow
def test_holdout_mape_check(reg, het, tmp_path):
    from bandpilot.data.dataset import Dataset, frame_from_masks, save_dataset
    from bandpilot.data.planning import plan

    pl = [m for m in plan(het.spec, cross_host_samples=60, seed=3, intra=False)]
    masks = np.array([m.masks for m in pl], dtype=np.int64)
    frame = frame_from_masks(het.spec, masks, het.measure(masks, seed=9), collective="all_gather_perf",
                             bytes_=1 << 24, source="test")
    save_dataset(Dataset(het.spec, frame), tmp_path / "holdout")
    v1 = _register(_surrogate(het))
    dec = promote(f"models:/{NAME}/{v1}", holdout=tmp_path / "holdout", policy={"max_mape": 0.01, "min_gbe": 0.5},
                  out_dir=tmp_path / "h1", **FAST)
    assert dec.candidate.mape is not None and dec.candidate.mape > 0.01
    assert not dec.passed and [c.name for c in dec.checks if not c.passed] == ["max_mape"]
    assert reg.get_alias(NAME, "challenger") == v1 and reg.get_alias(NAME, "champion") is None
    assert "held-out MAPE" in _version(NAME, v1).description
    assert dec.candidate.holdout["rows"] == "cross-host" and dec.candidate.holdout["n"] == len(pl)


@pytest.mark.slow
def test_cli_promote_and_approve(reg, het, tmp_path, capsys):
    from bandpilot.cli.main import main

    v1 = _register(_surrogate(het))
    args = ["promote", "--candidate", f"models:/{NAME}/{v1}", "--repeats", "1", "--ks", "1,3,9", "--workers", "1",
            "--no-progress", "--profiles", "idle,heavy", "--algorithms", "bandpilot"]
    assert main(args + ["--manual", "--out", str(tmp_path / "c1")]) == 0
    assert "awaiting approval" in capsys.readouterr().out
    assert reg.get_alias(NAME, "challenger") == v1
    assert main(["promote", "--approve", v1]) == 2
    assert "--name" in capsys.readouterr().err
    assert main(["promote", "--approve", v1, "--name", NAME]) == 0
    assert "is now 'champion'" in capsys.readouterr().out and reg.get_alias(NAME, "champion") == v1
    v2 = _register(_surrogate(het, _bad_stage1(het)))
    from typer.testing import CliRunner

    from bandpilot.cli.main import app

    got = CliRunner().invoke(app, ["promote", "--candidate", f"models:/{NAME}/{v2}", "--repeats", "1", "--ks", "2,5,12",
                                   "--workers", "1", "--no-progress", "--algorithms", "bandpilot",
                                   "--out", str(tmp_path / "c2")])
    assert got.exit_code == 1, got.output  # gate failed: challenger, non-zero exit for CI
    assert "FAIL" in got.output and reg.get_alias(NAME, "challenger") == v2
    assert main(["promote", "--candidate", "models:/bandpilot-het4mix/77", "--repeats", "1"]) == 2
    assert "no version" in capsys.readouterr().err
