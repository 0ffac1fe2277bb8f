"""The intra-host link matrix of ``nvidia-smi topo -m``: which link class joins each GPU pair (and
how many NVLinks), parsed from the tool's text output or the compact rows embedded in artifacts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bandpilot.errors import SpecError

#: Link classes of ``nvidia-smi topo -m``, best first. NV# carries its link count separately.
LINK_CLASSES = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
MAX_GPUS_PER_HOST = 16  # stage-1 tables have 2**n entries per host

_TOPO_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


@dataclass(frozen=True)
class Topology:
    """Intra-host link matrix: ``links[i][j]`` is a class from :data:`LINK_CLASSES`, ``nvlinks`` the NV count."""

    links: tuple[tuple[str, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    numa: tuple[int, ...] | None = None

    @property
    def n(self) -> int:
        return len(self.links)

    def as_rows(self) -> list[str]:
        """Compact text form (one row per GPU) used when a spec is embedded in a model artifact."""
        out = []
        for i in range(self.n):
            cells = [
                f"NV{self.nvlinks[i][j]}" if self.links[i][j] == "NV" else self.links[i][j]
                for j in range(self.n)
            ]
            out.append(" ".join(cells))
        return out


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    """Parse an ``nvidia-smi topo -m`` matrix (tab/space separated or a Markdown table).

    NIC rows/columns and the affinity columns are ignored, except NUMA affinity which the
    Default (proximity) baseline uses for its fill order.
    """
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    numa: dict[int, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or set(line) <= set("|-: "):
            continue
        cells = [c for c in re.split(r"[|\s]+", line) if c]
        if not cells:
            continue
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = cells
            continue
        label = cells[0]
        m = re.fullmatch(r"GPU(\d+)", label)
        if not m:
            continue
        idx = int(m.group(1))
        gpu_cols = [c for c in header if re.fullmatch(r"GPU\d+", c)]
        # Markdown tables repeat the corner label "GPU0" as the first header cell.
        if len(gpu_cols) > 1 and gpu_cols[0] == gpu_cols[1]:
            gpu_cols = gpu_cols[1:]
        n = len(gpu_cols)
        vals = cells[1 : 1 + n]
        if len(vals) < n:
            raise SpecError(f"{source}:{lineno}: topology row {label} has {len(vals)} cells, expected {n}")
        for v in vals:
            if not _TOPO_CELL.match(v):
                raise SpecError(f"{source}:{lineno}: unknown link class {v!r} in row {label}")
        rows[idx] = vals
        rest = cells[1 + n :]
        # NUMA affinity is the last small integer column when present.
        ints = [c for c in rest if re.fullmatch(r"\d+", c)]
        if ints:
            numa[idx] = int(ints[-1])
    if not rows:
        raise SpecError(f"{source}: no GPU rows found in topology matrix")
    n = len(rows)
    if sorted(rows) != list(range(n)):
        raise SpecError(f"{source}: topology GPU rows are not GPU0..GPU{n - 1}")
    if n > MAX_GPUS_PER_HOST:
        raise SpecError(f"{source}: {n} GPUs per host exceeds the supported {MAX_GPUS_PER_HOST}")
    links: list[tuple[str, ...]] = []
    nv: list[tuple[int, ...]] = []
    for i in range(n):
        lrow, nrow = [], []
        for j, v in enumerate(rows[i][:n]):
            if i == j:
                lrow.append("X")
                nrow.append(0)
            elif v.startswith("NV"):
                lrow.append("NV")
                nrow.append(int(v[2:]))
            else:
                lrow.append("SYS" if v == "SOC" else v)
                nrow.append(0)
        links.append(tuple(lrow))
        nv.append(tuple(nrow))
    for i in range(n):
        for j in range(n):
            if links[i][j] != links[j][i]:
                raise SpecError(f"{source}: topology is not symmetric at GPU{i}/GPU{j}")
    numa_t = tuple(numa.get(i, 0) for i in range(n)) if numa else None
    return Topology(tuple(links), tuple(nv), numa_t)
