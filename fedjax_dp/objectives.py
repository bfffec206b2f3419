"""Local objectives: ``objective(params, batch, anchor) -> scalar loss``.

``batch`` is ``(x, y, mask)``; ``anchor`` is the round's global model ``w_t``
(what a regulariser such as BLUR or FedProx pulls towards). A regulariser is a
wrapper around another objective.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_dp.errors import check

Objective = Callable  # (params, batch, anchor) -> scalar


def supervised(apply_fn: Callable) -> Objective:
  """Mean cross-entropy of ``apply_fn(params, x)`` over the batch's real examples."""
  from fedjax_dp.models import cross_entropy

  def objective(params, batch, anchor):
    del anchor
    x, y, mask = batch
    return cross_entropy(apply_fn(params, x), y, mask)

  return objective


def sq_distance(params, anchor) -> jax.Array:
  """||params - anchor||^2 over the whole parameter vector."""
  return sum(jnp.sum(jnp.square(p - a)) for p, a in
             zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(anchor)))


def proximal(objective: Objective, mu: float) -> Objective:
  """FedProx (Li et al. 2020): adds (mu/2) ||w - w_t||^2."""
  check(mu >= 0, "mu", mu, "must be >= 0")

  def wrapped(params, batch, anchor):
    return objective(params, batch, anchor) + 0.5 * mu * sq_distance(params, anchor)

  return wrapped
