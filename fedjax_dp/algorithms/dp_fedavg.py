"""FedAvg (McMahan et al. 2017) and user-level DP-FedAvg (McMahan et al. 2018;
Cheng et al., CVPR 2022, Alg. 1).

DP-FedAvg: each sampled client runs Q local steps from ``w_t``; its delta
``Delta_i = w_{t,Q} - w_t`` is clipped to L2 norm S; the server adds
N(0, (z S)^2 I) to the sum of clipped deltas, divides by the denominator
(the expected cohort size qN by default, or the realized |P_t| as in the
paper) and takes a server step (SGD with eta_g: ``w_{t+1} = w_t + eta_g * mean``).

Privacy: user-level (add/remove one client under Poisson sampling, replace
one client under fixed-size sampling); see
:class:`fedjax_dp.privacy.GaussianSumMechanism`. The realized denominator
|P_t| is refused with Poisson sampling: it is an unnoised statistic of the
draw, and the released average would reveal it. With fixed-size sampling
|P_t| = M is public and either denominator gives the same guarantee.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import optax

from fedjax_dp import aggregators, objectives
from fedjax_dp.accounting import LedgerAccounting
from fedjax_dp.algorithms import Setup, read_options
from fedjax_dp.algorithms.fedavg import FedAvgProgram
from fedjax_dp.client import local_sgd, make_optimizer
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.privacy import GaussianSumMechanism, NonPrivate, calibrate_noise_multiplier
from fedjax_dp.sampling import make_sampler
from fedjax_dp.transforms import clip_l2, identity


def make_model(config, data):
  from fedjax_dp.models import get_model
  return get_model(config.model_name, data.example_shape, data.num_classes,
                   conv_impl=config.conv_impl)


def resolve_noise_multiplier(config, data) -> float:
  """The configured noise multiplier, or the smallest one meeting ``target_epsilon``."""
  if config.target_epsilon is not None:
    return calibrate_noise_multiplier(
        config.target_epsilon, config.delta, config.rounds, config.sampling,
        config.sampling_prob, data.num_clients, config.cohort_size, config.accountant)
  if config.noise_multiplier is None:
    raise ConfigError("noise_multiplier", None, "set noise_multiplier >= 0 or target_epsilon > 0")
  return float(config.noise_multiplier)


def build_fedavg_family(config, data, *, private: bool,
                        wrap_objective: Optional[Callable] = None,
                        pre_clip: Sequence[optax.GradientTransformation] = (),
                        client_extras: Optional[Callable] = None) -> Setup:
  """Shared builder of the FedAvg family.

  Args:
    config: a :class:`fedjax_dp.config.RunConfig`.
    data: a :class:`fedjax_dp.data.FederatedData`.
    private: clip to ``config.clip`` and add calibrated Gaussian noise to the sum.
    wrap_objective: optional ``objective -> objective`` (a local regulariser).
    pre_clip: client transforms applied to the delta before clipping (e.g. LUS).
    client_extras: extra keyword arguments for the client transforms (see
      :class:`FedAvgProgram`).
  """
  if config.sampling == "fixed":
    check(config.cohort_size <= data.num_clients, "cohort_size", config.cohort_size,
          f"must be <= the population ({data.num_clients} clients)")
  model = make_model(config, data)
  objective = objectives.supervised(model.apply)
  if wrap_objective is not None:
    objective = wrap_objective(objective)
  local_train = local_sgd(objective, make_optimizer(config.client_optimizer, config.client_lr),
                          config.local_steps, config.batch_size)
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  if private:
    check(config.weighting == "uniform", "weighting", config.weighting,
          "must be 'uniform' for a private algorithm (example-count weights change the sensitivity)")
    check(not (config.sampling == "poisson" and config.denominator == "realized"), "denominator",
          config.denominator,
          "must be 'expected' with Poisson sampling in a private run: dividing by the realized "
          "cohort size releases that size, an unnoised statistic of the secret draw (it can be "
          "read off the noise scale of the released average); use --denominator expected "
          "(q N, public), or --sampling fixed, whose cohort size is public")
    z = resolve_noise_multiplier(config, data)
    mechanism = GaussianSumMechanism(config.clip, z, config.sampling, config.sampling_prob,
                                     data.num_clients, config.cohort_size)
    transform = optax.chain(*pre_clip, clip_l2(config.clip))
    aggregator = aggregators.mean(config.denominator, sampler.expected_size, mechanism.noise_stddev)
    clip = config.clip
  else:
    mechanism = NonPrivate()
    transform = optax.chain(*pre_clip) if pre_clip else identity()
    aggregator = aggregators.mean("realized")
    clip = None
  program = FedAvgProgram(
      model=model, local_train=local_train, client_transform=transform, aggregator=aggregator,
      server_optimizer=make_optimizer(config.server_optimizer, config.server_lr),
      mechanism=mechanism, weighting=config.weighting, clip=clip, client_extras=client_extras)
  return Setup(program, sampler, LedgerAccounting(mechanism, config.delta, config.accountant))


def build_fedavg(config, data) -> Setup:
  """Non-private FedAvg: weighted mean of client deltas (``weighting`` chooses the weights)."""
  read_options(config, {})
  return build_fedavg_family(config, data, private=False)


def build_dp_fedavg(config, data) -> Setup:
  """User-level DP-FedAvg (clip S, noise z S on the sum)."""
  read_options(config, {})
  return build_fedavg_family(config, data, private=True)
