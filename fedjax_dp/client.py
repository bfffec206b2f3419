"""Client-side local training, run per client under ``jax.vmap``.

Two local loops, each ``Q`` steps under ``lax.scan`` on the client's own
padded data: :func:`local_sgd` (the FedAvg family) and :func:`dp_sgd`,
client-side DP-SGD (Abadi et al., CCS 2016) for example-level DP in
federated learning (the DP-SGD family). One DP-SGD step:

1. sample a batch from the client's ``|D_n|`` examples: Poisson sampling with
   rate ``q_n = L / |D_n|`` (each example independently; a draw above the
   step's capacity keeps a uniformly random subset, which the ledger
   accounts, :func:`poisson_indices`), or a fixed-size batch of ``L``
   examples drawn without replacement (:func:`fixed_indices`);
2. its per-example clipped and noised gradient
   (:func:`fedjax_dp.transforms.per_example.dp_gradient`: per-example
   gradients, clipping to ``C``, Gaussian noise ``N(0, (sigma C)^2 I)`` on
   the clipped sum, divided by ``L``), and one optimizer step.

Privacy of :func:`dp_sgd` (example-level, local to each client): the privacy
unit is one example of one client, under replace-one (the client's example
count, which sets its sampling rate and weight, is public). With a
data-independent ``C`` each step is a sampled Gaussian mechanism (see
:mod:`fedjax_dp.transforms.per_example` for its multiplier and for
``data_dependent_noise``, which voids the guarantee); the uploaded model is
post-processing. The accounting lives in
:mod:`fedjax_dp.privacy.example_level`. Not covered: the per-client losses
and raw norm statistics a client reports (:class:`StepStats`, diagnostics).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check, check_choice, check_unless_traced
from fedjax_dp.sampling import SAMPLINGS
from fedjax_dp.transforms import (DPArgs, GradientRule, dp_gradient, global_norm, per_example_grads,
                                  plain_gradient)


def sample_batch(x: jax.Array, y: jax.Array, count: jax.Array, key: jax.Array, batch_size: int):
  """A minibatch drawn uniformly with replacement from the first ``count`` rows.

  Padded rows (index >= count) are never drawn, so every example of the batch is
  real and the batch mask is all ones.

  Args:
    x: one client's padded examples ``[M, ...]``.
    y: its padded labels ``[M]``.
    count: its number of real examples (a scalar int array, ``1 <= count <= M``; a client of 0
      examples draws row 0, a padded row).
    key: PRNG key of the draw.
    batch_size: ``L``, examples drawn (a Python int).

  Returns:
    ``(x_b [L, ...], y_b [L], mask [L])``, the mask all ones (float32).
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
    """``local_steps`` optimizer steps from ``params0``, a fresh optimizer state.

    Args:
      params0: the round's global model (a pytree; also the objective's anchor).
      x: the client's padded examples ``[M, ...]``.
      y: its padded labels ``[M]``.
      count: its number of real examples (scalar int array, >= 1).
      key: PRNG key, split into one key per step (its batch, :func:`sample_batch`).

    Returns:
      ``(params_Q, mean_loss)``: the local model after the steps and the mean over the steps of
      the batch loss (float32 scalar).
    """
    def step(carry, k):
      params, opt_state = carry
      loss, g = grad_fn(params, sample_batch(x, y, count, k, batch_size), params0)
      upd, opt_state = optimizer.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), loss

    keys = jax.random.split(key, local_steps)
    (params, _), losses = jax.lax.scan(step, (params0, optimizer.init(params0)), keys, unroll=unroll)
    return params, jnp.mean(losses)

  return train


class StepStats(NamedTuple):
  """What a client reports after its local steps (sums over the steps).

  ``stat_sum`` is the noisy shifted statistic (a DP release when the clip
  bound and its noise are data-independent); everything else is raw and not
  private (diagnostics, and the published SP-FL threshold rule).
  """

  loss: jax.Array           # mean per-example loss over the sampled examples
  norm_sum: jax.Array       # sum of raw per-example gradient norms (not private)
  examples: jax.Array       # realized number of sampled examples (not private)
  clipped: jax.Array        # number of examples whose gradient was scaled down
  noise_std: jax.Array      # mean over steps of the noise std on the sum
  stat_sum: jax.Array       # sum over steps of the noisy shifted statistic
  overflow: jax.Array       # steps whose Poisson draw exceeded the batch capacity
  nonfinite: jax.Array      # sampled examples whose gradient was NaN/Inf (zeroed)


