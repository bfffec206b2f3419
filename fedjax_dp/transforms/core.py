"""Clipping and Gaussian noise."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.errors import check_unless_traced

# Salts folded into the key by each random transform (see package docstring).
SALT_GAUSSIAN = 0x6A55
SALT_SIGN_FLIP = 0x51F1
SALT_SIGN_GAUSSIAN = 0x5167
SALT_CANARY = 0xCA7A


def global_norm(tree) -> jax.Array:
  """L2 norm of a pytree viewed as one flat vector, computed in float32.

  Args:
    tree: a pytree of arrays.

  Returns:
    A float32 scalar ``sqrt(sum over leaves of sum(x^2))``.
  """
  leaves = jax.tree_util.tree_leaves(tree)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def salted(key: jax.Array, salt: int) -> jax.Array:
  return jax.random.fold_in(key, salt)


def sample_like(tree, sample: Callable, key: jax.Array):
  """``sample(key, (n,))`` for all ``n`` coordinates of ``tree`` in one draw, cut into its
  leaves' shapes. One draw compiles one random-number computation where a draw per leaf would
  compile one per leaf.

  Args:
    tree: a pytree of arrays (only its leaves' shapes are read).
    sample: ``(key, shape) -> array`` of that shape (e.g. a normal or Bernoulli draw).
    key: the draw's PRNG key.

  Returns:
    A pytree like ``tree`` of the sample's values (in the sample's dtype).
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  sizes = [x.size for x in leaves]
  parts = jnp.split(sample(key, (sum(sizes),)), np.cumsum(sizes)[:-1])
  return jax.tree_util.tree_unflatten(treedef, [p.reshape(x.shape) for p, x in zip(parts, leaves)])


def gaussian_like(tree, stddev, key: jax.Array):
  """Independent N(0, stddev^2) noise shaped like ``tree`` (:func:`sample_like`), in each
  leaf's dtype.

  Args:
    tree: a pytree of arrays.
    stddev: the noise's standard deviation (>= 0; may be traced).
    key: the draw's PRNG key (drawn from as it is: salt it first, :func:`salted`).

  Returns:
    A pytree like ``tree``: float32 draws scaled by ``stddev``, cast to each leaf's dtype.
  """
  noise = sample_like(tree, lambda k, shape: stddev * jax.random.normal(k, shape, jnp.float32), key)
  return jax.tree_util.tree_map(lambda n, x: n.astype(x.dtype), noise, tree)


def identity() -> optax.GradientTransformationExtraArgs:
  return optax.with_extra_args_support(optax.identity())


