"""SP-FL: segmented clipping by privacy class with adaptive noise, and its baselines.

Wu and Li, "Segmental tailoring federated learning algorithm based on
differential privacy", Application Research of Computers 41(5), 2024
(SP-FL). Every algorithm here trains with client-side DP-SGD
(:func:`fedjax_dp.client.dp_sgd`): per-example gradients clipped, Gaussian noise on
each step's clipped sum, ``Q`` local steps with per-step sampling rate
``L / |D_n|``; the paper's server averages the uploaded models weighted by
sample counts (Sec. 2.4 f): ``weighting="examples"``, which the reproduction
sets (the configuration's default, ``"uniform"``, equals it only where clients
hold equal counts).

* ``spfl`` (as published): clients are split into a high and a low
  privacy-need class (``high_fraction``). High: adaptive clipping,
  ``C_{t,h} = beta_h * (mean per-example gradient norm of round t-1)``
  (Eq. 5), starting from the mean initial per-example gradient norm of all
  clients (Sec. 2.1). Low: proportional clipping ``C_{t,l} = beta_l *
  ||g_t(x_i)||_2`` (Eq. 7), i.e. each gradient scaled by ``beta_l``.
  Adaptive noise: standard deviation ``sigma * C`` for the bound in force
  (Sec. 2.2; for the low class ``sigma * beta_l * mean_i ||g_i||`` of the
  step's batch, our reading).
* ``spfl-sound``: the same classes with thresholds from privatised
  statistics only: high clients release each step a noisy sum of
  ``min(||g_i||, B) / B - 1/2`` (budget split as in Andrew et al. 2021, so
  the accounted multiplier stays ``sigma``), the server sets
  ``C_{t+1,h} = beta_h * clamp(B * (1/2 + noisy mean), min_clip, B)``
  starting from the data-independent ``clip``; the low class keeps
  proportional scaling by ``beta_l`` under a data-independent cap
  ``low_cap`` and noise ``sigma * low_cap``.
* ``dp-fl``: the same DP-SGD with a constant clip bound ``clip``.
* ``nodp-fl``: the same local training without clipping or noise.
* ``adp-fl`` (in :mod:`fedjax_dp.algorithms.adp_fl`): private quantile
  clipping (Andrew et al., NeurIPS 2021).

Privacy: example-level (the privacy unit is one example of one client, local
to each client; not a whole client) under replace-one, so each client's
example count (its sampling rate and its weight in the average) is public;
accounted per client by
:class:`fedjax_dp.privacy.example_level.ExampleLevelAccounting`.
As published, SP-FL has **no formal DP guarantee**: the low class's
proportional clipping leaves each step's sensitivity unbounded (and sets the
noise from the raw batch), and the high class's threshold is a raw statistic
of the previous round's data. Its summary says ``formal_guarantee: false``
with these reasons and prints no epsilon. ``spfl-sound``, ``dp-fl`` and
``adp-fl`` have a real per-class epsilon.

Every algorithm here is one :class:`fedjax_dp.round.Round`
(:func:`fedjax_dp.algorithms.dpsgd_family.dpsgd_round`) whose numbers (noise multipliers,
betas, bounds, the threshold rules' rates, learning rates, the clients'
privacy classes) are in the Setup's ``hparams``: runs that differ only in
numbers share one compilation. Byzantine clients attack the uploads and any
aggregator may combine them (the mean weighted by ``weighting`` by default):
each upload is private already, so both are post-processing.

Options (``--set name=value``): ``high_fraction`` (0.5), ``beta_high`` (1.0),
``beta_low`` (0.9), ``example_sampling`` ("fixed", accounted with RDP, or
"poisson", accounted with PLD: ``--accountant pld``),
``init_norm_examples`` (32; spfl's initial threshold reads this many
examples per client), ``low_cap`` (spfl-sound; default ``clip``),
``stat_bound`` (spfl-sound ``B``; default ``4 * clip``), ``stat_noise_ratio``
(5: the statistic's noise is this times ``sigma``), ``min_clip`` (1e-3; adp-fl's options are in :mod:`fedjax_dp.algorithms.adp_fl`).
Every algorithm of the family runs 100 clients and 2 local steps by default, so that a batch of
the default size fits each client's examples.
"""

