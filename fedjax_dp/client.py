"""Client-side local training, run per client under ``jax.vmap``."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check


def sample_batch(x: jax.Array, y: jax.Array, count: jax.Array, key: jax.Array, batch_size: int):
  """A minibatch drawn uniformly with replacement from the first ``count`` rows.

  Padded rows (index >= count) are never drawn, so every example of the batch is
  real and the batch mask is all ones.
  """
  idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(count, 1))
  return x[idx], y[idx], jnp.ones((batch_size,), jnp.float32)


def local_sgd(objective: Callable, optimizer: optax.GradientTransformation, local_steps: int,
              batch_size: int, unroll: int | bool = 1) -> Callable:
  """Q local optimizer steps on the client's own data, as one ``lax.scan``.

  Returns ``train(params0, x, y, count, key) -> (params_Q, mean_loss)`` where
  ``x, y`` are one client's padded arrays and ``count`` its number of examples.
  The objective sees ``params0`` (the round's global model) as its anchor.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
    optimizer: the client optimizer (fresh state each round).
    local_steps: Q.
    batch_size: examples per step, drawn with replacement from the client's data.
    unroll: ``lax.scan`` unroll factor (the local-loop strategy knob: ``True``
      unrolls fully, which is faster for tiny models and costs memory).
  """
  check(local_steps >= 1, "local_steps", local_steps, "must be >= 1")
  check(batch_size >= 1, "batch_size", batch_size, "must be >= 1")
  grad_fn = jax.value_and_grad(objective)

  def train(params0, x, y, count, key):
    def step(carry, k):
      params, opt_state = carry
      loss, g = grad_fn(params, sample_batch(x, y, count, k, batch_size), params0)
      upd, opt_state = optimizer.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), loss

    keys = jax.random.split(key, local_steps)
    (params, _), losses = jax.lax.scan(step, (params0, optimizer.init(params0)), keys, unroll=unroll)
    return params, jnp.mean(losses)

  return train


def make_optimizer(name: str, learning_rate: float, **kwargs) -> optax.GradientTransformation:
  """Named optax optimizer: "sgd", "momentum" (0.9), "adam" (FedAdam on the server), "adagrad", "yogi"."""
  from fedjax_dp.errors import check_choice
  check_choice("optimizer", name, OPTIMIZERS)
  check(learning_rate > 0, "learning_rate", learning_rate, "must be > 0")
  if name == "sgd":
    return optax.sgd(learning_rate)
  if name == "momentum":
    return optax.sgd(learning_rate, momentum=kwargs.get("momentum", 0.9))
  if name == "adam":
    return optax.adam(learning_rate, b1=0.9, b2=0.99, eps=kwargs.get("eps", 1e-3))
  if name == "adagrad":
    return optax.adagrad(learning_rate, eps=kwargs.get("eps", 1e-3))
  return optax.yogi(learning_rate, eps=kwargs.get("eps", 1e-3))


OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad", "yogi")
