"""The batch script, the per-index gres types read from Slurm, the job_submit.lua answer and the
checks on a user's script (no daemons needed; test_slurm_submit.py runs them on real Slurm)."""

from __future__ import annotations

import pytest

from bandpilot.errors import BandPilotError, RequestError
from bandpilot.integrations.slurm.service import answer, lua_script
from bandpilot.integrations.slurm.submit import check_options, node_types, read_script
from bandpilot.queue.launch_slurm import batch_script, components, single_job

TYPES = {n: {i: f"h100_{i}" for i in range(8)} for n in ("a", "b")}


def test_node_types_read_one_type_per_index_only():
    text = ("NodeName=a Arch=x Gres=gpu:h100_0:1(S:0),gpu:h100_1:1(S:0),gpu:h100_2:1(S:1) State=IDLE\n"
            "NodeName=b Arch=x Gres=gpu:8(S:0-1) State=IDLE\n"
            "NodeName=c Arch=x Gres=gpu:h100:8 State=IDLE\n"
            "NodeName=d Arch=x Gres=gpu:t_0:1,gpu:t_2:1 State=IDLE\n")
    assert node_types(text) == {"a": {0: "h100_0", 1: "h100_1", 2: "h100_2"}}


def test_uneven_or_differently_pinned_nodes_become_components_in_rank_order():
    ranks = ["b:3", "a:0", "b:1", "a:5", "a:2"]
    comps = components(ranks, TYPES)
    assert [(c.node, c.gpus) for c in comps] == [("b", (3, 1)), ("a", (0, 5, 2))]
    assert comps[0].gres() == "gpu:h100_1:1,gpu:h100_3:1" and not single_job(comps)
    s = batch_script(ranks, "srun hostname\n", types=TYPES, extra=["--time=5", "--job-name=x y"])
    lines = s.split("\n")
    assert lines[0] == "#!/bin/bash"
    assert lines[1] == "#SBATCH --nodes=1 --nodelist=b --ntasks=2 --gres=gpu:h100_1:1,gpu:h100_3:1 --time=5 '--job-name=x y'"
    assert lines[2] == "#SBATCH hetjob" and lines[3].startswith("#SBATCH --nodes=1 --nodelist=a --ntasks=3 ")
    assert "--het-group=0-1" in s and "SLURM_HOSTFILE" not in s and s.endswith("srun hostname\n")
    # the same count everywhere, untyped: one job, the rank map through SLURM_HOSTFILE
    even = batch_script(["a:0", "b:0", "a:1", "b:1"])
    assert "#SBATCH --nodes=2 --nodelist=a,b --ntasks=4 --ntasks-per-node=2 --gres=gpu:2" in even
    assert "a\nb\na\nb\nBANDPILOT_HOSTS" in even and "hetjob" not in even
    # same count, pinned, different indices per node: heterogeneous; the same indices: one job
    assert not single_job(components(["a:0", "b:1"], TYPES)) and single_job(components(["a:4", "b:4"], TYPES))


def test_lua_answer_is_exact_where_one_job_can_be():
    one = answer(["a:3", "a:0"], TYPES)
    assert one["req_nodes"] == "a" and one["tres_per_node"] == "gres:gpu:h100_0:1,gres:gpu:h100_3:1"
    assert one["exact"] == "indices" and one["tres_per_job"] == ""
    even = answer(["a:3", "b:1"], {})
    assert even["tres_per_node"] == "gres:gpu:1" and even["exact"] == "counts" and even["min_nodes"] == "2"
    uneven = answer(["a:0", "a:1", "b:0"], {})
    assert "tres_per_node" not in uneven and uneven["exact"] == "nodes" and "2+1" in uneven["note"]
    lua = lua_script("http://127.0.0.1:9000", 0.5)
    assert 'local URL = "http://127.0.0.1:9000"' in lua and "local TIMEOUT = 0.5" in lua
    assert "return slurm.SUCCESS" in lua and "slurm.ERROR" not in lua  # never a rejected job
    for url, t in (("ftp://x", 1.0), ("http://x", 0), ("http://x", 60)):
        with pytest.raises(BandPilotError):
            lua_script(url, t)


def test_user_scripts_and_options_bandpilot_owns(tmp_path):
    ok = tmp_path / "ok.sh"
    ok.write_text("#!/usr/bin/env bash\n#SBATCH --time=10 --job-name=train\n#SBATCH -A proj\nsrun python t.py\n"
                  "#SBATCH --nodes=9\n")
    body, opts = read_script(ok)
    assert opts == ["--time=10", "--job-name=train", "-A", "proj"] and body.startswith("srun python t.py")
    cases = [("#!/usr/bin/python\nprint(1)\n", "not bash"), ("echo hi\n", "starts with #!"),
             ("#!/bin/bash\n#SBATCH --gres=gpu:2\nsrun x\n", ":2: sbatch option --gres"),
             ("#!/bin/bash\n#SBATCH -N2\nsrun x\n", "-N2"), ("#!/bin/bash\n#SBATCH hetjob\n", "hetjob")]
    for text, word in cases:
        p = tmp_path / "bad.sh"
        p.write_text(text)
        with pytest.raises(RequestError, match=word.replace("+", r"\+")):
            read_script(p)
    with pytest.raises(RequestError, match="--gpus-per-node"):
        check_options(["--time=5", "--gpus-per-node=2"], "sbatch options")
    with pytest.raises(RequestError, match="missing.sh"):
        read_script(tmp_path / "missing.sh")


def test_a_grant_that_differs_is_a_warning_with_both_figures(capsys):
    from bandpilot.cli.slurm_submit import _report
    from bandpilot.integrations.slurm.submit import Grant, Submission

    sub = Submission("7", ["a:0", "a:1", "b:2"], "", 150.0, False, False, 40.0, 10.0,
                     Grant("7", "RUNNING", {"a": (0, 3), "b": (2,)}), 120.5)
    assert sub.verdict() == {"nodes": True, "counts": True, "indices": False}
    _report(sub, as_json=False)
    cap = capsys.readouterr()
    assert "asked a:0,1 b:2 - 150.00 GB/s predicted" in cap.out
    assert cap.err.startswith("warning: Slurm granted a:0,3 b:2 - 120.50 GB/s predicted, not the 150.00 GB/s asked "
                              "(indices differ)")
    sub.grant = Grant("7", "RUNNING", {"a": (0, 1), "b": (2,)})
    sub.granted_gbps = 150.0
    _report(sub, as_json=False)
    cap = capsys.readouterr()
    assert "granted a:0,1 b:2 - as asked (150.00 GB/s predicted)" in cap.out and not cap.err
    sub.grant = Grant("7", "PENDING", reason="Resources")
    _report(sub, as_json=False)
    assert "job 7 is PENDING (Resources)" in capsys.readouterr().out
