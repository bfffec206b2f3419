"""Logistic regression on a bag of words: TFF's StackOverflow tag-prediction model.

TFF's baseline (``tff.simulation.baselines.stackoverflow.create_tag_prediction_task``) feeds
a Keras ``Dense(num_tags, activation="sigmoid")`` the normalized bag of words of a post: the
vector of its words' frequencies over the word vocabulary (each word's count divided by the
number of words, out-of-vocabulary ones included; the out-of-vocabulary coordinate dropped).
Here the input is the post's word ids (the host keeps ids, not ``vocab_size`` floats per
example) and the bag of words is formed inside the model; the dense layer is applied as the
weighted sum of the kernel rows of the words present, which equals
``dense(bag_of_words(ids))`` without building the ``[B, vocab_size]`` vector. The outputs are
logits: the sigmoid is in the loss (:func:`fedjax_dp.models.sigmoid_cross_entropy`).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class BagOfWordsLR(nn.Module):
  """Logits ``[B, num_classes]`` of a dense layer on the normalized bag of words of ``[B, L]``
  word ids ``x``: ``logits = bow(x) @ kernel + bias``, ``bow(x)[j]`` the count of id ``j + 1``
  in ``x`` over its non-zero ids (0 padding, ``1..vocab_size`` the words, a larger id out of
  the vocabulary; ``bow`` is 0 for an example of padding only, where TFF's mean is NaN).

  Parameters as Keras' ``Dense`` initializes them in TFF's model: ``kernel``
  ``[vocab_size, num_classes]`` Glorot-uniform, ``bias`` zeros; with 10,000 words and 500 tags
  5,000,500 parameters. The product is taken as a gather of the kernel rows of the ids present
  (an id outside ``1..vocab_size`` adds nothing, padding and out-of-vocabulary alike), weighted
  by ``1 / words``: the same logits, at a cost of ``L`` rows per example instead of a
  ``vocab_size``-long vector.

  Attributes:
    num_classes: outputs (tags).
    vocab_size: the words in the vocabulary.
  """
  num_classes: int
  vocab_size: int = 10_000

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.glorot_uniform(),
                        (self.vocab_size, self.num_classes))
    bias = self.param("bias", nn.initializers.zeros, (self.num_classes,))
    ids = x.astype(jnp.int32)
    known = (ids >= 1) & (ids <= self.vocab_size)
    words = jnp.sum(ids > 0, axis=-1, keepdims=True).astype(jnp.float32)
    weights = known.astype(kernel.dtype) / jnp.maximum(words, 1.0).astype(kernel.dtype)
    rows = kernel[jnp.clip(ids - 1, 0, self.vocab_size - 1)]  # [B, L, num_classes]
    return jnp.einsum("bl,blc->bc", weights, rows) + bias
