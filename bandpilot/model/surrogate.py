"""What is a trained bandwidth surrogate ``B̂(S)`` to its users? Load, predict, save.

Single-host allocations never reach the network: they are the stage-1 table, exactly; cross-host
rows go through :mod:`~bandpilot.model.tokens` into a :mod:`~bandpilot.model.networks` net.
Everything the model needs at inference - stage-1 tables, the cluster spec, feature scaling
(buffers of the torch module) and weights - lives in one directory written by
:meth:`Surrogate.save`, which is also the artifact inside the MLflow model. This module imports
torch but never Lightning or MLflow at import time (MLflow only when a registry URI is loaded).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bandpilot.config import model_name
from bandpilot.topology.cluster import ClusterSpec, ranges, spec_from_dict
from bandpilot.errors import BandPilotError, ModelError
from bandpilot.model.canonical import PatternKeys
from bandpilot.model.domain_patterns import DomainPatterns
from bandpilot.model.domain_tokens import DomainView, Features, take_rows
from bandpilot.model.memory import PatternMemory, pattern_keys
from bandpilot.model.net_kinds import build_net
from bandpilot.model.prior_proxy import PriorProxy
from bandpilot.model.traced import TracedForward
from bandpilot.model.tokens import gpu_tokens, grouped_host_tokens, host_arrays, host_speed, host_tokens, to_torch

FORMAT_VERSION = 1
#: Forward passes of at most this many rows (one chunk: every search call) run on one intra-op
#: thread: on a busy 2-core machine torch's thread pool spins against the other processes (k = 4:
#: 400 ms vs 7 ms; 4 x 8 H100 at load 13, 20 decisions: max 8.2 s with the pool above 256 rows,
#: 0.35 s single-threaded). Bigger offline batches keep the pool.
SMALL_BATCH = 8192
#: Rows x tokens^2 of one forward chunk (128 Ki: 8,192 rows of up to 4 hosts, 128 rows of 32, 8 of
#: 128): the attention scores and the pairwise domain feature are that many cells per head /
#: feature. At 8 Mi cells a 2,000-job simulation on 128 hosts peaked at 2.2-2.4 GB RSS (one chunk
#: of super allocations held ~450 MB); at 128 Ki it peaks at 1.24 GB and runs no slower (41.7 vs
#: 50.7-52.6 CPU s, the same placements; ``python -m benchmarks simulate``). Below ~32 Ki per-chunk overhead shows.
FORWARD_TOKENS = 128 * 1024


class _threads_for:
    """One torch intra-op thread for a small batch, restored afterwards (no-op for big batches)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.prev = 0

    def __enter__(self) -> None:
        if self.rows <= SMALL_BATCH:
            self.prev = torch.get_num_threads()
            if self.prev != 1:
                torch.set_num_threads(1)

    def __exit__(self, *exc: Any) -> None:
        if self.prev > 1:
            torch.set_num_threads(self.prev)
CONFIG_FILE = "surrogate.json"
WEIGHTS_FILE = "weights.pt"
STAGE1_FILE = "stage1.npy"
REPLAY_FILE = "replay.npz"
PATTERNS_FILE = "domain_patterns.json"  # stage 1.5 of a 'domain' model


# ------------------------------------------------------------------------------------------
#: Prediction memo (:meth:`Surrogate._predict_model`): at most this many remembered inputs (~115
#: bytes each, ~120 MB when full; 1,000 simulated jobs on 128 hosts remember ~0.3 M); nets that are
#: not token-symmetric key rows by their bytes, on clusters up to this many hosts.
MEMO_ENTRIES = 1 << 20
MEMO_MAX_HOSTS = 4096
MEMO_KEY_BYTES = 64 * 1024 * 1024  # and at most this many bytes of keys (exact rows are 8 x hosts each)


