"""The FedAvg family's round: local training, client transforms, aggregation, server step.

One call of :meth:`FedAvgProgram.round_step` is one federated round and is
traced into one compiled function by the engine. Algorithms of the family
(FedAvg, DP-FedAvg, BLUR/LUS, ...) differ only in the pieces they pass in.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.aggregators import Aggregator
from fedjax_dp.transforms import global_norm


class CohortBatch(NamedTuple):
  """The cohort's data, gathered inside the compiled round."""

  x: jax.Array       # [C, M, ...]
  y: jax.Array       # [C, M]
  counts: jax.Array  # [C]
  ids: jax.Array     # [C] client ids (rows of per-client state)
  mask: jax.Array    # [C] 1.0 for real clients


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
  agg_state: Any
  round: jax.Array


def tree_sub(a, b):
  return jax.tree_util.tree_map(jnp.subtract, a, b)


def client_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
  """One key per client, a function of the round key and the client id only.

  A client's randomness does not depend on its slot in the cohort or on the
  cohort's padded capacity.
  """
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)


def client_weights(weighting: str, batch: "CohortBatch") -> jax.Array:
  """Aggregation weights: 1 per client ("uniform") or its number of examples ("examples")."""
  return (jnp.ones_like(batch.mask) if weighting == "uniform"
          else batch.counts.astype(jnp.float32))


def server_step(aggregator: Aggregator, server_optimizer: optax.GradientTransformation,
                state: "ServerState", deltas, weights, mask, key):
  """Aggregates the cohort's deltas and applies the server optimizer to ``-aggregate``.

  Returns ``(new_state, aggregate)``; SGD with learning rate eta_g gives
  ``w_{t+1} = w_t + eta_g * aggregate``.
  """
  agg, agg_state = aggregator.aggregate(deltas, weights, mask, state.agg_state, key)
  grads = jax.tree_util.tree_map(jnp.negative, agg)
  updates, opt_state = server_optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return ServerState(params, opt_state, agg_state, state.round + 1), agg


def mask_rows(tree, mask):
  """Zeros the rows of padded clients (exact zeros, whatever they computed)."""
  return jax.tree_util.tree_map(
      lambda u: jnp.where(mask.reshape((-1,) + (1,) * (u.ndim - 1)) > 0, u, jnp.zeros_like(u)), tree)


@dataclasses.dataclass(frozen=True, eq=False)
class FedAvgProgram:
  """A FedAvg-family algorithm assembled from pure pieces.

  Attributes:
    model: a :class:`fedjax_dp.models.Model`.
    local_train: ``(params0, x, y, count, key) -> (params_Q, loss)`` (see
      :func:`fedjax_dp.client.local_sgd`).
    client_transform: optax-style transform of the client delta
      ``Delta_i = w_{t,Q} - w_{t,0}``, called with ``key=`` and ``params=w_{t,Q}``
      plus whatever ``client_extras`` returns.
    aggregator: combines the cohort's transformed deltas.
    server_optimizer: optax optimizer applied to ``-aggregate`` (SGD with learning
      rate eta_g gives ``w_t = w_{t-1} + eta_g * aggregate``).
    weighting: "uniform" (every client weight 1, required by the DP mechanisms)
      or "examples" (weight = number of examples, as in McMahan et al. 2017).
    mechanism: the privacy record of one round (for the ledger).
    clip: the clip bound, if any, for the "fraction clipped" metric.
    client_extras: optional ``(params_Q, params0, x, y, count, key) -> dict`` of
      extra keyword arguments for ``client_transform`` (e.g. the gradient that
      LUS scores elements with).
  """

  model: Any
  local_train: Callable
  client_transform: optax.GradientTransformationExtraArgs
  aggregator: Aggregator
  server_optimizer: optax.GradientTransformation
  mechanism: Any
  weighting: str = "uniform"
  clip: Optional[float] = None
  client_extras: Optional[Callable] = None
  # Metrics computed only from the noisy aggregate (see fedjax_dp.engine).
  released_metrics = ("aggregate_norm",)

  def init(self, key: jax.Array) -> ServerState:
    params = self.model.init(key)
    return ServerState(params, self.server_optimizer.init(params), self.aggregator.init(params),
                       jnp.zeros((), jnp.int32))

  def eval_params(self, state: ServerState):
    return state.params

  def client_update(self, params0, x, y, count, key):
    """One client's local training and transformed delta: ``(delta, pre_norm, loss)``."""
    k_train, k_tx, k_extra = jax.random.split(key, 3)
    params_q, loss = self.local_train(params0, x, y, count, k_train)
    delta = tree_sub(params_q, params0)
    extras = {} if self.client_extras is None else self.client_extras(
        params_q, params0, x, y, count, k_extra)
    out, _ = self.client_transform.update(delta, self.client_transform.init(delta), params_q,
                                          key=k_tx, **extras)
    return out, global_norm(delta), loss

  def round_step(self, state: ServerState, batch: CohortBatch, key: jax.Array):
    k_clients, k_agg = jax.random.split(key)
    keys = client_keys(k_clients, batch.ids)
    deltas, norms, losses = jax.vmap(self.client_update, in_axes=(None, 0, 0, 0, 0))(
        state.params, batch.x, batch.y, batch.counts, keys)
    deltas = mask_rows(deltas, batch.mask)
    new_state, agg = server_step(self.aggregator, self.server_optimizer, state, deltas,
                                 client_weights(self.weighting, batch), batch.mask, k_agg)
    metrics = {"client_loss": losses, "update_norm": norms, "mask": batch.mask,
               "aggregate_norm": global_norm(agg),
               "nonfinite_updates": jnp.sum(batch.mask * ~jnp.isfinite(norms))}
    return new_state, metrics