def poisson_indices(count: jax.Array, rate: jax.Array, capacity: int, max_examples: int,
                    key: jax.Array):
  """Poisson sampling: each of the first ``count`` rows joins with probability ``rate``.

  The selected rows are packed into a fixed ``capacity`` (chosen on the host
  so that overflow has probability below 1e-9 per step). When more rows are
  selected, a uniformly random ``capacity`` of them are kept: each row's
  uniform draw ``u_i`` is also its priority, and given ``u_i < rate`` the
  priorities of the selected rows are i.i.d. uniform, so the ``capacity``
  smallest form a uniform random subset. That is the truncation
  ``TruncatedSubsampledGaussianDpEvent`` accounts for.

  Args:
    count: the client's number of real examples (scalar int array, ``<= max_examples``).
    rate: ``q_n = L / |D_n|``, each real row's inclusion probability, in [0, 1].
    capacity: rows a step's batch is packed into (a Python int, ``<= max_examples``).
    max_examples: ``M``, rows of the client's padded arrays (a Python int).
    key: PRNG key of the draw.

  Returns:
    ``(idx [capacity], mask [capacity], overflow)``: row indices (the selected ones first),
    float32 1.0 for the slots holding a selected row, and ``overflow`` 1.0 when rows were
    dropped (a raw diagnostic), else 0.0.
  """
  u = jax.random.uniform(key, (max_examples,))
  sel = (u < rate) & (jnp.arange(max_examples) < count)
  n = jnp.sum(sel)
  _, idx = jax.lax.top_k(-jnp.where(sel, u, 2.0), capacity)
  mask = (jnp.arange(capacity) < n).astype(jnp.float32)
  return idx, mask, (n > capacity).astype(jnp.float32)


def fixed_indices(count: jax.Array, size: int, max_examples: int, key: jax.Array):
  """``size`` distinct rows uniformly from the first ``count`` (needs ``count >= size``).

  Args:
    count: the client's number of real examples (scalar int array, ``>= size``; with fewer,
      padded rows fill the batch).
    size: ``L``, the batch size (a Python int, ``<= max_examples``).
    max_examples: ``M``, rows of the client's padded arrays (a Python int).
    key: PRNG key of the draw.

  Returns:
    ``(idx [size], mask [size], overflow)``: distinct row indices, a float32 mask of ones and
    ``overflow`` 0.0 (the same outputs as :func:`poisson_indices`).
  """
  u = jax.random.uniform(key, (max_examples,))
  u = jnp.where(jnp.arange(max_examples) < count, u, 2.0)
  idx = jnp.argsort(u)[:size]
  return idx, jnp.ones((size,), jnp.float32), jnp.zeros((), jnp.float32)


@dataclasses.dataclass(frozen=True)
class DPSGDSteps:
  """The static structure of a client's local DP-SGD steps (:func:`dp_sgd`); the numbers (its
  :class:`DPArgs`, the optimizer's learning rate) come per call.

  Attributes:
    local_steps: Q.
    batch_size: ``L``: the expected (Poisson) or exact (fixed) batch size;
      the Poisson rate of a client with ``|D_n|`` examples is ``L / |D_n|``.
    max_examples: rows of the padded client arrays.
    sampling: "poisson" or "fixed".
    capacity: Poisson batch capacity (default: overflow probability < 1e-9
      for the smallest client is the caller's job; here ``max_examples``).
    statistic: the per-step noisy norm statistic ("none", "below", "norm").
    private: False runs the same sampling and steps with plain minibatch
      gradients (no per-example work, clip or noise): the NoDP baseline.
    data_dependent_noise: see :func:`dp_gradient` (published SP-FL only; the
      run then has no formal guarantee).
    unroll: ``lax.scan`` unroll factor.

  Raises:
    ConfigError: a field out of range. A run's ``local_steps`` and ``batch_size`` are checked
      where its settings are read (:class:`fedjax_dp.config.RunConfig`); these checks are for
      a caller's own numbers.
  """

  local_steps: int
  batch_size: int
  max_examples: int
  sampling: str = "poisson"
  capacity: Optional[int] = None
  statistic: str = "none"
  private: bool = True
  data_dependent_noise: bool = False
  unroll: int | bool = 1

  def __post_init__(self):
    check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")
    check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
    check_choice("example_sampling", self.sampling, SAMPLINGS)
    check(1 <= self.batch_capacity <= self.max_examples, "capacity", self.batch_capacity,
          f"must be in [1, {self.max_examples}]")

  @property
  def batch_capacity(self) -> int:
    """Rows a step's batch is packed into: the Poisson capacity, or the fixed batch size."""
    if self.sampling == "poisson":
      return int(self.capacity or self.max_examples)
    return int(self.batch_size)

  @property
  def rule(self) -> GradientRule:
    """The static part of each step's gradient (:func:`dp_gradient`); refuses an unknown
    ``statistic``."""
    return GradientRule(float(self.batch_size), self.statistic, self.data_dependent_noise)