from __future__ import annotations

import functools
import numbers
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp import objectives
from fedjax_dp.algorithms.base import (EXAMPLE, LOCAL, NOISE, NONE, Setup, algorithm,
                                       cached_round, common_hparams, read_options, round_key)
from fedjax_dp.algorithms.dp_fedavg import make_model
from fedjax_dp.algorithms.fedavg import Pieces, Training, make_aggregator
from fedjax_dp.algorithms.options import Option
from fedjax_dp.algorithms.dpsgd_family import DPSGDPieces, Rules, dpsgd_round, example_record
from fedjax_dp.attacks import static_options
from fedjax_dp.client import DPSGDSteps, dp_sgd, mean_initial_norm
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.privacy.example_level import (ExampleLevelAccounting, PrivacyClass,
                                             calibrate_example_noise, split_noise_multiplier)
from fedjax_dp.round import run_keys
from fedjax_dp.sampling import SAMPLINGS, make_sampler, poisson_capacity
from fedjax_dp.transforms import dp_args

HIGH, LOW = 0, 1
_CLASS_TAG = 0x5BF1

POSITIVE = dict(low=0, low_open=True)
EXAMPLE_SAMPLING = Option("example_sampling", "fixed", "per-step batches: fixed size (RDP) or "
                          "Poisson (needs --accountant pld)", kind="choice", choices=SAMPLINGS)
CLASSES = (
    Option("high_fraction", 0.5, "fraction of clients in the high privacy-need class", low=0,
           high=1),
    Option("beta_high", 1.0, "SP-FL: the high class's bound is beta_high times a mean norm",
           **POSITIVE),
    Option("beta_low", 0.9, "SP-FL: the low class scales every gradient by beta_low", **POSITIVE),
)
# The noisy norm statistic's options (spfl-sound here, adp-fl in adp_fl.py).
STAT_NOISE_RATIO = Option("stat_noise_ratio", 5.0, "the norm statistic's noise is this times "
                          "sigma", **POSITIVE)
MIN_CLIP = Option("min_clip", 1e-3, "lower clamp of an adaptive bound", **POSITIVE)
SPFL_OPTIONS = CLASSES + (
    EXAMPLE_SAMPLING,
    Option("init_norm_examples", 32, "spfl: examples per client its initial threshold reads",
           kind="int", low=1))
SOUND_OPTIONS = CLASSES + (
    EXAMPLE_SAMPLING,
    Option("low_cap", None, "spfl-sound: the low class's data-independent cap; unset: clip",
           **POSITIVE),
    Option("stat_bound", None, "spfl-sound: B of the norm statistic min(||g||, B) / B; unset: "
           "4 clip", **POSITIVE),
    STAT_NOISE_RATIO, MIN_CLIP)
# What every algorithm of the family declares alike: the settings it reads, clients that hold
# enough examples for a batch of the default size (the default population's hold two) and the
# paper's two local steps (published SP-FL's noise, scaled by the batch's own norms, grows
# without bound over five).
TRAITS = dict(reads=LOCAL | NOISE, defaults={"num_clients": 100, "local_steps": 2})

REASON_LOW = ("proportional clipping C_{t,l} = beta * ||g_t(x_i)||_2 (Eq. 7) only scales each "
              "example's gradient by beta, so a step's L2 sensitivity is unbounded, and the noise "
              "scale sigma * beta * mean ||g_i|| is itself computed from the raw batch")
REASON_HIGH = ("the clip threshold C_{t,h} = beta * (mean per-example gradient norm of round t-1) "
               "and the initial threshold (mean initial norm of all clients) are raw, unnoised "
               "statistics of the clients' data; they set the noise scale and leak through it")


