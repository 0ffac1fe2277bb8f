"""Issue 24 (build item 3): the rack-scale surrogate - domain tokens between tray and cluster."""

from __future__ import annotations

import numpy as np
import pytest

from bandpilot.data.domain_planning import plan_domains
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.errors import ModelError
from bandpilot.fabric.emulator import make_fabric
from bandpilot.model.domain_patterns import DomainPatterns
from bandpilot.model.domain_tokens import DomainView
from bandpilot.model.tokens import host_arrays
from bandpilot.topology.cluster import spec_from_dict

TRAY = ["X NV18 NV18 NV18", "NV18 X NV18 NV18", "NV18 NV18 X NV18", "NV18 NV18 NV18 X"]


def nvl_spec(domains: int = 4, trays: int = 4):
    return spec_from_dict({
        "name": f"nvl-{domains}x{trays}", "gpus_per_host": 4,
        "host_groups": [{"prefix": "t", "count": domains * trays, "gpu": "GB200", "topology": TRAY,
                         "nvlink_domain_size": trays}],
        "network": {"nic_gbps": 400, "rails_per_host": 4},
        "emulator": {"seed": 3, "noise": 0.02,
                     "gpus": {"GB200": {"link": {"NV": 59.44}, "cap": 479.8, "sharpness": 2.1, "hop_penalty": 0.39,
                                        "ring_eff": [1.0, 1.05, 1.1, 0.99, 1.0, 1.01, 1.02]}}},
    })


@pytest.fixture(scope="module")
def fab():
    return make_fabric(nvl_spec())


def _planned(fab, cross: int, seed: int = 0):
    pl = [m for m in plan_domains(fab.spec, cross_domain_samples=cross, seed=seed) if m.cross_host]
    return np.array([m.masks for m in pl], dtype=np.int64)


def test_domain_tokens_are_one_per_domain(fab):
    spec = fab.spec
    masks = _planned(fab, 40)
    y = fab.bandwidth_masks(masks)
    view = DomainView(spec, fab.stage1, host_arrays(spec), DomainPatterns.fit(spec, fab.stage1, masks, y))
    row = np.zeros(spec.n_hosts, dtype=np.int64)
    row[[0, 1]] = [0b1111, 0b0011]  # domain 0: 6 GPUs on 2 trays
    row[5] = 0b0001  # domain 1: 1 GPU
    t = view.tokens(row[None, :])
    assert (~t["pad"]).sum() == 2 and t["xdom"][0] == 1.0
    assert sorted(t["cnt"][0][~t["pad"][0]].tolist()) == [1.0, 6.0]
    assert sorted(t["trays"][0][~t["pad"][0]].tolist()) == [1.0, 2.0]
    assert sorted(t["rails"][0][~t["pad"][0]].tolist()) == [1.0, 6.0]  # 4 + 2 rails driven on the two trays
    six = t["intra"][0][t["cnt"][0] == 6.0][0]
    inside = row.copy()
    inside[5] = 0
    assert view.inside(np.array([row, inside])).tolist() == [False, True]
    assert six == pytest.approx(view.inside_values(inside[None, :])[0])  # the domain token carries stage 1.5
    assert six == pytest.approx(fab.bandwidth_masks(inside[None, :])[0], rel=0.05)
    for rows in (masks, np.array([row, inside]), np.zeros((2, spec.n_hosts), dtype=np.int64)):
        assert np.array_equal(view.inside_of(view.live_units(rows)), view.inside(rows))  # from the features
    in_rows = masks[view.inside(masks)]  # vectorised lookups = the row-wise stage 1.5 table
    assert np.allclose(view.inside_values(in_rows), view.patterns.predict(in_rows))



def test_domain_keys_of_a_row_do_not_depend_on_the_batch(fab):
    """Unit features are computed on the units some row of the batch touches: a row's keys and
    tokens alone must equal its keys and tokens among rows that touch other domains."""
    spec = fab.spec
    masks = _planned(fab, 40)
    view = DomainView(spec, fab.stage1, host_arrays(spec), DomainPatterns.fit(spec, fab.stage1, masks, fab.bandwidth_masks(masks)))
    cross = masks[~view.inside(masks) & ((masks != 0).sum(axis=1) >= 2)]
    assert cross.shape[0] >= 5
    batch = view.keys(cross)
    alone = np.concatenate([view.keys(r[None, :]) for r in cross])
    assert np.array_equal(batch, alone)
    assert len({bytes(k) for k in batch}) > 1
    tok = view.tokens(cross[:1])
    assert np.array_equal(tok["intra"], view.tokens(cross)["intra"][:1, :tok["intra"].shape[1]])

