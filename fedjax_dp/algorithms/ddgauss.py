"""DDGauss: DP-FedAvg with the distributed discrete Gaussian and secure aggregation.

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation", ICML 2021 (Algorithms 1 and 2).
Each client of a fixed-size cohort of ``M`` runs FedAvg's local SGD and clip
(:func:`fedjax_dp.algorithms.fedavg.fedavg_client`), then encodes its update
as an integer vector (:mod:`fedjax_dp.transforms.discrete`):

  flatten, zero-pad to d = 2^k  ->  rotate: H D x / sqrt(d) (the round's public key)
  ->  scale by s  ->  conditional randomized rounding to L2 norm <= B
  ->  + N_Z(0, sigma^2) per coordinate, sigma = s z c / sqrt(M)

and uploads it (int32). The server sees only the sum modulo ``2^bits`` (the
secure aggregation, :func:`fedjax_dp.transforms.discrete.modular_sum`), takes
its signed representative, divides by ``s``, rotates back, truncates to the
model's size and divides by ``M``; the server step is FedAvg's.

Privacy: :mod:`fedjax_dp.privacy.ddgauss` (user-level, replace-one,
fixed-size cohorts). The client piece and the secure-sum piece declare the
same mechanism record, read from the hyper-parameters the round uses; a round
whose two pieces do not both declare it claims no guarantee.

Options (``--set``): ``bits`` (16), ``beta`` (exp(-1/2)), ``scale`` (unset:
from ``bits`` and ``k_stddevs``, 4), ``rounding_tries`` (32). Raw diagnostics:
``wrap_fraction`` (coordinates of the true sum outside ``[-2^(b-1), 2^(b-1))``),
``rounding_failures`` (clients whose conditional rounding used its fallback),
``rounding_draws`` (mean draws per client), ``sampler_unaccepted``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.aggregators import Aggregator
from fedjax_dp.algorithms.base import (LOCAL, NOISE, USER, Setup, algorithm, cached_round,
                                       common_hparams, read_options, round_key)
from fedjax_dp.algorithms.fedavg import Pieces, Training, fedavg_client
from fedjax_dp.algorithms.options import Option
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.round import Hooks, Piece, Round
from fedjax_dp.transforms import salted
from fedjax_dp.transforms import discrete
from fedjax_dp.privacy.ddgauss import DDGaussMechanism
from fedjax_dp.privacy import NonPrivate
from fedjax_dp.algorithms.dp_fedavg import make_model
from fedjax_dp.attacks import knowledge_of_unreleased, static_options
from fedjax_dp.privacy import ddgauss as pdd
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.sampling import make_sampler

OPTIONS = (
    Option("bits", 16, "b: the secure aggregation sums integers modulo 2^b", kind="int", low=2,
           high=24),
    Option("beta", math.exp(-0.5), "conditional rounding's beta: the rounded norm bound B holds "
           "for an unconditioned rounding with probability >= 1 - beta (0: B = s c + sqrt(d), "
           "no retries)", low=0, high=1, high_open=True),
    Option("scale", None, "s, the paper's 1/gamma (granularity gamma): updates are scaled by s "
           "before rounding; unset: from bits, k_stddevs standard deviations of the aggregate "
           "within 2^b (Sec. 4.4)", low=0, low_open=True),
    Option("k_stddevs", 4.0, "standard deviations of the aggregate kept within 2^b when the "
           "scale comes from bits", low=0, low_open=True),
    Option("rounding_tries", 32, "conditional rounding: at most this many draws, then rounding "
           "towards zero (counted in rounding_failures)", kind="int", low=1),
)


def declared_mechanism(hp: dict, dim: int, *, num_clients: int, sampling: str):
  """The :class:`fedjax_dp.privacy.ddgauss.DDGaussMechanism` of a round run with ``hp``.

  Args:
    hp: the round's hyper-parameters (``clip``, ``noise_multiplier``, ``scale``, ``sigma``,
      ``beta``, ``expected_size`` M, ``byzantine``), read as the float32 values the round uses.
    dim: ``d``, the padded (power-of-two) dimension of the encoded updates.
    num_clients: the population size N.
    sampling: "fixed" (the guarantee) or "poisson" (simulated, no guarantee).

  Returns:
    The record, its fields read from ``hp``.
  """
  m = float(hp["expected_size"])
  return DDGaussMechanism(float(hp["clip"]), float(hp["noise_multiplier"]), float(hp["scale"]),
                          float(hp["sigma"]), float(hp["beta"]), int(dim), m, int(num_clients),
                          sampling, int(hp["byzantine"]))


def as_integers(rows):
  """Uploads as int32 (an attacker's float rows rounded, non-finite entries 0)."""
  if jnp.issubdtype(rows.dtype, jnp.integer):
    return rows.astype(jnp.int32)
  safe = jnp.where(jnp.isfinite(rows), jnp.clip(jnp.round(rows), -2.0 ** 30, 2.0 ** 30), 0.0)
  return safe.astype(jnp.int32)


def ddgauss_client(model, dim: int, mechanism, training: Training) -> Piece:
  """``hp -> client``: local SGD and clip (FedAvg's client, trained as ``training`` says), then
  the integer encoding of the update in ``dim`` coordinates; the piece declares ``mechanism``.

  The encoding (Kairouz et al. 2021, Alg. 1): ``v`` the clipped update (``||v|| <= c``) zero-padded
  to ``d``, rotated ``H D v / sqrt(d)``, scaled by ``s``, conditionally rounded to L2 norm
  ``<= B``, plus ``N_Z(0, sigma^2)`` per coordinate, ``sigma = s z c / sqrt(M)``.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    dim: ``d``, the padded dimension (:func:`model_vector`).
    mechanism: ``(hp, dim) -> DDGaussMechanism`` (:func:`declared_mechanism`), the record the
      piece declares.
    training: the clients' local training.

  Returns:
    The client :class:`fedjax_dp.round.Piece`; its client's ``chp`` is the round's index (the
    public rotation key's input).
  """
  inner = fedavg_client(model, Pieces(transforms=("clip",)), training)

  def client(hp):
    train = inner(hp)

    def fn(params0, x, y, count, row, chp, key):
      """One client's clipped update, encoded as ``d`` int32 coordinates.

      Args:
        params0: the global model (a pytree).
        x: the client's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples.
        row: its state row, passed to FedAvg's client (none here).
        chp: the round's index (int32), the public rotation key's input.
        key: the client's PRNG key (its training, rounding and noise, each salted).

      Returns:
        A :class:`fedjax_dp.round.ClientOut` whose upload is the ``[d]`` int32 encoding, with
        ``aux`` the rounding's fallback flag and draw count and the sampler's unaccepted
        coordinates.
      """
      out = train(params0, x, y, count, row, (), key)
      flat, _ = ravel_pytree(out.upload)
      v = jnp.pad(flat.astype(jnp.float32), (0, dim - flat.size))
      rotated = discrete.rotate(v, discrete.rotation_key(hp["rotation_seed"], chp))
      rounded, draws, ok = discrete.conditional_round(
          hp["scale"] * rotated, hp["bound"], hp["rounding_tries"],
          salted(key, discrete.SALT_ROUNDING))
      noise, unaccepted = discrete.discrete_gaussian(
          salted(key, discrete.SALT_DISCRETE_GAUSSIAN), (dim,), jnp.maximum(hp["sigma"], 0.5))
      noise = jnp.where(hp["sigma"] > 0, noise, 0.0)
      return out._replace(upload=(rounded + noise).astype(jnp.int32),
                          aux={"rounding_failed": jnp.logical_not(ok), "rounding_draws": draws,
                               "unaccepted": unaccepted})

    return fn

  return Piece(client, "local_sgd+clip+ddgauss_encode", mechanism=mechanism)


def secure_sum(unravel, size: int, mechanism) -> Piece:
  """``hp -> Aggregator``: the modular sum of the uploads (all the server sees), decoded: signed,
  ``/ s``, rotated back, the model's ``size`` coordinates, ``/ M`` (public). Its state is the
  round's index (the rotation key's input).

  Args:
    unravel: the inverse of flattening the model's parameters (:func:`model_vector`).
    size: the model's parameter count (the decoded vector's first ``size`` coordinates).
    mechanism: ``(hp, dim) -> DDGaussMechanism``, the record the piece declares (the same
      object as the client piece's).

  Returns:
    The aggregator :class:`fedjax_dp.round.Piece` (public denominator ``M``).
  """

  def make(hp):
    def aggregate(updates, weights, mask, state, key):
      """The decoded mean of the real rows' modular sum.

      Args:
        updates: the cohort's ``[C, d]`` uploads (int32; an attacker's float rows are rounded,
          :func:`as_integers`).
        weights: ignored (uniform, checked by the builder).
        mask: ``[C]``, 1 for real clients and 0 for padding.
        state: the round's index (int32), the rotation key's input.
        key: unused (no server randomness).

      Returns:
        ``(aggregate, state + 1)``: the decoded sum divided by ``M = hp["expected_size"]``, a
        pytree like the model's parameters.
      """
      del weights, key  # uniform weights (checked by the builder); no server randomness
      total = discrete.to_signed(discrete.modular_sum(as_integers(updates), mask, hp["bits"]),
                                 hp["bits"])
      v = discrete.unrotate(total.astype(jnp.float32) / hp["scale"],
                            discrete.rotation_key(hp["rotation_seed"], state))
      return unravel(v[:size] / hp["expected_size"]), state + 1

    return Aggregator(lambda params: jnp.zeros((), jnp.int32), aggregate)

  return Piece(make, "secure_modular_sum", public_denominator=True, mechanism=mechanism)


def ddgauss_metrics(state, params, out, sent, mask, hp):
  """Raw diagnostics: the wrap-around of the true sum, the rounding's retries and fallbacks.

  Args:
    state: the round's state before the step (unused).
    params: the new global model (unused).
    out: the clients' :class:`fedjax_dp.round.ClientOut` (its ``aux``, ``[C]`` leaves).
    sent: the uploads after the attack, ``[C, d]``.
    mask: ``[C]``, 1 for real clients.
    hp: the round's hyper-parameters (``bits``).

  Returns:
    Scalars ``wrap_fraction``, ``rounding_failures``, ``rounding_draws`` (mean per real client)
    and ``sampler_unaccepted``.
  """
  del state, params
  real = jnp.maximum(jnp.sum(mask), 1.0)
  return {"wrap_fraction": discrete.wrapped_fraction(as_integers(sent), mask, hp["bits"]),
          "rounding_failures": jnp.sum(mask * out.aux["rounding_failed"]),
          "rounding_draws": jnp.sum(mask * out.aux["rounding_draws"]) / real,
          "sampler_unaccepted": jnp.sum(mask * out.aux["unaccepted"])}


def model_vector(model) -> tuple:
  """``(size, d, unravel)``: the model's parameter count, its padded dimension and the inverse of
  flattening its parameters."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  flat, unravel = ravel_pytree(jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  return flat.size, discrete.padded_dim(flat.size), unravel


def ddgauss_round(model, num_clients: int, sampling: str, training: Training, *,
                  attack: str = "none", attack_options: tuple = ()) -> Round:
  """DDGauss as a :class:`fedjax_dp.round.Round`; the server state is the round's index.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    num_clients: the population size N.
    sampling: "fixed" or "poisson" (the declared mechanism's cohorts).
    training: local training and the server's optimizer.
    attack, attack_options: the Byzantine clients' attack and its static options (strengths in
      ``hp``).
  """
  size, dim, unravel = model_vector(model)
  mechanism = functools.partial(declared_mechanism, num_clients=num_clients, sampling=sampling)
  return Round(
      model=model, num_clients=num_clients,
      client=ddgauss_client(model, dim, mechanism, training),
      aggregator=secure_sum(unravel, size, mechanism), attack=attack,
      attack_options=attack_options, server_optimizer=training.server_optimizer,
      hooks=Hooks(init_server=lambda params, hp: jnp.zeros((), jnp.int32),
                  client_hparams=lambda server, hp, ids: jnp.broadcast_to(server, ids.shape),
                  server_rule=lambda server, hp, aux, mask, ids: server + 1,
                  metrics=ddgauss_metrics))


def round_mechanism(rnd: Round, hparams: dict, dim: int):
  """The record both pieces declare (the same one), else :class:`fedjax_dp.privacy.NonPrivate`.

  Args:
    rnd: the DDGauss round (its client and aggregator pieces).
    hparams: the hyper-parameters the round runs with.
    dim: ``d``, the padded dimension.

  Returns:
    The :class:`fedjax_dp.privacy.ddgauss.DDGaussMechanism` for ``hparams``, or a
    :class:`fedjax_dp.privacy.NonPrivate` (no guarantee) when the pieces do not declare the same
    mechanism.
  """
  client = getattr(rnd.client, "mechanism", None)
  if client is None or client is not getattr(rnd.aggregator, "mechanism", None):
    return NonPrivate(relation="replace_one", guarantee_note=(
        "the client's encoding and the server's secure sum do not declare the same DDGauss "
        "mechanism: no guarantee"))
  return client(hparams, dim)


@algorithm("ddgauss", reference="Kairouz, Liu and Steinke, ICML 2021 (distributed discrete "
           "Gaussian, secure aggregation)", options=OPTIONS, reads=LOCAL | NOISE,
           privacy_unit=USER + " (replace-one, fixed-size cohorts)",
           defaults={"sampling": "fixed", "cohort_size": 70},
           about="DP-FedAvg whose clients add discrete Gaussian noise to integer updates that a "
                 "secure modular sum adds up")
def build_ddgauss(config, data) -> Setup:
  """DDGauss on the FedAvg family's client (see the module docstring); its guarantee is for
  fixed-size cohorts, which it runs by default (70 clients a round).

  Raises:
    ConfigError: for an aggregator, example-count weights, a cohort larger than the population,
      a target epsilon under Poisson sampling, or no noise multiplier.
  """
  opts = read_options(config)
  check(config.aggregator is None, "aggregator", config.aggregator,
        "must be unset for ddgauss: the server sees only the secure modular sum")
  check(config.weighting == "uniform", "weighting", config.weighting,
        "must be 'uniform' for ddgauss (the secure sum has no weights)")
  if config.sampling == "fixed":
    check(config.cohort_size <= data.num_clients, "cohort_size", config.cohort_size,
          f"must be <= the population ({data.num_clients} clients)")
  elif config.target_epsilon is not None:
    raise ConfigError("sampling", config.sampling, "must be 'fixed' to calibrate ddgauss to a "
                      "target epsilon (its guarantee is for a fixed cohort: --sampling fixed "
                      "--cohort-size M)")
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  model = make_model(config, data)
  rnd = cached_round(round_key(config, opts, model, data.num_clients), lambda: ddgauss_round(
      model, data.num_clients, config.sampling, Training.of(config), attack=config.attack,
      attack_options=static_options(config.attack, opts)))
  dim = model_vector(model)[1]
  quantization = pdd.Quantization(opts["bits"], opts["beta"], opts["scale"], opts["k_stddevs"])

  def make(z):
    return pdd.mechanism_for(
        z, clip=config.clip, quantization=quantization, dim=dim,
        cohort_size=sampler.expected_size, num_clients=data.num_clients,
        sampling=config.sampling, byzantine=config.byzantine)

  if config.target_epsilon is not None:
    z = pdd.calibrate_noise_multiplier(config.target_epsilon, config.delta, config.rounds, make)
  else:
    check(config.noise_multiplier is not None, "noise_multiplier", None,
          "set noise_multiplier >= 0 or target_epsilon > 0")
    z = config.noise_multiplier
  mech = make(z)
  hparams = common_hparams(
      config, opts, client_lr=config.client_lr, clip=mech.clip, noise_multiplier=mech.noise_multiplier,
      expected_size=sampler.expected_size, scale=mech.scale, sigma=mech.sigma, bound=mech.bound,
      beta=mech.beta, bits=opts["bits"], rounding_tries=opts["rounding_tries"],
      rotation_seed=config.seed % 2 ** 24)
  # Reading the clients' rows reads their noisy shares, which secure aggregation never releases.
  accounting = LedgerAccounting(round_mechanism(rnd, hparams, dim), config.delta, config.accountant,
                                attacker_knowledge=knowledge_of_unreleased(config.attack,
                                                                           config.byzantine))
  return Setup(rnd, sampler, accounting, hparams)
