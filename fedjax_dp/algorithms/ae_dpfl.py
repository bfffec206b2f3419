"""AE-DPFL: private aggregation of the clients' votes on a public unlabeled set.

Zhu, Yu, Wang et al., "Voting-based approaches for differentially private
federated learning" (AE-DPFL, the argmax-ensemble baseline Cheng et al., CVPR
2022 cite). One round:

* each sampled client trains from the global model with FedAvg's local SGD
  (:func:`fedjax_dp.client.local_sgd`) and votes on each of the ``m`` public
  examples: the one-hot vector of its local model's argmax, so its upload is a
  ``[m, num_classes]`` float32 histogram whose rows each sum to 1;
* the server sees only the sum of the votes (secure aggregation, simulated)
  plus ``N(0, sigma^2)`` on every count, ``sigma = z sqrt(m)``: the noised mean
  (:func:`fedjax_dp.aggregators.mean`) with the public denominator 1;
* the server labels each public example with the argmax of its noisy counts and
  trains the global model on them: ``server_steps`` SGD steps of
  ``server_batch`` examples (the run's ``--server-optimizer`` at ``--server-lr``,
  fresh each round), the round's own server step
  (:attr:`fedjax_dp.round.Hooks.server_step`).

The public set is a held-out part of the training split: the examples of the
last clients (ids ``N - k .. N - 1``, the fewest whose examples reach ``m``),
in id order, the first ``m`` of them. Those ``k`` clients leave the
population: the sampler, the privacy accounting and the Byzantine ids see
clients ``0 .. N - k - 1`` only. Their labels are never read (the round holds
``public_x`` only) and the test set is never touched.

Privacy: user-level, add/remove one client under Poisson sampling. A client's
votes are one-hot on each of the ``m`` examples, so adding or removing it
moves the count histogram by exactly L2 norm ``sqrt(m)`` (1 per example). The
client piece declares that bound (``hp["vote_norm"] = sqrt(m)``) and the sum
declares noise scaled to it, so the derived record
(:func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`) is one sampled
Gaussian of noise multiplier ``z = sigma / sqrt(m)`` per round:
``PoissonSampledDpEvent(q, GaussianDpEvent(z))``. Unsampled, that is the RDP of
``m`` Gaussian queries of sensitivity 1 and noise ``sigma`` composed; the
cohort is drawn once for all ``m`` queries, so the sampling wraps the whole
release. ``--noise-multiplier`` is ``z``; ``--target-epsilon`` calibrates it.
With fixed-size cohorts the record is replace-one with sensitivity
``2 sqrt(m)`` (the sum's triangle bound; replacing a client moves the counts by
at most ``sqrt(2m)``, so that epsilon is an upper bound). The public clients'
examples are public by design and not protected.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import aggregators, objectives
from fedjax_dp.algorithms.base import (LOCAL, USER, Setup, algorithm, cached_round,
                                       common_hparams, read_options, round_key)
from fedjax_dp.algorithms.fedavg import Training
from fedjax_dp.algorithms.options import Option
from fedjax_dp.client import local_sgd, make_optimizer
from fedjax_dp.errors import check
from fedjax_dp.privacy.mechanisms import RELATION_WORDS, GaussianSumMechanism
from fedjax_dp.round import ClientOut, Hooks, Piece, Round
from fedjax_dp.transforms import global_norm
from fedjax_dp.algorithms.dp_fedavg import make_model, resolve_noise_multiplier
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.mechanisms import user_level_mechanism
from fedjax_dp.sampling import make_sampler

OPTIONS = (
    Option("public_size", 100, "m: unlabeled public examples the clients vote on, held out from "
           "the training split (the last clients' examples; those clients leave the population)",
           kind="int", low=1, static=True),
    Option("server_steps", 50, "SGD steps the server trains the model on the noisy labels per "
           "round", kind="int", low=1, static=True),
    Option("server_batch", 32, "public examples per server step (drawn with replacement)",
           kind="int", low=1, static=True),
)


@dataclasses.dataclass(frozen=True)
class VoteSumMechanism(GaussianSumMechanism):
  """:class:`GaussianSumMechanism` whose bound ``clip`` is the votes' L2 norm ``sqrt(m)``: the
  same event, stated for AE-DPFL's release."""

  @property
  def guarantee_note(self) -> str:
    if self.noise_multiplier == 0:
      return "noise_multiplier=0: the exact vote counts are released, no guarantee"
    rel = RELATION_WORDS[self.relation] + (
        "; sensitivity taken as 2 sqrt(m)" if self.relation == "replace_one" else "")
    return (f"user-level DP; neighbouring relation: {rel}; one-hot votes on m = "
            f"{round(self.clip ** 2)} public examples: the counts' L2 sensitivity is sqrt(m) = "
            f"{self.clip:.4g}, noise std {self.noise_stddev:.4g} per count; the public set's "
            "clients are excluded from the population and not protected")