def options(config, unset_bounds=(("low_cap", 1.0), ("stat_bound", 4.0))) -> dict:
  """The run's options of its algorithm in the SP-FL family, validated (unknown names, and
  names of another algorithm of the family, are errors); each unset bound of ``unset_bounds``
  (``(name, factor)``) is ``factor * clip``."""
  opts = read_options(config)
  for name, times in unset_bounds:
    if name in opts and opts[name] is None:
      opts[name] = times * config.clip
  return opts


def privacy_classes(num_clients: int, high_fraction: float, seed: int) -> np.ndarray:
  """``[num_clients]`` int32: HIGH (0) for a random ``round(high_fraction * N)`` clients, else LOW.

  Args:
    num_clients: the population size N.
    high_fraction: the fraction of clients in the high privacy-need class, in [0, 1].
    seed: the run's seed (the draw has its own stream, ``default_rng([seed, tag])``).
  """
  perm = np.random.default_rng([seed, _CLASS_TAG]).permutation(num_clients)
  cls = np.full(num_clients, LOW, np.int32)
  cls[perm[:int(round(high_fraction * num_clients))]] = HIGH
  return cls


def spfl_classes(num_clients: int, high_fraction: float, seed: int) -> dict:
  """The clients of SP-FL's two privacy classes, as a run of ``spfl`` or ``spfl-sound`` draws
  them: a random ``round(high_fraction * N)`` of the clients need high privacy. The draw reads
  these three numbers and no data.

  Args:
    num_clients: the population size N (``data.num_clients``).
    high_fraction: the run's ``high_fraction`` option, in [0, 1].
    seed: the run's ``seed`` (:attr:`fedjax_dp.RunConfig.seed`).

  Returns:
    ``{"high": ids, "low": ids}``: sorted int64 arrays of client ids, together
    ``0..N-1``.

  Raises:
    ConfigError: ``num_clients < 1`` or ``high_fraction`` outside [0, 1].
  """
  check(isinstance(num_clients, (int, np.integer)) and num_clients >= 1, "num_clients",
        num_clients, "must be an integer >= 1")
  check(isinstance(high_fraction, numbers.Real) and 0 <= high_fraction <= 1, "high_fraction",
        high_fraction, "must be a number in [0, 1]")
  return _class_ids(privacy_classes(num_clients, high_fraction, seed))


def _class_ids(cls: np.ndarray) -> dict:
  """``{"high": ids, "low": ids}`` of a :func:`privacy_classes` draw."""
  return {"high": np.flatnonzero(cls == HIGH), "low": np.flatnonzero(cls == LOW)}


def example_capacity(config, data, sampling: str) -> Optional[int]:
  """The per-step batch capacity of Poisson example sampling (None for fixed-size batches).

  Large enough that a step of the largest client drops examples with
  probability below 1e-9; a draw above it keeps a random subset, which
  :class:`ExampleDPSGDMechanism` accounts for.

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig` (its ``batch_size`` L).
    data: the population (its example counts and padded rows ``M``).
    sampling: "fixed" or "poisson".

  Returns:
    ``min(M, c)``, ``c`` the smallest count with ``P[Binomial(n_max, L / n_max) > c] < 1e-9``
    for the largest client's ``n_max`` examples; None for "fixed".
  """
  if sampling == "fixed":
    return None
  n_max = int(data.counts.max())
  return min(int(data.x.shape[1]), poisson_capacity(n_max, min(1.0, config.batch_size / n_max)))


