"""Algorithms by name. Each module composes shared pieces; none copies the round.

A builder takes ``(config, data)`` and returns a :class:`Setup`: the program
(a :class:`fedjax_dp.round.Round`, the static structure of the one round),
its hyper-parameters (``hparams``: every number the round uses, as arrays),
its host-side sampler and its privacy accounting.
"""

from __future__ import annotations

import importlib
from typing import Callable

from fedjax_dp.algorithms.base import (INT_HPARAMS, Setup, as_hparams, cached_round,
                                       common_hparams, read_options)

__all__ = ["ALGORITHMS", "INT_HPARAMS", "Setup", "as_hparams", "build", "cached_round",
           "common_hparams", "get_builder", "option_table", "read_options", "refuse_unused"]


# name -> "module:function"; modules are imported on use (keeps imports light).
ALGORITHMS = {
    "fedavg": "fedjax_dp.algorithms.dp_fedavg:build_fedavg",
    "dp_fedavg": "fedjax_dp.algorithms.dp_fedavg:build_dp_fedavg",
    "spfl": "fedjax_dp.algorithms.spfl:build_spfl",
    "spfl-sound": "fedjax_dp.algorithms.spfl:build_spfl_sound",
    "dp-fl": "fedjax_dp.algorithms.spfl:build_dp_fl",
    "nodp-fl": "fedjax_dp.algorithms.spfl:build_nodp_fl",
    "adp-fl": "fedjax_dp.algorithms.adp_fl:build_adp_fl",
    "rsa": "fedjax_dp.algorithms.rsa:build_rsa",
    "dp-rsa-f": "fedjax_dp.algorithms.rsa:build_dp_rsa_f",
    "dp-rsa-g": "fedjax_dp.algorithms.rsa:build_dp_rsa_g",
    "sgd": "fedjax_dp.algorithms.robust_sgd:build_sgd",
    "signsgd": "fedjax_dp.algorithms.robust_sgd:build_signsgd",
    "gm": "fedjax_dp.algorithms.robust_sgd:build_gm",
    "median": "fedjax_dp.algorithms.robust_sgd:build_median",
    "trimmed_mean": "fedjax_dp.algorithms.robust_sgd:build_trimmed_mean",
    "krum": "fedjax_dp.algorithms.robust_sgd:build_krum",
    "centered_clipping": "fedjax_dp.algorithms.robust_sgd:build_centered_clipping",
    "dp_fedavg+blur": "fedjax_dp.algorithms.blur_lus:build_dp_fedavg_blur",
    "dp_fedavg+lus": "fedjax_dp.algorithms.blur_lus:build_dp_fedavg_lus",
    "blur+lus": "fedjax_dp.algorithms.blur_lus:build_blur_lus",
    "ddgauss": "fedjax_dp.algorithms.ddgauss:build_ddgauss",
    "ae-dpfl": "fedjax_dp.algorithms.ae_dpfl:build_ae_dpfl",
}


_USER = "user-level: one client's whole data set"
_EXAMPLE = "example-level: one example of one client"
_WORKER = "worker-level: one worker's whole data set (replace-one)"
_NONE = "none (no privacy mechanism)"
# name -> (paper, privacy unit, "module:attribute[key]" of its own --set options or "").
ABOUT = {
    "fedavg": ("McMahan et al. 2017", _NONE, ""),
    "dp_fedavg": ("McMahan et al. 2018; Cheng et al., CVPR 2022, Alg. 1", _USER, ""),
    "dp_fedavg+blur": ("Cheng et al., CVPR 2022 (BLUR)", _USER, "blur_lus:OPTIONS[dp_fedavg+blur]"),
    "dp_fedavg+lus": ("Cheng et al., CVPR 2022 (LUS)", _USER, "blur_lus:OPTIONS[dp_fedavg+lus]"),
    "blur+lus": ("Cheng et al., CVPR 2022, Alg. 2", _USER, "blur_lus:OPTIONS[blur+lus]"),
    "spfl": ("Wu and Li 2024 (SP-FL as published: no formal guarantee)", _EXAMPLE,
             "spfl:OPTIONS[spfl]"),
    "spfl-sound": ("Wu and Li 2024, thresholds from noisy statistics", _EXAMPLE,
                   "spfl:OPTIONS[spfl-sound]"),
    "dp-fl": ("client-side DP-SGD (SP-FL's baseline)", _EXAMPLE, "spfl:OPTIONS[dp-fl]"),
    "adp-fl": ("Andrew et al., NeurIPS 2021 (SP-FL's baseline)", _EXAMPLE, "spfl:OPTIONS[adp-fl]"),
    "nodp-fl": ("non-private DP-SGD steps (SP-FL's baseline)", _NONE, "spfl:OPTIONS[nodp-fl]"),
    "rsa": ("Li et al., AAAI 2019", _NONE, "rsa:OPTIONS[rsa]"),
    "dp-rsa-f": ("Zhu and Ling, IJCAI 2022, Sign-Flipping", _WORKER, "rsa:OPTIONS[dp-rsa-f]"),
    "dp-rsa-g": ("Zhu and Ling, IJCAI 2022, Sign-Gaussian", _WORKER, "rsa:OPTIONS[dp-rsa-g]"),
    "sgd": ("mean of stochastic gradients (Zhu and Ling's baseline)", _NONE, "options:L2"),
    "signsgd": ("Bernstein et al. 2019, majority vote", _NONE, "options:L2"),
    "gm": ("geometric median (Weiszfeld)", _NONE, "options:L2"),
    "median": ("coordinate-wise median", _NONE, "options:L2"),
    "trimmed_mean": ("Yin et al., ICML 2018", _NONE, "options:L2"),
    "krum": ("Blanchard et al., NeurIPS 2017", _NONE, "options:L2"),
    "centered_clipping": ("Karimireddy et al., ICML 2021", _NONE, "options:L2"),
    "ddgauss": ("Kairouz, Liu and Steinke, ICML 2021 (distributed discrete Gaussian, secure "
                "aggregation)", _USER + " (replace-one, fixed-size cohorts)", "ddgauss:OPTIONS"),
    "ae-dpfl": ("Zhu, Yu, Wang et al., voting-based DPFL (AE-DPFL: noisy argmax of the clients' "
                "votes on a public unlabeled set)", _USER + " (the public set's clients excluded)",
                "ae_dpfl:OPTIONS"),
}


