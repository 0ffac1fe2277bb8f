"""Three-tier fat-tree in the emulator (issue 24): racks (leaf switches) grouped into pods
(spine switches); the 12,288-GPU spec loads and builds fast enough to be usable."""

import numpy as np
import pytest

from bandpilot.errors import SpecError
from bandpilot.fabric.emulator import EmulatorFabric, make_fabric
from bandpilot.topology.cluster import load_cluster, spec_from_dict

SPEC = "params/clusters/h100-1536.yaml"


@pytest.fixture(scope="module")
def fab():
    return make_fabric(load_cluster(SPEC))


def _pair(spec, a: int, b: int, per: int = 8) -> np.ndarray:
    m = np.zeros((1, spec.n_hosts), dtype=np.int64)
    m[0, [a, b]] = (1 << per) - 1
    return m


def test_spec_size_and_tiers(fab):
    spec = fab.spec
    assert spec.n_gpus == 12_288 and spec.n_hosts == 1_536
    assert fab._n_domains == 96 and int(fab._pod.max()) + 1 == 12


def test_cross_pod_traffic_pays_the_core_tier(fab):
    spec = fab.spec
    same_rack = fab.bandwidth_masks(_pair(spec, 0, 1))[0]
    same_pod = fab.bandwidth_masks(_pair(spec, 0, 16))[0]  # rack 0 and rack 1, pod 0
    cross_pod = fab.bandwidth_masks(_pair(spec, 0, 16 * 8))[0]  # rack 0 (pod 0) and rack 8 (pod 1)
    assert same_rack > same_pod > cross_pod > 0
    net = fab.net
    # the switch cap binds for full hosts: each tier multiplies it by its factor
    assert cross_pod / same_pod == pytest.approx(net["cross_pod_factor"], rel=0.1)


def test_no_pod_tier_without_pod_racks():
    spec = load_cluster("params/clusters/h100-128.yaml")
    f = EmulatorFabric(spec)
    assert f._pod is None


@pytest.mark.parametrize("bad", [{"pod_racks": -1}, {"pod_racks": 2.5}, {"pod_racks": 2, "cross_pod_factor": 0}])
def test_bad_pod_parameters_rejected(bad):
    import yaml

    doc = yaml.safe_load(open("params/clusters/h100-128.yaml"))
    doc["emulator"]["network"].update(bad)
    with pytest.raises(SpecError, match="pod_racks"):
        EmulatorFabric(spec_from_dict(doc))
