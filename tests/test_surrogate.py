"""Surrogate inference: stage-1 exactness, permutation invariance, padding, save/load, bad input."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bandpilot.topology.cluster import load_cluster
from bandpilot.errors import BandPilotError, ModelError
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.data.synthetic import fabric_dataset, random_cross_masks
from bandpilot.model.net_kinds import build_net
from bandpilot.model.surrogate import Surrogate
from bandpilot.model.tokens import host_arrays, host_tokens, to_torch
from bandpilot.model.train import train

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 8, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 40, "n_train": 120, "threads": 1,
        "split": "random", "replay_size": 64}


@pytest.fixture(scope="module")
def het():
    spec = load_cluster(ROOT / "params/clusters/het4mix.yaml")
    return EmulatorFabric(spec)


@pytest.fixture(scope="module")
def trained(het):
    ds = fabric_dataset(het, n_cross=200, seed=1)
    return train(ds, TINY, plots=False)


def test_single_host_is_stage1_and_small_is_zero(trained, het):
    sur = trained.surrogate
    spec = het.spec
    masks = np.zeros((4, spec.n_hosts), dtype=np.int64)
    masks[0, 1] = 0b1011  # 3 GPUs on host 1
    masks[1, 3] = 0b11
    masks[2, 0] = 0b1  # one GPU -> 0
    # masks[3] empty -> 0
    out = sur.predict_masks(masks)
    assert out[0] == het.stage1[1, 0b1011]
    assert out[1] == het.stage1[3, 0b11]
    assert out[2] == 0.0 and out[3] == 0.0
    cross = random_cross_masks(spec, 50, seed=3)
    pred = sur.predict_masks(cross)
    assert np.all(np.isfinite(pred)) and np.all(pred > 0)


def test_predict_matches_predict_masks(trained, het):
    sur = trained.surrogate
    cross = random_cross_masks(het.spec, 20, seed=4)
    allocs = [het.spec.from_mask(m) for m in cross]
    np.testing.assert_array_equal(sur.predict(allocs), sur.predict_masks(cross))


def test_batching_and_padding_do_not_change_predictions(trained, het, monkeypatch):
    sur = trained.surrogate
    monkeypatch.setattr(sur, "memo_enabled", False)  # the network itself, not remembered patterns
    cross = random_cross_masks(het.spec, 200, seed=5)  # > 64 rows: exercises dedupe too
    batch = sur.predict_masks(np.concatenate([cross, cross[:50]]))
    single = np.array([sur.predict_masks(m[None, :])[0] for m in cross[:30]])
    np.testing.assert_allclose(batch[:30], single, rtol=1e-5)
    np.testing.assert_array_equal(batch[200:], batch[:50])


def test_prediction_memo_is_exact_and_follows_weight_updates(trained, het):
    """Rows are remembered across calls; an in-place weight update (``train`` fine-tunes
    ``sur.net`` in place) or a mode change must not serve stale values."""
    sur = trained.surrogate
    cross = random_cross_masks(het.spec, 40, seed=9)
    first = sur.predict_masks(cross)
    np.testing.assert_array_equal(sur.predict_masks(cross[::-1])[::-1], first)
    np.testing.assert_allclose(sur._predict_uncached(cross), sur._predict_model(cross), rtol=1e-6)
    p = next(sur.net.parameters())
    saved = p.detach().clone()
    try:
        with torch.no_grad():
            p.mul_(1.5)
        changed = sur.predict_masks(cross)
        assert not np.allclose(changed, first)
        np.testing.assert_allclose(sur._predict_uncached(cross), sur._predict_model(cross), rtol=1e-6)
    finally:
        with torch.no_grad():
            p.copy_(saved)
    np.testing.assert_allclose(sur.predict_masks(cross), first, rtol=1e-6)


def test_permutation_invariance_over_hosts(trained, het):
    net = trained.surrogate.net
    sur = trained.surrogate
    masks = random_cross_masks(het.spec, 64, seed=6)
    tok = host_tokens(masks, np.bitwise_count(masks).astype(np.int64), sur.stage1, host_arrays(het.spec))
    perm = np.random.default_rng(0).permutation(tok["pad"].shape[1])
    shuffled = {k: (v[:, perm] if v.ndim == 2 else v) for k, v in tok.items()}
    with torch.inference_mode():
        a = net(to_torch(tok))
        b = net(to_torch(shuffled))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_homogeneous_hosts_permuted_predict_equal():
    spec = load_cluster(ROOT / "params/clusters/h100.yaml")
    fab = EmulatorFabric(spec)
    net = build_net("hierarchical", spec, layers=1, hidden=16, heads=2)
    with torch.no_grad():
        for prm in net.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
    sur = Surrogate(spec, fab.stage1, net)
    masks = random_cross_masks(spec, 40, seed=7)
    rolled = np.roll(masks, 1, axis=1)  # same subsets on other (identical) hosts
    np.testing.assert_allclose(sur.predict_masks(masks), sur.predict_masks(rolled), rtol=1e-5)


def test_save_load_roundtrip_exact_and_fast(trained, het, tmp_path):
    sur = trained.surrogate
    path = sur.save(tmp_path / "m")
    t0 = time.perf_counter()
    back = Surrogate.load(path)
    assert time.perf_counter() - t0 < 0.5
    cross = random_cross_masks(het.spec, 100, seed=8)
    np.testing.assert_array_equal(back.predict_masks(cross), sur.predict_masks(cross))
    assert back.spec.fingerprint() == het.spec.fingerprint()
    np.testing.assert_array_equal(back.stage1, sur.stage1)
    assert back.replay is not None and len(back.replay[1]) == 64


def test_bad_inputs_raise_model_error(trained, het, tmp_path):
    sur = trained.surrogate
    with pytest.raises(ModelError, match="unknown"):
        sur.predict([["rtx4090:0", "nohost:1"]])
    with pytest.raises(ModelError):
        sur.predict([["v100:9", "a800:0"]])
    with pytest.raises(ModelError, match="shape"):
        sur.predict_masks(np.zeros((3, 7), dtype=np.int64))
    with pytest.raises(ModelError, match="does not have"):
        sur.predict_masks(np.array([[1 << 9, 1, 0, 0]]))
    with pytest.raises(ModelError, match="not found"):
        Surrogate.load(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    with pytest.raises(ModelError, match="no BandPilot surrogate"):
        Surrogate.load(tmp_path / "junk")
    for exc in (ModelError("x"),):
        assert isinstance(exc, BandPilotError)


def test_naive_ablation_trains_and_predicts(het):
    ds = fabric_dataset(het, n_cross=150, seed=2)
    res = train(ds, {**TINY, "model": "naive"}, plots=False)
    pred = res.surrogate.predict_masks(random_cross_masks(het.spec, 10, seed=9))
    assert pred.shape == (10,) and np.all(pred > 0)
    assert res.surrogate.kind == "naive"


@pytest.mark.slow
def test_surrogate_import_does_not_load_lightning_or_mlflow():
    code = "import sys, bandpilot.model.surrogate; print('lightning' in sys.modules, 'mlflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "False False", out.stderr


def test_small_batches_run_single_threaded_and_restore_threads(trained, het):
    import torch

    from bandpilot.model.surrogate import SMALL_BATCH

    sur = trained.surrogate
    masks = random_cross_masks(het.spec, 2, seed=6)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        small = sur.predict_masks(masks)
        assert torch.get_num_threads() == 2  # restored after the one-thread forward pass
        big = sur._forward(np.tile(masks, (SMALL_BATCH // 2 + 1, 1)))
        np.testing.assert_allclose(big.reshape(-1, 2), np.broadcast_to(small, (SMALL_BATCH // 2 + 1, 2)), rtol=1e-5)
    finally:
        torch.set_num_threads(before)