def resolve_sigma(config, data, opts) -> float:
  """``sigma``: ``noise_multiplier``, or calibrated so that every client meets ``target_epsilon``.

  Calibration takes the worst case: the smallest client (largest sampling
  rate) taking part in every one of the ``rounds`` rounds (``rounds * Q``
  steps).

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig` (``noise_multiplier`` or
      ``target_epsilon``, ``delta``, ``rounds``, ``local_steps``, ``batch_size``,
      ``accountant``).
    data: the population (the smallest client's example count).
    opts: the run's options (``example_sampling``).

  Returns:
    The per-step noise multiplier (float).

  Raises:
    ConfigError: when neither ``noise_multiplier`` nor ``target_epsilon`` is set, the
      accountant cannot compose the steps' sampling, or no noise multiplier meets the target.
  """
  sampling = opts["example_sampling"]
  if config.target_epsilon is not None:
    return calibrate_example_noise(config.target_epsilon, config.delta,
                                   config.rounds * config.local_steps, int(data.counts.min()),
                                   config.batch_size, sampling, config.accountant,
                                   example_capacity(config, data, sampling))
  if config.noise_multiplier is None:
    raise ConfigError("noise_multiplier", None, "set noise_multiplier >= 0 or target_epsilon > 0")
  return float(config.noise_multiplier)


def _inf():
  return jnp.asarray(jnp.inf, jnp.float32)


def _class_mean(values, mask, weight):
  """``(sum(values * mask * weight), sum(mask * weight))``."""
  w = mask * weight
  return jnp.sum(values * w), jnp.sum(w)


def build_dpsgd_family(config, data, rules: Rules, opts: dict, hparams: dict, classes: list,
                       client_class: Optional[np.ndarray] = None) -> Setup:
  """Shared builder: model, local DP-SGD, the round, sampler, hparams and per-class accounting.

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig`.
    data: its :class:`fedjax_dp.data.FederatedData`.
    rules: the algorithm's steps and thresholds (module-level functions reading every number
      from ``hp``: the round is cached by its static structure, :func:`round_key`, so a later
      build with other numbers reuses the first build's functions).
    opts: its options (:func:`options`).
    hparams: the algorithm's numbers (added to :func:`fedjax_dp.algorithms.common_hparams`,
      with ``client_lr`` and ``client_class``).
    classes: ``(name, client_ids, keys, reason)`` per privacy class, where ``keys`` names the
      hparams of the class's noise (``(grad_key,)`` or ``(grad_key, stat_key)``) or is None
      for a class without a guarantee (``reason`` says why). Each class's record is the one
      the round's DP-SGD client piece declares for those keys, from the same hparams the
      compiled steps use; a client that declares none (published SP-FL's noise scaled by the
      batch's own norms, or NoDP-FL's plain steps) gives no class a guarantee.
    client_class: each client's privacy class (``[num_clients]`` int32; None: all 0).

  Raises:
    ConfigError: for a cohort larger than the population or a batch larger than the smallest
      client's examples.
  """
  if config.sampling == "fixed":
    check(config.cohort_size <= data.num_clients, "cohort_size", config.cohort_size,
          f"must be <= the population ({data.num_clients} clients)")
  check(config.batch_size <= int(data.counts.min()), "batch_size", config.batch_size,
        f"must be <= the smallest client's examples ({int(data.counts.min())}): the per-step "
        "sampling rate L / |D_n| is at most 1")
  model, max_examples = make_model(config, data), int(data.x.shape[1])
  sampling = opts["example_sampling"]
  pieces = DPSGDPieces(rules, config.weighting, DPSGDSteps(
      config.local_steps, config.batch_size, max_examples, sampling,
      example_capacity(config, data, sampling), rules.statistic, rules.private,
      rules.data_dependent_noise))
  # Any aggregator, and attacks on the uploads: each upload is already private (example-level,
  # local to its client), so what the server or an attacker computes from them is post-processing.
  aggregation = Pieces(aggregator=config.aggregator or "mean", weighting=config.weighting)

  def make():
    local_train = dp_sgd(objectives.supervised(model), pieces.steps)
    return dpsgd_round(model, data.num_clients, pieces, Training.of(config),
                       local_train=local_train, aggregator=make_aggregator(aggregation, opts),
                       attack=config.attack,
                       attack_options=static_options(config.attack, opts))

  rnd = cached_round(round_key(config, opts, model, data.num_clients, max_examples, pieces), make)
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  if client_class is None:
    client_class = np.zeros(data.num_clients, np.int32)
  # Q L: the expected examples behind one client's round (public), for the threshold rules.
  hp = common_hparams(config, opts, client_lr=config.client_lr, expected_size=sampler.expected_size,
                      examples_per_round=float(config.local_steps * config.batch_size),
                      client_class=client_class, **hparams)
  return Setup(rnd, sampler, class_accounting(config, data.counts, pieces, rnd, hp, classes),
               hp)


