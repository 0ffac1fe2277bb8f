"""Placement constraints: ONE type from the request to the GPUs.

A request's constraints are parsed once (:meth:`Constraints.parse`, from the API body, a JSONL
line, a stored row's JSON or a dispatcher call), validated against the cluster once
(:meth:`Constraints.validate`), then used to filter the free GPUs (:meth:`Constraints.filter`, the
Kubernetes *Filter* step) and to check what a search returned (:meth:`Constraints.check_selection`).
The queue, the store (``to_dict`` JSON), the placer, the dispatcher and the simulator all use it.

Built-in constraints:

=============  ==================================================================================
single_host    all ``k`` GPUs on one host
single_domain  all ``k`` GPUs in one domain (hosts without a domain form one implicit domain)
allowed_hosts  only these hosts (a list, or one comma-separated string)
allowed_gpus   only these GPUs (``host:index`` ids; on ``allowed_hosts`` if both are given)
min_gbps       reject (defer) placements predicted below this many GB/s (a number > 0)
whole_domains  only domains that are wholly free
segment        NVLink-domain clusters: each domain's share a multiple of it (it must divide ``k``)
=============  ==================================================================================

A new constraint is one module with a :class:`ConstraintRule` subclass that calls
:func:`register_constraint`, plus one line naming the module in :data:`PLUGINS`: its value is
parsed, stored, validated, filtered and checked with the built-ins (it lives in
:attr:`Constraints.extra`). Every error is a
:class:`~bandpilot.errors.PlacementError` with ``reason="invalid_request"`` (a
:class:`~bandpilot.errors.RequestError`), one line naming where.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np

from bandpilot.errors import PlacementError, SpecError
from bandpilot.topology.cluster import ClusterSpec, popcount
from bandpilot.topology.domains import domain_index

__all__ = ["BUILTIN", "ConstraintRule", "Constraints", "Feasible", "constraint_keys", "register_constraint"]

#: Built-in constraint keys, in their stored order.
BUILTIN = ("single_host", "single_domain", "allowed_hosts", "allowed_gpus", "min_gbps", "whole_domains", "segment")


def _bad(message: str) -> PlacementError:
    return PlacementError("invalid_request", message)


class ConstraintRule:
    """One registered (non-built-in) constraint. Override what it needs; every hook has a no-op default.

    ``parse`` normalises the JSON value (raise :func:`_bad`-style errors naming ``where``);
    ``to_json`` is what the store keeps; ``validate`` checks it against the cluster for ``k``;
    ``filter`` restricts the free mask (per-host bitmasks) before the search; ``check`` returns
    what is wrong with a returned allocation (``None``: fine)."""

    key: str = ""
    help: str = ""

    def parse(self, value: Any, where: str) -> Any:
        return value

    def to_json(self, value: Any) -> Any:
        return value

    def validate(self, value: Any, spec: ClusterSpec, k: int, who: str) -> None:
        return None

    def filter(self, value: Any, spec: ClusterSpec, free: np.ndarray, k: int) -> np.ndarray:
        return free

    def check(self, value: Any, spec: ClusterSpec, mask: np.ndarray) -> str | None:
        return None


_RULES: dict[str, ConstraintRule] = {}
#: Modules that register constraints, imported on first use (a new constraint: its module + one line here).
PLUGINS: tuple[str, ...] = ()
_plugins_loaded = False


def _rules() -> dict[str, ConstraintRule]:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for module in PLUGINS:
            importlib.import_module(module)
    return _RULES


def register_constraint(rule: ConstraintRule) -> ConstraintRule:
    """Add a constraint (one registration per module); its key must be new."""
    if not rule.key or rule.key in BUILTIN or rule.key in _RULES:
        raise ValueError(f"constraint {rule.key!r} is empty or already registered")
    _RULES[rule.key] = rule
    return rule


def constraint_keys() -> tuple[str, ...]:
    """Every known constraint key: the built-ins, then the registered ones."""
    return BUILTIN + tuple(_rules())


@dataclass(frozen=True)
class Feasible:
    """What :meth:`Constraints.filter` leaves: ``eligible`` (free and allowed), ``free`` (after every
    constraint) and ``n`` (GPUs in ``free``); ``short`` names the first check that left fewer
    than ``k`` (``"allowed"``, ``"single_host"``, ``"single_domain"``, ``"filtered"``) or is None."""

    eligible: np.ndarray
    free: np.ndarray
    n: int
    short: str | None
    per_domain: np.ndarray  # eligible GPUs per domain


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """Placement constraints of one request (see the module docstring)."""

    single_host: bool = False
    single_domain: bool = False
    allowed_hosts: tuple[str, ...] | None = None
    allowed_gpus: tuple[str, ...] | None = None
    min_gbps: float | None = None
    whole_domains: bool = False
    segment: int | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=())  # registered constraints, by key

    # ---- parse / store -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The stored JSON form (only what is set)."""
        out: dict[str, Any] = {}
        for key in ("single_host", "single_domain"):
            if getattr(self, key):
                out[key] = True
        for key in ("allowed_hosts", "allowed_gpus"):
            if getattr(self, key) is not None:
                out[key] = list(getattr(self, key))
        if self.min_gbps is not None:
            out["min_gbps"] = self.min_gbps
        if self.whole_domains:
            out["whole_domains"] = True
        if self.segment is not None:
            out["segment"] = self.segment
        for key, value in self.extra:
            out[key] = _RULES[key].to_json(value)
        return out

    @cached_property
    def key(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def parse(cls, doc: Any, where: str = "constraints") -> Constraints:
        """The one parser: ``None``, a :class:`Constraints` or a JSON object (stored rows too)."""
        if doc is None:
            return cls()
        if isinstance(doc, Constraints):
            return doc
        if not isinstance(doc, Mapping):
            raise _bad(f"{where}: 'constraints' must be an object")
        known = constraint_keys()
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise _bad(f"{where}: unknown constraint {unknown[0]!r} (known: {', '.join(known)})")
        flags: dict[str, Any] = {}
        for key in ("single_host", "single_domain", "whole_domains"):
            v = doc.get(key, False)
            if not isinstance(v, bool):
                raise _bad(f"{where}: constraint {key!r} must be true or false, got {v!r}")
            flags[key] = v
        lists: dict[str, Any] = {key: _name_list(doc.get(key), key, where) for key in ("allowed_hosts", "allowed_gpus")}
        mg = doc.get("min_gbps")
        if mg is not None:
            if isinstance(mg, bool) or not isinstance(mg, (int, float)) or not math.isfinite(mg) or mg <= 0:
                raise _bad(f"{where}: constraint 'min_gbps' must be a positive number, got {mg!r}")
            mg = float(mg)
        seg = doc.get("segment")
        if seg is not None and (isinstance(seg, bool) or not isinstance(seg, (int, np.integer)) or seg < 1):
            raise _bad(f"{where}: constraint 'segment' must be a positive integer (GPUs), got {seg!r}")
        extra = tuple(
            (key, _RULES[key].parse(doc[key], where)) for key in _rules() if doc.get(key) is not None
        )
        return cls(**flags, **lists, min_gbps=mg, segment=None if seg is None else int(seg), extra=extra)

    from_dict = parse

    def names(self) -> list[str]:
        """The set constraints that restrict where GPUs may come from (for messages)."""
        what = []
        if self.allowed_hosts is not None:
            what.append(f"allowed_hosts ({len(self.allowed_hosts)} hosts)")
        if self.allowed_gpus is not None:
            what.append(f"allowed_gpus ({len(self.allowed_gpus)} GPUs)")
        for key in ("single_host", "whole_domains", "single_domain"):
            if getattr(self, key):
                what.append(key)
        return what + [key for key, _ in self.extra]

    # ---- validate against the cluster -------------------------------------------------------
    def allowed_mask(self, spec: ClusterSpec) -> np.ndarray | None:
        """Per-host bitmask of the GPUs ``allowed_hosts``/``allowed_gpus`` permit (None: all)."""
        mask = None
        if self.allowed_hosts is not None:
            mask = np.zeros(spec.n_hosts, dtype=np.int64)
            for h in self.allowed_hosts:
                i = spec.host_index[h]
                mask[i] = spec.full_masks[i]
        if self.allowed_gpus is not None:
            g = spec.to_mask(self.allowed_gpus)
            mask = g if mask is None else (mask & g)
        return mask

    def validate(self, spec: ClusterSpec, k: int, who: str = "request", loc: str = "") -> None:
        """Cluster checks, once per request (the queue, at submit): :meth:`check_names`, and the
        constraints leave at least ``k`` GPUs even on an idle cluster. ``loc`` + ``who`` prefix
        the message (``"file:3: "`` + ``"request 'r1'"``)."""
        self.check_names(spec, k, who, loc)
        who = loc + who
        mask = self.allowed_mask(spec)
        per_host = spec.gpus_per_host.astype(np.int64) if mask is None else popcount(mask)
        total = int(per_host.sum())
        if total < k:
            raise _bad(f"{who}: k={k} but the constraints allow only {total} GPUs")
        if self.single_host and int(per_host.max()) < k:
            raise _bad(f"{who}: k={k} cannot fit on a single host (largest allowed host has {int(per_host.max())})")
        if self.single_domain or self.whole_domains or self.segment is not None:
            # only for domain constraints: built for every request it was a third of validating one (profiled)
            dom = domain_index(spec.hosts)[0]
            if self.single_domain:
                best = int(np.bincount(dom, weights=per_host).max())
                if best < k:
                    raise _bad(f"{who}: k={k} cannot fit in a single domain (largest allowed has {best} GPUs)")
            if self.whole_domains or self.segment is not None:
                self._validate_domain_units(spec, k, per_host, dom, who)
        for key, value in self.extra:
            _RULES[key].validate(value, spec, k, who)

    def check_names(self, spec: ClusterSpec, k: int, who: str = "constraints", loc: str = "") -> None:
        """What every caller checks (the dispatcher too): ``k`` fits the cluster, the hosts and
        GPUs named exist, the allowed GPUs sit on allowed hosts, ``segment`` has NVLink domains
        and divides ``k``."""
        label, who = f"{who} allowed_gpus", loc + who
        if k > spec.n_gpus:
            raise _bad(f"{who}: k={k} exceeds the cluster size ({spec.n_gpus} GPUs in {spec.name!r})")
        for h in self.allowed_hosts or ():
            if h not in spec.host_index:
                hint = " (GPU ids go in allowed_gpus)" if ":" in h else ""
                raise _bad(f"{who}: unknown host {h!r} in allowed_hosts{hint}")
        if self.allowed_gpus is not None:
            try:
                spec.to_mask(self.allowed_gpus, label)
            except SpecError as exc:
                raise _bad(f"{loc}{exc}") from None
            if self.allowed_hosts is not None:
                outside = [g for g in self.allowed_gpus if g.rpartition(":")[0] not in set(self.allowed_hosts)]
                if outside:
                    raise _bad(f"{who}: allowed_gpus {outside[0]!r} is not on an allowed host")
        if self.segment is not None:
            if not spec.nvlink_domains:
                raise _bad(f"{who}: constraint 'segment' needs NVLink domains; cluster {spec.name!r} has none")
            if k % self.segment:
                raise _bad(f"{who}: segment {self.segment} does not divide k={k}")

    def _validate_domain_units(self, spec: ClusterSpec, k: int, per_host: np.ndarray, dom: np.ndarray, who: str) -> None:
        size = np.bincount(dom, weights=spec.gpus_per_host)
        if self.segment is not None and self.segment > int(size.max()):
            raise _bad(f"{who}: segment {self.segment} is larger than any domain ({int(size.max())} GPUs)")
        if self.whole_domains:
            whole = np.bincount(dom, weights=per_host) == size
            total = int(size[whole].sum())
            if k > total:
                raise _bad(
                    f"{who}: whole_domains request k={k} is larger than the {int(whole.sum())} whole domains "
                    f"it may use ({total} GPUs)"
                )

    # ---- filter the free GPUs, check a selection --------------------------------------------
    def filter(self, spec: ClusterSpec, free: np.ndarray, k: int, domains: np.ndarray,
               allowed: np.ndarray | None = None) -> Feasible:
        """The free GPUs the constraints leave (the scheduler's Filter step). ``domains`` is the
        domain index per host; ``allowed`` a cached :meth:`allowed_mask`."""
        if allowed is None and (self.allowed_hosts is not None or self.allowed_gpus is not None):
            allowed = self.allowed_mask(spec)
        elig = free if allowed is None else (free & allowed)
        per_host = popcount(elig)
        n_dom = int(domains.max()) + 1 if domains.size else 1
        per_dom = np.bincount(domains, weights=per_host, minlength=n_dom).astype(np.int64)
        short = None
        if int(per_host.sum()) < k:
            short = "allowed"
        elif self.single_host and int(per_host.max()) < k:
            short = "single_host"
        elif self.single_domain and int(per_dom.max()) < k:
            short = "single_domain"
        out = elig
        if self.single_host:
            out = np.where(per_host >= k, out, 0)
        if self.whole_domains or self.single_domain:
            per = np.bincount(domains, weights=popcount(out), minlength=n_dom)
            if self.whole_domains:  # every GPU of the domain free (and allowed)
                size = np.bincount(domains, weights=spec.gpus_per_host, minlength=per.size)
                out = np.where((per == size)[domains], out, 0)
                per = np.where(per == size, per, 0)
            if self.single_domain:
                out = np.where((per >= k)[domains], out, 0)
        for key, value in self.extra:
            out = _RULES[key].filter(value, spec, out, k)
        n = int(popcount(out).sum())
        if short is None and n < k:
            short = "filtered"
        return Feasible(elig, out, n, short, per_dom)

    def check_selection(self, spec: ClusterSpec, gpus: Sequence[str], eligible: np.ndarray, k: int,
                        domains: np.ndarray, mask: np.ndarray | None = None) -> str | None:
        """What is wrong with a returned allocation (``None``: nothing): k distinct GPUs, all
        free and allowed, on one host / in one domain when asked, and the registered checks.
        ``mask``: the per-host masks ``gpus`` were named from (``spec.from_mask``), checked as
        they are instead of parsing the names back (~0.1 ms of a 32-GPU decision)."""
        if mask is not None:
            n = int(popcount(np.asarray(mask, dtype=np.int64)).sum())
            if n != k or len(gpus) != k:
                return f"returned {n} GPUs ({len(gpus)} named) for k={k}"
            mask = np.asarray(mask, dtype=np.int64)
        else:
            gpus = list(gpus)
            if len(gpus) != k or len(set(gpus)) != len(gpus):
                return f"returned {len(gpus)} GPUs ({len(set(gpus))} distinct) for k={k}"
            try:
                mask = spec.to_mask(gpus)
            except SpecError as exc:
                return str(exc)
        if np.any(mask & ~eligible):
            return f"returned GPUs that are not free or not allowed: {spec.from_mask(mask & ~eligible)[:4]}"
        if self.single_host and int((mask != 0).sum()) != 1:
            return "returned GPUs on several hosts for a single_host request"
        if self.single_domain and len(set(domains[mask != 0].tolist())) != 1:
            return "returned GPUs in several domains for a single_domain request"
        for key, value in self.extra:
            bad = _RULES[key].check(value, spec, mask)
            if bad:
                return bad
        return None


def _name_list(v: Any, key: str, where: str) -> tuple[str, ...] | None:
    if v is None:
        return None
    if isinstance(v, str):
        v = [x for x in v.split(",") if x.strip()]
    if isinstance(v, tuple):
        v = list(v)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
        raise _bad(f"{where}: constraint {key!r} must be a non-empty list of names")
    vals = [x.strip() for x in v]
    if len(set(vals)) != len(vals):
        dup = next(x for x in vals if vals.count(x) > 1)
        raise _bad(f"{where}: constraint {key!r} lists {dup!r} twice")
    return tuple(vals)
