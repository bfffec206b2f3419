"""The DP-SGD family on the one round: client-side DP-SGD with per-class clip thresholds.

A DP-SGD-family round (spfl, spfl-sound, dp-fl, adp-fl, nodp-fl) is
described by a :class:`DPSGDPieces` record (static: the clients' steps with their
example sampling and per-step statistic, whether they are private) and built by
:func:`dpsgd_round`, a :class:`fedjax_dp.round.Round`: each cohort client
runs ``Q`` local DP-SGD steps (:func:`fedjax_dp.client.dp_sgd`, per-example
clipping and noise from :mod:`fedjax_dp.transforms.per_example`) and uploads
its model delta; the server averages the deltas and updates the per-class
clip thresholds (its state). Every number (the noise multipliers, betas,
the threshold rules' rates, the client and server learning rates, the
clients' privacy classes) comes in the round's ``hparams``, so runs that
differ only in numbers share one compilation. The algorithms' builders are
in :mod:`fedjax_dp.algorithms.spfl` and :mod:`fedjax_dp.algorithms.adp_fl`.

Privacy: example-level, local to each client (see :mod:`fedjax_dp.client`
and :mod:`fedjax_dp.transforms.per_example`; accounted by
:mod:`fedjax_dp.privacy.example_level`). The aggregate of the clients'
deltas is post-processing of their DP-SGD outputs, and so are the
thresholds when they are set from noisy statistics only. Not covered: the
per-client losses and raw norm statistics reported in the run's metrics
(:func:`dpsgd_metrics`, diagnostics).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax.numpy as jnp

from fedjax_dp.algorithms.fedavg import Training
from fedjax_dp.client import DPSGDSteps, make_optimizer
from fedjax_dp.round import ClientOut, Hooks, Piece, Round, tree_sub
from fedjax_dp.transforms import global_norm
from fedjax_dp.privacy.example_level import ExampleDPSGDMechanism


@dataclasses.dataclass(frozen=True)
class Rules:
  """What an algorithm of the DP-SGD family adds to the round: its clients' steps and its
  per-class clip thresholds (static; none of the functions may hold a number of the run: they
  read them from ``hp``, so that runs that differ only in numbers share the round).

  Attributes:
    statistic: the per-step noisy norm statistic ("none", "below", "norm").
    private: per-example clipping and noise (False: NoDP-FL's plain minibatch steps).
    client_args: ``(thresholds, hp, classes [C]) -> DPArgs`` with ``[C]`` leaves.
    threshold_rule: ``(thresholds, hp, StepStats [C], mask [C], classes [C]) -> thresholds``.
    init_thresholds: ``(params, hp) -> thresholds`` (``[len(class_names)]``, or ``[1]``) at
      round 0.
    class_names: the privacy classes in threshold order (metrics ``clip_<name>``).
    data_dependent_noise: published SP-FL's noise scaled by the batch's own norms.
  """

  statistic: str
  private: bool
  client_args: Callable
  threshold_rule: Callable
  init_thresholds: Callable
  class_names: tuple = ()
  data_dependent_noise: bool = False


@dataclasses.dataclass(frozen=True)
class DPSGDPieces:
  """The static structure of a DP-SGD-family round.

  Attributes:
    rules: the algorithm's steps and thresholds.
    weighting: "examples" or "uniform".
    steps: the clients' local steps (:class:`fedjax_dp.client.DPSGDSteps`: Q, L, the per-step
      example sampling and its Poisson capacity, the statistic, whether they are private).
  """

  rules: Rules
  weighting: str
  steps: DPSGDSteps


def example_record(pieces: DPSGDPieces) -> Callable:
  """``(hp, grad_key, stat_key=None) -> ExampleDPSGDMechanism``: the per-step privacy record of a
  class whose clients' DP-SGD uses ``hp[grad_key]`` on the gradient and ``hp[stat_key]`` on the
  norm statistic, with the combined multiplier ``hp["sigma"]`` (the float32 values the compiled
  steps use) and the round's batch size, steps, sampling and capacity."""

  steps = pieces.steps

  def record(hp, grad_key: str, stat_key: Optional[str] = None):
    """The per-step record of a class.

    Args:
      hp: the round's hyper-parameters (``sigma`` and the keys below).
      grad_key: the key of the gradient's noise multiplier.
      stat_key: the key of the norm statistic's noise std, or None (no statistic).

    Returns:
      An :class:`ExampleDPSGDMechanism` with ``pieces``' batch size, steps, sampling and capacity.
    """
    return ExampleDPSGDMechanism(
        float(hp["sigma"]), steps.batch_size, steps.local_steps, steps.sampling,
        grad_noise_multiplier=float(hp[grad_key]),
        stat_noise=float(hp[stat_key]) if stat_key else 0.0, capacity=steps.capacity)

  return record


