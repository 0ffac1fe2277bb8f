"""What would profiling a fabric measure? Synthetic datasets: exact stage-1 rows of every host
plus random cross-host allocations, measured on an emulator (tests, benchmarks, demos)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bandpilot.errors import DataError

if TYPE_CHECKING:
    from bandpilot.data.dataset import Dataset


def random_cross_masks(spec: Any, n: int, seed: int = 0, max_hosts: int | None = None) -> np.ndarray:
    """``n`` distinct random cross-host allocations: 2..max_hosts hosts, a random non-empty subset on each."""
    rng = np.random.default_rng(seed)
    hmax = min(spec.n_hosts, max_hosts or spec.n_hosts)
    if hmax < 2:
        raise DataError(f"cluster {spec.name!r} has one host: no cross-host allocations")
    out: dict[bytes, np.ndarray] = {}
    full = spec.full_masks
    tries = 0
    while len(out) < n and tries < 50 * n + 1000:
        tries += 1
        k = int(rng.integers(2, hmax + 1))
        hosts = rng.choice(spec.n_hosts, size=k, replace=False)
        m = np.zeros(spec.n_hosts, dtype=np.int64)
        m[hosts] = rng.integers(1, full[hosts] + 1)
        out.setdefault(m.tobytes(), m)
    return np.array(list(out.values()), dtype=np.int64).reshape(-1, spec.n_hosts)


def stage1_masks(spec: Any) -> np.ndarray:
    """Every subset of >= 2 GPUs of every host, as mask rows."""
    rows = []
    for h, host in enumerate(spec.hosts):
        sub = np.arange(1, 1 << host.n_gpus, dtype=np.int64)
        sub = sub[np.bitwise_count(sub) >= 2]
        m = np.zeros((sub.size, spec.n_hosts), dtype=np.int64)
        m[:, h] = sub
        rows.append(m)
    return np.concatenate(rows)


def fabric_dataset(fabric: Any, n_cross: int = 400, seed: int = 0, cross_masks: np.ndarray | None = None,
                   noisy: bool = True) -> "Dataset":
    """A dataset from a fabric: exact stage-1 rows for every subset of every host plus ``n_cross``
    random cross-host allocations (``fabric.measure`` when ``noisy``, else the truth)."""
    import pandas as pd

    from bandpilot.data.dataset import Dataset, frame_from_masks

    spec = fabric.spec
    s1 = stage1_masks(spec)
    b1 = fabric.stage1[np.argmax(s1 != 0, axis=1), s1.max(axis=1)]
    cm = random_cross_masks(spec, n_cross, seed) if cross_masks is None else np.asarray(cross_masks, dtype=np.int64)
    bc = fabric.measure(cm, seed=seed) if noisy else fabric.bandwidth_masks(cm)
    kw = dict(collective=spec.collective, bytes_=spec.message_bytes)
    frame = pd.concat([frame_from_masks(spec, s1, b1, source="stage1", **kw),
                       frame_from_masks(spec, cm, bc, source="cross", **kw)], ignore_index=True)
    return Dataset(spec, frame)
