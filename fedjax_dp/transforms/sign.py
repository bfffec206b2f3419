"""Sign transforms and the two DP mechanisms of DP-RSA (Zhu and Ling, IJCAI 2022).

Each is an ``optax.GradientTransformationExtraArgs`` applied to one worker's
vector ``u = x_0 - x_k`` (a pytree) and returns a pytree of +-1:

* :func:`to_sign`: ``sign(u)`` with the paper's convention ``sign(0) = +1``
  (non-private RSA, Eq. 6).
* :func:`sign_flip`: Sign-Flipping (Eq. 8): each coordinate of ``sign(u)`` is
  kept with probability ``gamma`` and flipped with probability ``1 - gamma``.
* :func:`sign_gaussian`: Sign-Gaussian (Eq. 9): ``sign(u + e)``,
  ``e ~ N(0, sigma^2 I)``; with ``clip`` the difference is first bounded (per
  coordinate to ``[-clip, clip]`` with ``norm="linf"``, or in L2 norm with
  ``norm="l2"``), which is what gives it a formal guarantee (see
  :mod:`fedjax_dp.privacy.sign`).

The random transforms fold the salts of :mod:`fedjax_dp.transforms.core` into
``key=`` so they draw independently of other transforms in a chain.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check_choice, check_unless_traced
from fedjax_dp.transforms.core import (SALT_SIGN_FLIP, SALT_SIGN_GAUSSIAN, clip_l2, gaussian_like,
                                       salted, sample_like)

NORMS = ("linf", "l2")


def paper_sign(x: jax.Array) -> jax.Array:
  """+1 for ``x >= 0``, -1 otherwise (Zhu and Ling 2022: sign returns 1 for non-negative input)."""
  return jnp.where(x >= 0, 1.0, -1.0).astype(x.dtype)


def _stateless(update) -> optax.GradientTransformationExtraArgs:
  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def to_sign() -> optax.GradientTransformationExtraArgs:
  """``sign(u)`` (no privacy)."""

  def update(updates, state, params=None, **extra):
    """``(sign(updates), state)``, +-1 in each leaf's dtype.

    Args:
      updates: the worker's ``u``, a pytree.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      **extra: unused extra arguments of the chain.
    """
    del params, extra
    return jax.tree_util.tree_map(paper_sign, updates), state

  return _stateless(update)


def sign_flip(keep_prob: float) -> optax.GradientTransformationExtraArgs:
  """Sign-Flipping, Zhu and Ling (2022) Eq. 8; needs ``key=``.

  Privacy: per coordinate and round this is binary randomized response:
  (ln(gamma / (1 - gamma)), 0)-DP for any change of the worker's data
  (Theorem 1), whatever ``u`` is (no clipping needed).

  Args:
    keep_prob: gamma in [0.5, 1]; 1 keeps every sign (no privacy).

  Returns:
    The transform (stateless), ``update(u, state, key=key) -> (signs, state)``: each coordinate
    of ``sign(u)`` (+1 for ``u_i >= 0``) kept with probability gamma, flipped otherwise.

  Raises:
    ConfigError: a concrete ``keep_prob`` outside [0.5, 1] (a traced one, the compiled round's
      hyper-parameter, is checked where the settings are read).
  """
  check_unless_traced(lambda g: g is not None and 0.5 <= g <= 1, "keep_prob", keep_prob,
                      "must be in [0.5, 1]")

  def update(updates, state, params=None, *, key, **extra):
    """``(sign(u) * (+1 w.p. gamma, -1 w.p. 1 - gamma), state)``, independently per coordinate.

    Args:
      updates: the worker's ``u``, a pytree.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      key: PRNG key; the keep draws come from ``fold_in(key, SALT_SIGN_FLIP)``.
      **extra: unused extra arguments of the chain.
    """
    del params, extra
    keep = sample_like(updates, lambda k, shape: jax.random.bernoulli(k, keep_prob, shape),
                       salted(key, SALT_SIGN_FLIP))
    out = jax.tree_util.tree_map(
        lambda u, kept: paper_sign(u) * jnp.where(kept, 1.0, -1.0).astype(u.dtype), updates, keep)
    return out, state

  return _stateless(update)


def clip_linf(bound: float) -> optax.GradientTransformationExtraArgs:
  """Clamps every coordinate to ``[-bound, bound]``; a NaN coordinate (a diverged worker) becomes
  0, so the bound holds for every input (a clamped NaN stays NaN, and the sign of NaN plus noise
  is not random: the per-coordinate guarantee would fail for it).

  Raises:
    ConfigError: a concrete ``bound`` that is not > 0 (a traced one is checked where the settings
      are read).
  """
  check_unless_traced(lambda b: b is not None and b > 0, "sign_clip", bound, "must be > 0")

  def update(updates, state, params=None, **extra):
    """``(clip(u, -bound, bound), state)`` with NaN entries 0.

    Args:
      updates: a pytree.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      **extra: unused extra arguments of the chain.
    """
    del params, extra
    return jax.tree_util.tree_map(
        lambda u: jnp.where(jnp.isnan(u), jnp.zeros_like(u), jnp.clip(u, -bound, bound)),
        updates), state

  return _stateless(update)


def sign_gaussian(sigma: float, clip: Optional[float] = None,
                  norm: str = "linf") -> optax.GradientTransformationExtraArgs:
  """Sign-Gaussian, Zhu and Ling (2022) Eq. 9: ``sign(clip(u) + e)``; needs ``key=``.

  The probability that coordinate i's sign is flipped is ``Phi(-|u_i| / sigma)``
  (Eq. 10).

  Privacy: only with ``clip``. ``norm="linf"`` bounds each coordinate to
  ``[-clip, clip]``: each coordinate is then (ln(Phi(c/s) / Phi(-c/s)), 0)-DP
  per round. ``norm="l2"`` bounds ``||u||_2 <= clip``: the release is
  post-processing of a Gaussian mechanism with sensitivity ``2 clip``
  (replace-one). Without ``clip`` the guarantee of the paper's Theorem 2 rests
  on a data-dependent condition on ``sigma`` versus ``max_i |u_i|`` and is
  not a DP guarantee.

  Args:
    sigma: noise standard deviation (> 0).
    clip: the bound, or None (no formal guarantee).
    norm: "linf" or "l2".

  Returns:
    The transform (stateless), ``update(u, state, key=key) -> (signs, state)``.

  Raises:
    ConfigError: an unknown ``norm``, or a concrete ``sigma`` or ``clip`` that is not > 0 (traced
      ones, the compiled round's hyper-parameters, are checked where the settings are read).
  """
  check_unless_traced(lambda s: s is not None and s > 0, "sign_sigma", sigma, "must be > 0")
  check_choice("sign_clip_norm", norm, NORMS)
  if clip is not None:
    bound = clip_linf(clip) if norm == "linf" else clip_l2(clip)
  else:
    bound = None

  def update(updates, state, params=None, *, key, **extra):
    """``(sign(clip(u) + e), state)``, ``e ~ N(0, sigma^2 I)`` (without ``clip``: ``sign(u + e)``).

    Args:
      updates: the worker's ``u``, a pytree.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      key: PRNG key; the noise comes from ``fold_in(key, SALT_SIGN_GAUSSIAN)``.
      **extra: unused extra arguments of the chain.
    """
    del params, extra
    if bound is not None:
      updates, _ = bound.update(updates, optax.EmptyState())
    noise = gaussian_like(updates, sigma, salted(key, SALT_SIGN_GAUSSIAN))
    return jax.tree_util.tree_map(lambda u, e: paper_sign(u + e), updates, noise), state

  return _stateless(update)
