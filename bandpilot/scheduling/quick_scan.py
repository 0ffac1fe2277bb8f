"""Which requests of a batch must be tried? In a long queue on a full cluster most requests
cannot fit what is free and are quick deferrals (:meth:`BatchReport.add_quick`); visiting them one
by one in Python was most of the batch loop's own cost (~3,000 pending requests per batch for
thousands of batches in a 10,000-job simulation). :class:`QuickScan` holds the queue's sizes as an
array, so the next request to try - one whose ``k`` fits the free GPUs, or whose (k, constraints)
was not validated yet in this batch - is found by one vectorised comparison, and the stretch
before it is deferred in bulk. The decision per request is the batch loop's own (same order, same
outcomes): only the way the stretch is found differs."""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

_K = operator.attrgetter("k")
_CONS = operator.attrgetter("constraints")


class QuickScan:
    """The requests of a batch in order, as sizes and (k, constraints) codes."""

    def __init__(self, reqs: Sequence[Any]) -> None:
        self.n = len(reqs)
        self.ks = np.fromiter(map(_K, reqs), dtype=np.int64, count=self.n)
        codes: dict[tuple[int, int], int] = {}
        reps: list[tuple[int, Any]] = []
        out = []
        # constraints objects are shared (parsed once per stored text), so the distinct
        # (k, constraints object) pairs are few; their validation key is computed once each
        for k, c in zip(map(_K, reqs), map(_CONS, reqs)):
            code = codes.get((k, id(c)))
            if code is None:
                code = codes[(k, id(c))] = len(reps)
                reps.append((k, c))
            out.append(code)
        self.codes = np.asarray(out, dtype=np.int64)
        self.vkeys = [(k, c.key) for k, c in reps]

    def next_tried(self, start: int, n_free: int, valid: set[tuple[int, str]]) -> int:
        """The first position >= ``start`` the batch must try (``n`` if none): its k fits
        ``n_free`` or its (k, constraints key) is not in ``valid``."""
        if start >= self.n:
            return self.n
        known = np.fromiter((vk in valid for vk in self.vkeys), dtype=bool, count=len(self.vkeys))
        must = (self.ks[start:] <= n_free) | ~known[self.codes[start:]]
        j = int(np.argmax(must))
        return start + j if must[j] else self.n
