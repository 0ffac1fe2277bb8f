"""Model-guided search over ``C(A, k)``: EHA, PTS, count-vector search, the ``bandpilot`` hybrid, Exact.
Shared per-request precomputation in :mod:`.context`, one module per algorithm family; every
algorithm takes a :class:`SearchContext` and returns a :class:`Found`."""

from bandpilot.dispatch.search.context import Found, IntractableError, SearchContext
from bandpilot.dispatch.search.count_vector import coarse_count_search, count_search, exact
from bandpilot.dispatch.search.domain_exact import cross_domain_bound, domain_exact
from bandpilot.dispatch.search.domains import domain_search
from bandpilot.dispatch.search.eha import eha, single_host
from bandpilot.dispatch.search.hybrid import bandpilot
from bandpilot.dispatch.search.local import local_search
from bandpilot.dispatch.search.partitions import pareto_options, partition_counts, partitions
from bandpilot.dispatch.search.pts import pts

__all__ = [
    "Found",
    "IntractableError",
    "SearchContext",
    "bandpilot",
    "coarse_count_search",
    "count_search",
    "cross_domain_bound",
    "domain_exact",
    "domain_search",
    "eha",
    "exact",
    "local_search",
    "pareto_options",
    "partition_counts",
    "partitions",
    "pts",
    "single_host",
]