class Surrogate:
    """A trained ``B̂(S)``: ``predict`` / ``predict_masks`` (the dispatcher's hot path), save/load."""

    def __init__(self, spec: ClusterSpec, stage1: np.ndarray, net: nn.Module, *, kind: str = "hierarchical",
                 meta: dict[str, Any] | None = None, replay: tuple[np.ndarray, np.ndarray] | None = None,
                 uri: str | None = None, name: str | None = None, model_version: str | None = None,
                 patterns: DomainPatterns | None = None) -> None:
        stage1 = np.asarray(stage1, dtype=np.float64)
        width = 1 << int(spec.gpus_per_host.max())
        if stage1.shape != (spec.n_hosts, width):
            raise ModelError(f"stage-1 tables have shape {stage1.shape}, cluster {spec.name!r} needs {(spec.n_hosts, width)}")
        self.spec = spec
        self.stage1 = stage1
        self.net = net.eval()
        self.kind = kind
        self.meta = dict(meta or {})
        self.replay = replay
        self.uri = uri
        self.name = name or model_name(spec.name)
        self.model_version = model_version
        self._hosts = host_arrays(spec)
        self._hosts["speed"] = host_speed(stage1, self._hosts["gtype"], spec.full_masks)
        self._max_gpus = int(spec.gpus_per_host.max())
        self._full = spec.full_masks
        self.memory: PatternMemory | None = None  # measured-pattern corrections (see bandpilot.model.memory)
        #: stage 1.5 of a 'domain' model: in-domain values by count pattern (its net sees domain tokens)
        self.patterns = patterns
        self._view: DomainView | None = None
        self._screen: PriorProxy | None = None  # screening_model(), built on first use
        #: the prediction memo (off: every cross-host row goes through the net - the reference path)
        self.memo_enabled = True
        #: merge identical tokens of a row before a token-symmetric net (off: the reference path)
        self.merge_tokens = True
        #: rows the net was actually run on since construction (memo misses; informational)
        self.forward_rows = 0

    def __repr__(self) -> str:
        return f"Surrogate({self.kind}, cluster={self.spec.name!r}, uri={self.uri!r}, version={self.model_version!r})"

    # -- features --------------------------------------------------------------------------
    def tokens(self, masks: np.ndarray, cols: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Raw padded tokens for (cross-host) mask rows, as the net consumes them (``cols``: a
        'domain' model's rows given on those host columns only)."""
        masks = np.asarray(masks, dtype=np.int64)
        if cols is not None:
            return self.domain_view.tokens(masks, cols)
        if self.kind == "naive":
            return gpu_tokens(masks, self._hosts, self._max_gpus)
        if self.kind == "domain":
            return self.domain_view.tokens(masks)
        return host_tokens(masks, np.bitwise_count(masks).astype(np.int64), self.stage1, self._hosts)

    @property
    def domain_view(self) -> DomainView:
        """Domain tokens and in-domain values ('domain' models; built on first use)."""
        if self._view is None or self._view.patterns is not self.patterns or self._view.stage1 is not self.stage1:
            if self.patterns is None:
                raise ModelError(f"model {self.name!r} of kind 'domain' has no stage-1.5 domain patterns")
            self._view = DomainView(self.spec, self.stage1, self._hosts, self.patterns)
        return self._view

    def net_rows(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """Which cross-host rows the net predicts (a 'domain' model: not those inside one NVLink domain)."""
        if self.kind != "domain":
            return np.ones(masks.shape[0], dtype=bool)
        return ~self.domain_view.inside(masks, cols)

    def _check_masks(self, masks: Any, cols: np.ndarray | None = None) -> np.ndarray:
        """``masks`` as int64 ``(n, n_hosts)`` rows (``cols``: ``(n, len(cols))`` rows on those hosts)."""
        try:
            masks = np.asarray(masks, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise ModelError("masks must be an integer array of per-host bitmasks") from None
        width = self.spec.n_hosts if cols is None else cols.size
        if masks.ndim == 1 and masks.size == width:
            masks = masks[None, :]
        if masks.ndim != 2 or masks.shape[1] != width:
            raise ModelError(f"masks have shape {masks.shape}; the model of {self.spec.name!r} needs (n, {width})")
        # one OR per column: a GPU outside its host (or a negative mask's sign bit) shows in it
        anyset = np.bitwise_or.reduce(masks, axis=0) if masks.shape[0] else np.zeros(width, dtype=np.int64)
        if np.any(anyset & ~(self._full if cols is None else self._full[cols])):
            nz = np.flatnonzero(masks.any(axis=0))
            hosts = nz if cols is None else cols[nz]
            sub = masks[:, nz]
            bad = (sub < 0) | ((sub & ~self._full[None, hosts]) != 0)
            r, h = (int(x[0]) for x in np.nonzero(bad))
            h = int(hosts[h])
            raise ModelError(f"mask row {r} sets GPUs host {self.spec.hosts[h].name!r} does not have ({int(masks[r, h])})")
        return masks

    # -- inference -------------------------------------------------------------------------
    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        """``B̂`` for rows of per-host masks: <= 1 GPU -> 0, one host -> stage 1, else the model."""
        return self._predict_rows(self._check_masks(masks), None)

    def predict_columns(self, masks: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """:meth:`predict_masks` of rows given on the sorted host columns ``cols`` only (every other
        host empty): the same values. A 'domain' model reads only the columns a row uses - a
        local-search batch on 10,008 GPUs is thousands of rows over ~1,000-2,000 of 2,502 trays,
        and densifying them cost more than the net; other kinds get the dense rows."""
        cols = np.asarray(cols, dtype=np.int64)
        if self.kind != "domain":
            masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
            full = np.zeros((masks.shape[0], self.spec.n_hosts), dtype=np.int64)
            full[:, cols] = masks
            return self.predict_masks(full)
        return self._predict_rows(self._check_masks(masks, cols), cols)

    def _predict_rows(self, masks: np.ndarray, cols: np.ndarray | None) -> np.ndarray:
        counts = np.bitwise_count(masks)
        used = counts > 0
        n_used = used.sum(axis=1)
        out = np.zeros(masks.shape[0])
        single = n_used == 1
        if single.any():
            hosts = np.arange(self.spec.n_hosts) if cols is None else cols
            out[single] = self.stage1[hosts[None, :], masks[single]].sum(axis=1)
        cross = np.flatnonzero(n_used >= 2)
        if cross.size == masks.shape[0]:  # a search's batch: no copy of its rows
            return self._predict_cross(masks, cols)
        if cross.size:
            out[cross] = self._predict_cross(masks[cross], cols)
        return out

    def _predict_cross(self, masks: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        # a domain model's in-domain test, memo, memory and forward read one reduction of the rows
        feats = self.domain_view.live_units(masks, cols) if self.kind == "domain" else None
        if feats is None or not (inside := self.domain_view.inside_of(feats)).any():
            return self._predict_net(masks, cols, feats)
        out = np.empty(masks.shape[0])  # rows inside one NVLink domain: stage 1.5, exactly as measured
        out[inside] = self.domain_view.inside_values(masks[inside], cols)
        if not inside.all():
            out[~inside] = self._predict_net(masks[~inside], cols, take_rows(feats, ~inside))
        return out

    def _predict_net(self, masks: np.ndarray, cols: np.ndarray | None, feats: Features | None) -> np.ndarray:
        """Model output of rows the net predicts, with the measured-pattern memory's correction."""
        keys = None if feats is None else self.domain_view.keys_of(*feats)
        out = self._predict_model(masks, keys, cols, feats)
        if self.memory is not None and len(self.memory):
            out = out * np.exp(self.memory.correction(self.pattern_keys(masks) if keys is None else keys))
        return out

    def pattern_keys(self, masks: np.ndarray) -> np.ndarray:
        if self.kind == "domain":
            # what the domain net reads: per-tray count patterns would mix rows that group their trays
            # into domains differently (held-out cross-domain MAPE 1.40 % with them, 1.33 % with these)
            return self.domain_view.keys(masks)
        return pattern_keys(masks, self._hosts["gtype"], self._max_gpus)

    def remember(self, masks: np.ndarray, busbw: np.ndarray) -> None:
        """Build the pattern memory from measured cross-host rows (model residuals, median per pattern)."""
        masks = self._check_masks(masks)
        self.memory = None
        net = self.net_rows(masks)
        masks, busbw = masks[net], np.asarray(busbw, dtype=np.float64)[net]
        resid = np.log(np.asarray(busbw, dtype=np.float64)) - np.log(self._predict_model(masks))
        self.memory = PatternMemory.build(self.pattern_keys(masks), resid)

    def _predict_model(self, masks: np.ndarray, keys: np.ndarray | None = None, cols: np.ndarray | None = None,
                       feats: Features | None = None) -> np.ndarray:
        """Model output for cross-host rows, remembered while the weights, the stage-1 tables and
        the mode stay the same: a scheduler or a simulation asks about the same inputs decision
        after decision. A token-symmetric net (:mod:`~bandpilot.model.canonical`) is asked once
        per canonical pattern - rows alike up to host order and to which tokens share a domain (each
        token's domain-mate count kept) share one forward row, within a call and across calls;
        other nets remember exact rows. ``cols``: a 'domain' model's rows on those host columns only;
        ``feats``: their :meth:`DomainView.live_units` (the tokens are built from them)."""
        if masks.shape[0] == 0 or not self.memo_enabled:
            return self._predict_uncached(masks, cols)
        rows = np.ascontiguousarray(masks, dtype=np.int64)
        if keys is None:
            keys = self._memo_keys(rows) if cols is None else self.domain_view.keys(rows, cols)
        if keys is None:
            return self._predict_uncached(masks)
        params = getattr(self, "_params", None)  # listing a module's parameters walks it: once per net
        if params is None or params[0] is not self.net:
            params = self._params = (self.net, list(self.net.parameters()))
        token = (id(self.stage1), self.kind, self.net.training, sum(p._version for p in params[1]))
        memo = getattr(self, "_memo", None)
        if memo is None or memo[0] != token:
            memo = (token, {})
            self._memo: tuple[Any, dict[Any, Any]] = memo
        table: dict[Any, Any] = memo[1]
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        vals = np.empty(uniq.size)
        ukeys = uniq.tolist()
        miss = []
        for i, key in enumerate(ukeys):
            v = table.get(key)
            if v is None:
                miss.append(i)
            else:
                vals[i] = v
        if miss:
            got = self._predict_uncached(rows[first[miss]], cols, None if feats is None else take_rows(feats, first[miss]))
            vals[miss] = got
            if len(table) + len(miss) > min(MEMO_ENTRIES, MEMO_KEY_BYTES // keys.dtype.itemsize):
                table.clear()
            for i, v in zip(miss, got.tolist()):
                table[ukeys[i]] = v
        return vals[inverse.ravel()]

    def _memo_keys(self, rows: np.ndarray) -> np.ndarray | None:
        """Memo keys of cross-host rows (canonical patterns, or the rows' bytes), None: no memo."""
        if self.kind == "domain":  # keyed by the domain tokens (bandpilot.model.domain_tokens)
            return self.domain_view.keys(rows)
        keyer = self._pattern_keyer()
        if keyer is not None:
            return keyer.keys(rows)
        if rows.shape[1] > MEMO_MAX_HOSTS:
            return None
        return rows.view(np.dtype((np.void, 8 * rows.shape[1]))).ravel()

    def _pattern_keyer(self) -> PatternKeys | None:
        """Canonical token ids of a token-symmetric hierarchical net (None for other nets)."""
        if self.kind != "hierarchical" or not getattr(self.net, "token_symmetric", False):
            return None
        keyer = getattr(self, "_keyer", None)
        if keyer is None or keyer[0] is not self.stage1:
            keyer = self._keyer = (self.stage1, PatternKeys(self.stage1, self._hosts, self._max_gpus))
        return keyer[1]

    def _predict_uncached(self, masks: np.ndarray, cols: np.ndarray | None = None, feats: Features | None = None) -> np.ndarray:
        if feats is not None:  # rows of distinct memo keys: no two share their (count, intra) columns
            return self._forward(masks, cols=cols, feats=feats)
        if self.kind in ("hierarchical", "domain") and masks.shape[0] > 64:
            # Identical (count, intra) rows predict identically: dedupe before the forward pass.
            counts = np.bitwise_count(masks).astype(np.int64)
            hosts = np.arange(self.spec.n_hosts) if cols is None else cols
            intra = self.stage1[hosts[None, :], masks]
            key = np.ascontiguousarray(np.concatenate([counts.astype(np.float64), intra], axis=1))
            keyv = key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))).ravel()
            _, first, inverse = np.unique(keyv, return_index=True, return_inverse=True)
            if first.size < masks.shape[0] * 0.8:
                return self._forward(masks[first], cols=cols)[inverse.ravel()]
        return self._forward(masks, cols=cols)

    def _forward(self, masks: np.ndarray, chunk: int = 8192, cols: np.ndarray | None = None,
                 feats: Features | None = None) -> np.ndarray:
        """Net output for rows, in chunks of at most ``chunk`` rows and :data:`FORWARD_TOKENS`
        squared-token cells: attention and the pairwise domain feature grow with rows x tokens^2,
        and a chunk of 8,192 super allocations over ~100 hosts each held GBs (the simulator's
        3.4 GB peak). Rows go in ascending token count, so short rows are not padded to long ones.
        A 'domain' model's tokens are the units a row uses, not its hosts: counted by hosts, a
        row over 1,000 trays (~30 domains) went through the net alone (``cols``: rows on those
        host columns only; ``feats``: their :meth:`DomainView.live_units`, packed per chunk)."""
        n = masks.shape[0]
        out = np.empty(n)
        self.forward_rows += n
        if n == 0:
            return out
        # A token-symmetric net gets each row's identical tokens merged, weighted by their number
        # (the same function: a drain row over 128 alike hosts is ~10 tokens, not 128, and attention
        # is quadratic in them); ``merge_tokens = False`` is the reference path.
        keyer = self._pattern_keyer() if self.merge_tokens and cols is None else None
        if keyer is not None:
            gr = keyer.groups(masks)
            n_tok = np.bincount(gr[0], minlength=n)
            g_start = np.concatenate([[0], np.cumsum(n_tok)])
        else:
            n_tok = self._token_counts(masks, cols) if feats is None else (feats[1]["cnt"] > 0).sum(axis=1)
        order = np.argsort(n_tok, kind="stable")
        with torch.inference_mode(), _threads_for(n):
            s = 0
            while s < n:
                t_max = int(n_tok[order[min(n, s + chunk) - 1]])
                rows = max(1, min(chunk, FORWARD_TOKENS // max(1, t_max * t_max)))
                idx = order[s : s + rows]
                if feats is not None:
                    tok = self.domain_view.pack(*take_rows(feats, idx))
                elif keyer is None:
                    tok = self.tokens(masks[idx], cols)
                else:  # this chunk's groups, renumbered to its rows
                    sel = ranges(g_start[idx], n_tok[idx])
                    sub = (np.repeat(np.arange(idx.size), n_tok[idx]), *(g[sel] for g in gr[1:]))
                    tok = grouped_host_tokens(masks[idx], sub, self.stage1, self._hosts)
                out[idx] = torch.exp(self._run_net(to_torch(tok))).double().numpy()
                s += rows
        return out

    def _run_net(self, tok: dict[str, torch.Tensor]) -> torch.Tensor:
        """The net on a token batch, through its traced copy once a layout repeats (:mod:`.traced`)."""
        run = getattr(self, "_traced", None)
        if run is None:
            run = self._traced = TracedForward()
        return run(self.net, tok)

    def inside_bound(self, units: np.ndarray, k: int) -> np.ndarray | None:
        """Per unit an upper bound on this model's value of any ``k``-GPU row over >= 2 trays of it
        ('domain' models: stage 1.5, see :meth:`DomainView.inside_bound`), or None; rows on one
        tray are its stage-1 value. A search may skip units whose bound cannot win."""
        if self.kind != "domain":
            return None
        return self.domain_view.inside_bound(units, k)

    def screening_model(self) -> Any:
        """A cheap stand-in of this model that a search may rank big candidate batches with (its
        own physics prior: :class:`~bandpilot.model.prior_proxy.PriorProxy`), or None: only a
        'domain' model offers one (its batches are thousands of wide rows)."""
        if self.kind != "domain" or not hasattr(self.net, "prior_log"):
            return None
        if self._screen is None:
            self._screen = PriorProxy(self)
        return self._screen

    def _token_counts(self, masks: np.ndarray, cols: np.ndarray | None) -> np.ndarray:
        """Tokens the net reads per row: units used ('domain'), else hosts used."""
        used = masks != 0
        if self.kind != "domain":
            return used.sum(axis=1)
        unit = self.domain_view.ix.unit if cols is None else self.domain_view.ix.unit[cols]
        if used.shape[1] == 0:
            return np.zeros(masks.shape[0], dtype=np.int64)
        # columns grouped by unit, one OR per (row, unit) block: a batch of ~1,000 rows x ~1,000
        # trays made ~500,000 (row, unit) pairs to de-duplicate by hashing (~1.5 ms per call)
        order = np.argsort(unit, kind="stable")
        su = unit[order]
        starts = np.flatnonzero(np.r_[True, su[1:] != su[:-1]])
        return np.logical_or.reduceat(used[:, order], starts, axis=1).sum(axis=1)

    def predict(self, allocations: Sequence[Sequence[str]]) -> np.ndarray:
        """``B̂`` for allocations given as GPU-id lists (``"host:idx"``)."""
        if isinstance(allocations, (str, bytes)):
            raise ModelError("predict takes a list of allocations (lists of GPU ids), not a string")
        try:
            masks = self.spec.to_masks([list(a) for a in allocations])
        except BandPilotError as exc:
            raise ModelError(f"model {self.name!r}: {exc}") from None
        except TypeError:
            raise ModelError("predict takes a list of allocations (lists of GPU ids)") from None
        return self.predict_masks(masks)

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the self-contained model directory (config + spec JSON, weights, stage-1, replay)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "net": self.net.config,
            "spec": self.spec.to_dict(),
            "fingerprint": self.spec.fingerprint(),
            "name": self.name,
            "meta": self.meta,
        }
        (path / CONFIG_FILE).write_text(json.dumps(cfg, indent=1, default=_json_default))
        torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, path / WEIGHTS_FILE)
        np.save(path / STAGE1_FILE, self.stage1)
        if self.replay is not None:
            np.savez_compressed(path / REPLAY_FILE, masks=self.replay[0], busbw=self.replay[1])
        if self.memory is not None:
            self.memory.save(path)
        if self.patterns is not None:
            (path / PATTERNS_FILE).write_text(json.dumps(self.patterns.to_dict()))
        return path

    @classmethod
    def load_dir(cls, path: str | Path, *, uri: str | None = None, name: str | None = None,
                 model_version: str | None = None) -> "Surrogate":
        path = Path(path)
        cfg_p = path / CONFIG_FILE
        if not cfg_p.is_file():
            nested = sorted(path.glob(f"**/{CONFIG_FILE}"))
            if not nested:
                raise ModelError(f"no BandPilot surrogate at {path} (missing {CONFIG_FILE})")
            cfg_p = nested[0]
            path = cfg_p.parent
        try:
            cfg = json.loads(cfg_p.read_text())
            if cfg.get("format_version") != FORMAT_VERSION:
                raise ModelError(f"{cfg_p}: unsupported model format {cfg.get('format_version')!r}")
            spec = spec_from_dict(cfg["spec"], source=str(cfg_p))
            net = build_net(cfg["kind"], spec, **cfg["net"])
            state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
            stage1 = np.load(path / STAGE1_FILE)
            pats = path / PATTERNS_FILE
            patterns = DomainPatterns.from_dict(spec, stage1, json.loads(pats.read_text())) if pats.is_file() else None
        except BandPilotError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError) as exc:
            raise ModelError(f"{path}: corrupt surrogate artifact ({exc.__class__.__name__}: {str(exc)[:120]})") from None
        replay = None
        if (path / REPLAY_FILE).is_file():
            with np.load(path / REPLAY_FILE) as z:
                replay = (z["masks"].astype(np.int64), z["busbw"].astype(np.float64))
        sur = cls(spec, stage1, net, kind=cfg["kind"], meta=cfg.get("meta") or {}, replay=replay,
                   uri=uri or str(path), name=name or cfg.get("name"), model_version=model_version, patterns=patterns)
        try:
            sur.memory = PatternMemory.load(path)
        except (OSError, KeyError, ValueError) as exc:
            raise ModelError(f"{path}: corrupt pattern memory ({exc.__class__.__name__}: {str(exc)[:120]})") from None
        if sur.kind == "domain" and sur.memory is not None and len(sur.memory) and sur.memory.keys.dtype.itemsize != 16:
            raise ModelError(f"{path}: pattern memory keyed by trays, not domain tokens (a pre-release 'domain' model): retrain it")
        return sur

    @classmethod
    def load(cls, uri: str | Path, *, located: tuple[Path, str, str] | None = None) -> "Surrogate":
        """Load from ``models:/NAME@alias``, ``models:/NAME/VERSION``, ``runs:/ID/model`` or a local path;
        ``located`` is what :func:`~bandpilot.model.local_registry.lookup` already found for ``uri``."""
        s = str(uri)
        if s.startswith(("models:/", "runs:/")):
            from bandpilot.model.local_registry import lookup

            t0 = time.perf_counter()
            found: tuple[Path, str | None, str | None] | None = located or lookup(s)  # the project's SQLite registry without importing MLflow (seconds)
            if found is None:
                from bandpilot.model.artifacts import fetch_model_dir  # imports mlflow only for registry URIs

                found = fetch_model_dir(s)
            local, name, version = found
            sur = cls.load_dir(local, uri=s, name=name, model_version=version)
            sur.meta.setdefault("load_seconds", time.perf_counter() - t0)
            return sur
        from bandpilot.model.local_registry import model_path

        return cls.load_dir(model_path(s), uri=s)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