def class_accounting(config, counts, pieces: DPSGDPieces, rnd, hp: dict, classes: list):
  """The :class:`ExampleLevelAccounting` of ``classes`` over clients of ``counts`` examples.

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig` (``delta``, ``accountant``,
      ``byzantine``).
    counts: ``[N]`` the clients' example counts (their sampling rates).
    pieces: the round's static structure: the nominal per-step record (``hp["sigma"]``) for the
      summary's noise multiplier.
    rnd: the round; each class's record is the one its client piece declares for ``hp``.
    hp: the round's hyper-parameters.
    classes: ``(name, client_ids, keys, reason)`` per privacy class (:func:`build_dpsgd_family`);
      a class with keys gets no record when the client piece declares none.
  """
  declared = rnd.client.mechanism
  privacy_classes = []
  for class_name, ids, keys, reason in classes:
    if keys is not None and declared is None:
      keys, reason = None, reason or "the client's DP-SGD declares no privacy record"
    privacy_classes.append(PrivacyClass(class_name, ids, None if keys is None else declared(hp, *keys),
                                        reason))
  nominal = example_record(pieces)(hp, "sigma") if "sigma" in hp else None
  return ExampleLevelAccounting(privacy_classes, counts, config.delta,
                                config.accountant, nominal,
                                "released" if config.byzantine else None)


def _constant_rule(thresholds, hp, stats, mask, classes):
  del hp, stats, mask, classes
  return thresholds


def init_clip_bound(params, hp):
  """``[C]``: the data-independent starting bound ``config.clip`` (``hp["clip"]``)."""
  del params
  return jnp.reshape(hp["clip"], (1,))


def _one_clip_args(thresholds, hp, cls):
  """One class: every client gets the bound ``thresholds[0]`` and multiplier ``hp["sigma"]``."""
  return dp_args(jnp.full(cls.shape, thresholds[0]), 1.0, hp["sigma"])


DP_FL = Rules("none", True, _one_clip_args, _constant_rule, init_clip_bound, ("all",))


@algorithm("dp-fl", reference="client-side DP-SGD (SP-FL's baseline)", privacy_unit=EXAMPLE,
           options=(EXAMPLE_SAMPLING,), about="clients train with DP-SGD at a constant clip bound",
           **TRAITS)
def build_dp_fl(config, data) -> Setup:
  """DP-FL: client-side DP-SGD with the constant clip bound ``config.clip``."""
  opts = options(config)
  sigma = resolve_sigma(config, data, opts)
  ids = tuple(range(data.num_clients))
  classes = [("all", ids, ("sigma",) if sigma > 0 else None,
              "" if sigma > 0 else "noise_multiplier=0: clipping only")]
  return build_dpsgd_family(config, data, DP_FL, opts, {"sigma": sigma, "clip": config.clip},
                            classes)


def _nodp_args(thresholds, hp, cls):
  del thresholds, hp
  return dp_args(jnp.full(cls.shape, jnp.inf), 1.0, 0.0)


def _no_thresholds(params, hp):
  del params, hp
  return jnp.zeros((1,), jnp.float32)


NODP_FL = Rules("none", False, _nodp_args, _constant_rule, _no_thresholds)


@algorithm("nodp-fl", reference="non-private DP-SGD steps (SP-FL's baseline)", privacy_unit=NONE,
           options=(EXAMPLE_SAMPLING,), about="DP-FL's local training without clipping or noise",
           **dict(TRAITS, reads=LOCAL))
