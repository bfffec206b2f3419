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


def read_options(config, defaults: dict) -> dict:
  """``config.options`` over an algorithm's ``defaults``; an unknown name is a ConfigError.

  Every builder reads its ``--set NAME=VALUE`` settings through this, so a
  misspelt option fails before compilation instead of being ignored. A NaN or
  infinite value (a float, or the strings "inf", "-inf", "nan", "infinity" in
  any case) is refused too, except the strings for an option whose default is a
  string (a name, such as ``nonfinite_value``).
  """
  from fedjax_dp.errors import check
  opts = dict(config.options or {})
  for k, v in opts.items():
    check(k in defaults, "option", k,
          f"must be one of {sorted(defaults)} for algorithm {config.algorithm!r}")
    check(not _nonfinite_option(v, named=isinstance(defaults[k], str)), f"option {k}", v,
          "must be a finite number")
  return {**defaults, **opts}


def get_builder(name: str) -> Callable:
  from fedjax_dp.errors import check_choice
  check_choice("algorithm", name, sorted(ALGORITHMS))
  module, fn = ALGORITHMS[name].split(":")
  return getattr(importlib.import_module(module), fn)


def build(config, data) -> Setup:
  return get_builder(config.algorithm)(config, data)
