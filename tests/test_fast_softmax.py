"""Inference softmax in plain ops (issue 24): ``Surrogate._forward`` computes attention weights as
exp(x - max) / sum instead of ``torch.softmax`` (3x cheaper on small blocks on CPU). The function is
the same, so the fast path must match ``torch.softmax`` and the reference forward
(``fast_softmax = False``) up to float32 rounding, on both attention paths (broadcast for <= 8
tokens, matmul above) and with the -1e9 key mask; training never sees it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bandpilot.data.synthetic import random_cross_masks
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model import networks
from bandpilot.model.net_kinds import build_net
from bandpilot.model.surrogate import Surrogate
from bandpilot.topology.cluster import load_cluster

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-5  # float32: exp and the normalising sum rounded in another kernel


@pytest.mark.parametrize("dim", [2, -1])
def test_plain_softmax_matches_torch_with_masked_keys(dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 4, 11, 11, generator=g) * 4
    x.narrow(dim, 7, 4).fill_(-1e9)  # padded keys
    want = torch.softmax(x, dim=dim)
    with networks.fast_softmax():
        got = networks._softmax(x.clone(), dim)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-7)
    assert float(got.narrow(dim, 7, 4).abs().max()) == 0.0
    assert torch.equal(networks._softmax(x, dim), want)  # outside the context: torch.softmax itself


def test_fast_softmax_flag_is_restored_after_an_error():
    with pytest.raises(RuntimeError), networks.fast_softmax():
        raise RuntimeError
    assert networks._FAST_SOFTMAX is False


@pytest.fixture(scope="module")
def fab128():
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml"))


@pytest.mark.parametrize("merge", [False, True])
def test_forward_with_plain_softmax_predicts_like_torch_softmax(fab128, merge):
    torch.manual_seed(5)
    net = build_net("hierarchical", fab128.spec, hidden=16, heads=2, layers=2, host_speed=True)
    with torch.no_grad():
        for p in net.parameters():  # every weight random: the head's last layer starts at zero
            if p.ndim:
                p.normal_(0.0, 0.5)
    sur = Surrogate(fab128.spec, fab128.stage1, net)
    sur.merge_tokens = merge
    rows = random_cross_masks(fab128.spec, 400, seed=6)
    n_hosts = (rows != 0).sum(axis=1)
    assert n_hosts.min() <= 8 < n_hosts.max()  # both attention paths
    sur.fast_softmax = False
    ref = sur._forward(rows)
    sur.fast_softmax = True
    got = sur._forward(rows)
    assert np.ptp(np.log(ref)) > 0.1
    np.testing.assert_allclose(got, ref, rtol=RTOL)
    assert networks._FAST_SOFTMAX is False
