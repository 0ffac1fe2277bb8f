"""The traced forward path of a hierarchical surrogate (:mod:`bandpilot.model.traced`): the same
floats as the module on every batch size and token layout, traced only after repeated calls, and
dropped when the weights change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bandpilot.data.synthetic import fabric_dataset
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model import traced
from bandpilot.model.params import TrainParams
from bandpilot.model.surrogate import to_torch
from bandpilot.model.tokens import grouped_host_tokens, host_tokens
from bandpilot.model.train import train
from bandpilot.topology.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sur():
    fab = make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))
    params = TrainParams.load(ROOT / "params" / "train.yaml", {"seed": 0, "epochs": 3})
    return train(fabric_dataset(fab, n_cross=120, seed=0), params, plots=False).surrogate


def batches(sur, rng, merged: bool):
    spec = sur.spec
    for n in (1, 2, 5, 9, 40, 200):
        masks = np.zeros((n, spec.n_hosts), dtype=np.int64)
        for r in range(n):
            for h in rng.choice(spec.n_hosts, size=int(rng.integers(2, spec.n_hosts + 1)), replace=False):
                masks[r, h] = int(rng.integers(1, 256))
        if merged:
            yield to_torch(grouped_host_tokens(masks, sur._pattern_keyer().groups(masks), sur.stage1, sur._hosts))
        else:
            yield to_torch(host_tokens(masks, np.bitwise_count(masks).astype(np.int64), sur.stage1, sur._hosts))


@pytest.mark.parametrize("merged", [True, False])
def test_traced_outputs_equal_the_modules_on_every_batch(sur, merged, monkeypatch):
    monkeypatch.setattr(traced, "TRACE_AFTER", 8)
    net = sur.net.eval()
    run = traced.TracedForward()
    rng = np.random.default_rng(1)
    toks = list(batches(sur, rng, merged))
    with torch.inference_mode():
        for _ in range(traced.TRACE_AFTER):  # the calls before a layout is traced
            run(net, toks[0])
        assert any(v is not None for v in run._traces.values())  # traced now
        for tok in toks + list(batches(sur, rng, merged)):
            assert torch.equal(run(net, tok), net(tok))


def test_no_trace_before_repeats_and_new_weights_drop_it(sur, monkeypatch):
    monkeypatch.setattr(traced, "TRACE_AFTER", 8)
    net = sur.net.eval()
    run = traced.TracedForward()
    tok = next(batches(sur, np.random.default_rng(2), True))
    with torch.inference_mode():
        for _ in range(traced.TRACE_AFTER - 1):
            run(net, tok)
        assert not run._traces  # a one-shot command never traces
        run(net, tok)
        assert run._traces
        before = run(net, tok)
    with torch.no_grad():
        net.head[-1].bias.add_(0.5)  # new weights (as fine-tuning would)
    try:
        with torch.inference_mode():
            after = run(net, tok)
            assert not run._traces and torch.equal(after, net(tok)) and not torch.equal(after, before)
    finally:
        with torch.no_grad():
            net.head[-1].bias.sub_(0.5)
