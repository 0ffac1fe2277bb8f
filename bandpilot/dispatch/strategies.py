"""Which strategies can place a request? A registry name -> :class:`Strategy`, each marked
model-guided, baseline or oracle, with its help text. :meth:`Dispatcher.select
<bandpilot.dispatch.dispatcher.Dispatcher.select>`, the evaluation, the promotion gate, the
simulator and the CLI help all read it.

A strategy's ``run`` gets a :class:`~bandpilot.dispatch.builtin_strategies.Job` (the
constraint-filtered free GPUs, ``k``, the state, the guiding model and its contention predictor)
and returns a per-host GPU mask (the dispatcher predicts it) or a search's
:class:`~bandpilot.dispatch.search.Found`. A new strategy is one module with its function plus one
:func:`register` call::

    register(Strategy("mine", BASELINE, "my baseline", "mypackage.mine:select"))

``run`` is a callable or a ``"module:function"`` path imported on first use, so listing the
strategies (CLI help) imports no numpy. ``defaults`` says where a strategy runs when nobody names
the algorithms: ``evaluate`` (the ``bandpilot evaluate`` matrix), ``gate`` (the promotion gate)
and ``simulate`` (the simulator's choices). Oracles need the true fabric (``fabric=``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

from bandpilot.errors import PlacementError

if TYPE_CHECKING:
    from bandpilot.dispatch.builtin_strategies import Job

__all__ = [
    "BASELINE", "KINDS", "MODEL_GUIDED", "ORACLE", "Strategy", "get", "help_text", "label", "names",
    "pricing", "pricings", "register", "register_pricing",
]

MODEL_GUIDED, BASELINE, ORACLE = "model-guided", "baseline", "oracle"
KINDS = (MODEL_GUIDED, BASELINE, ORACLE)


@dataclass(frozen=True)
class Strategy:
    name: str
    kind: str  # MODEL_GUIDED | BASELINE | ORACLE
    help: str
    target: Union[str, Callable[["Job"], Any]]  # the run function, or "module:function"
    label: str = ""  # report label (default: the name)
    defaults: frozenset[str] = field(default_factory=frozenset)  # evaluate | gate | simulate

    def run(self, job: "Job") -> Any:
        """A per-host mask (numpy array) or a :class:`~bandpilot.dispatch.search.Found`."""
        fn = self.target
        if isinstance(fn, str):
            module, _, attr = fn.partition(":")
            fn = getattr(importlib.import_module(module), attr)
        return fn(job)


_REGISTRY: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.kind not in KINDS:
        raise ValueError(f"strategy {strategy.name!r}: kind must be one of {KINDS}")
    if strategy.name in _REGISTRY:
        raise ValueError(f"strategy {strategy.name!r} is already registered")
    _REGISTRY[strategy.name] = strategy
    return strategy


def names(kind: str | None = None, default_for: str | None = None) -> tuple[str, ...]:
    """Registered names (all, of one kind, or run by default for ``evaluate``/``gate``/``simulate``).
    All names come grouped by kind (model-guided, baselines, oracles); a filter keeps registration order."""
    if kind is None and default_for is None:
        return tuple(n for k in KINDS for n, s in _REGISTRY.items() if s.kind == k)
    return tuple(n for n, s in _REGISTRY.items()
                 if (kind is None or s.kind == kind) and (default_for is None or default_for in s.defaults))


def get(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PlacementError("invalid_request", f"unknown algorithm {name!r}; choose from {list(names())}") from None


def help_text(default_for: str | None = None) -> str:
    """One line for CLI help: ``name (kind): help; ...``."""
    return "; ".join(f"{n} ({_REGISTRY[n].kind}): {_REGISTRY[n].help}" for n in names(default_for=default_for))


def label(name: str) -> str:
    s = _REGISTRY.get(name)
    return (s.label or s.name) if s else name



# ---- the built-in strategies (they run in :mod:`bandpilot.dispatch.builtin_strategies`) ----------
_B = "bandpilot.dispatch.builtin_strategies:"
_ALL = frozenset({"evaluate", "gate", "simulate"})
for _s in (
    Strategy("bandpilot", MODEL_GUIDED, "count-vector search when tractable, else EHA + PTS + local search",
             _B + "bandpilot", "BandPilot", _ALL),
    Strategy("eha", MODEL_GUIDED, "the paper's host-elimination search on its own", _B + "eha", "EHA",
             frozenset({"evaluate"})),
    Strategy("pts", MODEL_GUIDED, "the paper's pruned tree search on its own", _B + "pts", "PTS",
             frozenset({"evaluate"})),
    Strategy("ideal", ORACLE, "bandpilot guided by the true fabric (Ideal-BP)", _B + "bandpilot", "Ideal-BP",
             frozenset({"evaluate", "gate"})),
    Strategy("topo", BASELINE, "Slurm-like compactness: fewest hosts, best fit, best link classes",
             _B + "topo", "Topo", _ALL),
    Strategy("default", BASELINE, "proximity: host order, then NUMA/index order", _B + "default", "Default", _ALL),
    Strategy("random", BASELINE, "k free GPUs at random (seeded)", _B + "random", "Random", _ALL),
    Strategy("block", BASELINE, "Slurm topology/block-like: best-fit block (NVLink domain), then compact",
             _B + "block", "Block", frozenset({"simulate"})),
    Strategy("exact", ORACLE, "true optimum by enumeration (raises if intractable)", _B + "exact", "Exact"),
):
    register(_s)


# ---- pricings: how a model-guided search values a candidate -------------------------------------
# A pricing is a factory ``(model, state) -> ContentionPredictor`` (``"module:callable"``, imported on
# first use): the search's scores come from it, so a new notion of "what a placement is worth"
# plugs in here without touching any search loop. Baselines and oracles keep today's contention.
_PRICINGS: dict[str, tuple[str, Union[str, Callable[..., Any]]]] = {}


def register_pricing(name: str, help: str, target: Union[str, Callable[..., Any]]) -> None:
    if name in _PRICINGS:
        raise ValueError(f"pricing {name!r} is already registered")
    _PRICINGS[name] = (help, target)


def pricing(name: str) -> Callable[..., Any]:
    """The predictor factory of a registered pricing; an unknown name is a one-line error."""
    try:
        _, fn = _PRICINGS[name]
    except KeyError:
        raise PlacementError("invalid_request", f"unknown pricing {name!r}; choose from {list(_PRICINGS)}") from None
    if isinstance(fn, str):
        module, _, attr = fn.partition(":")
        fn = getattr(importlib.import_module(module), attr)
    return fn


def pricings() -> tuple[str, ...]:
    """Registered pricing names."""
    return tuple(_PRICINGS)


register_pricing("now", "against the jobs running now (the paper's B(S, tau))",
                 "bandpilot.dispatch.contention:ContentionPredictor")
register_pricing("lifetime", "over the estimated run time: co-tenants that end, later cross-host jobs on the hosts, "
                 "the slowdown imposed on co-tenants (needs the queue's outlook; else as now)",
                 "bandpilot.dispatch.lifetime:pricing_predictor")
register_pricing("lifetime-queue", "lifetime, and among near-equal candidates the one that leaves the next pending "
                 "gangs their best placement", "bandpilot.dispatch.lifetime:queue_pricing_predictor")