def test_domain_delta_features_and_keys_match_reducing_every_row(fab, monkeypatch):
    """Features and keys from a batch's first row plus the blocks / tokens where a row differs
    (the delta paths, forced on) equal reducing and hashing every row (forced off): on moves of
    one row (a tray or two changed each) and on unrelated rows."""
    from bandpilot.model import domain_tokens

    spec = fab.spec
    masks = _planned(fab, 40)
    view = DomainView(spec, fab.stage1, host_arrays(spec), DomainPatterns.fit(spec, fab.stage1, masks, fab.bandwidth_masks(masks)))
    rng = np.random.default_rng(3)
    base = np.zeros(spec.n_hosts, dtype=np.int64)
    base[[0, 1, 4, 6, 9, 13]] = [0b1111, 0b0011, 0b0111, 0b1000, 0b1111, 0b0101]
    moves = np.repeat(base[None, :], 60, axis=0)
    for row in moves[1:]:
        for h in rng.choice(spec.n_hosts - 1, size=int(rng.integers(1, 3)), replace=False):  # never the last
            row[h] = rng.integers(0, 16)  # a tray emptied, filled or changed
    cols = np.flatnonzero(moves.any(axis=0))
    assert masks.shape[0] >= 32 and cols.size < spec.n_hosts
    for batch, c in ((moves[:, cols], cols), (moves, None), (masks, None)):
        got = []
        for at_from, most in ((32, 1.0), (1 << 30, 0.0)):  # delta paths always, never
            monkeypatch.setattr(domain_tokens, "DELTA_FROM", at_from)
            monkeypatch.setattr(domain_tokens, "DELTA_MAX_CHANGED", most)
            got.append((*view.live_units(batch, c), view.keys(batch, c)))
        (lu, z, keys), (lu_ref, z_ref, keys_ref) = got
        assert np.array_equal(lu, lu_ref) and z.keys() == z_ref.keys()
        assert all(np.array_equal(z[k], z_ref[k]) for k in z_ref) and np.array_equal(keys, keys_ref)
        assert len({bytes(k) for k in keys}) > 10


def test_domain_forward_reads_the_memo_keys_reduction(fab):
    """The memo's misses go to the net as tokens packed from the features their keys were made of
    (one reduction of the rows): the same floats as the reference path (memo off: tokens from the
    masks, rows de-duplicated by (count, intra)), on column-restricted rows with repeats."""
    import torch

    from bandpilot.model.net_kinds import build_net
    from bandpilot.model.surrogate import Surrogate

    spec = fab.spec
    masks = _planned(fab, 120)
    torch.manual_seed(5)
    net = build_net("domain", spec, hidden=16, heads=2, layers=1, host_speed=True)
    with torch.no_grad():
        for p in net.parameters():
            if p.ndim:
                p.normal_(0.0, 0.5)  # the head's last layer starts at zero: the residual would not show
    sur = Surrogate(spec, fab.stage1, net, kind="domain",
                    patterns=DomainPatterns.fit(spec, fab.stage1, masks, fab.bandwidth_masks(masks)))
    masks[:, 5] = 0  # a host no row uses: the rows go on the other columns
    rows = masks[sur.net_rows(masks) & ((masks != 0).sum(axis=1) >= 2)]
    rows = np.concatenate([rows, rows[::3]])  # repeats: one forward row each
    cols = np.flatnonzero(rows.any(axis=0))
    assert rows.shape[0] > 64 and cols.size < spec.n_hosts
    got = sur.predict_columns(rows[:, cols], cols)
    sur.memo_enabled = False
    ref = sur.predict_columns(rows[:, cols], cols)
    assert np.array_equal(got, ref) and np.array_equal(sur.predict_masks(rows), ref)
    for bad in (-1, 1 << 4):  # a sign bit, a GPU the 4-GPU tray does not have: named, row and host
        wrong = rows[:, cols].copy()
        wrong[7, 3] = bad
        with pytest.raises(ModelError, match=f"mask row 7 sets GPUs host 't{cols[3]}' does not have"):
            sur.predict_columns(wrong, cols)


