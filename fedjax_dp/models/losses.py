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

Multi-label classification (StackOverflow tag prediction, TFF's
``tff.simulation.baselines.stackoverflow.create_tag_prediction_task``) has logits
``[B, num_classes]``, one independent sigmoid per class, and labels ``[B, T]``: the ids of an
example's classes, padded with :data:`IGNORE` (a compact form of the multi-hot vector
:func:`multi_hot` expands). Its loss is the binary cross-entropy of each class, averaged over
the classes (:func:`sigmoid_cross_entropy`); its metrics are TFF's recall at 5 and precision
(:func:`multi_label_sums`). :func:`evaluation_sums` gives either kind's metrics by name.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
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


# The k of recall at k (TFF's tag prediction reports recall_at_5).
RECALL_K = 5
# The metrics an evaluation reports, by whether the labels are multi-label; the first is the
# headline (the runs' ``test_accuracy`` and ``final_accuracy`` slot).
METRICS = {False: ("accuracy",), True: ("recall_at_5", "precision")}
# How a metric is named in printed lines.
METRIC_LABELS = {"accuracy": "accuracy", "recall_at_5": "recall@5", "precision": "precision"}


def multi_hot(labels: jax.Array, num_classes: int) -> jax.Array:
  """``[B, T]`` class ids (:data:`IGNORE` padding) -> ``float32`` ``[B, num_classes]``, 1 at
  each class an example holds (once, however often its id is repeated), 0 elsewhere."""
  return jnp.max(jax.nn.one_hot(labels, num_classes, dtype=jnp.float32), axis=-2)


def per_example_sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``[B]``: each example's binary cross-entropy of ``sigmoid(logits)`` against
  ``multi_hot(labels)``, averaged over the classes (Keras' ``BinaryCrossentropy`` of one
  example, which TFF's tag prediction uses, computed from the logits).

  Args:
    logits: ``[B, num_classes]``.
    labels: ``[B, T]`` class ids, :data:`IGNORE` padding.
  """
  targets = multi_hot(labels, logits.shape[-1])
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), targets),
                  axis=-1)


def _example_weights(mask: Optional[jax.Array], batch: int) -> jax.Array:
  return jnp.ones(batch, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)


def multi_label_sums(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None,
                     k: int = RECALL_K) -> dict:
  """Sums over the real examples of a multi-label batch, each a ``(numerator, denominator)``
  pair whose sums over chunks of a test set divide into exact values.

  * ``"loss"``: the per-example binary cross-entropy
    (:func:`per_example_sigmoid_cross_entropy`) over the number of examples.
  * ``"recall_at_5"`` (``k = 5``): the examples' true classes among their ``k`` highest logits,
    over their true classes: Keras' ``Recall(top_k=k)`` as TFF's tag prediction reports it
    (micro-averaged: every true class of every example counts once).
  * ``"precision"``: the classes predicted (``sigmoid(logit) > 0.5``, a positive logit) that
    are true, over those predicted: Keras' ``Precision()`` (micro-averaged).

  Args:
    logits: ``[B, num_classes]``.
    labels: ``[B, T]`` class ids, :data:`IGNORE` padding.
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.
    k: the k of recall at k (at most ``num_classes``).

  Returns:
    ``{"loss": (s, n), f"recall_at_{k}": (s, n), "precision": (s, n)}``, float32 scalars.
  """
  w = _example_weights(mask, logits.shape[0])
  targets = multi_hot(labels, logits.shape[-1])
  ce = per_example_sigmoid_cross_entropy(logits, labels)
  _, top = jax.lax.top_k(logits.astype(jnp.float32), min(k, logits.shape[-1]))
  hits = jnp.sum(jnp.take_along_axis(targets, top, axis=-1), axis=-1)
  predicted = (logits > 0).astype(jnp.float32)
  return {"loss": (jnp.sum(jnp.where(w > 0, ce * w, 0.0)), jnp.sum(w)),
          f"recall_at_{k}": (jnp.sum(hits * w), jnp.sum(jnp.sum(targets, -1) * w)),
          "precision": (jnp.sum(jnp.sum(predicted * targets, -1) * w),
                        jnp.sum(jnp.sum(predicted, -1) * w))}


def sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array,
                          mask: jax.Array | None = None) -> jax.Array:
  """Mean over the real examples of :func:`per_example_sigmoid_cross_entropy` (0 when there is
  none). TFF's tag prediction sums it over a batch (Keras' ``Reduction.SUM``); a mean makes a
  client's step independent of its batch size, as the single-label loss is.

  Args:
    logits: ``[B, num_classes]``.
    labels: ``[B, T]`` class ids, :data:`IGNORE` padding.
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.
  """
  w = _example_weights(mask, logits.shape[0])
  ce = per_example_sigmoid_cross_entropy(logits, labels)
  return _ratio(jnp.sum(jnp.where(w > 0, ce * w, 0.0)), jnp.sum(w))


def supervised_loss(multi_label: bool = False):
  """The training loss ``(logits, labels, mask) -> scalar`` of single-label
  (:func:`cross_entropy`) or multi-label (:func:`sigmoid_cross_entropy`) labels."""
  return sigmoid_cross_entropy if multi_label else cross_entropy


def evaluation_sums(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None,
                    multi_label: bool = False) -> dict:
  """The ``(numerator, denominator)`` sums of a batch's metrics by name, ``"loss"`` and those
  of :data:`METRICS` (single-label: ``"accuracy"``, :func:`masked_sums`; multi-label:
  ``"recall_at_5"`` and ``"precision"``, :func:`multi_label_sums`). :func:`ratios` divides
  them (over a whole test set once its chunks' sums are added).

  Args:
    logits: the model's logits for the batch.
    labels: its labels (class ids).
    mask: optional ``[B]`` weights (0/1 floats); ``None`` means all ones.
    multi_label: the labels are multi-label.
  """
  if multi_label:
    return multi_label_sums(logits, labels, mask)
  loss, correct, weight = masked_sums(logits, labels, mask)
  return {"loss": (loss, weight), "accuracy": (correct, weight)}


def ratios(sums: dict) -> dict:
  """``{name: numerator / denominator}`` of :func:`evaluation_sums` (0 where the denominator is
  0: no true class, no predicted one), divided on the host in float64.

  The division runs outside XLA so that a figure does not depend on how a program compiles it
  (XLA may turn a division by a value it can fold into a multiplication by the reciprocal): a
  run alone and the same run in a vmapped group report the same bits.

  Args:
    sums: ``{name: (numerator, denominator)}``, arrays of any shape (a leading experiment axis
      when vmapped), on the host or the device.

  Returns:
    ``{name: ratio}``, float64 numpy arrays of the sums' shape.
  """
  out = {}
  for name, (s, n) in jax.device_get(sums).items():
    s, n = np.asarray(s, np.float64), np.asarray(n, np.float64)
    out[name] = np.where(n > 0, s / np.where(n > 0, n, 1.0), 0.0)
  return out


def num_params(params) -> int:
  """Number of scalars in a parameter pytree."""
  return int(sum(math.prod(jnp.shape(p)) for p in jax.tree_util.tree_leaves(params)))