def public_split(data, size: int):
  """``(public_x [size, ...], population)``: the public set and the clients that remain.

  The public set is the first ``size`` examples, in id order, of the fewest last clients whose
  examples reach ``size``; ``population`` is ``data`` without those clients (views, no copy).
  """
  reach = np.cumsum(data.counts[::-1])
  k = int(np.searchsorted(reach, size)) + 1
  check(k < data.num_clients, "public_size", size,
        f"must leave at least one client: the last {data.num_clients - 1} of {data.num_clients} "
        f"clients hold {int(reach[-2]) if data.num_clients > 1 else 0} examples")
  n = data.num_clients - k
  public_x = np.concatenate([data.x[i, :data.counts[i]] for i in range(n, data.num_clients)])
  population = dataclasses.replace(data, x=data.x[:n], y=data.y[:n], counts=data.counts[:n])
  return public_x[:size], population


def vote_client(model, training: Training) -> Piece:
  """``hp -> client``: local SGD from the global model (as ``training`` says), then one-hot
  votes on ``hp["public_x"]``.

  Declares the L2 bound ``vote_norm`` (``sqrt(m)``): every row of the upload is one-hot
  whatever the model computes (an all-NaN row of logits votes for class 0).
  """
  loss = objectives.supervised(model)

  def client(hp):
    train = local_sgd(loss, make_optimizer(training.client_optimizer, hp["client_lr"]),
                      training.local_steps, training.batch_size)

    def fn(params0, x, y, count, row, chp, key):
      """One client's local SGD, then its one-hot votes on the public set.

      Args:
        params0: the global model (a pytree).
        x: the client's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples.
        row: unused (no per-client state).
        chp: unused (no per-client hyper-parameters).
        key: PRNG key of its local SGD.

      Returns:
        A :class:`fedjax_dp.round.ClientOut` whose upload is the ``[m, num_classes]`` float32
        one-hot votes, with the mean training loss and the votes' norm ``sqrt(m)``.
      """
      del row, chp
      params, train_loss = train(params0, x, y, count, key)
      logits = model.apply(params, hp["public_x"])
      votes = jax.nn.one_hot(jnp.argmax(logits, axis=-1), model.num_classes, dtype=jnp.float32)
      return ClientOut(upload=votes, loss=train_loss, norm=global_norm(votes))

    return fn

  return Piece(client, "local_sgd+vote", bound="vote_norm")


def noisy_vote_sum() -> Piece:
  """``hp -> Aggregator``: the sum of the votes plus ``N(0, (z vote_norm)^2)`` per count (the
  noised mean with the public denominator 1)."""
  def make(hp):
    return aggregators.mean("expected", 1.0, hp["noise_multiplier"] * hp["vote_norm"])
  return Piece(make, "noisy_vote_sum", noise="vote_norm", public_denominator=True)


def label_and_train(model, *, server_optimizer: str, server_steps: int, server_batch: int):
  """The round's server step: the public examples labelled by the argmax of the noisy counts,
  then ``server_steps`` steps of SGD from the global model on them.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    server_optimizer: the server's optimizer name (:data:`fedjax_dp.client.OPTIMIZERS`), built
      fresh each round with rate ``hp["server_lr"]``.
    server_steps: optimizer steps per round (>= 1).
    server_batch: public examples per step, drawn with replacement (>= 1).

  Returns:
    :attr:`fedjax_dp.round.Hooks.server_step`, ``(state, counts, hp, key) -> (params,
    opt_state)``.
  """
  loss = objectives.supervised(model)

  def server_step(state, counts, hp, key):
    """The new global model trained on the labels ``argmax(counts)`` of ``hp["public_x"]``.

    Args:
      state: the round's :class:`fedjax_dp.round.RoundState` (its ``params``, ``opt_state``).
      counts: the aggregate, ``[m, num_classes]`` noisy vote counts.
      hp: the round's hyper-parameters (``public_x``, ``server_lr``).
      key: PRNG key of the steps' batches.

    Returns:
      ``(params, opt_state)``: the trained model and the round state's optimizer state as it is.
    """
    labels = jnp.argmax(counts, axis=-1).astype(jnp.int32)
    train = local_sgd(loss, make_optimizer(server_optimizer, hp["server_lr"]), server_steps,
                      server_batch)
    params, _ = train(state.params, hp["public_x"], labels, labels.shape[0], key)
    return params, state.opt_state

  return server_step