@pytest.mark.slow
def test_domain_surrogate_learns_cross_domain_rows_and_round_trips(fab, tmp_path):
    from bandpilot.model.crossval import fit
    from bandpilot.model.surrogate import Surrogate

    ds = fabric_dataset(fab, cross_masks=_planned(fab, 300), seed=1)
    res = fit(ds, {"model": "domain", "epochs": 80, "folds": 3, "threads": 1}, plots=False)
    sur = res.surrogate
    assert sur.kind == "domain" and len(sur.patterns) > 0
    test = np.array([m.masks for m in plan_domains(fab.spec, cross_domain_samples=200, seed=9) if m.cross_host])
    truth = fab.bandwidth_masks(test)
    ape = np.abs(sur.predict_masks(test) / truth - 1)
    net = sur.net_rows(test)
    assert net.sum() > 100 and (~net).sum() > 20
    assert ape[net].mean() < 0.05 and ape[~net].mean() < 0.03  # cross-domain net, in-domain stage 1.5
    sur.memo_enabled = False  # the domain-token memo changes no prediction
    ref = sur.predict_masks(test)
    sur.memo_enabled = True
    assert np.allclose(sur.predict_masks(test), ref, rtol=1e-5) and np.allclose(sur.predict_masks(test), ref, rtol=1e-5)
    row = test[net][0]
    swapped = np.roll(row, 4)  # every tray one domain on (4 trays per domain): same domain tokens
    view = sur.domain_view
    assert view.keys(np.array([row, swapped]))[0] == view.keys(np.array([row, swapped]))[1]
    other = row.copy()
    other[np.flatnonzero(other)[0]] = 0
    assert view.keys(np.array([row, other]))[0] != view.keys(np.array([row, other]))[1]
    sur.save(tmp_path / "m")
    back = Surrogate.load(tmp_path / "m")
    assert back.kind == "domain" and np.allclose(back.predict_masks(test), sur.predict_masks(test))


def test_domain_model_needs_nvlink_domains():
    from bandpilot.model.net_kinds import build_net
    from bandpilot.topology.cluster import load_cluster
    from pathlib import Path

    h100 = load_cluster(Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml")
    with pytest.raises(ModelError, match="needs a cluster with NVLink domains"):
        build_net("domain", h100)
    with pytest.raises(ModelError, match="members must be 1"):
        build_net("domain", nvl_spec(), members=3)


def _two_class_spec(per_class: int):
    groups = [{"prefix": p, "count": per_class * 3, "gpu": g, "topology": TRAY, "nvlink_domain_size": 3}
              for p, g in (("a", "GB200"), ("b", "GB300"))]
    return spec_from_dict({"name": f"two-{per_class}", "gpus_per_host": 4, "host_groups": groups,
                           "network": {"nic_gbps": 400, "rails_per_host": 4}})


def test_plan_grows_with_domain_classes_not_domains():
    from collections import Counter

    from bandpilot.data.domain_planning import domain_levels

    assert domain_levels(16) == [2, 3, 4, 6, 9, 13, 16] and domain_levels(2) == [2] and domain_levels(1) == []
    assert len(domain_levels(1389)) == 18  # a log ladder, not 1,388 levels
    sizes = {}
    for per_class in (2, 6):
        spec = _two_class_spec(per_class)
        unit = spec.units[0]
        plan = [m for m in plan_domains(spec, cross_domain_samples=90, seed=2, intra=False)]
        kinds = Counter("in" if m.stratum.startswith("1d") else "cross" for m in plan)
        sizes[per_class] = dict(kinds)
        gpu_of = {int(unit[h]): spec.hosts[h].gpu for h in range(spec.n_hosts)}
        mixes = Counter()
        for m in plan:
            if not m.stratum.startswith("1d"):
                us = sorted({int(unit[h]) for h in np.flatnonzero(np.array(m.masks))})
                mixes[tuple(sorted(gpu_of[u] for u in us))] += 1
        assert mixes[("GB200", "GB300")] > 5  # classes take turns: the mixed pair is sampled
        in_doms = {gpu_of[int(unit[np.flatnonzero(np.array(m.masks))[0]])] for m in plan if m.stratum.startswith("1d")}
        assert in_doms == {"GB200", "GB300"}  # stage 1.5 once per class
    assert sizes[2]["in"] == sizes[6]["in"]  # three times the domains, the same stage-1.5 plan
    assert sizes[2]["cross"] <= sizes[6]["cross"] <= 90


def test_domain_model_finetunes_on_new_cross_domain_rows(fab):
    from bandpilot.model.crossval import fit
    from bandpilot.model.finetune import finetune

    sur = fit(fabric_dataset(fab, cross_masks=_planned(fab, 80), seed=1),
              {"model": "domain", "epochs": 10, "folds": 2, "threads": 1}, plots=False).surrogate
    new = fabric_dataset(fab, cross_masks=_planned(fab, 60, seed=5), seed=4)
    res = finetune(sur, new, {"finetune_epochs": 5, "threads": 1}, plots=False)
    assert res.surrogate.kind == "domain" and res.surrogate.patterns is sur.patterns
    assert np.isfinite(res.surrogate.predict_masks(_planned(fab, 20, seed=7))).all()
