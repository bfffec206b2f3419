"""Client-side DP-SGD (Abadi et al., CCS 2016) for example-level DP in federated learning.

Each client trains the round's global model on its own data with Q local
DP-SGD steps, run per client under ``jax.vmap`` and over the steps under
``lax.scan``. One step:

1. sample a batch from the client's ``|D_n|`` examples: Poisson sampling with
   rate ``q_n = L / |D_n|`` (each example independently; a draw above the
   step's capacity keeps a uniformly random subset, which the ledger
   accounts), or a fixed-size batch of ``L`` examples drawn without
   replacement;
2. per-example gradients ``g_i`` by a nested ``jax.vmap`` (clients x examples);
   a gradient with a NaN or Inf entry is replaced by zeros (and counted);
3. per-example scaling and clipping ``g_i * min(1, s, C / ||g_i||)`` (``s`` is
   a constant scale, the SP-FL proportional factor beta; ``s = 1`` is plain
   clipping to ``C``);
4. Gaussian noise ``N(0, (sigma C)^2 I)`` on the batch's clipped sum, divided
   by the expected batch size ``L`` (public), and one optimizer step.

``C``, ``s`` and ``sigma`` come in per client as arrays (:class:`DPArgs`), so
a clip bound that changes every round or differs between privacy classes does
not recompile the round. The family runs on the one federated round
(:func:`dpsgd_round`, a :class:`fedjax_dp.round.Round`): every number (the
noise multipliers, betas, the threshold rules' rates, the client and server
learning rates, the clients' privacy classes) comes in the round's
``hparams``, so runs that differ only in numbers share one compilation.

Optionally each step also releases a noisy per-example *statistic* of the
batch's gradient norms (for adaptive clip bounds): ``sum_i (s_i - 1/2) +
N(0, stat_noise^2)`` with ``s_i`` in ``[0, 1]`` (``"below"``:
``1[||g_i|| <= C]``, Andrew et al., NeurIPS 2021; ``"norm"``:
``min(||g_i||, B) / B``). Shifting by 1/2 halves its add/remove sensitivity
to 1/2 (Andrew et al., Sec. 3).

Privacy (example-level, local to each client): the privacy unit is one
example of one client, under replace-one (the client's example count, which
sets its sampling rate and weight, is public). With a data-independent ``C``
(or one computed only from earlier noisy releases) each step is a sampled
Gaussian mechanism with multiplier ``z = sigma`` without a statistic and
``z = (sigma^-2 + (2 stat_noise)^-2)^(-1/2)`` with one; the uploaded model is
post-processing. The accounting lives in
:mod:`fedjax_dp.privacy.example_level`. SP-FL's proportional clipping as
published needs ``data_dependent_noise=True`` in :func:`dp_sgd` (chosen when
the round is built): then a client with ``C = inf`` gets noise scaled by its
batch's own mean gradient norm and *no* DP guarantee holds. Without it the
noise is always ``sigma * C`` (an infinite ``C`` then gives an infinite
noise, never a silent data-dependent one). Not covered in any case: the
per-client losses and raw norm statistics reported in the run's metrics
(diagnostics).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp import aggregators
from fedjax_dp.client import make_optimizer
from fedjax_dp.errors import check, check_choice
from fedjax_dp.round import ClientOut, Round, tree_sub
from fedjax_dp.transforms import gaussian_like, global_norm, salted

EXAMPLE_SAMPLINGS = ("poisson", "fixed")
STATISTICS = ("none", "below", "norm")
SALT_STAT = 0x57A7


class DPArgs(NamedTuple):
  """One client's DP-SGD settings for this round (arrays; batched under vmap).

  Attributes:
    clip: per-example L2 bound ``C`` (``inf``: no bound; the noise scale is
      then data-dependent and there is no DP guarantee).
    scale: constant factor ``s`` applied to every per-example gradient before
      clipping (SP-FL's proportional clipping factor beta; 1 for plain DP-SGD).
    noise_multiplier: ``sigma``: the noise on a step's clipped sum has standard
      deviation ``sigma * C`` (``sigma * s * mean_i ||g_i||`` when ``C = inf``).
    stat_noise: standard deviation of the noise on the step's norm statistic.
    stat_bound: ``B`` of the ``"norm"`` statistic ``min(||g_i||, B) / B``.
  """

  clip: jax.Array
  scale: jax.Array
  noise_multiplier: jax.Array
  stat_noise: jax.Array
  stat_bound: jax.Array


def dp_args(clip, scale=1.0, noise_multiplier=0.0, stat_noise=0.0, stat_bound=1.0) -> DPArgs:
  """A :class:`DPArgs` of float32 arrays (broadcast to a common shape)."""
  vals = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in
                                (clip, scale, noise_multiplier, stat_noise, stat_bound)))
  return DPArgs(*vals)


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


def per_example_grads(objective: Callable, params, anchor, x: jax.Array, y: jax.Array):
  """Per-example losses ``[B]`` and gradients (leaves ``[B, ...]``) by ``jax.vmap``.

  ``objective(params, (x, y, mask), anchor)`` is evaluated on one example at a
  time; under the engine's client ``vmap`` this is the nested clients x
  examples vmap.
  """
  def one(p, xi, yi):
    return objective(p, (xi[None], yi[None], jnp.ones((1,), jnp.float32)), anchor)
  return jax.vmap(jax.value_and_grad(one), in_axes=(None, 0, 0))(params, x, y)


def clip_factors(norms: jax.Array, clip: jax.Array, scale: jax.Array) -> jax.Array:
  """Per-example factors ``min(1, s, C / ||g_i||)``: ``||factor_i g_i|| <= min(C, s ||g_i||)``."""
  return jnp.minimum(jnp.minimum(1.0, scale), clip / jnp.maximum(norms, 1e-30))


def poisson_indices(count: jax.Array, rate: jax.Array, capacity: int, max_examples: int,
                    key: jax.Array):
  """Poisson sampling: each of the first ``count`` rows joins with probability ``rate``.

  The selected rows are packed into a fixed ``capacity`` (chosen on the host
  so that overflow has probability below 1e-9 per step). When more rows are
  selected, a uniformly random ``capacity`` of them are kept: each row's
  uniform draw ``u_i`` is also its priority, and given ``u_i < rate`` the
  priorities of the selected rows are i.i.d. uniform, so the ``capacity``
  smallest form a uniform random subset. That is the truncation
  ``TruncatedSubsampledGaussianDpEvent`` accounts for. Returns
  ``(idx [capacity], mask [capacity], overflow)``; ``overflow`` is 1.0 when
  rows were dropped (a raw diagnostic).
  """
  u = jax.random.uniform(key, (max_examples,))
  sel = (u < rate) & (jnp.arange(max_examples) < count)
  n = jnp.sum(sel)
  _, idx = jax.lax.top_k(-jnp.where(sel, u, 2.0), capacity)
  mask = (jnp.arange(capacity) < n).astype(jnp.float32)
  return idx, mask, (n > capacity).astype(jnp.float32)


def fixed_indices(count: jax.Array, size: int, max_examples: int, key: jax.Array):
  """``size`` distinct rows uniformly from the first ``count`` (needs ``count >= size``)."""
  u = jax.random.uniform(key, (max_examples,))
  u = jnp.where(jnp.arange(max_examples) < count, u, 2.0)
  idx = jnp.argsort(u)[:size]
  return idx, jnp.ones((size,), jnp.float32), jnp.zeros((), jnp.float32)


def dp_gradient(objective: Callable, params, anchor, x: jax.Array, y: jax.Array,
                mask: jax.Array, args: DPArgs, key: jax.Array, expected_batch: float,
                statistic: str = "none", data_dependent_noise: bool = False):
  """One DP-SGD gradient: ``(sum_i mask_i clip(g_i) + N(0, (sigma C)^2 I)) / L``.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
    params: the current local model.
    anchor: the round's global model (passed through to the objective).
    x, y: the sampled batch (``[K, ...]``, ``[K]``).
    mask: ``[K]`` 1.0 for sampled examples (0 for the capacity's padding).
    args: this client's :class:`DPArgs`.
    key: noise key.
    expected_batch: ``L``, the public denominator.
    statistic: "none", "below" or "norm" (module docstring).
    data_dependent_noise: SP-FL's published rule (a static choice): where
      ``C = inf``, scale the noise by the batch's mean gradient norm.

  Returns:
    ``(gradient, info)`` with ``info`` a dict of scalars: ``loss_sum``,
    ``norm_sum``, ``examples``, ``clipped``, ``noise_std``, ``stat``,
    ``nonfinite`` (examples whose gradient had NaN/Inf and was zeroed).

  Privacy: the noise standard deviation is ``sigma * C`` for the bound in
  force. With ``data_dependent_noise`` and ``C = inf`` (SP-FL's proportional
  clipping, Eq. 7) the bound in force is ``s * ||g_i||`` per example and the
  noise uses ``sigma * s * mean_i ||g_i||`` over the batch: it depends on the
  data and the step has no sensitivity bound, hence no DP guarantee. A
  non-finite gradient is zeroed before clipping, so it cannot turn the sum
  into NaN and void the bound.
  """
  check_choice("statistic", statistic, STATISTICS)
  losses, grads = per_example_grads(objective, params, anchor, x, y)
  norms = jax.vmap(global_norm)(grads)
  finite = jnp.isfinite(norms)
  grads = jax.tree_util.tree_map(
      lambda g: jnp.where(finite.reshape((-1,) + (1,) * (g.ndim - 1)), g, jnp.zeros_like(g)), grads)
  norms = jnp.where(finite, norms, 0.0)
  factors = clip_factors(norms, args.clip, args.scale) * mask
  clipped_sum = jax.tree_util.tree_map(
      lambda g: jnp.tensordot(factors, g, axes=(0, 0)).astype(g.dtype), grads)
  examples = jnp.sum(mask)
  mean_norm = jnp.sum(norms * mask) / jnp.maximum(examples, 1.0)
  if data_dependent_noise:
    bound = jnp.where(jnp.isfinite(args.clip), args.clip, args.scale * mean_norm)
  else:
    bound = args.clip
  noise_std = args.noise_multiplier * bound
  noisy = jax.tree_util.tree_map(jnp.add, clipped_sum, gaussian_like(clipped_sum, noise_std, key))
  grad = jax.tree_util.tree_map(lambda g: g / expected_batch, noisy)
  if statistic == "none":
    stat = jnp.zeros((), jnp.float32)
  else:
    if statistic == "below":
      s = (norms <= args.clip).astype(jnp.float32)
    else:
      s = jnp.minimum(norms, args.stat_bound) / args.stat_bound
    stat = jnp.sum((s - 0.5) * mask) + args.stat_noise * jax.random.normal(
        salted(key, SALT_STAT), (), jnp.float32)
  info = {"loss_sum": jnp.sum(losses * mask), "norm_sum": jnp.sum(norms * mask),
          "examples": examples, "clipped": jnp.sum((factors < 1.0) * mask),
          "noise_std": noise_std, "stat": stat,
          "nonfinite": jnp.sum((~finite) * mask)}
  return grad, info


def plain_gradient(objective: Callable, params, anchor, x, y, mask, key, expected_batch: float):
  """Non-private counterpart of :func:`dp_gradient`: ``sum_i mask_i g_i / L``, no per-example work."""
  del key
  def total(p):
    return objective(p, (x, y, mask), anchor) * jnp.sum(mask)
  loss_sum, g = jax.value_and_grad(total)(params)
  grad = jax.tree_util.tree_map(lambda t: t / expected_batch, g)
  zero = jnp.zeros((), jnp.float32)
  return grad, {"loss_sum": loss_sum, "norm_sum": zero, "examples": jnp.sum(mask),
                "clipped": zero, "noise_std": zero, "stat": zero, "nonfinite": zero}


def dp_sgd(objective: Callable, local_steps: int, batch_size: int, max_examples: int,
           sampling: str = "poisson", capacity: Optional[int] = None, statistic: str = "none",
           private: bool = True, data_dependent_noise: bool = False,
           unroll: int | bool = 1) -> Callable:
  """Q local DP-SGD steps on one client's data, as one ``lax.scan``.

  The arguments are the static structure; the numbers come per call (the
  client's :class:`DPArgs`, and the optimizer, built inside the trace from
  the round's ``hparams``).

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
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

  Returns:
    ``train(params0, x, y, count, key, args, optimizer) -> (params_Q, StepStats)``,
    where ``optimizer`` is the client optimizer applied to the noisy gradient
    (fresh state each round).
  """
  check(local_steps >= 1, "local_steps", local_steps, "must be >= 1")
  check(batch_size >= 1, "batch_size", batch_size, "must be >= 1")
  check_choice("example_sampling", sampling, EXAMPLE_SAMPLINGS)
  check_choice("statistic", statistic, STATISTICS)
  cap = int(capacity or max_examples) if sampling == "poisson" else int(batch_size)
  check(1 <= cap <= max_examples, "capacity", cap, f"must be in [1, {max_examples}]")
  L = float(batch_size)

  def train(params0, x, y, count, key, args: DPArgs, optimizer: optax.GradientTransformation):
    rate = L / jnp.maximum(count, 1).astype(jnp.float32)

    def step(carry, k):
      params, opt_state = carry
      k_batch, k_noise = jax.random.split(k)
      if sampling == "poisson":
        idx, mask, overflow = poisson_indices(count, rate, cap, max_examples, k_batch)
      else:
        idx, mask, overflow = fixed_indices(count, cap, max_examples, k_batch)
      if private:
        g, info = dp_gradient(objective, params, params0, x[idx], y[idx], mask, args, k_noise, L,
                              statistic, data_dependent_noise)
      else:
        g, info = plain_gradient(objective, params, params0, x[idx], y[idx], mask, k_noise, L)
      upd, opt_state = optimizer.update(g, opt_state, params)
      return (optax.apply_updates(params, upd), opt_state), dict(info, overflow=overflow)

    keys = jax.random.split(key, local_steps)
    (params, _), infos = jax.lax.scan(step, (params0, optimizer.init(params0)), keys, unroll=unroll)
    examples = jnp.sum(infos["examples"])
    stats = StepStats(
        loss=jnp.sum(infos["loss_sum"]) / jnp.maximum(examples, 1.0),
        norm_sum=jnp.sum(infos["norm_sum"]), examples=examples,
        clipped=jnp.sum(infos["clipped"]), noise_std=jnp.mean(infos["noise_std"]),
        stat_sum=jnp.sum(infos["stat"]), overflow=jnp.sum(infos["overflow"]),
        nonfinite=jnp.sum(infos["nonfinite"]))
    return params, stats

  return train


def mean_initial_norm(objective: Callable, params, x, y, counts, per_client: int) -> jax.Array:
  """Mean per-example gradient L2 norm at ``params`` over every client's first ``per_client`` rows.

  SP-FL's initial clip threshold ("the mean of all clients' initial gradient
  L2 norms", Sec. 2.1). It reads the raw data: not private.
  """
  per_client = int(min(per_client, x.shape[1]))

  def client(xc, yc, c):
    _, g = per_example_grads(objective, params, params, xc[:per_client], yc[:per_client])
    m = (jnp.arange(per_client) < c).astype(jnp.float32)
    return jnp.sum(jax.vmap(global_norm)(g) * m), jnp.sum(m)

  sums, ns = jax.lax.map(lambda a: client(*a), (x, y, counts))
  return jnp.sum(sums) / jnp.maximum(jnp.sum(ns), 1.0)


@dataclasses.dataclass(frozen=True)
class DPSGDPieces:
  """The static structure of a DP-SGD-family round (its Round's ``describe``).

  Attributes:
    name: the algorithm ("spfl", "spfl-sound", "dp-fl", "adp-fl", "nodp-fl").
    sampling: per-step example sampling, "poisson" or "fixed".
    capacity: the Poisson batch capacity (None for fixed-size batches).
    statistic: the per-step noisy norm statistic ("none", "below", "norm").
    private: per-example clipping and noise (False: NoDP-FL's plain minibatch steps).
    data_dependent_noise: published SP-FL's noise scaled by the batch's own norms.
    class_names: the privacy classes in threshold order (metrics ``clip_<name>``).
    weighting: "examples" or "uniform".
  """

  name: str
  sampling: str
  capacity: Optional[int]
  statistic: str
  private: bool
  data_dependent_noise: bool
  class_names: tuple
  weighting: str

  # No update-level clip bound: each example's gradient is clipped inside DP-SGD instead (so the
  # engine reports no update-level ``fraction_clipped``).
  bound = None


def dpsgd_client(local_train: Callable, client_optimizer: str) -> Callable:
  """``hp -> client``: :func:`dp_sgd`'s ``Q`` local steps, uploading ``w_{t,Q} - w_t``.

  The client optimizer is built inside the trace with learning rate
  ``hp["client_lr"]``; the client's :class:`DPArgs` come in as its
  ``client_hp``; its :class:`StepStats` are the ``aux`` output (for the
  threshold rule and the metrics).
  """

  def client(hp):
    optimizer = make_optimizer(client_optimizer, hp["client_lr"])

    def fn(params0, x, y, count, row, args, key):
      del row
      params_q, stats = local_train(params0, x, y, count, key, args, optimizer)
      delta = tree_sub(params_q, params0)
      return ClientOut(upload=delta, loss=stats.loss, norm=global_norm(delta), aux=stats)

    return fn

  return client


def dpsgd_metrics(class_names: tuple) -> Callable:
  """The round's extra metrics from the clients' :class:`StepStats` (raw diagnostics) and the
  thresholds in force this round (``clip_<class>``, from the server state before the rule)."""

  def metrics(state, new_params, out, sent, mask, hp):
    del new_params, sent, hp
    stats = out.aux
    examples = jnp.maximum(jnp.sum(stats.examples * mask), 1.0)
    m = {"fraction_examples_clipped": jnp.sum(stats.clipped * mask) / examples,
         "mean_example_grad_norm": jnp.sum(stats.norm_sum * mask) / examples,
         "noise_std": jnp.sum(stats.noise_std * mask) / jnp.maximum(jnp.sum(mask), 1.0),
         "poisson_overflow_steps": jnp.sum(stats.overflow * mask),
         "nonfinite_example_grads": jnp.sum(stats.nonfinite * mask)}
    for i, name in enumerate(class_names):
      m[f"clip_{name}"] = state.server[i]
    return m

  return metrics


def dpsgd_round(model, num_clients: int, pieces: DPSGDPieces, *, local_train: Callable,
                client_optimizer: str, server_optimizer: str, client_args: Callable,
                threshold_rule: Callable, init_thresholds: Callable) -> Round:
  """A round of client-side DP-SGD with per-class thresholds, on the one federated round.

  Per round: each cohort client gets :class:`DPArgs` from its privacy class
  (``hp["client_class"]``, ``[num_clients]`` int32) and the current
  thresholds (``client_args``), runs :func:`dp_sgd` and uploads its model
  delta; the server takes the mean of the deltas weighted by
  ``pieces.weighting`` ("examples": sample counts, as in SP-FL Sec. 2.4 f;
  with server SGD at rate 1 this is the weighted average of the models) and
  then updates the thresholds from what the clients reported
  (``threshold_rule``). The thresholds are the round's server state.

  Args:
    model: a :class:`fedjax_dp.models.Model`.
    num_clients: the population size.
    pieces: the static structure (:class:`DPSGDPieces`).
    local_train: from :func:`dp_sgd`.
    client_optimizer: name of the client optimizer (rate ``hp["client_lr"]``).
    server_optimizer: name of the server optimizer (rate ``hp["server_lr"]``).
    client_args: ``(thresholds, hp, classes [C]) -> DPArgs`` with ``[C]`` leaves.
    threshold_rule: ``(thresholds, hp, StepStats [C], mask [C], classes [C]) -> thresholds``.
    init_thresholds: ``(params, hp) -> thresholds`` (``[len(class_names)]``, or ``[1]``) at round 0.

  None of the functions may hold a number of the run: they read them from
  ``hp``, so that the :class:`Round` can be shared by runs that differ only
  in numbers (:func:`fedjax_dp.algorithms.cached_round`).
  """

  def classes_of(hp, ids):
    return jnp.asarray(hp["client_class"], jnp.int32)[ids]

  def client_hparams(thresholds, hp, ids):
    return client_args(thresholds, hp, classes_of(hp, ids))

  def server_rule(thresholds, hp, stats, mask, ids):
    return threshold_rule(thresholds, hp, stats, mask, classes_of(hp, ids))

  def init_server(params, hp):
    return jnp.asarray(init_thresholds(params, hp), jnp.float32)

  def aggregator(hp):
    del hp
    return aggregators.robust.guard_nonfinite(aggregators.mean("realized"))

  return Round(
      model=model, num_clients=num_clients,
      client=dpsgd_client(local_train, client_optimizer), aggregator=aggregator,
      weighting=pieces.weighting, server_optimizer=server_optimizer, init_server=init_server,
      client_hparams=client_hparams, server_rule=server_rule,
      metrics=dpsgd_metrics(tuple(pieces.class_names)),
      # The aggregate of the clients' DP-SGD deltas, and the thresholds, which the sound
      # variants set from noisy statistics only (see fedjax_dp.engine).
      released_metrics=("aggregate_norm", "clip_*"), describe=pieces)
