"""Issue 26 item 9: messages a new user reads - said once, in plain grammar, with the numbers that
explain them; a dry run fails where the real run would; Slurm export for clusters without domains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bandpilot.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "params" / "clusters" / "h100.yaml"


@pytest.fixture
def store(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["cluster", "init", "--cluster", str(H100), "--store", url]) == 0
    capsys.readouterr()
    return url


def test_a_single_bad_request_is_reported_once(store, capsys):
    assert main(["queue", "submit", "-k", "40", "--store", store]) == 2
    err = capsys.readouterr().err
    assert err.count("k=40 exceeds the cluster size") == 1, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_partial_hint_counts_in_plain_grammar(store, tmp_path, capsys):
    jl = tmp_path / "r.jsonl"
    jl.write_text('{"id": "a", "k": 2}\n{"id": "b", "k": 99}\n')
    assert main(["queue", "submit", str(jl), "--store", store]) == 2
    err = capsys.readouterr().err
    assert "the valid one)" in err and "1 valid ones" not in err
    jl.write_text('{"id": "a", "k": 2}\n{"id": "c", "k": 3}\n{"id": "b", "k": 99}\n')
    assert main(["queue", "submit", str(jl), "--store", store]) == 2
    assert "the 2 valid ones)" in capsys.readouterr().err


def test_unknown_token_messages(store, capsys):
    assert main(["tokens", "revoke", "x", "--store", store]) == 2
    err = capsys.readouterr().err
    assert "token 'x'" in err and "for token" not in err
    assert main(["tokens", "revoke", "--tenant", "nobody", "--store", store]) == 2
    assert "tenant 'nobody' has no active token" in capsys.readouterr().err


def test_select_says_how_big_the_cluster_is(tmp_path, capsys):
    state = tmp_path / "s.json"
    free = [f"h100-{h}:{g}" for h in range(4) for g in range(8)][:25]
    state.write_text(json.dumps({"free": free, "jobs": []}))
    assert main(["select", "30", "--state", str(state), "--cluster", str(H100)]) == 2
    err = capsys.readouterr().err
    assert "only 25 of the cluster's 32 GPUs are free" in err, err
    assert main(["select", "40", "--state", str(state), "--cluster", str(H100)]) == 2
    assert "cluster h100 has 32 GPUs" in capsys.readouterr().err


def test_slurm_export_for_a_cluster_without_domains_is_a_switch_tree(capsys, tmp_path):
    assert main(["cluster", "topology", "--cluster", str(H100), "--format", "slurm"]) == 0
    text = capsys.readouterr().out
    assert "topology/tree" in text and "SwitchName=h100 Nodes=h100-[0-3]" in text and "BlockName" not in text
    assert main(["cluster", "topology", "--cluster", str(ROOT / "params/clusters/h100-64.yaml"), "--format",
                 "slurm-tree"]) == 0
    tree = capsys.readouterr().out
    leaves = [ln for ln in tree.splitlines() if ln.startswith("SwitchName=") and " Nodes=" in ln]
    root = [ln for ln in tree.splitlines() if " Switches=" in ln]
    assert len(leaves) >= 2 and len(root) == 1
    assert all(ln.split()[0].removeprefix("SwitchName=") in root[0] for ln in leaves)


@pytest.fixture(scope="module")
def h100_model(tmp_path_factory):
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.model.crossval import fit
    from bandpilot.topology.cluster import load_cluster

    res = fit(fabric_dataset(EmulatorFabric(load_cluster(H100)), n_cross=80, seed=3),
              {"epochs": 2, "hidden": 8, "heads": 2, "threads": 1, "folds": 2, "replay_size": 8}, plots=False)
    d = tmp_path_factory.mktemp("model") / "m"
    res.surrogate.save(d)
    return d


def test_verify_dry_run_refuses_another_clusters_model_like_the_real_run(h100_model, capsys):
    other = ROOT / "params" / "clusters" / "het4mix.yaml"
    assert main(["verify", "--model", str(h100_model), "--cluster", str(other)]) == 2
    real = capsys.readouterr().err
    assert main(["verify", "--model", str(h100_model), "--cluster", str(other), "--dry-run"]) == 2
    dry = capsys.readouterr()
    assert dry.err == real and "the model is for cluster 'h100'" in dry.err and dry.out == ""
    assert main(["verify", "--model", str(h100_model), "--dry-run"]) == 0  # its own cluster: the plan
    assert "nccl-tests runs" in capsys.readouterr().out
