"""GPU ids <-> masks: the vectorised path of ``to_sparse_mask``/``from_mask`` (every ``select``
re-checks its ids) gives what the per-id checked path gives, and ill-formed ids still fail with
the checked path's message."""

import numpy as np
import pytest

from bandpilot.errors import SpecError
from bandpilot.topology.cluster import load_cluster


@pytest.fixture(scope="module")
def spec():
    return load_cluster("params/clusters/nvl72x16.yaml")


def _checked(spec, gpus):
    by_host: dict[int, int] = {}
    for g in gpus:
        h, i = spec.parse_gpu(g)
        by_host[h] = by_host.get(h, 0) | 1 << i
    hosts = sorted(by_host)
    return hosts, [by_host[h] for h in hosts]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_matches_the_checked_path(spec, seed):
    rng = np.random.default_rng(seed)
    mask = np.where(rng.random(spec.n_hosts) < 0.3, rng.integers(0, 16, spec.n_hosts), 0)
    gpus = spec.from_mask(mask)
    assert gpus == [f"{spec.hosts[h].name}:{i}" for h in range(spec.n_hosts) for i in range(4) if mask[h] >> i & 1]
    shuffled = list(rng.permutation(gpus))
    assert spec.to_sparse_mask(shuffled) == _checked(spec, shuffled)
    assert np.array_equal(spec.to_mask(shuffled), mask)


@pytest.mark.parametrize("bad, message", [
    (["nope:0"], "unknown host"), (["{h}:9"], "unknown GPU index"), (["{h}:0", "{h}:0"], "listed twice"),
    (["{h}"], "malformed GPU id"), (["{h}:+1"], "unknown GPU index"), ([3], "malformed GPU id"),
])
def test_ill_formed_ids_fail_as_before(spec, bad, message):
    h = spec.hosts[5].name
    with pytest.raises(SpecError, match=message):
        spec.to_sparse_mask([b.format(h=h) if isinstance(b, str) else b for b in bad])
