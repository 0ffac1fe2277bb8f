"""Issue 11: the prior learned from the data, the production fit on every measurement with
pattern-grouped cross-validated metrics, physical-truth cluster sources, the gate's CV MAPE."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.data.dataset import Dataset
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.model.crossval import fit, holdout_patterns, pattern_folds
from bandpilot.model.datamodule import cross_pool
from bandpilot.model.train import train
from bandpilot.topology.cluster import load_cluster

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 30, "layers": 1, "hidden": 16, "heads": 2, "n_train": 150, "threads": 1, "replay_size": 32,
        "split": "random"}


@pytest.fixture(scope="module")
def het_ds() -> Dataset:
    return fabric_dataset(EmulatorFabric(load_cluster(ROOT / "params/clusters/het4mix.yaml")), n_cross=260, seed=4)


def _declared(ds: Dataset, factor: float) -> Dataset:
    return Dataset(dataclasses.replace(ds.spec, nic_gbps=ds.spec.nic_gbps * factor), ds.frame, ds.path)


# ------------------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 30), min_size=12, max_size=200), st.integers(2, 6), st.integers(0, 99))
@settings(max_examples=60, deadline=None)
def test_pattern_folds_partition_rows_and_never_split_a_pattern(labels, k, seed):
    pattern = np.array([f"p{v}" for v in labels])
    if np.unique(pattern).size < k:
        with pytest.raises(DataError, match="cross-validation folds"):
            pattern_folds(pattern, k, seed)
        return
    folds = pattern_folds(pattern, k, seed)
    assert len(folds) == k and all(f.size for f in folds)
    rows = np.concatenate(folds)
    assert np.array_equal(np.sort(rows), np.arange(pattern.size))
    owner = {}
    for i, f in enumerate(folds):
        for p in set(pattern[f]):
            assert owner.setdefault(p, i) == i
    again = pattern_folds(pattern, k, seed)
    assert all(np.array_equal(a, b) for a, b in zip(folds, again))


def test_holdout_takes_whole_patterns():
    pattern = np.repeat([f"p{i}" for i in range(20)], 5)
    idx = holdout_patterns(pattern, 0.2, seed=1)
    held = set(pattern[idx])
    assert 0 < idx.size <= 20 and set(pattern[np.setdiff1d(np.arange(100), idx)]).isdisjoint(held)
    with pytest.raises(DataError, match="holdout"):
        holdout_patterns(np.array(["a", "a", "b"]), 0.5)


# ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_prior_fit_to_data_makes_declared_nic_speed_irrelevant(het_ds):
    """The NIC written 4x off: with the prior fit to the data the model predicts what it predicts with
    the right constant; trusting the declared constant (the first release) costs accuracy."""
    base = train(het_ds, TINY, plots=False)
    off = train(_declared(het_ds, 4.0), TINY, plots=False)
    masks = base.test["masks"]
    rel = np.abs(off.surrogate.predict_masks(masks) / base.surrogate.predict_masks(masks) - 1.0)
    assert rel.max() < 0.02, rel.max()
    assert abs(off.metrics["test_r2"] - base.metrics["test_r2"]) < 0.005
    assert off.data["prior"]["efficiency"] == pytest.approx(base.data["prior"]["efficiency"] / 4.0, rel=0.05)
    declared = train(_declared(het_ds, 4.0), {**TINY, "prior_fit": "declared", "resid_bound": 1.0}, plots=False)
    assert declared.metrics["test_mape"] > base.metrics["test_mape"] + 1.0


@pytest.mark.slow
def test_fit_uses_every_measurement_and_reports_cross_validation(het_ds, tmp_path):
    res = fit(het_ds, {**TINY, "folds": 4}, out_dir=tmp_path / "plots")
    pool = cross_pool(het_ds)
    m = res.metrics
    assert int(m["n_train"]) == len(pool) == int(m["n_test"])
    assert res.data["split"] == "all" and "4-fold" in res.data["metrics_from"]
    assert len(res.data["cv_folds"]) == 4 and sum(f["n"] for f in res.data["cv_folds"]) == len(pool)
    for i in range(4):
        assert f"cv_fold{i}_mape" in m
    assert m["test_mape"] == m["cv_mape"] and 0 < m["cv_mape"] < 20
    assert np.isfinite(res.test["yhat"]).all() and res.test["yhat"].size == len(pool)
    assert res.surrogate.meta["metrics"]["cv_mape"] == m["cv_mape"]
    assert (tmp_path / "plots").is_dir() and res.plots

    held = fit(het_ds, {**TINY, "folds": 3, "holdout": 0.2}, plots=False)
    n_test = int(held.metrics["n_test"])
    assert 0 < n_test < len(pool) and int(held.metrics["n_train"]) == len(pool) - n_test
    assert held.metrics["test_mape"] != held.metrics["cv_mape"]
    assert set(held.test["pattern"]).isdisjoint(set(pool.pattern) - set(held.test["pattern"]))


def test_fit_refuses_too_few_patterns(het_ds):
    f = het_ds.frame
    cross = f[f["n_hosts"] >= 2]
    key = cross["counts"].map(lambda c: tuple(sorted(int(x) for x in c if x)))
    common = key.value_counts().index[:3]  # the three most frequent count patterns only
    few = Dataset(het_ds.spec, pd_concat(f[f["n_hosts"] < 2], cross[key.isin(common)]))
    assert len(cross_pool(few)) >= 10
    with pytest.raises(DataError, match="cannot form 5 cross-validation folds"):
        fit(few, {**TINY, "folds": 5}, plots=False)


def pd_concat(*frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def test_training_params_are_validated():
    from bandpilot.model.params import TrainParams

    for bad in ({"prior_fit": "guess"}, {"resid_bound": 0}, {"folds": 1}, {"holdout": 0.95}):
        with pytest.raises(SpecError):
            TrainParams.from_dict(bad)


@pytest.mark.slow
def test_cli_train_fits_everything_and_bad_folds_register_nothing(het_ds, tmp_path, mlflow_uri, capsys, monkeypatch):
    import mlflow

    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))

    from bandpilot.cli.main import main
    from bandpilot.data.dataset import save_dataset

    d = tmp_path / "ds"
    save_dataset(het_ds, d)
    params = tmp_path / "train.yaml"
    params.write_text(yaml.safe_dump({"train": {**TINY, "epochs": 10}}))
    rc = main(["train", "--data", str(d), "--params", str(params), "--folds", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "3-fold pattern-grouped cross-validation" in out
    mv = mlflow.MlflowClient().get_model_version("bandpilot-het4mix", "1")
    run = mlflow.get_run(mv.run_id)
    assert {"cv_mape", "cv_fold0_mape", "cv_fold2_r2"} <= set(run.data.metrics)
    assert "metrics from the 3-fold" in mv.description
    # cross-validated figures are tagged as such, and the record names no checkout path
    assert {"cv_mape", "cv_r2"} <= set(mv.tags) and not any(k.startswith("test_") for k in mv.tags)
    assert "Cross-validated, out-of-fold" in mv.description and "Test (" not in mv.description
    assert str(tmp_path) not in mv.description and ", ds)" in mv.description
    assert run.data.tags["bandpilot.dataset_path"] == "ds"
    assert not any(k.startswith("test_") for k in run.data.metrics)  # the CV figures once, as cv_*

    rc = main(["train", "--data", str(d), "--params", str(params), "--folds", "100000"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and err.count("\n") == 1 and "folds" in err
    assert len(mlflow.MlflowClient().search_model_versions("name='bandpilot-het4mix'")) == 1


# ------------------------------------------------------------------------------------------
def test_cluster_sources_prefer_measurements_and_say_when_they_fall_back(tmp_path, monkeypatch):
    from flows._common import cluster_sources, truth_line

    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    (tmp_path / "params" / "clusters").mkdir(parents=True)
    for f in ("h100.yaml", "het4mix.yaml"):
        (tmp_path / "params" / "clusters" / f).write_text((ROOT / "params" / "clusters" / f).read_text())
    entries = yaml.safe_load((ROOT / "params" / "pipeline.yaml").read_text())["clusters"]
    src = cluster_sources(entries)
    assert [s.measured for s in src] == [False, False] and all(s.note and "not found" in s.note for s in src)
    line = truth_line(src)
    assert line.startswith("truth: EMULATED") and "not found: " in line and "h100-16m" in line

    meas = tmp_path / "meas"
    meas.mkdir()
    (meas / "cluster.yaml").write_text((ROOT / "params" / "clusters" / "h100.yaml").read_text())
    src = cluster_sources([{"measured": "meas", "fallback": "params/clusters/h100.yaml"}])
    assert src[0].path == "meas" and src[0].measured is False  # a directory of an emulator spec is not measurements
    with pytest.raises(SpecError, match=r"clusters\[0\]"):
        cluster_sources([{"measured": "nowhere"}])
    with pytest.raises(SpecError, match="non-empty list"):
        cluster_sources([])


def test_physical_measurements_are_sources_when_present(shared_data, tmp_path, monkeypatch):
    from flows._common import cluster_sources, truth_line

    monkeypatch.setenv("BANDPILOT_HOME", str(ROOT))
    entries = yaml.safe_load((ROOT / "params" / "pipeline.yaml").read_text())["clusters"]
    src = cluster_sources(entries)
    assert all(s.measured and s.note is None for s in src)
    assert truth_line(src).startswith("truth: measured tables")


# ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_pattern_memory_corrects_measured_patterns_only_and_survives_save(het_ds, tmp_path):
    from bandpilot.model.memory import MEMORY_FILE

    res = fit(het_ds, {**TINY, "folds": 3, "holdout": 0.3}, plots=False)
    sur = res.surrogate
    pool = cross_pool(het_ds)
    seen = ~np.isin(pool.pattern, res.test["pattern"])
    # keys are (GPU type, count) multisets: finer than count patterns on a heterogeneous cluster
    assert sur.memory is not None and len(sur.memory) == np.unique(sur.pattern_keys(pool.masks[seen])).size
    keep = sur.memory
    with_mem = sur.predict_masks(pool.masks)
    sur.memory = None
    model_only = sur.predict_masks(pool.masks)
    sur.memory = keep
    # held-out patterns: the model alone; measured ones: pulled to the measurements
    np.testing.assert_allclose(with_mem[~seen], model_only[~seen])
    err_mem = np.abs(np.log(with_mem[seen] / pool.busbw[seen]))
    err_model = np.abs(np.log(model_only[seen] / pool.busbw[seen]))
    assert np.median(err_mem) < np.median(err_model)
    keys = sur.pattern_keys(pool.masks)
    single = [i for i in np.flatnonzero(seen) if (keys[seen] == keys[i]).sum() == 1]
    assert single
    np.testing.assert_allclose(with_mem[single], pool.busbw[single], rtol=1e-6)
    # the holdout metrics are of patterns the memory never saw
    assert res.metrics["test_mape"] > 0

    sur.save(tmp_path / "m")
    assert (tmp_path / "m" / MEMORY_FILE).is_file()
    from bandpilot.model.surrogate import Surrogate

    back = Surrogate.load(tmp_path / "m")
    np.testing.assert_allclose(back.predict_masks(pool.masks), with_mem, rtol=1e-6)
    (tmp_path / "m" / MEMORY_FILE).write_bytes(b"not a zip")
    from bandpilot.errors import ModelError

    with pytest.raises(ModelError, match="pattern memory"):
        Surrogate.load(tmp_path / "m")


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_pattern_keys_ignore_host_order_within_a_type_and_gpu_choice(data):
    from bandpilot.model.memory import PatternMemory, pattern_keys

    gtype = np.array([0, 0, 1, 1])
    n = data.draw(st.integers(1, 20))
    masks = np.array(data.draw(st.lists(st.lists(st.integers(0, 255), min_size=4, max_size=4), min_size=n, max_size=n)))
    swapped = masks[:, [1, 0, 3, 2]]  # swap hosts of the same type
    assert np.array_equal(pattern_keys(masks, gtype, 8), pattern_keys(swapped, gtype, 8))
    shifted = masks.copy()
    shifted[:, 0] = (masks[:, 0] << 1) & 255 | (masks[:, 0] >> 7)  # rotate GPUs inside host 0: same count
    assert np.array_equal(pattern_keys(masks, gtype, 8), pattern_keys(shifted, gtype, 8))
    mem = PatternMemory.build(pattern_keys(masks[:1], gtype, 8), np.array([0.25]))
    corr = mem.correction(pattern_keys(masks, gtype, 8))
    same = pattern_keys(masks, gtype, 8) == pattern_keys(masks[:1], gtype, 8)[0]
    assert np.allclose(corr[same], 0.25) and np.allclose(corr[~same], 0.0)


@pytest.mark.slow
def test_host_speed_token_ranks_a_uniformly_slow_host_last():
    """An NVSwitch host that is uniformly 30 % slow: its stage 1 sits far above the network, so without a
    per-host speed token the model cannot tell which host of a count pattern to avoid."""
    import itertools

    from bandpilot.fabric.faults import Fault, FaultyFabric

    spec = load_cluster(ROOT / "params/clusters/h100.yaml")
    truth = FaultyFabric(EmulatorFabric(spec), [Fault("slow_host", "h100-2", factor=0.7)])
    ds = fabric_dataset(truth, n_cross=300, seed=5)
    # Same count pattern, once with the slow host and once on a healthy one: which is faster?
    combos = [c for c in itertools.product(range(9), repeat=4) if sum(x > 0 for x in c) >= 2 and c[2] and not c[3]]
    with_slow = np.array([[(1 << x) - 1 for x in c] for c in combos], dtype=np.int64)
    without = with_slow.copy()
    without[:, [2, 3]] = with_slow[:, [3, 2]]  # move host 2's GPUs to healthy host 3
    t_diff = np.log(truth.bandwidth_masks(without) / truth.bandwidth_masks(with_slow))
    hit = t_diff > 0.05
    agree = {}
    for on in (True, False):
        sur = fit(ds, {**TINY, "epochs": 60, "folds": 2, "host_speed": on}, plots=False).surrogate
        p_diff = np.log(sur.predict_masks(without[hit]) / sur.predict_masks(with_slow[hit]))
        agree[on] = float((p_diff > 0).mean())
    assert agree[True] >= 0.95 and agree[True] > agree[False], agree


def test_cli_train_checks_the_store_before_fitting(het_ds, tmp_path, capsys, monkeypatch):
    """An unusable tracking store fails before the fit (it failed after a 31-minute fit on 10,008
    GPUs, with nothing saved): no model directory, no plots, one-line error."""
    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    from bandpilot.cli.main import main
    from bandpilot.data.dataset import save_dataset

    d = save_dataset(het_ds, tmp_path / "ds")
    rc = main(["train", "--data", str(d), "--folds", "3", "-o", str(tmp_path / "out"),
               "--tracking-uri", f"file://{tmp_path / 'mlruns'}"])  # MLflow's file store takes no new runs
    err = capsys.readouterr().err
    assert rc != 0 and err.startswith("error:") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
