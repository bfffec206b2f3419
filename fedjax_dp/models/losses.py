"""Masked classification losses and metrics.

Batches are padded to a fixed size so that a round compiles once; ``mask``
(``[B]``, 1.0 for a real example, 0.0 for padding) removes the padding. A
fully padded batch gives 0 (never NaN), with a zero gradient.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax


def _masked_mean(values, mask):
  if mask is None:
    return jnp.mean(values)
  mask = jnp.asarray(mask, values.dtype)
  total = jnp.sum(mask)
  safe_total = jnp.where(total > 0, total, 1.0)
  s = jnp.sum(jnp.where(mask > 0, values * mask, 0.0))
  return jnp.where(total > 0, s / safe_total, 0.0)


def per_example_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Softmax cross-entropy ``[B]`` for integer ``labels`` ``[B]``."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)


def cross_entropy(logits: jax.Array, labels: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
  """Mean softmax cross-entropy over the examples where ``mask`` is nonzero.

  Args:
    logits: ``[B, num_classes]``.
    labels: integer class ids ``[B]``.
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.

  Returns:
    Scalar ``sum(mask * ce) / sum(mask)``, or 0 when ``sum(mask) == 0``.
  """
  return _masked_mean(per_example_cross_entropy(logits, labels), mask)


def accuracy(logits: jax.Array, labels: jax.Array,
             mask: jax.Array | None = None) -> jax.Array:
  """Fraction of masked examples whose argmax logit is the label (0 if none)."""
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return _masked_mean(correct, mask)


def num_params(params) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(math.prod(jnp.shape(p)) for p in jax.tree_util.tree_leaves(params)))
