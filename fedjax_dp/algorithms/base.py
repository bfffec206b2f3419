"""What every algorithm's builder shares: the :class:`Setup` it returns, its hyper-parameters
and its settings, read once, and the compiled rounds kept by their static structure."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np


class Setup(NamedTuple):
  program: Any
  sampler: Any
  accounting: Any
  hparams: Optional[dict] = None


def common_hparams(config, opts: dict, **extra) -> dict:
  """The hparams every round reads (server rate, Byzantine clients, attack and aggregator
  strengths, ``l2``) plus ``extra``, as arrays (:func:`as_hparams`)."""
  from fedjax_dp.algorithms import options
  hp = {"server_lr": config.server_lr, "l2": 0.0, "byzantine": config.byzantine}
  for o in options.BYZANTINE + options.AGGREGATOR:
    if o.kind != "choice" and o.name not in options.STATIC_AGGREGATOR:
      hp[o.name] = opts.get(o.name, o.default)
  hp["alie_z"] = float("nan") if hp["alie_z"] is None else hp["alie_z"]
  hp.update(extra)
  return as_hparams(hp)


INT_HPARAMS = ("byzantine", "client_class")


def as_hparams(values: dict) -> dict:
  """Hyper-parameters as the compiled round takes them: int32 arrays for the counts and ids of
  :data:`INT_HPARAMS`, float32 arrays for every other number. A finite number that float32
  cannot hold (``--clip 1e308``) is refused, naming it, instead of becoming inf; so is one
  so close to zero that float32 makes it 0 or a denormal (``--noise-multiplier 1e-300``
  would add no noise at all while its record said some)."""
  from fedjax_dp.errors import check
  out = {}
  for k, v in values.items():
    if k in INT_HPARAMS:
      out[k] = np.asarray(v, np.int32)
      continue
    wide = np.asarray(v, np.float64)
    check(not np.any(np.isfinite(wide) & (np.abs(wide) > np.finfo(np.float32).max)), k, v,
          f"is beyond float32 (magnitude at most {np.finfo(np.float32).max:.3g}), the dtype the "
          "compiled round computes in")
    tiny = np.finfo(np.float32).tiny
    check(not np.any((wide != 0) & (np.abs(wide) < tiny)), k, v,
          f"must be 0 or at least {tiny:.3g} in magnitude: float32, the dtype the compiled "
          "round computes in, makes a smaller one zero or a denormal")
    out[k] = wide.astype(np.float32)
  return out


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


def read_options(config, table, byzantine: bool = False) -> dict:
  """The algorithm's settings (``--set``) read against its :class:`options.Option` table.

  ``byzantine``: the algorithm takes Byzantine clients, so it also reads the
  attack's and the robust aggregators' options (:data:`options.BYZANTINE`,
  :data:`options.AGGREGATOR`). Every builder reads its settings through this,
  once, before building: a misspelt name, a wrong type, a non-finite or
  out-of-range value fails before compilation instead of being ignored.
  """
  from fedjax_dp.algorithms import options
  from fedjax_dp.errors import check
  table = tuple(table) + ((options.BYZANTINE + options.AGGREGATOR) if byzantine else ())
  opts = options.read(config, table)
  if byzantine:
    if "krum_m" in (config.options or {}) and config.sampling == "fixed":
      # More rows than a cohort would make multi-Krum a plain mean.
      check(opts["krum_m"] <= config.cohort_size, "option krum_m", opts["krum_m"],
            f"must be <= cohort_size={config.cohort_size} (multi-Krum averages the krum_m "
            "best-scored rows of a cohort)")
    from fedjax_dp.algorithms.robust_sgd import AGGREGATORS
    in_use = {"attack": config.attack,
              "aggregator": config.aggregator or AGGREGATORS.get(config.algorithm,
                                                                 "the algorithm's own")}
    options.refuse_inapplicable(config.options or {}, in_use)
    if in_use["aggregator"] == "krum" and config.byzantine:
      # Krum's f is the population's Byzantine count (any of them may be sampled); with a cohort
      # of n <= 2f + 2 rows it scores each row by one neighbour, and identical attackers win.
      n = (config.cohort_size if config.sampling == "fixed"
           else round(config.sampling_prob * config.num_clients))
      check(n > 2 * config.byzantine + 2, "byzantine", config.byzantine,
            f"is too many for Krum with cohorts of {n} clients: it needs more than 2f + 2 = "
            f"{2 * config.byzantine + 2} rows (f: the Byzantine clients, any of whom may be in a "
            "cohort); lower byzantine or raise the cohort")
  return opts
