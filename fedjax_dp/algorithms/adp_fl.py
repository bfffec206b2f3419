"""ADP-FL: client-side DP-SGD with a clip bound set by private quantile estimation.

Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021 (Alg. 1 and Sec. 3), standing in for the ADP-FL
baseline of SP-FL (Wu and Li 2024): the paper cites as ADP-FL its ref. [15], a
scheme for clients that do or do not trust the server (Sec. 2.5.1), and its
experiments describe ADP-FL only as DP federated learning with adaptive clipping
(Sec. 3.2), whose standard method this is. Here at the example level: every local
DP-SGD step of every cohort client also releases ``sum_i (1[||g_i|| <= C] - 1/2) +
N(0, stat_noise^2)`` over its sampled batch; after the round the server
forms the noisy fraction of per-example norms under ``C``,
``b~ = 1/2 + sum / (n_cohort Q L)``, and moves the shared bound
geometrically towards the ``target_quantile`` gamma:
``C <- C * exp(-clip_lr * (b~ - gamma))``.

Privacy: example-level (one example of one client, local to each client),
under replace-one. The budget is split as in Andrew et al.: each example
moves the statistic by at most 1/2 and the clipped sum by at most ``C``,
with noise ``stat_noise`` and ``z_Delta C``; scaled so both have noise ``z``
the example's joint contribution has norm at most 1 (so replacing it moves
the pair by at most 2, the unit of the replace-one event), when the gradient gets
``z_Delta = (z^-2 - (2 stat_noise)^-2)^(-1/2)``, and each step is accounted
as one sampled Gaussian mechanism with multiplier ``z``. The bound of a
round is post-processing of earlier noisy releases, so it does not depend on
the current step's data. Options: ``target_quantile`` (0.5), ``clip_lr``
(0.2), ``stat_noise_ratio`` (5: ``stat_noise = 5 z``), ``example_sampling``,
``min_clip`` (1e-3) and ``max_clip`` (``1000 * clip``), the data-independent
clamp of the bound; the initial bound is ``config.clip``. Every number
(``sigma``, ``z_grad``, ``stat_noise``, ``target_quantile``, ``clip_lr``,
``min_clip``, ``max_clip``, ``clip``) is in the Setup's ``hparams``.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_dp.algorithms.base import EXAMPLE, Setup, algorithm
from fedjax_dp.algorithms.dpsgd_family import Rules
from fedjax_dp.algorithms.options import Option
from fedjax_dp.algorithms.spfl import (EXAMPLE_SAMPLING, MIN_CLIP, POSITIVE, STAT_NOISE_RATIO,
                                       TRAITS, build_dpsgd_family, init_clip_bound, options,
                                       resolve_sigma, statistic_budget)
from fedjax_dp.errors import check
from fedjax_dp.transforms import dp_args

OPTIONS = (
    EXAMPLE_SAMPLING, STAT_NOISE_RATIO, MIN_CLIP,
    Option("max_clip", None, "adp-fl: upper clamp of the adaptive bound; unset: 1000 clip",
           **POSITIVE),
    Option("target_quantile", 0.5, "adp-fl: the quantile of per-example norms the bound tracks",
           low=0, high=1, low_open=True, high_open=True),
    Option("clip_lr", 0.2, "adp-fl: the bound's geometric learning rate", **POSITIVE),
)


def quantile_update(clip, stat_sum, expected, target_quantile, clip_lr, min_clip=0.0,
                    max_clip=jnp.inf):
  """Andrew et al. 2021, Alg. 1: ``C * exp(-eta_C (b~ - gamma))`` with ``b~ = 1/2 + stat_sum / expected``.

  The result is clamped to the data-independent ``[min_clip, max_clip]`` (post-processing), so
  a run of extreme noise draws cannot drive the bound to 0 or to an infinite value (whose noise
  ``sigma * C`` would turn the model into NaN).

  Args:
    clip: ``C``, the bound in force (> 0).
    stat_sum: the noisy sum of ``1[||g_i|| <= C] - 1/2`` over the round's sampled examples.
    expected: the public expected number of examples it covers (``n_cohort Q L``; at least 1
      is used).
    target_quantile: ``gamma`` in (0, 1), the quantile of the per-example norms tracked.
    clip_lr: ``eta_C`` > 0, the geometric learning rate.
    min_clip: lower clamp of the result.
    max_clip: upper clamp of the result.

  Returns:
    The new bound, in ``[min_clip, max_clip]``.
  """
  b = 0.5 + stat_sum / jnp.maximum(expected, 1.0)
  return jnp.clip(clip * jnp.exp(-clip_lr * (b - target_quantile)), min_clip, max_clip)


def _adp_args(thresholds, hp, cls):
  return dp_args(jnp.full(cls.shape, thresholds[0]), 1.0, hp["z_grad"], hp["stat_noise"])


def _adp_rule(thresholds, hp, stats, mask, cls):
  del cls
  n = jnp.sum(mask)
  new = quantile_update(thresholds[0], jnp.sum(stats.stat_sum * mask), n * hp["examples_per_round"],
                        hp["target_quantile"], hp["clip_lr"], hp["min_clip"], hp["max_clip"])
  return thresholds.at[0].set(jnp.where(n > 0, new, thresholds[0]))


ADP_FL = Rules("below", True, _adp_args, _adp_rule, init_clip_bound, ("all",))


@algorithm("adp-fl", reference="Andrew et al., NeurIPS 2021 (SP-FL's baseline)",
           privacy_unit=EXAMPLE, options=OPTIONS,
           about="DP-SGD clients whose clip bound tracks a quantile of the per-example norms, "
                 "privately", **TRAITS)
def build_adp_fl(config, data) -> Setup:
  """ADP-FL: example-level DP-SGD with a private geometric quantile clip bound.

  Raises:
    ConfigError: for ``max_clip <= min_clip``, a bad option or setting.
  """
  opts = options(config, (("max_clip", 1e3),))
  check(opts["max_clip"] > opts["min_clip"], "max_clip", opts["max_clip"],
        f"must be > min_clip={opts['min_clip']}")
  sigma = resolve_sigma(config, data, opts)
  stat_noise, z_grad = statistic_budget(sigma, opts, "adp-fl")
  classes = [("all", tuple(range(data.num_clients)), ("z_grad", "stat_noise"),
              "adaptive clip bound from noisy per-example quantile bits (accounted: the gradient "
              "and the bits share the step's multiplier z)")]
  hparams = {"sigma": sigma, "z_grad": z_grad, "stat_noise": stat_noise,
             "target_quantile": opts["target_quantile"], "clip_lr": opts["clip_lr"],
             "min_clip": opts["min_clip"], "max_clip": opts["max_clip"],
             "clip": config.clip}
  return build_dpsgd_family(config, data, ADP_FL, opts, hparams, classes)