def build_nodp_fl(config, data) -> Setup:
  """NoDP-FL: the same local training (sampling, steps, server) without clipping or noise."""
  opts = options(config)
  ids = tuple(range(data.num_clients))
  classes = [("all", ids, None, "non-private: no clipping and no noise")]
  return build_dpsgd_family(config, data, NODP_FL, opts, {}, classes)


def _spfl_common(config, data):
  opts = options(config)
  sigma = resolve_sigma(config, data, opts)
  cls = privacy_classes(data.num_clients, opts["high_fraction"], config.seed)
  ids = _class_ids(cls)
  return opts, sigma, cls, tuple(ids["high"].tolist()), tuple(ids["low"].tolist())


@functools.lru_cache(maxsize=16)
def _initial_norm_fn(model, per_client: int):
  """Jitted :func:`mean_initial_norm` of ``model`` (compiled once per model and data shape)."""
  objective = objectives.supervised(model)
  return jax.jit(lambda p, x, y, n: mean_initial_norm(objective, p, x, y, n, per_client))


def initial_spfl_threshold(model, data, seed: int, per_client: int) -> float:
  """SP-FL's initial high-class threshold (Sec. 2.1): the mean initial per-example gradient norm
  of all clients, at the run's initial model (:func:`fedjax_dp.round.run_keys`), over each client's first
  ``per_client`` examples. It reads the raw data: not private.

  Computed on the host by the builder (into ``hp["init_clip_high"]``), so the
  round itself holds no data and is shared by every run of the same shapes.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    data: the population (``x [N, M, ...]``, ``y``, ``counts``).
    seed: the run's seed (its initial model is ``model.init(run_keys(seed)[0])``).
    per_client: examples read per client (>= 1).

  Returns:
    The mean norm (float).
  """
  params = model.init(run_keys(seed)[0])
  fn = _initial_norm_fn(model, int(per_client))
  return float(fn(params, data.x[:, :per_client], data.y[:, :per_client], data.counts))


def _spfl_init(params, hp):
  del params
  return jnp.stack([jnp.asarray(hp["init_clip_high"], jnp.float32), _inf()])


def _spfl_args(thresholds, hp, c):
  high = c == HIGH
  return dp_args(jnp.where(high, thresholds[0], jnp.inf),
                 jnp.where(high, 1.0, hp["beta_low"]), hp["sigma"])


def _spfl_rule(thresholds, hp, stats, mask, c):
  # Eq. 5: C_{t+1,h} = beta_h * mean per-example gradient norm of the round (high clients).
  hi = (c == HIGH).astype(jnp.float32)
  s, _ = _class_mean(stats.norm_sum, mask, hi)
  e, _ = _class_mean(stats.examples, mask, hi)
  new = jnp.where(e > 0, hp["beta_high"] * s / jnp.maximum(e, 1.0), thresholds[0])
  return thresholds.at[0].set(new)


SPFL = Rules("none", True, _spfl_args, _spfl_rule, _spfl_init, ("high", "low"),
             data_dependent_noise=True)


@algorithm("spfl", reference="Wu and Li 2024 (SP-FL as published: no formal guarantee)",
           privacy_unit=EXAMPLE, options=SPFL_OPTIONS,
           about="DP-SGD clients in two privacy classes, adaptive and proportional clipping",
           **TRAITS)
def build_spfl(config, data) -> Setup:
  """SP-FL as published (Wu and Li 2024, Eqs. 5 and 7): no formal DP guarantee."""
  opts, sigma, cls, high_ids, low_ids = _spfl_common(config, data)
  classes = [("high", high_ids, None, REASON_HIGH), ("low", low_ids, None, REASON_LOW)]
  c0 = initial_spfl_threshold(make_model(config, data), data, config.seed,
                              opts["init_norm_examples"])
  hparams = {"sigma": sigma, "beta_high": opts["beta_high"], "beta_low": opts["beta_low"],
             "init_clip_high": c0}
  return build_dpsgd_family(config, data, SPFL, opts, hparams, classes, cls)


