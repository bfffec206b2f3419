"""FedAvg (McMahan et al. 2017) and user-level DP-FedAvg (McMahan et al. 2018;
Cheng et al., CVPR 2022, Alg. 1).

DP-FedAvg: each sampled client runs Q local steps from ``w_t``; its delta
``Delta_i = w_{t,Q} - w_t`` is clipped to L2 norm S; the server adds
N(0, (z S)^2 I) to the sum of clipped deltas, divides by the denominator
(the expected cohort size qN by default, or the realized |P_t| as in the
paper) and takes a server step (SGD with eta_g: ``w_{t+1} = w_t + eta_g * mean``).

Any run of the family may have Byzantine clients (``config.byzantine``, the
last ids, sending ``config.attack``) and any aggregator (``config.aggregator``:
the noised mean by default, or a robust one).

Privacy: user-level (add/remove one client under Poisson sampling, replace
one client under fixed-size sampling), derived from the pieces that run
(an attack that reads the regular clients' rows reads their clipped,
un-noised updates, which no mechanism protects: such a run reports
``attacker_knowledge: "omniscient"`` and no guarantee)
via :func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`: a robust
aggregator adds no noise, so a run with one has no guarantee. The realized
denominator |P_t| is refused with Poisson sampling in a private run: it is an
unnoised statistic of the draw, and the released average would reveal it.
With fixed-size sampling |P_t| = M is public and either denominator gives the
same guarantee.
"""

from __future__ import annotations

from fedjax_dp.algorithms.base import (LOCAL, NOISE, NONE, USER, Setup, algorithm, cached_round,
                                       common_hparams, read_options, round_key)
from fedjax_dp.algorithms.fedavg import Pieces, Training, fedavg_round
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.privacy import CohortSampling, calibrate_noise_multiplier
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.mechanisms import user_level_mechanism
from fedjax_dp.sampling import make_sampler
from fedjax_dp.models import Model, check_labels, get_model
from fedjax_dp.attacks import knowledge_of_unreleased, static_options


def make_model(config, data):
  """The run's model: ``config.model`` itself when it is a :class:`fedjax_dp.models.Model`
  (the Python API), else the named model for the data's shapes; either computes in
  ``config.compute_dtype`` (part of the Model, hence of every builder's round cache key), and
  either is multi-label exactly when the data is (:func:`fedjax_dp.models.check_labels`)."""
  import dataclasses
  if isinstance(config.model, Model):
    check(tuple(config.model.input_shape) == tuple(data.example_shape)
          and config.model.num_classes == data.num_classes, "model", config.model.name,
          f"must take inputs {tuple(data.example_shape)} and give {data.num_classes} classes "
          f"(it takes {tuple(config.model.input_shape)}, gives {config.model.num_classes})")
    check_labels(config.model.name, config.model.multi_label, data.name, data.multi_label)
    return dataclasses.replace(config.model, compute_dtype=config.compute_dtype)
  model = get_model(config.model_name, data.example_shape, data.num_classes,
                    conv_impl=config.conv_impl, compute_dtype=config.compute_dtype)
  check_labels(model.name, model.multi_label, data.name, data.multi_label)
  return model


def resolve_noise_multiplier(config, data) -> float:
  """The configured noise multiplier, or the smallest one meeting ``target_epsilon``."""
  if config.target_epsilon is not None:
    return calibrate_noise_multiplier(
        config.target_epsilon, config.delta, config.rounds,
        CohortSampling(config.sampling, config.sampling_prob, data.num_clients,
                       config.cohort_size, config.byzantine), config.accountant)
  if config.noise_multiplier is None:
    raise ConfigError("noise_multiplier", None, "set noise_multiplier >= 0 or target_epsilon > 0")
  return float(config.noise_multiplier)