def dpsgd_client(local_train: Callable, client_optimizer: str, pieces: DPSGDPieces) -> Piece:
  """``hp -> client``: :func:`fedjax_dp.client.dp_sgd`'s ``Q`` local steps, uploading ``w_{t,Q} - w_t``.

  Args:
    local_train: :func:`fedjax_dp.client.dp_sgd`'s ``train``.
    client_optimizer: the client optimizer's name, built inside the trace with learning rate
      ``hp["client_lr"]``.
    pieces: the round's static structure; with per-example clipping to a data-independent
      bound, the piece declares the per-step record (:func:`example_record`).

  Returns:
    The client :class:`fedjax_dp.round.Piece`. Its client's
    :class:`fedjax_dp.transforms.per_example.DPArgs` come in as its ``client_hp``; its
    :class:`fedjax_dp.client.StepStats` are the ``aux`` output (for the threshold rule and the
    metrics).
  """

  def client(hp):
    optimizer = make_optimizer(client_optimizer, hp["client_lr"])

    def fn(params0, x, y, count, row, args, key):
      """One client's local DP-SGD.

      Args:
        params0: the global model ``w_t`` (a pytree).
        x: the client's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples ``|D_n|``.
        row: unused (no per-client state).
        args: its :class:`fedjax_dp.transforms.per_example.DPArgs` (clip bound, scale, noise).
        key: its PRNG key.

      Returns:
        A :class:`fedjax_dp.round.ClientOut`: the delta ``w_{t,Q} - w_t``, the mean example
        loss, the delta's norm and the :class:`fedjax_dp.client.StepStats` as ``aux``.
      """
      del row
      params_q, stats = local_train(params0, x, y, count, key, args, optimizer)
      delta = tree_sub(params_q, params0)
      return ClientOut(upload=delta, loss=stats.loss, norm=global_norm(delta), aux=stats)

    return fn

  # Per-example clipping to a data-independent bound with noise declares its per-step record;
  # plain steps (NoDP-FL) and noise scaled by the batch's own norms (published SP-FL) declare none.
  sound = pieces.rules.private and not pieces.rules.data_dependent_noise
  return Piece(client, "dp_sgd", mechanism=example_record(pieces) if sound else None)


def dpsgd_metrics(class_names: tuple) -> Callable:
  """The round's extra metrics from the clients' :class:`fedjax_dp.client.StepStats` (raw
  diagnostics) and the thresholds in force this round (``clip_<class>``, from the server state
  before the rule)."""

  def metrics(state, new_params, out, sent, mask, hp):
    """The round's diagnostics (:attr:`fedjax_dp.round.Hooks.metrics`).

    Args:
      state: the round's state before the step (its ``server``: the thresholds in force).
      new_params: unused.
      out: the clients' :class:`fedjax_dp.round.ClientOut` (``aux``: ``[C]`` StepStats).
      sent: unused.
      mask: ``[C]``, 1 for real clients.
      hp: unused.

    Returns:
      Scalars: the fraction of sampled examples clipped, their mean gradient norm, the mean
      noise std, the Poisson overflow steps, the non-finite example gradients and
      ``clip_<class>`` per class.
    """
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


def dpsgd_round(model, num_clients: int, pieces: DPSGDPieces, training: Training, *,
                local_train: Callable, aggregator: Callable, attack: str = "none",
                attack_options: tuple = ()) -> Round:
  """A round of client-side DP-SGD with per-class thresholds, on the one federated round.

  Per round: each cohort client gets
  :class:`fedjax_dp.transforms.per_example.DPArgs` from its privacy class
  (``hp["client_class"]``, ``[num_clients]`` int32) and the current
  thresholds (``client_args``), runs :func:`fedjax_dp.client.dp_sgd` and
  uploads its model delta; the server takes the mean of the deltas weighted by
  ``pieces.weighting`` ("examples": sample counts, as in SP-FL Sec. 2.4 f;
  with server SGD at rate 1 this is the weighted average of the models) and
  then updates the thresholds from what the clients reported
  (``pieces.rules.threshold_rule``). The thresholds are the round's server state.

  Args:
    model: a :class:`fedjax_dp.models.Model`.
    num_clients: the population size.
    pieces: the static structure (:class:`DPSGDPieces`), the algorithm's :class:`Rules` in it.
    training: the client optimizer (rate ``hp["client_lr"]``) and the server optimizer (rate
      ``hp["server_lr"]``).
    local_train: from :func:`fedjax_dp.client.dp_sgd`.
    aggregator: ``hp -> Aggregator`` (the weighted mean, or a robust aggregator); any
      aggregator is post-processing of the clients' locally private uploads.
    attack, attack_options: the Byzantine clients' attack on the uploads and its static options
      (strengths in ``hp``).
  """
  rules = pieces.rules

  def classes_of(hp, ids):
    return jnp.asarray(hp["client_class"], jnp.int32)[ids]

  def _client_hparams(thresholds, hp, ids):
    """:attr:`fedjax_dp.round.Hooks.client_hparams`: ``client_args`` of the clients' classes."""
    return rules.client_args(thresholds, hp, classes_of(hp, ids))

  def _server_rule(thresholds, hp, stats, mask, ids):
    """:attr:`fedjax_dp.round.Hooks.server_rule`: ``threshold_rule`` of the clients' classes."""
    return rules.threshold_rule(thresholds, hp, stats, mask, classes_of(hp, ids))

  def init_server(params, hp):
    return jnp.asarray(rules.init_thresholds(params, hp), jnp.float32)

  return Round(
      model=model, num_clients=num_clients,
      client=dpsgd_client(local_train, training.client_optimizer, pieces), aggregator=aggregator,
      attack=attack, attack_options=attack_options,
      weighting=pieces.weighting, server_optimizer=training.server_optimizer,
      hooks=Hooks(init_server=init_server, client_hparams=_client_hparams,
                  server_rule=_server_rule, metrics=dpsgd_metrics(tuple(rules.class_names))),
      # The aggregate of the clients' DP-SGD deltas, and the thresholds, which the sound
      # variants set from noisy statistics only (see fedjax_dp.engine); published SP-FL sets them
      # from raw norms, so there they are diagnostics.
      released_metrics=("aggregate_norm",) + (() if rules.data_dependent_noise else ("clip_*",)),
      # Per-example gradients apply the model to one example at a time.
      model_batch=1 if rules.private else None)
