"""What every algorithm's builder shares: the :class:`Setup` it returns, its hyper-parameters
and its settings, read once, and the compiled rounds kept by their static structure."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from fedjax_dp import components


class Setup(NamedTuple):
  program: Any
  sampler: Any
  accounting: Any
  hparams: Optional[dict] = None


def common_hparams(config, opts: dict, **extra) -> dict:
  """The hparams every round reads (server rate, Byzantine clients, the numeric options of every
  declared attack and aggregator, ``l2``) plus ``extra``, as arrays (:func:`as_hparams`); an
  unset numeric option (None in its declaration) enters as NaN."""
  from fedjax_dp.algorithms import options
  hp = {"server_lr": config.server_lr, "l2": 0.0, "byzantine": config.byzantine}
  for o in options.byzantine():
    if not o.static:
      value = opts.get(o.name, o.default)
      hp[o.name] = float("nan") if value is None else value
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


def byzantine_key(config, opts: dict, aggregator: str) -> tuple:
  """What the run's attack and ``aggregator`` give a compiled round's cache key: their names and
  static options' values in ``opts`` (:meth:`fedjax_dp.components.Component.static_key`)."""
  return (components.get("attack", config.attack).static_key(opts),
          components.get("aggregator", aggregator).static_key(opts))


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

  ``byzantine``: the algorithm takes Byzantine clients, so it also reads the options of every
  declared attack and aggregator (:func:`options.byzantine`), refuses those of an attack or
  aggregator that does not run, and lets the run's aggregator check its cohorts (its
  ``check_cohort`` trait, :mod:`fedjax_dp.aggregators.robust`). Every builder reads its settings
  through this, once, before building: a misspelt name, a wrong type, a non-finite or
  out-of-range value fails before compilation instead of being ignored.
  """
  from fedjax_dp.algorithms import options
  if not byzantine:
    return options.read(config, table)
  from fedjax_dp.algorithms.robust_sgd import AGGREGATORS
  in_use = {"attack": config.attack,
            "aggregator": config.aggregator or AGGREGATORS.get(config.algorithm,
                                                               "the algorithm's own")}
  opts = options.read(config, tuple(table) + options.byzantine(in_use))
  options.refuse_inapplicable(config.options or {}, in_use)
  declared = in_use["aggregator"] in components.names("aggregator")
  check_cohort = (components.get("aggregator", in_use["aggregator"]).traits.get("check_cohort")
                  if declared else None)
  if check_cohort is not None:
    fixed = config.sampling == "fixed"
    check_cohort(opts, cohort=(config.cohort_size if fixed
                               else round(config.sampling_prob * config.num_clients)),
                 byzantine=config.byzantine, fixed=fixed)
  return opts
