"""The surrogate's prediction memo keyed by canonical patterns (bandpilot.model.canonical): rows alike
up to host order and domain names share one forward row, and the memo changes neither predictions
(beyond float32 summation order) nor what a simulation places and when."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bandpilot.data.synthetic import fabric_dataset, random_cross_masks
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model.canonical import PatternKeys
from bandpilot.model.tokens import host_arrays
from bandpilot.model.train import train
from bandpilot.simulation.engine import SimConfig, simulate
from bandpilot.simulation.workloads import public_trace_workload
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 3, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 20, "n_train": 80, "threads": 1,
        "split": "random", "replay_size": 16}
#: float32 sums in another token order: the only difference a memo hit may make
RTOL = 1e-5


@pytest.fixture(scope="module")
def fab128():
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml"))  # 8 racks of 16 hosts


@pytest.fixture(scope="module")
def sur128(fab128):
    return train(fabric_dataset(fab128, n_cross=120, seed=1), TINY, plots=False).surrogate


def _rack_shuffle(n_racks: int, per_rack: int, seed: int) -> np.ndarray:
    """A host permutation that keeps racks together (racks renamed, hosts shuffled within)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(per_rack) + per_rack * r for r in rng.permutation(n_racks)])


def test_keys_identify_rows_alike_up_to_host_order_and_rack_names(fab128):
    keys = PatternKeys(fab128.stage1, host_arrays(fab128.spec), 8).keys
    H = fab128.spec.n_hosts

    def row(**hosts: int) -> np.ndarray:
        m = np.zeros(H, dtype=np.int64)
        for h, mask in hosts.items():
            m[int(h[1:])] = mask
        return m

    a = row(h0=0b1111, h1=0b1111)  # two hosts of rack 0
    same_rack = row(h5=0b1111, h2=0b1111)
    other_rack = row(h40=0b1111, h33=0b1111)
    split = row(h0=0b1111, h20=0b1111)  # racks 0 and 1
    split2 = row(h17=0b1111, h100=0b1111)  # racks 1 and 6
    other_gpus = row(h0=0b1111, h1=0b11110000)  # the other NUMA half: another stage-1 token
    fewer = row(h0=0b1111, h1=0b111)
    k = keys(np.array([a, same_rack, other_rack, split, split2, other_gpus, fewer]))
    assert k[0] == k[1] == k[2] and k[3] == k[4]
    assert k[0] != k[3] and k[0] != k[6]
    assert (k[5] == k[0]) == (fab128.stage1[1, 0b11110000] == fab128.stage1[1, 0b1111])


def test_keys_merge_rows_that_group_their_hosts_into_racks_alike(fab128, sur128):
    """The net reads racks only as each token's rack-mate count (same_dom) and whether the row spans
    racks (xdom): rows whose tokens have the same rack-mate counts, however the tokens pair up into
    racks, share a key - and the network (memo off) predicts them alike. Other groupings do not."""
    keys = PatternKeys(fab128.stage1, host_arrays(fab128.spec), 8).keys
    H = fab128.spec.n_hosts

    def row(*hosts: tuple[int, int]) -> np.ndarray:
        m = np.zeros(H, dtype=np.int64)
        for h, mask in hosts:
            m[h] = mask
        return m

    a, b, c, d = 0b1, 0b11, 0b111, 0b1111  # four distinct tokens (1-4 GPUs)
    rows = np.array([
        row((0, a), (1, b), (16, c), (17, d)),  # racks {a, b}, {c, d}
        row((0, a), (1, c), (16, b), (17, d)),  # racks {a, c}, {b, d}: every token has one rack-mate
        row((40, d), (41, a), (100, b), (101, c)),  # {a, d}, {b, c} in other racks
        row((0, a), (1, b), (2, c), (16, d)),  # {a, b, c}, {d}: other rack-mate counts
        row((0, a), (16, b), (32, c), (48, d)),  # four racks
        row((0, a), (1, b), (2, c), (3, d)),  # one rack (xdom 0)
    ])
    k = keys(rows)
    assert k[0] == k[1] == k[2]
    assert len({bytes(x) for x in k[[0, 3, 4, 5]]}) == 4
    sur128.memo_enabled = False
    try:
        ref = sur128.predict_masks(rows)
    finally:
        sur128.memo_enabled = True
    np.testing.assert_allclose(ref[1:3], ref[0], rtol=RTOL)


def test_memo_predictions_match_the_network_and_share_forward_rows(sur128):
    rows = random_cross_masks(sur128.spec, 300, seed=2)
    rows = np.concatenate([rows, rows[:, _rack_shuffle(8, 16, 0)]])
    sur128.memo_enabled = False
    try:
        ref = sur128.predict_masks(rows)
    finally:
        sur128.memo_enabled = True
    sur128._memo = None
    before = sur128.forward_rows
    got = sur128.predict_masks(rows)
    np.testing.assert_allclose(got, ref, rtol=RTOL)
    # the shuffled half is the same patterns: at most half the rows reach the net
    assert sur128.forward_rows - before <= 300
    np.testing.assert_array_equal(got[300:], got[:300])
    again = sur128.forward_rows
    np.testing.assert_array_equal(sur128.predict_masks(rows[::-1]), got[::-1])
    assert sur128.forward_rows == again


@pytest.mark.slow
def test_simulation_with_the_memo_places_like_the_network(sur128, fab128):
    """Real model, real simulator: the same jobs start and end at the same times; where the GPUs
    differ the two choices are the same pattern (an exact tie the float order used to break)."""
    jobs = public_trace_workload("helios", 60, n_gpus=fab128.spec.n_gpus, load=0.9, seed=0)
    cfg = SimConfig(profile=SchedulerProfile("test"))
    out = {}
    for memo in (False, True):
        sur128.memo_enabled = memo
        sur128._memo = None
        try:
            out[memo] = simulate(jobs, Dispatcher(sur128), fab128, cfg).jobs
        finally:
            sur128.memo_enabled = True
    spec = fab128.spec
    assert len(out[True]) == len(out[False]) == 60
    for a, b in zip(out[False], out[True]):
        assert (a.id, a.status, a.k, a.n_hosts) == (b.id, b.status, b.k, b.n_hosts)
        assert a.start_s == pytest.approx(b.start_s, rel=1e-9) and a.end_s == pytest.approx(b.end_s, rel=1e-9)
        if a.gpus != b.gpus:
            pair = spec.to_masks([a.gpus.split(","), b.gpus.split(",")])
            sur128.memo_enabled = False
            try:
                va, vb = sur128.predict_masks(pair)
            finally:
                sur128.memo_enabled = True
            assert va == pytest.approx(vb, rel=RTOL), (a.id, a.gpus, b.gpus)
