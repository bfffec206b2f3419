"""Server-side aggregators.

Contract: ``aggregate(updates, weights, mask, state, key) -> (aggregate, state)``
where ``updates`` is a pytree whose leaves have a leading client axis ``[N, ...]``,
``weights`` and ``mask`` are ``[N]`` float arrays (``mask`` is 1 for real clients
and 0 for padding) and ``key`` is a PRNG key. Padded rows never influence the
result.

:func:`get` builds a declared aggregator by name (``fedjax_dp.component_names("aggregator")``:
the mean, the coordinate-wise and geometric medians, the trimmed mean, Krum, centered clipping,
the sign votes), as a run does: ``get("trimmed_mean", {"trim_beta": 0.2})``; each is guarded
against non-finite rows (:mod:`fedjax_dp.aggregators.robust` holds them).
"""

from fedjax_dp.aggregators.base import Aggregator, DENOMINATORS, mean, weighted_sum
from fedjax_dp.aggregators import robust
from fedjax_dp.aggregators.robust import get

__all__ = ["Aggregator", "DENOMINATORS", "get", "mean", "weighted_sum", "robust"]
