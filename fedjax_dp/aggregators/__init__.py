"""Server-side aggregators.

Contract: ``aggregate(updates, weights, mask, state, key) -> (aggregate, state)``
where ``updates`` is a pytree whose leaves have a leading client axis ``[N, ...]``,
``weights`` and ``mask`` are ``[N]`` float arrays (``mask`` is 1 for real clients
and 0 for padding) and ``key`` is a PRNG key. Padded rows never influence the
result.
"""

from fedjax_dp.aggregators.base import Aggregator, DENOMINATORS, mean, weighted_sum
from fedjax_dp.aggregators import robust

__all__ = ["Aggregator", "DENOMINATORS", "mean", "weighted_sum", "robust"]