def clip_l2(bound: float) -> optax.GradientTransformationExtraArgs:
  """Scales the whole update to L2 norm at most ``bound``: u / max(1, ||u|| / bound).

  The norm is over the concatenation of all leaves (one vector per client), as
  in DP-FedAvg (Cheng et al. 2022, Alg. 1, line "clip"). After this transform
  the update's L2 norm is at most ``bound``: that is the sensitivity the
  mechanism records rely on. An update whose norm is not finite (a NaN or
  Inf entry from a diverged client, or a norm that overflows) becomes all
  zeros, so the bound holds for every input (scaling Inf would give NaN, and
  one NaN row would make the released sum NaN).

  Args:
    bound: the L2 bound ``S``: a number, or the compiled round's hyper-parameter (traced).

  Raises:
    ConfigError: a concrete ``bound`` that is not a finite number > 0. A traced bound is not
      checked here: the settings it comes from are, where they are read
      (:class:`fedjax_dp.config.RunConfig`).
  """
  check_unless_traced(lambda b: b is not None and b > 0, "clip", bound, "must be > 0")
  check_unless_traced(np.isfinite, "clip", bound, "must be a finite number")

  def update(updates, state, params=None, **extra):
    """``updates / max(1, ||updates|| / bound)``, or zeros when the norm is not finite.

    Args:
      updates: a pytree (one client's update), clipped as one vector.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      **extra: unused extra arguments of the chain.

    Returns:
      ``(clipped, state)``, ``clipped`` like ``updates`` with L2 norm at most ``bound``.
    """
    del params, extra
    norm = global_norm(updates)
    finite = jnp.isfinite(norm)
    scale = jnp.where(finite, jnp.minimum(1.0, bound / jnp.maximum(norm, 1e-30)), 0.0)
    return jax.tree_util.tree_map(
        lambda u: jnp.where(finite, u * scale, jnp.zeros_like(u)).astype(u.dtype), updates), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def add_gaussian_noise(stddev: float, salt: int = SALT_GAUSSIAN) -> optax.GradientTransformationExtraArgs:
  """Adds N(0, stddev^2) independently to every coordinate; needs ``key=``.

  ``salt`` is folded into the key; give a second noise transform in the same
  chain its own salt, or both draw the same noise.

  Args:
    stddev: the noise standard deviation (>= 0; a traced hyper-parameter inside the round).
    salt: folded into the ``key`` the update gets (default :data:`SALT_GAUSSIAN`).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose update takes ``key=``.

  Raises:
    ConfigError: a concrete ``stddev`` below 0 (a traced one is checked where the settings it
      comes from are read).
  """
  check_unless_traced(lambda s: s is not None and s >= 0, "noise stddev", stddev, "must be >= 0")

  def update(updates, state, params=None, *, key, **extra):
    """``updates + N(0, stddev^2 I)``.

    Args:
      updates: a pytree.
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      key: PRNG key; the noise is drawn from ``fold_in(key, salt)``.
      **extra: unused extra arguments of the chain.

    Returns:
      ``(noised, state)``, ``noised`` like ``updates``.
    """
    del params, extra
    noise = gaussian_like(updates, stddev, salted(key, salt))
    return jax.tree_util.tree_map(jnp.add, updates, noise), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def canary_direction(like, seed, client) -> jax.Array:
  """Canary ``client``'s fixed direction: a pytree shaped like ``like`` of L2 norm 1, uniform on
  the unit sphere (standard normal coordinates, normalised), a function of ``seed`` and ``client``
  only (traced or not), so an auditor recomputes it from the two numbers.

  Args:
    like: a pytree (only its leaves' shapes and dtypes are read).
    seed: the audit's canary seed (an int; may be traced).
    client: the canary's client id (an int; may be traced).

  Returns:
    A pytree like ``like``, in its leaves' dtypes, drawn from
    ``fold_in(fold_in(PRNGKey(seed), SALT_CANARY), client)``.
  """
  key = jax.random.fold_in(salted(jax.random.PRNGKey(seed), SALT_CANARY), client)
  u = sample_like(like, lambda k, shape: jax.random.normal(k, shape, jnp.float32), key)
  norm = global_norm(u)
  return jax.tree_util.tree_map(lambda a, x: (a / norm).astype(x.dtype), u, like)


def replace_by_canary(seed) -> optax.GradientTransformationExtraArgs:
  """Replaces a canary client's update by its canary; needs ``client=(id, scale)``.

  A client whose ``scale`` is below 0 keeps its update; one whose ``scale`` is ``c >= 0`` sends
  ``c * u`` instead, ``u`` its :func:`canary_direction` (``seed``, ``id``): the white-box
  "gradient canaries" of Steinke, Nasr and Jagielski ("Privacy Auditing with One (1) Training
  Run", NeurIPS 2023). ``c = 0`` is a canary left out of the run: it sends nothing.

  Privacy: a transform before the clip. A user-level guarantee bounds what any one client can
  contribute through the clip, whatever its update, so the canary is within what it covers; the
  clip, the noise, the sampling and the accounting act on it as on every other client.
  """
  def update(updates, state, params=None, *, client, **extra):
    """``(c * u, state)`` for a canary (``c >= 0``), else ``(updates, state)``.

    Args:
      updates: the client's update (a pytree).
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      client: ``(id, scale)``: the client's id and its canary scale ``c`` (below 0: no canary).
      **extra: unused extra arguments of the chain.
    """
    del params, extra
    ident, scale = client
    u = canary_direction(updates, seed, ident)
    return jax.tree_util.tree_map(
        lambda a, c: jnp.where(scale >= 0, scale * c, a).astype(a.dtype), updates, u), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