def _sound_init(params, hp):
  """Data-independent start: ``config.clip`` for the high class, ``low_cap`` for the low class."""
  del params
  return jnp.stack([jnp.asarray(hp["clip"], jnp.float32), jnp.asarray(hp["low_cap"], jnp.float32)])


def _sound_args(thresholds, hp, c):
  high = c == HIGH
  return dp_args(jnp.where(high, thresholds[0], hp["low_cap"]),
                 jnp.where(high, 1.0, hp["beta_low"]),
                 jnp.where(high, hp["z_grad"], hp["sigma"]),
                 jnp.where(high, hp["stat_noise"], 0.0), hp["stat_bound"])


def _sound_rule(thresholds, hp, stats, mask, c):
  # Only the high clients' noisy statistics are used (low clients upload none).
  hi = (c == HIGH).astype(jnp.float32)
  s, n = _class_mean(stats.stat_sum, mask, hi)
  expected = n * hp["examples_per_round"]  # public: cohort membership, Q and L
  mean_norm = hp["stat_bound"] * (0.5 + s / jnp.maximum(expected, 1.0))
  mean_norm = jnp.clip(mean_norm, hp["min_clip"], hp["stat_bound"])
  new = jnp.where(n > 0, hp["beta_high"] * mean_norm, thresholds[0])
  return thresholds.at[0].set(new)


def statistic_budget(sigma: float, opts: dict, algorithm: str):
  """``(stat_noise, z_grad)``: the norm statistic's noise (``stat_noise_ratio * sigma``) and the
  gradient's multiplier when both share the step's ``sigma`` (Andrew et al. 2021, Sec. 3):
  ``z_grad = (sigma^-2 - (2 stat_noise)^-2)^(-1/2)``.

  Args:
    sigma: the step's noise multiplier (> 0).
    opts: the run's options (``stat_noise_ratio``, > 1/2 for a split to exist).
    algorithm: the algorithm's name, for the refusal.

  Raises:
    ConfigError: for ``sigma <= 0`` or ``stat_noise_ratio <= 1/2``.
  """
  check(sigma > 0, "noise_multiplier", sigma, f"must be > 0 for {algorithm}")
  stat_noise = opts["stat_noise_ratio"] * sigma
  return stat_noise, split_noise_multiplier(sigma, stat_noise)


SPFL_SOUND = Rules("norm", True, _sound_args, _sound_rule, _sound_init, ("high", "low"))


@algorithm("spfl-sound", reference="Wu and Li 2024, thresholds from noisy statistics",
           privacy_unit=EXAMPLE, options=SOUND_OPTIONS,
           about="SP-FL whose thresholds come from noisy statistics: a real epsilon per class",
           **TRAITS)
def build_spfl_sound(config, data) -> Setup:
  """SP-FL with privatised thresholds and a data-independent low-class cap: a real epsilon per class."""
  opts, sigma, cls, high_ids, low_ids = _spfl_common(config, data)
  stat_noise, z_grad = statistic_budget(sigma, opts, "spfl-sound")
  classes = [
      ("high", high_ids, ("z_grad", "stat_noise"),
       "clip threshold from a noisy per-example norm statistic (accounted: the gradient and the "
       "statistic share the step's multiplier, Andrew et al. 2021)"),
      ("low", low_ids, ("sigma",),
       "proportional scaling by beta_low under the data-independent cap low_cap; noise sigma * "
       "low_cap")]
  hparams = {"sigma": sigma, "z_grad": z_grad, "stat_noise": stat_noise,
             "beta_high": opts["beta_high"], "beta_low": opts["beta_low"],
             "low_cap": opts["low_cap"], "stat_bound": opts["stat_bound"],
             "min_clip": opts["min_clip"], "clip": config.clip}
  return build_dpsgd_family(config, data, SPFL_SOUND, opts, hparams, classes, cls)
