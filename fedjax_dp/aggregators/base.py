"""The aggregator interface and the (optionally noised) mean."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check_choice, check_unless_traced
from fedjax_dp.transforms.core import gaussian_like, salted, SALT_GAUSSIAN

DENOMINATORS = ("realized", "expected")


class Aggregator(NamedTuple):
  """``init(params_like) -> state`` and ``aggregate(updates, weights, mask, state, key)``.

  An aggregate that depends on the rows only through their weighted sum also
  gives ``prepare`` and ``finish``, with ``aggregate(u, w, m, s, k) ==
  finish(weighted_sum(u', w, m'), sum(w * m'), s, k)`` where ``(u', m') =
  prepare(u, m)`` acts on each row alone. The round then sums the rows block
  by block without holding all of them (``--client-chunk``); aggregators that
  need every row at once (medians, Krum, the geometric median) leave them None.

  Attributes:
    init: ``init(params_like) -> state``, the aggregator's state for a model like
      ``params_like`` (``optax.EmptyState()`` for a stateless one).
    aggregate: ``aggregate(updates, weights, mask, state, key) -> (aggregate, state)``, pure
      and traced inside the round. ``updates``: the cohort's rows, a pytree with leaves
      ``[N, ...]``; ``weights``: ``[N]`` aggregation weights (ignored by the robust
      aggregators, which weigh every real row alike); ``mask``: ``[N]``, 1 for real clients and
      0 for padding (a padded row never moves the aggregate); ``state``: as ``init`` made it or
      the last call returned it; ``key``: a PRNG key (used by noised and randomized
      aggregators). Returns a pytree like one row and the next state.
    prepare: ``prepare(updates, mask) -> (updates, mask)``, acting on each row alone; None
      unless the aggregate is linear.
    finish: ``finish(total, weight, state, key) -> (aggregate, state)`` of the rows' weighted
      sum ``total`` and total weight ``weight``; None unless the aggregate is linear.
  """

  init: Callable[[Any], Any]
  aggregate: Callable[..., tuple]
  prepare: Optional[Callable] = None
  finish: Optional[Callable] = None

  @property
  def linear(self) -> bool:
    """Whether the aggregate depends on the rows only through their weighted sum: it gives
    ``prepare`` and ``finish`` (the round may then sum the rows block by block)."""
    return self.prepare is not None and self.finish is not None


def weighted_sum(updates, weights: jax.Array, mask: jax.Array):
  """sum_i mask_i * weights_i * updates_i over the leading client axis.

  Args:
    updates: a pytree whose leaves have a leading client axis ``[N, ...]``.
    weights: ``[N]`` aggregation weights.
    mask: ``[N]``, 1 for real clients and 0 for padding (a padded row adds nothing).

  Returns:
    A pytree like one row of ``updates`` (leaves ``[...]``, in each leaf's dtype); the weights
    are applied in float32.
  """
  w = (weights * mask).astype(jnp.float32)
  return jax.tree_util.tree_map(lambda u: jnp.tensordot(w, u, axes=(0, 0)).astype(u.dtype), updates)


def mean(denominator: str = "realized", expected_size: Optional[float] = None,
         noise_stddev: Optional[float] = None) -> Aggregator:
  """Weighted mean, with optional Gaussian noise added to the weighted sum.

  Implements the server aggregation of DP-FedAvg (Cheng et al. 2022, Alg. 1):
  ``(sum_i Delta_i + N(0, noise_stddev^2 I)) / denominator``.

  Args:
    denominator: "realized": the realized total weight of the cohort
      (``sum_i mask_i w_i``, the paper's ``|P_t|`` when weights are 1; biased
      under Poisson sampling because it depends on the draw), or "expected": the
      fixed ``expected_size`` (``q N`` for Poisson sampling), which makes the
      noisy estimate of the mean update unbiased (McMahan et al. 2018).
    expected_size: required for "expected".
    noise_stddev: standard deviation of the noise on the sum (``z * S`` for
      DP-FedAvg; may be a traced hyper-parameter), or None for no noise.

  Raises:
    ConfigError: an unknown ``denominator``, a missing ``expected_size`` with "expected", or a
      concrete ``expected_size`` <= 0 or ``noise_stddev`` < 0 (traced ones, the compiled round's
      hyper-parameters, are checked where the settings they come from are read).
  """
  check_choice("denominator", denominator, DENOMINATORS)
  if denominator == "expected":
    check_unless_traced(lambda e: e is not None and e > 0, "expected_size", expected_size,
                        "must be > 0 when denominator='expected'")
  check_unless_traced(lambda s: s is None or s >= 0, "noise_stddev", noise_stddev, "must be >= 0")

  def finish(total, weight, state, key):
    """``((total + N(0, noise_stddev^2 I)) / d, state)`` (``Aggregator.finish``), with ``d`` the
    realized ``max(weight, 1)`` or the expected ``expected_size``.

    Args:
      total: ``sum_i m_i w_i u_i``, a pytree like one update (:func:`weighted_sum`).
      weight: ``sum_i m_i w_i``, the cohort's realized total weight (a scalar).
      state: the aggregator's state (``optax.EmptyState()``), returned as it is.
      key: PRNG key of the noise (salted with ``SALT_GAUSSIAN``); unused without noise.
    """
    if noise_stddev is not None:
      noise = gaussian_like(total, noise_stddev, salted(key, SALT_GAUSSIAN))
      total = jax.tree_util.tree_map(jnp.add, total, noise)
    denom = jnp.maximum(weight, 1.0) if denominator == "realized" else expected_size
    return jax.tree_util.tree_map(lambda t: t / denom, total), state

  def _aggregate(updates, weights, mask, state, key):
    """``(noised mean, state)``: ``finish`` of the rows' weighted sum and total weight."""
    return finish(weighted_sum(updates, weights, mask), jnp.sum(weights * mask), state, key)

  return Aggregator(lambda params: optax.EmptyState(), _aggregate, lambda u, m: (u, m), finish)