# Algorithms that take no Byzantine clients and no other aggregator, so not the attack's and the
# aggregators' options either (their builders read their own table only).
NO_BYZANTINE = frozenset({"ae-dpfl"})


def option_table(name: str) -> tuple:
  """Every ``--set`` option algorithm ``name`` takes (its own, then the attack's and the
  aggregators', which every algorithm but those of :data:`NO_BYZANTINE` takes)."""
  from fedjax_dp.algorithms import options
  from fedjax_dp.errors import check_choice
  check_choice("algorithm", name, sorted(ALGORITHMS))
  ref = ABOUT[name][2]
  own = ()
  if ref:
    module, attr = ref.split(":")
    key = None
    if "[" in attr:
      attr, key = attr[:-1].split("[")
    own = getattr(importlib.import_module(f"fedjax_dp.algorithms.{module}"), attr)
    own = own[key] if key else own
  return tuple(own) + (() if name in NO_BYZANTINE else options.BYZANTINE + options.AGGREGATOR)


def get_builder(name: str) -> Callable:
  from fedjax_dp.errors import check_choice
  check_choice("algorithm", name, sorted(ALGORITHMS))
  module, fn = ALGORITHMS[name].split(":")
  return getattr(importlib.import_module(module), fn)


# The RunConfig fields beyond the common ones (data, model, rounds, sampling, seed, evaluation,
# Byzantine clients and aggregator, batch size and client rate, delta and accountant) that each
# algorithm reads.
_LOCAL = frozenset({"local_steps", "client_optimizer", "weighting", "server_optimizer", "server_lr"})
_NOISE = frozenset({"clip", "noise_multiplier", "target_epsilon"})
# User-level DP-FedAvg and its variants: the server's noised mean is the mechanism.
CENTRAL_NOISE = ("dp_fedavg", "dp_fedavg+blur", "dp_fedavg+lus", "blur+lus")
USES = {name: _LOCAL | _NOISE | {"denominator"} for name in CENTRAL_NOISE}
USES["fedavg"] = _LOCAL
USES.update({name: _LOCAL | _NOISE for name in ("spfl", "spfl-sound", "dp-fl", "adp-fl")})
USES["nodp-fl"] = _LOCAL
USES.update({name: frozenset() for name in ("rsa", "dp-rsa-f", "dp-rsa-g", "sgd", "signsgd", "gm",
                                            "median", "trimmed_mean", "krum", "centered_clipping")})
USES["ddgauss"] = _LOCAL | _NOISE
USES["ae-dpfl"] = (_LOCAL - {"weighting"}) | {"noise_multiplier", "target_epsilon"}
SPECIFIC = frozenset().union(*USES.values())


def unused_fields(config) -> list:
  """The algorithm-specific fields ``config.algorithm`` does not read."""
  return sorted(SPECIFIC - USES[config.algorithm])