def ae_dpfl_round(model, num_clients: int, training: Training, *, server_steps: int,
                  server_batch: int) -> Round:
  """AE-DPFL as a :class:`fedjax_dp.round.Round` over a population of ``num_clients``.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    num_clients: the population size without the public set's clients.
    training: the clients' local training and the server's optimizer.
    server_steps: the server's steps per round on the public labels (:func:`label_and_train`).
    server_batch: public examples per server step.

  Returns:
    The round: :func:`vote_client`, :func:`noisy_vote_sum` and the server step.
  """
  return Round(
      model=model, num_clients=num_clients, client=vote_client(model, training),
      aggregator=noisy_vote_sum(), server_optimizer=training.server_optimizer,
      hooks=Hooks(server_step=label_and_train(
          model, server_optimizer=training.server_optimizer, server_steps=server_steps,
          server_batch=server_batch)))


def _float32_at_least(x: float) -> float:
  """The smallest float32 >= ``x``: the round runs in float32, and a vote norm rounded down would
  scale the noise to less than the votes' sensitivity ``sqrt(m)``."""
  f = np.float32(x)
  return float(f if float(f) >= x else np.nextafter(f, np.float32(np.inf)))


@algorithm("ae-dpfl", reference="Zhu, Yu, Wang et al., voting-based DPFL (AE-DPFL: noisy argmax "
           "of the clients' votes on a public unlabeled set)", options=OPTIONS, byzantine=False,
           privacy_unit=USER + " (the public set's clients excluded)",
           reads=(LOCAL - {"weighting"}) | {"noise_multiplier", "target_epsilon"},
           about="the server labels a public set by the noisy argmax of the clients' votes and "
                 "trains on it")
def build_ae_dpfl(config, data) -> Setup:
  """AE-DPFL (see the module docstring).

  Raises:
    ConfigError: for a data set without one label per example, Byzantine clients, an
      aggregator, a public set that leaves no client, a cohort larger than the population, or
      no noise multiplier.
  """
  opts = read_options(config)
  check(data.y.ndim == 2, "dataset", data.name,
        "must have one label per example for ae-dpfl (clients vote one class per public example)")
  check(config.byzantine == 0, "byzantine", config.byzantine, "must be 0 for ae-dpfl")
  check(config.aggregator is None, "aggregator", config.aggregator,
        "must be unset for ae-dpfl: the server sees only the noisy sum of the votes")
  public_x, population = public_split(data, opts["public_size"])
  if config.sampling == "fixed":
    check(config.cohort_size <= population.num_clients, "cohort_size", config.cohort_size,
          f"must be <= the population ({population.num_clients} clients; the last "
          f"{data.num_clients - population.num_clients} hold the public set)")
  sampler = make_sampler(config.sampling, population.num_clients, config.seed,
                         config.sampling_prob, config.cohort_size, config.capacity)
  z = resolve_noise_multiplier(config, population)
  model = make_model(config, data)
  rnd = cached_round(round_key(config, opts, model, population.num_clients),
                     lambda: ae_dpfl_round(model, population.num_clients, Training.of(config),
                                           server_steps=opts["server_steps"],
                                           server_batch=opts["server_batch"]))
  hparams = common_hparams(config, opts, client_lr=config.client_lr, noise_multiplier=z,
                           vote_norm=_float32_at_least(math.sqrt(opts["public_size"])),
                           public_x=public_x)
  mechanism = user_level_mechanism(rnd, hparams, config.sampling, config.sampling_prob,
                                   population.num_clients, config.cohort_size)
  if isinstance(mechanism, GaussianSumMechanism):
    mechanism = VoteSumMechanism(**dataclasses.asdict(mechanism))
  return Setup(rnd, sampler, LedgerAccounting(mechanism, config.delta, config.accountant), hparams)
