"""Issue 26 items 2 and 9: the main job's summary prints whole GPU lists, every outcome count in words,
"and N more" instead of silently dropping outcomes, a store hint that works from any directory, and a
short truth line that says each thing once."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _outcome(i: int, status: str, gpus: list[str] | None = None, reason: str | None = None,
             detail: str | None = None) -> dict:
    return {"request_id": f"demo-h100-{i:03d}", "k": len(gpus) if gpus else 12, "status": status,
            "gpus": gpus, "reason": reason, "detail": detail, "predicted_gbps": 137.9 if gpus else None}


def _results(outcomes: list[dict], store: str) -> dict:
    return {"dvc_md5": "abc.dir", "clusters": {"h100": {
        "retrain": {"name": "bandpilot-h100", "version": "2", "trained": True, "champion": "2", "dataset_hash": "f" * 40,
                    "gate": {"action": "promoted", "decision": {}}},
        "batch": {"batch_id": 3, "policy": "utility", "outcomes": outcomes},
        "store": store, "truth": "emulator (params/clusters/h100.yaml)"}}}


def test_summary_prints_whole_gpu_lists_counts_in_words_and_how_many_more(tmp_path):
    from flows.pipeline import summary_lines

    twelve = [f"h100-2:{g}" for g in range(8)] + [f"h100-3:{g}" for g in range(4)]
    outs = [_outcome(0, "assigned", twelve)]
    outs += [_outcome(i, "assigned", [f"h100-{i % 4}:{g}" for g in range(2)]) for i in range(1, 9)]
    outs += [_outcome(i, "deferred", reason="insufficient_gpus", detail="needs 12 GPUs, fewer are free")
             for i in range(9, 24)]
    store = f"sqlite:///{tmp_path / '.bandpilot' / 'queue-h100.db'}"
    text = "\n".join(summary_lines(_results(outs, store)))
    assert "h100-2:0-7 h100-3:0-3" in text  # all 12 GPUs, compact, nothing cut
    assert "9 assigned, 15 deferred" in text and "{" not in text
    assert "and 16 more" in text  # 8 of 24 outcomes printed
    outs[:9] = []  # deferred ones on screen: the reason with what it means
    text = "\n".join(summary_lines(_results(outs, store)))
    assert "deferred  insufficient_gpus: needs 12 GPUs, fewer are free" in text
    assert f"bandpilot queue list --store {store}" in text or f"bandpilot queue status --store {store}" in text
    assert "sqlite:///.bandpilot" not in text  # a relative hint creates a store wherever it runs


def test_summary_counts_every_status_in_a_stable_order():
    from flows.pipeline import batch_counts

    outs = [{"status": s} for s in ["deferred", "assigned", "rejected", "deferred", "assigned", "assigned"]]
    assert batch_counts(outs) == "3 assigned, 2 deferred, 1 rejected"
    assert batch_counts([]) == "no requests"


def test_truth_line_is_short_and_says_each_thing_once(tmp_path, monkeypatch):
    from flows._common import cluster_sources, truth_line

    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path))
    (tmp_path / "params" / "clusters").mkdir(parents=True)
    for f in ("h100.yaml", "het4mix.yaml"):
        (tmp_path / "params" / "clusters" / f).write_text((ROOT / "params" / "clusters" / f).read_text())
    entries = yaml.safe_load((ROOT / "params" / "pipeline.yaml").read_text())["clusters"]
    line = truth_line(cluster_sources(entries))
    assert line.startswith("truth: EMULATED") and len(line) <= 160, (len(line), line)
    assert line.count("h100.yaml") == 1 and line.count("het4mix.yaml") == 1
    assert "h100-16m" in line and "het4mix-16m" in line and "not found" in line
