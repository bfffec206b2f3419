"""Clipping and Gaussian noise."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check, check_positive

# Salts folded into the key by each random transform (see package docstring).
SALT_GAUSSIAN = 0x6A55
SALT_SIGN_FLIP = 0x51F1
SALT_SIGN_GAUSSIAN = 0x5167


def global_norm(tree) -> jax.Array:
  """L2 norm of a pytree viewed as one flat vector."""
  leaves = jax.tree_util.tree_leaves(tree)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def salted(key: jax.Array, salt: int) -> jax.Array:
  return jax.random.fold_in(key, salt)


def gaussian_like(tree, stddev, key: jax.Array):
  """Independent N(0, stddev^2) noise shaped like ``tree`` (one key per leaf)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(key, len(leaves))
  noise = [stddev * jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)
           for k, x in zip(keys, leaves)]
  return jax.tree_util.tree_unflatten(treedef, noise)


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
  """
  check_positive("clip", bound)
  check(jnp.isfinite(bound), "clip", bound, "must be a finite number")

  def update(updates, state, params=None, **extra):
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
  """
  check(stddev is not None and stddev >= 0, "noise stddev", stddev, "must be >= 0")

  def update(updates, state, params=None, *, key, **extra):
    del params, extra
    noise = gaussian_like(updates, stddev, salted(key, salt))
    return jax.tree_util.tree_map(jnp.add, updates, noise), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
