"""Recurrent models: the LSTMs of federated Shakespeare and StackOverflow.

Inputs are token ids ``[B, T]`` (stored as ``float32`` in
:class:`fedjax_dp.data.FederatedData`, cast back to ``int32`` here); outputs are
logits ``[B, T, vocab_size]``, one next-token prediction per position, trained
with the sequence loss of :func:`fedjax_dp.models.cross_entropy`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp


class CharLSTM(nn.Module):
  """Embedding, stacked LSTMs, an optional dense projection, dense logits over the vocabulary
  at every position.

  The defaults are the next-character model of the federated Shakespeare
  benchmarks: embedding 8, two LSTM layers of 256 units, dense to the 90-token
  vocabulary (Reddi et al., "Adaptive Federated Optimization", ICLR 2021;
  FedJAX's ``create_lstm_model``): 720 + 271,360 + 525,312 + 23,130 = 820,522
  parameters. The LSTM is flax's ``OptimizedLSTMCell`` run by ``nn.RNN`` (a
  ``lax.scan`` over positions), so it stays one loop under ``vmap`` over
  clients.

  StackOverflow's next-word model (TFF's baseline, FedJAX's ``create_lstm_model``) is
  ``embed=96, hidden=(670,), project=96``: with 10,004 tokens 960,384 + 2,055,560 + 64,416 +
  970,388 = 4,050,748 parameters.

  Attributes:
    vocab_size: number of tokens (input ids and output classes).
    embed: embedding width.
    hidden: units of each LSTM layer, bottom first.
    project: width of a dense layer (no activation) between the last LSTM and the logits;
      ``None``: none.
  """
  vocab_size: int
  embed: int = 8
  hidden: Sequence[int] = (256, 256)
  project: Optional[int] = None

  @nn.compact
  def __call__(self, x):
    h = nn.Embed(self.vocab_size, self.embed)(x.astype(jnp.int32))
    for units in self.hidden:
      h = nn.RNN(nn.OptimizedLSTMCell(units))(h)
    if self.project is not None:
      h = nn.Dense(self.project)(h)
    return nn.Dense(self.vocab_size)(h)
