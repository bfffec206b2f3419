"""Masked classification losses and metrics.

Batches are padded to a fixed size so that a round compiles once; ``mask``
(``[B]``, 1.0 for a real example, 0.0 for padding) removes the padding. A
fully padded batch gives 0 (never NaN), with a zero gradient.

Labels are ``[B]`` (one class per example) or ``[B, *label_shape]`` with
logits ``[B, *label_shape, num_classes]`` (e.g. next-character prediction at
each of 80 positions). A label equal to :data:`IGNORE` counts in no loss and
no metric (the positions after the end of a text in its last window): loss and
accuracy are means over the label positions that are real, those with label
``>= 0`` in an example whose mask is nonzero.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

IGNORE = -1


def _weights(labels, mask):
  """Weight of each label position: the example's mask where the label is not ignored."""
  w = (labels >= 0).astype(jnp.float32)
  if mask is None:
    return w
  mask = jnp.asarray(mask, jnp.float32)
  return w * mask.reshape(mask.shape + (1,) * (labels.ndim - mask.ndim))


def per_example_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Softmax cross-entropy of each label position, the shape of ``labels``
  (an :data:`IGNORE` position gets a finite value that the masked means drop)."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.maximum(labels, 0))


def masked_sums(logits: jax.Array, labels: jax.Array,
                mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(loss_sum, correct, weight)`` over the real label positions.

  ``loss_sum`` sums the cross-entropy, ``correct`` counts argmax hits and
  ``weight`` counts the positions (for ``[B]`` labels: ``sum(mask)``). Sums
  over chunks of a test set divide into exact means.

  Args:
    logits: ``[B, *label_shape, num_classes]``.
    labels: integer class ids ``[B, *label_shape]`` (:data:`IGNORE` ignored).
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.

  Returns:
    Three float32 scalars ``(loss_sum, correct, weight)``.
  """
  w = _weights(labels, mask)
  ce = per_example_cross_entropy(logits, labels)
  hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return (jnp.sum(jnp.where(w > 0, ce * w, 0.0)), jnp.sum(hit * w), jnp.sum(w))


def _ratio(s, total):
  return jnp.where(total > 0, s / jnp.where(total > 0, total, 1.0), 0.0)


def cross_entropy(logits: jax.Array, labels: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
  """Mean softmax cross-entropy over the real label positions.

  Args:
    logits: ``[B, *label_shape, num_classes]``.
    labels: integer class ids ``[B, *label_shape]`` (:data:`IGNORE` ignored).
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.

  Returns:
    Scalar ``sum(w * ce) / sum(w)``, ``w`` the mask times ``labels >= 0``, or 0
    when ``sum(w) == 0``.
  """
  loss, _, weight = masked_sums(logits, labels, mask)
  return _ratio(loss, weight)


def accuracy(logits: jax.Array, labels: jax.Array,
             mask: jax.Array | None = None) -> jax.Array:
  """Fraction of real label positions whose argmax logit is the label (0 if none).

  Args:
    logits: ``[B, *label_shape, num_classes]``.
    labels: integer class ids ``[B, *label_shape]`` (:data:`IGNORE` ignored).
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.

  Returns:
    Scalar ``sum(w * hit) / sum(w)``, ``w`` as in :func:`cross_entropy`, or 0 when
    ``sum(w) == 0``.
  """
  _, correct, weight = masked_sums(logits, labels, mask)
  return _ratio(correct, weight)


def num_params(params) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(math.prod(jnp.shape(p)) for p in jax.tree_util.tree_leaves(params)))
