"""Algorithms by name. Each module composes shared pieces; none copies the round.

A builder takes ``(config, data)`` and returns a :class:`Setup`: the program
(a :class:`fedjax_dp.round.Round`, the static structure of the one round),
its hyper-parameters (``hparams``: every number the round uses, as arrays),
its host-side sampler and its privacy accounting.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple, Optional

import numpy as np


class Setup(NamedTuple):
  program: Any
  sampler: Any
  accounting: Any
  hparams: Optional[dict] = None


# Options every algorithm with Byzantine clients takes: the attack's strengths and the robust
# aggregators' parameters (numbers go into hparams; gm_max_iter, krum_m, cc_iters are loop
# counts and nonfinite_value a choice, part of the round's structure).
BYZANTINE_OPTIONS = {"attack_sigma": 1e4, "attack_scale": -5.0, "alie_z": None, "ipm_epsilon": 0.1,
                     "nonfinite_value": "nan"}
AGGREGATOR_OPTIONS = {"trim_beta": 0.1, "gm_tol": 1e-6, "gm_max_iter": 100, "krum_m": 1,
                      "cc_tau": 1.0, "cc_iters": 1}
STATIC_AGGREGATOR_OPTIONS = ("gm_max_iter", "krum_m", "cc_iters")


def check_byzantine_options(opts: dict) -> None:
  """Host-side validation of :data:`BYZANTINE_OPTIONS` and :data:`AGGREGATOR_OPTIONS` values."""
  from fedjax_dp.errors import check, check_choice
  for k in ("attack_sigma", "attack_scale", "ipm_epsilon", "trim_beta", "gm_tol", "cc_tau"):
    v = opts[k]
    check(isinstance(v, (int, float)) and not isinstance(v, bool), k, v, "must be a number")
  check(opts["alie_z"] is None or isinstance(opts["alie_z"], (int, float)), "alie_z", opts["alie_z"],
        "must be a number or unset (the paper's z_max)")
  check(opts["attack_sigma"] > 0, "attack_sigma", opts["attack_sigma"], "must be > 0")
  check(opts["ipm_epsilon"] > 0, "ipm_epsilon", opts["ipm_epsilon"], "must be > 0")
  check_choice("nonfinite_value", opts["nonfinite_value"], ("nan", "inf", "mixed"))
  check(0 <= opts["trim_beta"] < 0.5, "trim_beta", opts["trim_beta"], "must be in [0, 0.5)")
  check(opts["gm_tol"] > 0, "gm_tol", opts["gm_tol"], "must be > 0")
  check(opts["cc_tau"] > 0, "cc_tau", opts["cc_tau"], "must be > 0")
  for k in STATIC_AGGREGATOR_OPTIONS:
    check(isinstance(opts[k], int) and not isinstance(opts[k], bool) and opts[k] >= 1, k, opts[k],
          "must be an integer >= 1")


def common_hparams(config, opts: dict, **extra) -> dict:
  """The hparams every round reads (server rate, Byzantine clients, attack and aggregator
  strengths, ``l2``) plus ``extra``, as float32 arrays (``byzantine`` int32)."""
  hp = {"server_lr": config.server_lr, "l2": 0.0, "byzantine": config.byzantine}
  for k in BYZANTINE_OPTIONS:
    if k != "nonfinite_value":
      hp[k] = opts.get(k, BYZANTINE_OPTIONS[k])
  hp["alie_z"] = float("nan") if hp["alie_z"] is None else hp["alie_z"]
  for k in AGGREGATOR_OPTIONS:
    if k not in STATIC_AGGREGATOR_OPTIONS:
      hp[k] = opts.get(k, AGGREGATOR_OPTIONS[k])
  hp.update(extra)
  return {k: np.asarray(v, np.int32 if k == "byzantine" else np.float32) for k, v in hp.items()}


_ROUNDS: dict = {}


def cached_round(key: tuple, make: Callable):
  """The :class:`fedjax_dp.round.Round` for a static structure ``key``, built once.

  Builders describe everything that shapes the compiled round (model, shapes,
  which pieces, loop counts) in ``key``; two runs that differ only in numbers
  get the same Round, hence the same compiled step.
  """
  if key not in _ROUNDS:
    _ROUNDS[key] = make()
  return _ROUNDS[key]


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
}


_NONFINITE_WORDS = ("inf", "+inf", "-inf", "nan", "+nan", "-nan", "infinity", "+infinity", "-infinity")


def _nonfinite_option(value, named: bool) -> bool:
  """True if ``value`` (or a number inside a list/tuple/dict of it) is NaN or infinite.

  The CLI reads ``--set`` values with ``json.loads``, which turns ``NaN`` and
  ``Infinity`` into floats and leaves ``inf`` or ``nan`` as strings; both are
  refused unless the option takes a name (``named``: its default is a string,
  e.g. ``nonfinite_value="nan"`` picks an attack).
  """
  from fedjax_dp.config import is_nonfinite
  if isinstance(value, str):
    return not named and value.strip().lower() in _NONFINITE_WORDS
  if isinstance(value, (list, tuple)):
    return any(_nonfinite_option(v, named) for v in value)
  if isinstance(value, dict):
    return any(_nonfinite_option(v, named) for v in value.values())
  return is_nonfinite(value)


def read_options(config, defaults: dict, byzantine: bool = False) -> dict:
  """``config.options`` over an algorithm's ``defaults``; an unknown name is a ConfigError.

  ``byzantine``: the algorithm takes Byzantine clients, so it also accepts
  (and validates) :data:`BYZANTINE_OPTIONS` and :data:`AGGREGATOR_OPTIONS`.

  Every builder reads its ``--set NAME=VALUE`` settings through this, so a
  misspelt option fails before compilation instead of being ignored. A NaN or
  infinite value (a float, or the strings "inf", "-inf", "nan", "infinity" in
  any case) is refused too, except the strings for an option whose default is a
  string (a name, such as ``nonfinite_value``).
  """
  from fedjax_dp.errors import check
  if byzantine:
    defaults = {**BYZANTINE_OPTIONS, **AGGREGATOR_OPTIONS, **defaults}
  opts = dict(config.options or {})
  for k, v in opts.items():
    check(k in defaults, "option", k,
          f"must be one of {sorted(defaults)} for algorithm {config.algorithm!r}")
    check(not _nonfinite_option(v, named=isinstance(defaults[k], str)), f"option {k}", v,
          "must be a finite number")
  out = {**defaults, **opts}
  if byzantine:
    check_byzantine_options(out)
  return out


def get_builder(name: str) -> Callable:
  from fedjax_dp.errors import check_choice
  check_choice("algorithm", name, sorted(ALGORITHMS))
  module, fn = ALGORITHMS[name].split(":")
  return getattr(importlib.import_module(module), fn)


def build(config, data) -> Setup:
  return get_builder(config.algorithm)(config, data)