def unread_fields(config) -> dict:
  """The fields ``config`` leaves unread, each with why: not read by its algorithm
  (:func:`unused_fields`) or by the run's other settings (:func:`unread_by_settings`)."""
  out = {name: f"is not used by algorithm {config.algorithm!r}: leave it out (of the settings "
               "that depend on the algorithm, it reads "
               f"{sorted(USES[config.algorithm]) or 'none'})"
         for name in unused_fields(config)}
  out.update({name: f"is not used: {why}; leave it out"
              for name, why in unread_by_settings(config).items()})
  return out


def refuse_unused(config, given, others=()) -> None:
  """Refuses a setting given (a flag, a config file's key, a keyword of
  :func:`fedjax_dp.simulate`) that ``config.algorithm`` does not read: it would otherwise run as
  if it applied (``clip`` for DP-RSA, ``target_epsilon`` for FedAvg). ``given``: the names of
  the fields given; unsetting one (None) is always allowed. ``others``: the configurations the
  same settings also run with (a sweep's grid points): a setting counts as read when one of
  them reads it.
  """
  from fedjax_dp.errors import check
  unread_elsewhere = [unread_fields(c) for c in others]
  for name, why in unread_fields(config).items():
    check(name not in given or getattr(config, name) is None
          or any(name not in u for u in unread_elsewhere), name, getattr(config, name), why)


# The algorithms whose attacks read what the regular workers release or, if told, their raw
# state (attacker_knowledge); the others fix it: the FedAvg family releases only a noised
# aggregate, so its attackers read raw updates, and the DP-SGD family and the robust baselines
# upload what they release.
CHOOSES_KNOWLEDGE = ("rsa", "dp-rsa-f", "dp-rsa-g")


def unread_by_settings(config) -> dict:
  """The fields that the run's other settings leave unread, each with the reason."""
  no_byzantine = "there are no Byzantine clients (byzantine 0)" if config.byzantine == 0 else None
  no_attack = "there is no attack (attack none)" if config.attack == "none" else no_byzantine
  from fedjax_dp.attacks import get as get_attack
  knowledge = no_attack or (
      f"attack {config.attack!r} reads no regular client"
      if not get_attack(config.attack).reads_honest else
      None if config.algorithm in CHOOSES_KNOWLEDGE else
      f"algorithm {config.algorithm!r} fixes what its attacks read (only "
      f"{', '.join(CHOOSES_KNOWLEDGE)} let it be chosen; the summary's attacker_knowledge says "
      "what was read)")
  unnoised = (f"the aggregator {config.aggregator!r} adds no noise (only the noised mean does, "
              "and the run has no guarantee)"
              if config.algorithm in CENTRAL_NOISE and config.aggregator not in (None, "mean")
              else None)
  unaccounted = (f"algorithm {config.algorithm!r} has no privacy mechanism, so nothing is "
                 "accounted" if ABOUT[config.algorithm][1] == _NONE else
                 "dp-rsa-g without sign_clip has no guarantee, so nothing is accounted"
                 if config.algorithm == "dp-rsa-g"
                 and (config.options or {}).get("sign_clip") is None else unnoised)
  workers_unused = ("the rdp accountant's epsilons take milliseconds and are computed in the "
                    "run's process" if config.accountant == "rdp" else None)
  only = lambda partition: (f"partition is {config.partition} (only {partition} reads it)"
                            if config.partition != partition else None)
  from fedjax_dp.data.specs import BY_NAME
  spec = BY_NAME.get(config.dataset)
  no_files = (f"dataset {config.dataset!r} is bundled with scikit-learn (no files are read)"
              if spec is not None and not spec.files else None)
  no_download = (f"dataset {config.dataset!r} has no tensorflow-datasets download"
                 if spec is not None and spec.tfds_name is None else None)
  from fedjax_dp.models import CONV_MODELS, MODELS
  no_conv = (f"model {config.model_name!r} has no convolution"
             if config.model_name in set(MODELS) - CONV_MODELS else None)
  reasons = (("cohort_size", "sampling is poisson (clients join with sampling_prob)"
              if config.sampling == "poisson" else None),
             ("sampling_prob", "sampling is fixed (cohort_size clients a round)"
              if config.sampling == "fixed" else None),
             ("capacity", "sampling is fixed (the round's slots are the cohort_size clients)"
              if config.sampling == "fixed" else None),
             ("attack", no_byzantine if config.attack != "none" else None),
             ("attacker_knowledge", knowledge),
             ("noise_multiplier", unnoised), ("target_epsilon", unnoised),
             ("delta", unaccounted), ("accountant", unaccounted),
             ("accounting_workers", unaccounted or workers_unused),
             ("dirichlet_alpha", only("dirichlet")), ("shards_per_client", only("shards")),
             ("min_labels_per_client", only("shards")),
             ("data_dir", no_files), ("download", no_download), ("conv_impl", no_conv))
  return {name: why for name, why in reasons if why is not None}


def build(config, data) -> Setup:
  return get_builder(config.algorithm)(config, data)
