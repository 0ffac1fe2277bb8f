"""Merged host tokens (issue 24): a token-symmetric net gets each row's identical tokens as one
token weighted by their number. The net's function is the same (attention over m identical keys
is one key with m times the weight; counts, means and domain-mate shares weigh by m), so the fast
path must predict what the per-host reference path (``merge_tokens = False``) predicts, up to
float32 summation order, on random rows and on the rack-wide rows of a busy cluster's drain."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bandpilot.data.synthetic import random_cross_masks
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model.canonical import PatternKeys
from bandpilot.model.net_kinds import build_net
from bandpilot.model.surrogate import Surrogate
from bandpilot.model.tokens import host_arrays
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-5  # float32 sums in another order (and log m added to a score instead of m multiplying)


@pytest.fixture(scope="module")
def fab128():
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml"))  # 8 racks of 16 hosts


def _random_net(spec, seed: int, **cfg):
    """An untrained net with every weight random (the head's last layer starts at zero: with it the
    residual - attention included - would not show in the output)."""
    torch.manual_seed(seed)
    net = build_net("hierarchical", spec, hidden=16, heads=2, host_speed=True, **cfg)
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim:
                p.normal_(0.0, 0.5)
    return net


def _wide_rows(n_hosts: int, n: int, seed: int) -> np.ndarray:
    """Rows like the drain's super allocations: most hosts of most racks, few distinct masks."""
    rng = np.random.default_rng(seed)
    rows = np.zeros((n, n_hosts), dtype=np.int64)
    choices = np.array([0b1, 0b11, 0b1111, 0b11110000, 0xFF, 0b111])
    for i in range(n):
        used = rng.random(n_hosts) < rng.uniform(0.3, 1.0)
        rows[i, used] = rng.choice(choices, int(used.sum()))
    return rows[(rows != 0).sum(axis=1) >= 2]


def _both(sur: Surrogate, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sur.merge_tokens = False
    try:
        ref = sur._forward(rows)
    finally:
        sur.merge_tokens = True
    return ref, sur._forward(rows)


@pytest.mark.parametrize("cfg", [dict(layers=1), dict(layers=2, imbalance=True), dict(layers=1, members=2)])
def test_merged_tokens_predict_like_one_token_per_host(fab128, cfg):
    sur = Surrogate(fab128.spec, fab128.stage1, _random_net(fab128.spec, 3, **cfg))
    rows = np.concatenate([random_cross_masks(fab128.spec, 300, seed=4), _wide_rows(128, 300, seed=5)])
    ref, got = _both(sur, rows)
    assert np.ptp(np.log(ref)) > 0.1  # the rows differ to the net: the comparison means something
    np.testing.assert_allclose(got, ref, rtol=RTOL)


def test_groups_merge_only_tokens_the_net_cannot_tell_apart(fab128):
    keyer = PatternKeys(fab128.stage1, host_arrays(fab128.spec), 8)
    rows = _wide_rows(128, 50, seed=6)
    r, c, size, mates = keyer.groups(rows)
    used = rows != 0
    np.testing.assert_array_equal(np.bincount(r, weights=size, minlength=rows.shape[0]), used.sum(axis=1))
    assert r.size < used.sum() / 3  # wide rows of few masks: far fewer tokens than hosts
    dom = host_arrays(fab128.spec)["domain"]
    for i in range(0, rows.shape[0], 7):
        hosts = np.flatnonzero(used[i])
        want = {}
        for h in hosts:  # (token id, rack-mate count) -> hosts
            key = (int(keyer.token[h, rows[i, h]]), int((dom[hosts] == dom[h]).sum()))
            want[key] = want.get(key, 0) + 1
        g = r == i
        got = {(int(keyer.token[h, rows[i, h]]), int(m)): int(s) for h, s, m in zip(c[g], size[g], mates[g])}
        assert got == want


def test_merged_tokens_keep_rows_apart_that_group_racks_differently(fab128):
    """Two rows of the same tokens whose racks hold them differently: mates keep them apart."""
    sur = Surrogate(fab128.spec, fab128.stage1, _random_net(fab128.spec, 7, layers=1))
    a = np.zeros((2, 128), dtype=np.int64)
    a[0, [0, 1, 2, 3]] = 0xFF  # one rack
    a[1, [0, 1, 16, 17]] = 0xFF  # two racks
    ref, got = _both(sur, a)
    np.testing.assert_allclose(got, ref, rtol=RTOL)
    assert abs(got[0] / got[1] - 1) > 1e-4


@pytest.mark.slow
def test_simulation_with_merged_tokens_places_like_one_token_per_host(fab128):
    """A trained model in the simulator (fifo + greedy on the 128-host cluster): every job starts and
    ends at the same time on the same GPUs with merged tokens as with one token per host."""
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.model.train import train
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.workloads import public_trace_workload

    tiny = {"epochs": 3, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 20, "n_train": 80, "threads": 1,
            "split": "random", "replay_size": 16}
    sur = train(fabric_dataset(fab128, n_cross=120, seed=1), tiny, plots=False).surrogate
    jobs = public_trace_workload("helios", 80, n_gpus=fab128.spec.n_gpus, load=0.9, seed=0)
    cfg = SimConfig(profile=SchedulerProfile("test"))
    out = {}
    for merge in (False, True):
        sur.merge_tokens, sur._memo = merge, None
        out[merge] = [(j.id, j.status, j.start_s, j.end_s, j.gpus) for j in simulate(jobs, Dispatcher(sur), fab128, cfg).jobs]
    assert out[True] == out[False]