def fedavg_pieces(config, private: bool, regularizer: str, pre_clip: tuple) -> Pieces:
  """The static pieces of a FedAvg-family round: ``pre_clip`` transforms, then, in a private
  run, the clip and the noised mean (Gaussian noise when the aggregator is the mean).

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig` (its aggregator, weighting, sampling
      and denominator).
    private: clip each update to ``clip`` and, with the mean, add ``N(0, (z clip)^2 I)`` to the
      sum (DP-FedAvg).
    regularizer: "none" or "blur" (the local objective).
    pre_clip: client transform names before the clip (``("sparsify",)`` for LUS).

  Returns:
    The round's :class:`fedjax_dp.algorithms.fedavg.Pieces` (non-private: the realized
    denominator and the configured weighting; private: uniform weights and
    ``config.denominator``).

  Raises:
    ConfigError: for RSA's ``sign_sum`` aggregator; in a private run, for example-count weights
      (they change the sensitivity) or the realized denominator under Poisson sampling (it
      releases the cohort's size, an unnoised statistic of the secret draw).
  """
  aggregator = config.aggregator or "mean"
  check(aggregator not in ("sign_sum",), "aggregator", aggregator,
        "must not be 'sign_sum' for the FedAvg family (RSA's sum of signs, unnormalised)")
  if not private:
    return Pieces(transforms=tuple(pre_clip), aggregator=aggregator, noise=False,
                  weighting=config.weighting, denominator="realized", regularizer=regularizer)
  check(config.weighting == "uniform", "weighting", config.weighting,
        "must be 'uniform' for a private algorithm (example-count weights change the sensitivity)")
  check(not (config.sampling == "poisson" and config.denominator == "realized"), "denominator",
        config.denominator,
        "must be 'expected' with Poisson sampling in a private run: dividing by the realized "
        "cohort size releases that size, an unnoised statistic of the secret draw (it can be "
        "read off the noise scale of the released average); use --denominator expected "
        "(q N, public), or --sampling fixed, whose cohort size is public")
  return Pieces(transforms=tuple(pre_clip) + ("clip",), aggregator=aggregator,
                noise=aggregator == "mean", weighting="uniform", denominator=config.denominator,
                regularizer=regularizer)


def build_fedavg_family(config, data, *, private: bool, regularizer: str = "none",
                        pre_clip: tuple = ()) -> Setup:
  """Shared builder of the FedAvg family.

  Args:
    config: a :class:`fedjax_dp.config.RunConfig`.
    data: a :class:`fedjax_dp.data.FederatedData`.
    private: clip to ``clip`` and add calibrated Gaussian noise to the sum.
    regularizer: "none" or "blur" (the local objective).
    pre_clip: client transforms before the clip (``("sparsify",)`` for LUS).

  Returns:
    The run's :class:`Setup`; its privacy is derived from the round's pieces
    (:func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`).

  Raises:
    ConfigError: for a setting the family refuses (:func:`fedavg_pieces`), a cohort larger than
      the population, or no noise multiplier in a private run.
  """
  opts = read_options(config)
  if config.sampling == "fixed":
    check(config.cohort_size <= data.num_clients, "cohort_size", config.cohort_size,
          f"must be <= the population ({data.num_clients} clients)")
  pieces = fedavg_pieces(config, private, regularizer, pre_clip)
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  z = resolve_noise_multiplier(config, data) if private else 0.0
  model = make_model(config, data)
  rnd = cached_round(round_key(config, opts, model, data.num_clients), lambda: fedavg_round(
      model, data.num_clients, pieces, Training.of(config), attack=config.attack,
      attack_options=static_options(config.attack, opts), lus_batches=opts.get("lus_batches", 1),
      static=opts))
  hparams = common_hparams(
      config, opts, client_lr=config.client_lr, clip=config.clip, noise_multiplier=z,
      expected_size=sampler.expected_size, **{"lambda": opts.get("lambda", 0.0),
                                              "sparsity": opts.get("sparsity", 0.0)})
  mechanism = user_level_mechanism(rnd, hparams, config.sampling, config.sampling_prob,
                                   data.num_clients, config.cohort_size)
  # The clients' clipped updates are not released (only the noisy sum is).
  accounting = LedgerAccounting(mechanism, config.delta, config.accountant, attacker_knowledge=
                                knowledge_of_unreleased(config.attack, config.byzantine))
  return Setup(rnd, sampler, accounting, hparams)


# User-level DP-FedAvg and its variants (blur_lus.py) read these settings.
PRIVATE_READS = LOCAL | NOISE | {"denominator"}


@algorithm("fedavg", reference="McMahan et al. 2017", privacy_unit=NONE, reads=LOCAL,
           about="federated averaging: local SGD, the mean of the clients' updates")
def build_fedavg(config, data) -> Setup:
  """Non-private FedAvg: weighted mean of client deltas (``weighting`` chooses the weights)."""
  return build_fedavg_family(config, data, private=False)


@algorithm("dp_fedavg", reference="McMahan et al. 2018; Cheng et al., CVPR 2022, Alg. 1",
           privacy_unit=USER, reads=PRIVATE_READS, central_noise=True,
           about="user-level DP-FedAvg: clipped updates, Gaussian noise on their sum")
def build_dp_fedavg(config, data) -> Setup:
  """User-level DP-FedAvg (clip S, noise z S on the sum)."""
  return build_fedavg_family(config, data, private=True)
