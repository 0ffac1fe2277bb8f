"""Run under BandPilot 0.1 (the flat layout, extracted from git history by ``test_compat.py``):
write what 0.1 wrote - a model directory, MLflow's pickled pyfunc wrapper, a queue store mid-life -
plus what 0.1 read back from them, for the packaged layout to load and compare.

    python legacy_writer.py OUT_DIR      (cwd = the 0.1 source tree, PYTHONPATH = it)
"""

import json
import sys
from pathlib import Path

import cloudpickle

from bandpilot import queue as q  # 0.1 module paths, on purpose
from bandpilot.cluster import load_cluster
from bandpilot.dispatcher import Dispatcher
from bandpilot.fabric import EmulatorFabric, make_fabric
from bandpilot.registry import SurrogatePyfunc
from bandpilot.training import fabric_dataset, train

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
spec = load_cluster("params/clusters/het4mix.yaml")
tiny = {"epochs": 4, "layers": 1, "hidden": 8, "heads": 2, "prior_steps": 20, "n_train": 80, "threads": 1,
        "split": "random", "replay_size": 16}
res = train(fabric_dataset(EmulatorFabric(spec), n_cross=120, seed=3), tiny, plots=False)
res.surrogate.save(out / "model")
allocs = [["a800:0", "a800:1"], ["v100:0", "a6000:1", "a6000:2"], ["rtx4090:0", "a800:3", "v100:5", "a6000:7"]]
pred = [float(x) for x in res.surrogate.predict(allocs)]
(out / "model_predictions.json").write_text(json.dumps({"allocations": allocs, "busbw": pred}))
(out / "python_model.pkl").write_bytes(cloudpickle.dumps(SurrogatePyfunc()))

store = q.open_store(f"sqlite:///{out / 'queue.db'}")
h100 = load_cluster("params/clusters/h100.yaml")
store.init_cluster(h100)
q.submit(store, [{"id": f"job-{i}", "k": k, "tenant": t}
                 for i, (k, t) in enumerate([(8, "a"), (4, "b"), (2, "a"), (16, "b"), (1, "c"), (12, "a")])])
q.run_batch(store, Dispatcher(make_fabric(h100)))
q.release(store, "job-0")
q.drain(store, "h100-3:7", reason="legacy fixture")
(out / "queue_status.json").write_text(json.dumps(q.status(store), default=str))
store.engine.dispose()
