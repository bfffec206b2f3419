"""Algorithms by name. Each module composes shared pieces; none copies the round.

A builder takes ``(config, data)`` and returns a :class:`Setup`: the program
(the pure round), its host-side sampler and its privacy accounting.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple


class Setup(NamedTuple):
  program: Any
  sampler: Any
  accounting: Any


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


def read_options(config, defaults: dict) -> dict:
  """``config.options`` over an algorithm's ``defaults``; an unknown name is a ConfigError.

  Every builder reads its ``--set NAME=VALUE`` settings through this, so a
  misspelt option fails before compilation instead of being ignored.
  """
  from fedjax_dp.errors import check
  opts = dict(config.options or {})
  for k in opts:
    check(k in defaults, "option", k,
          f"must be one of {sorted(defaults)} for algorithm {config.algorithm!r}")
  return {**defaults, **opts}


def get_builder(name: str) -> Callable:
  from fedjax_dp.errors import check_choice
  check_choice("algorithm", name, sorted(ALGORITHMS))
  module, fn = ALGORITHMS[name].split(":")
  return getattr(importlib.import_module(module), fn)


def build(config, data) -> Setup:
  return get_builder(config.algorithm)(config, data)