def dp_sgd(objective: Callable, steps: DPSGDSteps) -> Callable:
  """Q local DP-SGD steps on one client's data, as one ``lax.scan``.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
    steps: the static structure (:class:`DPSGDSteps`).

  Returns:
    ``train(params0, x, y, count, key, args, optimizer) -> (params_Q, StepStats)``,
    where ``args`` are the client's :class:`DPArgs` and ``optimizer`` is the client optimizer
    applied to the noisy gradient (fresh state each round), both built inside the trace from
    the round's ``hparams``.

  Raises:
    ConfigError: an unknown ``steps.statistic``.
  """
  rule, cap, L = steps.rule, steps.batch_capacity, float(steps.batch_size)

  def train(params0, x, y, count, key, args: DPArgs, optimizer: optax.GradientTransformation):
    """``steps.local_steps`` DP-SGD steps from ``params0``, a fresh optimizer state.

    Args:
      params0: the round's global model (a pytree; also the objective's anchor).
      x: the client's padded examples ``[M, ...]`` (``M = steps.max_examples``).
      y: its padded labels ``[M]``.
      count: its number of real examples ``|D_n|`` (scalar int array); its Poisson rate is
        ``L / max(count, 1)``.
      key: PRNG key, split into one key per step, each split into the batch's, the gradient
        noise's and the statistic's.
      args: the client's :class:`DPArgs` (clip bound ``C``, scale, ``sigma``, statistic noise).
      optimizer: the client optimizer, applied to each step's noisy gradient.

    Returns:
      ``(params_Q, StepStats)``: the local model after the steps and the steps' statistics.
    """
    rate = L / jnp.maximum(count, 1).astype(jnp.float32)

    def step(carry, k):
      params, opt_state = carry
      k_batch, k_noise, k_stat = jax.random.split(k, 3)
      if steps.sampling == "poisson":
        idx, mask, overflow = poisson_indices(count, rate, cap, steps.max_examples, k_batch)
      else:
        idx, mask, overflow = fixed_indices(count, cap, steps.max_examples, k_batch)
      batch = (x[idx], y[idx], mask)
      if steps.private:
        g, info = dp_gradient(objective, params, params0, batch, args, k_noise, rule, k_stat)
      else:
        g, info = plain_gradient(objective, params, params0, batch, L)
      upd, opt_state = optimizer.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), dict(info, overflow=overflow)

    keys = jax.random.split(key, steps.local_steps)
    (params, _), infos = jax.lax.scan(step, (params0, optimizer.init(params0)), keys,
                                      unroll=steps.unroll)
    return params, _step_stats(infos)

  return train


def _step_stats(infos: dict) -> StepStats:
  """The :class:`StepStats` of the steps' stacked ``info`` dicts (:func:`dp_gradient`'s, with
  each step's ``overflow``)."""
  examples = jnp.sum(infos["examples"])
  return StepStats(
      loss=jnp.sum(infos["loss_sum"]) / jnp.maximum(examples, 1.0),
      norm_sum=jnp.sum(infos["norm_sum"]), examples=examples,
      clipped=jnp.sum(infos["clipped"]), noise_std=jnp.mean(infos["noise_std"]),
      stat_sum=jnp.sum(infos["stat"]), overflow=jnp.sum(infos["overflow"]),
      nonfinite=jnp.sum(infos["nonfinite"]))


def mean_initial_norm(objective: Callable, params, x, y, counts, per_client: int) -> jax.Array:
  """Mean per-example gradient L2 norm at ``params`` over every client's first ``per_client`` rows.

  SP-FL's initial clip threshold ("the mean of all clients' initial gradient
  L2 norms", Sec. 2.1). It reads the raw data: not private.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss`` (evaluated with ``params`` as anchor).
    params: the model the norms are taken at (a pytree).
    x: every client's padded examples ``[N, M, ...]``.
    y: their padded labels ``[N, M]``.
    counts: ``[N]`` their numbers of real examples (only real rows count).
    per_client: rows read per client (a Python int; capped at ``M``).

  Returns:
    float32 scalar: the mean norm over the real rows read (0 when there is none).
  """
  per_client = int(min(per_client, x.shape[1]))

  def client(xc, yc, c):
    """One client's gradient norms over its real rows among the first ``per_client``.

    Args:
      xc: the client's padded examples ``[M, ...]``.
      yc: its padded labels ``[M]``.
      c: its number of real examples.

    Returns:
      ``(norm_sum, rows)``: float32 sums of those rows' norms and of the rows.
    """
    _, g = per_example_grads(objective, params, params, xc[:per_client], yc[:per_client])
    m = (jnp.arange(per_client) < c).astype(jnp.float32)
    return jnp.sum(jax.vmap(global_norm)(g) * m), jnp.sum(m)

  sums, ns = jax.lax.map(lambda a: client(*a), (x, y, counts))
  return jnp.sum(sums) / jnp.maximum(jnp.sum(ns), 1.0)


def make_optimizer(name: str, learning_rate: float, **kwargs) -> optax.GradientTransformation:
  """Named optax optimizer: "sgd", "momentum" (0.9), "adam" (FedAdam on the server), "adagrad",
  "yogi".

  Args:
    name: one of :data:`OPTIMIZERS`.
    learning_rate: the step size (> 0; a traced hyper-parameter inside the round).
    **kwargs: ``momentum`` (default 0.9) for "momentum"; ``eps`` (default 1e-3) for "adam",
      "adagrad" and "yogi".

  Returns:
    The ``optax.GradientTransformation``.

  Raises:
    ConfigError: an unknown ``name``, or a concrete ``learning_rate`` that is not > 0 (a traced
      one, the compiled round's hyper-parameter, is checked where the settings are read).
  """
  check_choice("optimizer", name, OPTIMIZERS)
  check_unless_traced(lambda r: r > 0, "learning_rate", learning_rate, "must be > 0")
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
