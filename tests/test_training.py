"""Sampling/splits, metrics, training end to end, bad data, Optuna sweep, fine-tuning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bandpilot.topology.cluster import load_cluster
from bandpilot.data.dataset import Dataset, load_dataset, save_dataset
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.model.datamodule import cross_pool, split_pool
from bandpilot.model.finetune import finetune
from bandpilot.model.metrics import evaluate_predictions
from bandpilot.model.params import TrainParams
from bandpilot.model.sweep import sweep
from bandpilot.model.train import train

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 8, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 40, "n_train": 120, "threads": 1,
        "replay_size": 64}


@pytest.fixture(scope="module")
def het():
    return EmulatorFabric(load_cluster(ROOT / "params/clusters/het4mix.yaml"))


@pytest.fixture(scope="module")
def ds(het, tmp_path_factory):
    d = tmp_path_factory.mktemp("het") / "ds"
    save_dataset(fabric_dataset(het, n_cross=300, seed=1), d)
    return load_dataset(d)


@pytest.fixture
def mlflow_env(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    return uri


@pytest.mark.parametrize("split", ["random", "stratified", "pattern"])
def test_splits_are_disjoint_and_cross_host(ds, split):
    pool = cross_pool(ds)
    p = TrainParams.from_dict({"split": split, "n_train": 100})
    tr, te = split_pool(pool, p)
    assert len(tr) == 100 and len(te) > 0
    assert not set(pool.gpus[tr]) & set(pool.gpus[te])
    assert (pool.n_hosts[te] >= 2).all()
    if split == "pattern":
        assert not set(pool.pattern[tr]) & set(pool.pattern[te])
    tr2, te2 = split_pool(pool, p)
    np.testing.assert_array_equal(tr, tr2)  # deterministic per seed


def test_stratified_covers_patterns(ds):
    pool = cross_pool(ds)
    tr, _ = split_pool(pool, TrainParams.from_dict({"split": "stratified", "n_train": 100}))
    n_pat = len(set(pool.pattern))
    assert len(set(pool.pattern[tr])) == min(100, n_pat)


def test_explicit_split(het, ds):
    extra = fabric_dataset(het, n_cross=40, seed=9)
    res = train(ds, {**TINY, "split": "explicit"}, explicit=extra, plots=False)
    assert res.metrics["n_train"] == len(cross_pool(extra))
    test_keys = {",".join(het.spec.from_mask(m)) for m in res.test["masks"]}
    assert not test_keys & set(cross_pool(extra).gpus)


def test_evaluate_predictions():
    y = np.array([10.0, 20.0, 40.0, 80.0])
    ev = evaluate_predictions(y, y * 1.1, np.array(["1+1", "1+1", "2+2", "4+4"]), np.array([2, 2, 2, 3]))
    assert ev["mape"] == pytest.approx(10.0)
    assert ev["spearman"] == pytest.approx(1.0)
    assert ev["max_err"] == pytest.approx(8.0)
    assert ev["by_hosts"][2]["n"] == 3 and ev["by_pattern"]["1+1"]["mape"] == pytest.approx(10.0)
    assert evaluate_predictions(y, y)["r2"] == 1.0


def test_train_end_to_end_with_plots(ds, tmp_path):
    res = train(ds, {**TINY, "split": "pattern"}, out_dir=tmp_path / "plots")
    m = res.metrics
    for k in ("test_r2", "test_mape", "test_max_err", "test_spearman", "n_train", "n_test", "train_seconds"):
        assert k in m and np.isfinite(m[k])
    assert m["test_mape"] < 30  # 8 epochs of a tiny net: the physics prior does most of the work
    assert len(res.history) == 8 and "train_loss" in res.history[0]
    for p in res.plots.values():
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert res.data["dataset_hash"] and len(res.data["dataset_hash"]) >= 16
    assert res.data["test_patterns"] > 0 and res.surrogate.meta["metrics"] == m


def test_training_is_deterministic(ds):
    a = train(ds, {**TINY, "epochs": 3}, plots=False)
    b = train(ds, {**TINY, "epochs": 3}, plots=False)
    np.testing.assert_array_equal(a.test["yhat"], b.test["yhat"])


def _with_frame(ds: Dataset, frame: pd.DataFrame) -> Dataset:
    return Dataset(ds.spec, frame.reset_index(drop=True), ds.path)


def test_bad_data(ds):
    f = ds.frame
    with pytest.raises(DataError, match="empty"):
        train(_with_frame(ds, f.iloc[:0]), TINY)
    tiny = pd.concat([f[f["n_hosts"] == 1], f[f["n_hosts"] >= 2].iloc[:5]])
    with pytest.raises(DataError, match="at least"):
        train(_with_frame(ds, tiny), TINY)
    nan = f.copy()
    nan.loc[nan.index[-1], "busbw"] = np.nan
    with pytest.raises(DataError, match="NaN or negative"):
        train(_with_frame(ds, nan), TINY)
    neg = f.copy()
    neg.loc[neg.index[-1], "busbw"] = -3.0
    with pytest.raises(DataError, match="NaN or negative"):
        train(_with_frame(ds, neg), TINY)
    other = f.copy()
    other.loc[other.index[0], "cluster"] = "h100"
    with pytest.raises(DataError, match="h100"):
        train(_with_frame(ds, other), TINY)
    no_stage1 = f[f["n_hosts"] >= 2]
    with pytest.raises(DataError, match="intra-host subsets"):
        train(_with_frame(ds, no_stage1), TINY)
    with pytest.raises(SpecError):
        TrainParams.from_dict({"split": "bogus"})
    with pytest.raises(SpecError):
        TrainParams.from_dict({"no_such_param": 1})


def test_finetune_reduces_error_on_shifted_data(het, ds):
    base = train(ds, {**TINY, "epochs": 15}, plots=False).surrogate
    # The network got 20 % slower: new measurements of fresh allocations.
    new = fabric_dataset(het, n_cross=120, seed=5)
    f = new.frame.copy()
    cross = f["n_hosts"] >= 2
    f.loc[cross, "busbw"] *= 0.8
    res = finetune(base, Dataset(het.spec, f), {**TINY, "finetune_epochs": 30, "finetune_lr": 3e-3})
    m = res.metrics
    assert m["test_mape"] < m["test_mape_before"]
    assert "replay_mape_after" in m and m["n_replay"] > 0
    assert res.surrogate.replay is not None
    h100 = fabric_dataset(EmulatorFabric(load_cluster(ROOT / "params/clusters/h100.yaml")), n_cross=20)
    with pytest.raises(DataError, match="cluster"):
        finetune(base, h100, TINY)


@pytest.mark.slow
def test_sweep_two_trials_sqlite(ds, tmp_path, mlflow_env):
    import mlflow

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    res = sweep(ds, {**TINY, "epochs": 4}, n_trials=2, storage=storage, study_name="t",
                space={"lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}})
    assert res.n_trials == 2 and res.parent_run_id
    assert (tmp_path / "optuna.db").is_file()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res.parent_run_id]
    assert len(children) == 2
    assert all("epoch_train_loss" in r.data.metrics for r in children)
    assert res.result.surrogate.meta["sweep"]["best_trial"] in (0, 1)
    # A resumed study keeps counting trials.
    res2 = sweep(ds, {**TINY, "epochs": 4}, n_trials=1, storage=storage, study_name="t", log_mlflow=False,
                 space={"lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}})
    assert res2.n_trials == 3


def test_validation_callbacks_keep_the_best_state_and_stop_early(ds):
    """Lightning's validation loop feeds KeepBest and EarlyStopping: the fit stops `patience` epochs
    after its best validation MAPE and ends with that epoch's weights."""
    import optuna

    from bandpilot.model.datamodule import val_split

    p = {**TINY, "epochs": 40, "val_fraction": 0.25, "patience": 2, "lr": 0.03}
    res = train(ds, p, plots=False)
    vals = [row["val_mape"] for row in res.history]
    best = int(np.argmin(vals))
    assert len(vals) == best + 3 < 40  # stopped early, 2 epochs after the best
    assert res.metrics["val_mape"] == min(vals)
    # the returned net is the best epoch's: its validation MAPE, recomputed, is the best one
    import torch

    from bandpilot.model.tokens import to_torch

    pool = cross_pool(ds)
    tp = TrainParams.from_dict(p)
    tr, _ = split_pool(pool, tp)
    _, va = val_split(pool, tr, tp)
    with torch.no_grad():
        pv = torch.exp(res.surrogate.net(to_torch(res.surrogate.tokens(pool.masks[va])))).double().numpy()
    y = pool.busbw[va]
    assert abs(float(np.mean(np.abs(pv - y) / y) * 100) - min(vals)) < 1e-9
    # an Optuna trial that prunes at once stops the fit after its first validation
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1e-9))
    pruned = train(ds, {**p, "patience": 0}, trial=study.ask(), plots=False)
    assert len(pruned.history) == 1 and pruned.pruned
