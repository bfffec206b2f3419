"""Local objectives: ``objective(params, batch, anchor) -> scalar loss``.

``batch`` is ``(x, y, mask)``; ``anchor`` is the round's global model ``w_t``
(what a regulariser such as BLUR or FedProx pulls towards). A regulariser is a
wrapper around another objective.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_dp.errors import check_unless_traced
from fedjax_dp.models import supervised_loss

Objective = Callable  # (params, batch, anchor) -> scalar


def supervised(model) -> Objective:
  """Mean loss of ``model.apply(params, x)`` over the batch's real examples: softmax
  cross-entropy (:func:`fedjax_dp.models.cross_entropy`), or for a multi-label model
  (:attr:`~fedjax_dp.models.Model.multi_label`) the binary cross-entropy of a sigmoid per class
  (:func:`fedjax_dp.models.sigmoid_cross_entropy`).

  Args:
    model: a :class:`fedjax_dp.models.Model` (its ``apply`` and ``multi_label``).

  Returns:
    The objective ``(params, batch, anchor) -> scalar``.
  """
  loss, apply_fn = supervised_loss(model.multi_label), model.apply

  def objective(params, batch, anchor):
    """The loss at ``params``.

    Args:
      params: the model's parameters (a pytree its ``apply`` takes).
      batch: ``(x, y, mask)``: inputs ``[B, ...]``, integer labels ``[B, *label_shape]`` (with
        a multi-label model, each example's class ids) and ``[B]`` weights (1 for a real example, 0
        for padding).
      anchor: unused (the round's global model).
    """
    del anchor
    x, y, mask = batch
    return loss(apply_fn(params, x), y, mask)

  return objective


def sq_distance(params, anchor) -> jax.Array:
  """||params - anchor||^2 over the whole parameter vector."""
  return sum(jnp.sum(jnp.square(p - a)) for p, a in
             zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(anchor)))


def proximal(objective: Objective, mu: float) -> Objective:
  """FedProx (Li et al. 2020): adds (mu/2) ||w - w_t||^2."""
  check_unless_traced(lambda m: m >= 0, "mu", mu, "must be >= 0")

  def wrapped(params, batch, anchor):
    """``objective(params, batch, anchor) + (mu/2) ||params - anchor||^2``.

    Args:
      params: the model's parameters.
      batch: ``(x, y, mask)``, passed to ``objective``.
      anchor: the round's global model ``w_t`` (a pytree shaped as ``params``).
    """
    return objective(params, batch, anchor) + 0.5 * mu * sq_distance(params, anchor)

  return wrapped


def blur(objective: Objective, lam: float, radius: float) -> Objective:
  """BLUR, bounded local update regularisation (Cheng et al., CVPR 2022, Sec. 4.1, Eq. 5).

  The client minimises ``h_i(w) = f_i(w) + (lam/2) * max(0, ||w - w_t||^2 - S^2)``
  where ``w_t`` is the round's global model (the objective's ``anchor``), ``S``
  the clipping bound (``radius``) and the norm runs over the whole parameter
  vector. The gradient of the regulariser is 0 while the local update is inside
  the ball of radius S and ``lam * (w - w_t)`` outside it (on the sphere itself
  it is 0), so an SGD step outside the ball discounts the accumulated update by
  ``(1 - lam * eta_l)`` (Lemma 2, which assumes ``lam * eta_l < 1``; not checked here: past
  it a step outside the ball jumps beyond the anchor, and past 2 the update grows).

  Privacy: BLUR only changes local training; ``S`` and ``w_t`` are public. It
  does not bound the update's norm (clipping still does): it makes updates
  smaller before the clip, so less is lost to it.

  Args:
    objective: the local objective ``f_i`` (``(params, batch, anchor) -> loss``).
    lam: lambda >= 0 (the paper's grid: 0.05, 0.1, 0.2, 0.4, 0.8).
    radius: S > 0, normally the clip bound (both may be traced hyper-parameters).

  Returns:
    The objective ``h_i``, ``(params, batch, anchor) -> loss``.

  Raises:
    ConfigError: ``lam < 0`` or ``radius <= 0`` (when not traced).
  """
  check_unless_traced(lambda v: v is not None and v >= 0, "lambda", lam, "must be >= 0")
  check_unless_traced(lambda v: v is not None and v > 0, "radius", radius,
                      "must be > 0 (the clip bound S)")
  r2 = jnp.square(radius)

  def wrapped(params, batch, anchor):
    """``h_i(params)``.

    Args:
      params: the model's parameters ``w``.
      batch: ``(x, y, mask)``, passed to ``objective``.
      anchor: the round's global model ``w_t`` (a pytree shaped as ``params``).
    """
    d2 = sq_distance(params, anchor)
    # jnp.where (not jnp.maximum) so the gradient on the sphere is exactly 0.
    excess = jnp.where(d2 > r2, d2 - r2, 0.0)
    return objective(params, batch, anchor) + 0.5 * lam * excess

  return wrapped
