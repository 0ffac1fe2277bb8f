"""A job's parallelism shape: TP x PP x DP (EP inside the DP x TP plane) and what each axis moves per step.

    Shape.parse("tp=8,pp=4,dp=16,ep=8")
    Shape.parse({"tp": 8, "pp": 4, "dp": 16, "traffic": {"tp": 4e9}, "compute_ms": 900})
    Shape.parse({"tp": 4, "pp": 2, "dp": 8, "model": "llama-70b"})

``k = tp * pp * dp``. Ranks follow Megatron's order (TP fastest, then DP, then PP):
``rank = t + tp * (d + dp * p)``. EP groups are ``ep`` consecutive ranks of one PP stage (so an EP
group is part of a TP group when ``ep <= tp``, and whole TP groups of neighbouring DP replicas above).

Traffic per step (bytes each GPU of the axis moves) and compute time per step come from explicit
figures, or from a preset model (:data:`PRESETS`) through the usual Megatron volumes:

* TP: 4 all-reduces of one micro-batch's activations (``seq * hidden * 2`` bytes) per layer, over
  ``layers / pp`` layers and ``microbatches`` micro-batches;
* PP: one activation send forward and one gradient back per micro-batch and stage boundary;
* DP: one all-reduce of the bf16 gradients of the GPU's parameter shard (``2 * params / (tp * pp)``);
* EP (MoE): 4 all-to-alls of the routed tokens per MoE layer and micro-batch;
* compute: ``6 * params * tokens`` FLOPs at :data:`EFFECTIVE_TFLOPS` per GPU.

The presets are illustrative (public model dimensions, default batch sizes), meant to rank
placements, not to predict a real job's step time; give ``traffic`` / ``compute_ms`` for that.
Parsed once and validated with one-line errors (:class:`PlacementError` ``invalid_request``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from bandpilot.errors import PlacementError

AXES = ("tp", "pp", "dp", "ep")
#: Largest degree accepted on any axis (a sanity bound, not a cluster limit).
MAX_DEGREE = 65_536
#: Effective per-GPU throughput behind preset compute times (bf16, ~40 % MFU on an H100).
EFFECTIVE_TFLOPS = 400.0


@dataclass(frozen=True)
class Preset:
    params: float  # parameters
    hidden: int
    layers: int
    seq: int = 4096
    microbatches: int = 8  # per step, per DP replica (micro-batch size 1)
    moe_layers: int = 0
    topk: int = 0


#: Common model sizes (public dimensions).
PRESETS: dict[str, Preset] = {
    "llama-8b": Preset(8.0e9, 4096, 32),
    "llama-70b": Preset(70.6e9, 8192, 80),
    "llama-405b": Preset(405e9, 16384, 126),
    "gpt-175b": Preset(175e9, 12288, 96, seq=2048),
    "mixtral-8x7b": Preset(12.9e9, 4096, 32, moe_layers=32, topk=2),  # active parameters
}
DEFAULT_PRESET = "llama-8b"


def _err(msg: str) -> PlacementError:
    return PlacementError("invalid_request", msg)


@dataclass(frozen=True)
class Shape:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    #: bytes per step per GPU on each axis; axes left out come from the preset model
    traffic: Mapping[str, float] = field(default_factory=dict)
    compute_ms: float | None = None
    model: str | None = None

    KEYS = ("tp", "pp", "dp", "ep", "traffic", "compute_ms", "model")

    @property
    def k(self) -> int:
        return self.tp * self.pp * self.dp

    # ------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, value: Any, where: str = "shape") -> Shape:
        if isinstance(value, Shape):
            return value
        if isinstance(value, str):
            value = _parse_text(value, where)
        if not isinstance(value, Mapping):
            raise _err(f"{where} must be 'tp=T,pp=P,dp=D[,ep=E]' or a mapping, got {type(value).__name__}")
        unknown = sorted(set(map(str, value)) - set(cls.KEYS))
        if unknown:
            raise _err(f"{where}: unknown keys {unknown}; known: {list(cls.KEYS)}")
        deg = {a: _degree(value.get(a, 1), f"{where}.{a}") for a in AXES}
        k = deg["tp"] * deg["pp"] * deg["dp"]
        if k > MAX_DEGREE:
            raise _err(f"{where}: tp*pp*dp = {k} exceeds {MAX_DEGREE}")
        plane = deg["tp"] * deg["dp"]
        if plane % deg["ep"]:
            raise _err(f"{where}.ep={deg['ep']} must divide tp*dp={plane} (EP lives in the DP x TP plane)")
        traffic = parse_traffic(value.get("traffic") or {}, f"{where}.traffic")
        cms = value.get("compute_ms")
        if cms is not None:
            if isinstance(cms, bool) or not isinstance(cms, (int, float)) or not cms == cms or cms < 0 or cms == float("inf"):
                raise _err(f"{where}.compute_ms must be a finite number >= 0, got {cms!r}")
            cms = float(cms)
        model = value.get("model")
        if model is not None and (not isinstance(model, str) or model not in PRESETS):
            raise _err(f"{where}.model {model!r} is not a preset; choose from {sorted(PRESETS)}")
        return cls(deg["tp"], deg["pp"], deg["dp"], deg["ep"], traffic, cms, model)

    def check_k(self, k: int) -> None:
        if k != self.k:
            raise _err(f"shape tp={self.tp} x pp={self.pp} x dp={self.dp} = {self.k} GPUs, but k={k}")

    # ------------------------------------------------------------------------------------
    def volumes(self) -> tuple[dict[str, float], float]:
        """Bytes per step per GPU on each active axis (degree > 1) and the compute time (ms)."""
        p = PRESETS[self.model or DEFAULT_PRESET]
        act = p.seq * p.hidden * 2.0  # one micro-batch's activations, bf16
        layers = p.layers / self.pp
        derived = {
            "tp": 4 * act * layers * p.microbatches * 2 * (self.tp - 1) / self.tp,
            "pp": 2 * act * p.microbatches,
            "dp": 2 * (2.0 * p.params / (self.tp * self.pp)) * (self.dp - 1) / self.dp,
            "ep": 4 * act * max(p.topk, 1) * (p.moe_layers / self.pp) * p.microbatches * (self.ep - 1) / self.ep,
        }
        vol = {}
        for a in AXES:
            if getattr(self, a) > 1:
                vol[a] = float(self.traffic.get(a, derived[a]))
        if self.compute_ms is not None:
            cms = self.compute_ms
        else:
            tokens = p.seq * p.microbatches * self.dp
            cms = 6.0 * p.params * tokens / (self.k * EFFECTIVE_TFLOPS * 1e12) * 1e3
        return vol, float(cms)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep}
        if self.traffic:
            out["traffic"] = dict(self.traffic)
        if self.compute_ms is not None:
            out["compute_ms"] = self.compute_ms
        if self.model is not None:
            out["model"] = self.model
        return out

    def __str__(self) -> str:
        s = f"tp={self.tp},pp={self.pp},dp={self.dp}"
        return s + (f",ep={self.ep}" if self.ep > 1 else "")


_ITEM = re.compile(r"^\s*([a-z_]+)\s*=\s*([^=,]+?)\s*$")


def _pairs(text: str, where: str) -> dict[str, str]:
    if not text.strip():
        raise _err(f"{where} is empty")
    out: dict[str, str] = {}
    for part in text.split(","):
        m = _ITEM.match(part)
        if not m:
            raise _err(f"{where}: {part.strip()!r} is not KEY=VALUE")
        if m.group(1) in out:
            raise _err(f"{where}: {m.group(1)} given twice")
        out[m.group(1)] = m.group(2)
    return out


def _parse_text(text: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in _pairs(text, where).items():
        if key in AXES:
            if not re.fullmatch(r"[0-9]{1,9}", v):
                raise _err(f"{where}.{key} must be a positive integer, got {v!r}")
            out[key] = int(v)
        elif key == "model":
            out[key] = v
        elif key == "compute_ms":
            out[key] = _number(v, f"{where}.{key}")
        else:
            raise _err(f"{where}: unknown key {key!r}; known: {list(AXES) + ['compute_ms', 'model']}")
    return out


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
           "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40}


def _number(v: str, where: str) -> float:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)([a-z]*)", v.strip().lower())
    if not m or m.group(2) not in _SUFFIX:
        raise _err(f"{where} must be a number >= 0 (optional suffix K/M/G/T, KiB/MiB/GiB/TiB), got {v!r}")
    x = float(m.group(1)) * _SUFFIX[m.group(2)]
    if x == float("inf"):
        raise _err(f"{where} is too large: {v!r}")
    return x


def parse_traffic(value: Any, where: str = "traffic") -> dict[str, float]:
    """``tp=4GiB,dp=2e9`` or ``{"tp": 4294967296}``: bytes per step per GPU on each named axis."""
    if isinstance(value, str):
        return {a: _number(v, f"{where}.{a}") for a, v in _check_axes(_pairs(value, where), where).items()}
    if not isinstance(value, Mapping):
        raise _err(f"{where} must be 'tp=BYTES,...' or a mapping, got {type(value).__name__}")
    out = {}
    for a, v in _check_axes(dict(value), where).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or v < 0 or v == float("inf"):
            raise _err(f"{where}.{a} must be a finite number of bytes >= 0, got {v!r}")
        out[a] = float(v)
    return out


def _check_axes(d: dict[str, Any], where: str) -> dict[str, Any]:
    bad = sorted(str(a) for a in d if a not in AXES)
    if bad:
        raise _err(f"{where}: unknown axes {bad}; known: {list(AXES)}")
    return d


def _degree(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v > MAX_DEGREE:
        raise _err(f"{where} must be an integer in 1..{MAX_DEGREE}, got {v!r}")
    return int(v)
