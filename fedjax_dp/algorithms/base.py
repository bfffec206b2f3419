"""What every algorithm's builder shares: its declaration (:func:`algorithm`), the :class:`Setup`
it returns, its hyper-parameters and its settings, read once, and the compiled rounds kept by
their static structure (:func:`round_key`, :func:`cached_round`)."""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from fedjax_dp import components
from fedjax_dp.algorithms import options
from fedjax_dp.errors import check

# The privacy units an algorithm declares (its ``privacy_unit`` trait).
USER = "user-level: one client's whole data set"
EXAMPLE = "example-level: one example of one client"
WORKER = "worker-level: one worker's whole data set (replace-one)"
NONE = "none (no privacy mechanism)"

# The RunConfig fields beyond the common ones (data, model, rounds, sampling, seed, evaluation,
# Byzantine clients and aggregator, batch size and client rate, delta and accountant) that an
# algorithm may read; each declares the ones it reads (its ``reads`` trait).
LOCAL = frozenset({"local_steps", "client_optimizer", "weighting", "server_optimizer",
                   "server_lr"})
NOISE = frozenset({"clip", "noise_multiplier", "target_epsilon"})

# Every trait an algorithm declares, with the value it takes when its declaration leaves it out:
#   privacy_unit: what its guarantee protects (one of USER, EXAMPLE, WORKER, NONE, with a note);
#   reads: the RunConfig fields beyond the common ones that it reads (the others are refused);
#   byzantine: it takes Byzantine clients, an attack and another aggregator (and their options);
#   central_noise: the server's noised mean is its mechanism (a robust aggregator voids it);
#   chooses_knowledge: its attacks read what the regular clients release or, if told
#     (attacker_knowledge), their raw state; the others fix what their attacks read;
#   aggregator: the aggregator it is (the robust baselines), None where it has its own or
#     takes the run's;
#   defaults: its own values of run settings (RunConfig fields) that the user did not give;
#   unaccounted: ``options -> why`` a run with these options (``config.options``) has no
#     guarantee although the algorithm has a mechanism (None: it always has one), or None.
TRAITS = {"privacy_unit": NONE, "reads": frozenset(), "byzantine": True, "central_noise": False,
          "chooses_knowledge": False, "aggregator": None, "defaults": {}, "unaccounted": None}


def algorithm(name: str, *, reference: str, about: str, options: Sequence = (),
              **traits) -> Callable[[Callable], Callable]:
  """Declares the decorated builder ``(config, data) -> Setup`` as algorithm ``name``
  (:func:`fedjax_dp.components.declare`), with every trait of :data:`TRAITS` (the ones not
  given take its values).

  Args:
    name: the algorithm's name (``--algorithm``).
    reference: the paper it implements.
    about: one line saying what it is.
    options: its own settings (``--set``; :class:`fedjax_dp.components.Option`).
    **traits: the traits of :data:`TRAITS` it declares.

  Raises:
    ConfigError: for a trait that :data:`TRAITS` does not name.
  """
  unknown = sorted(set(traits) - set(TRAITS))
  check(not unknown, f"algorithm {name}'s trait", unknown, f"must be one of {sorted(TRAITS)}")
  traits = {**TRAITS, **traits}
  traits["reads"] = frozenset(traits["reads"])
  return components.declare("algorithm", name, reference=reference, about=about,
                            options=options, **traits)


class Setup(NamedTuple):
  program: Any
  sampler: Any
  accounting: Any
  hparams: Optional[dict] = None


def option_table(name: str, in_use: Optional[Mapping] = None) -> tuple:
  """Every ``--set`` option algorithm ``name`` takes: its own, then, where it takes Byzantine
  clients (its ``byzantine`` trait), those of every declared attack and aggregator
  (:func:`options.byzantine`).

  Args:
    name: a declared algorithm.
    in_use: ``{"attack": name, "aggregator": name}`` of a run: an option that two components of
      one kind declare is read as the running one declares it (:func:`options.byzantine`).

  Raises:
    ConfigError: naming the declared algorithms, for an unknown ``name``.
  """
  declared = components.get("algorithm", name)
  return declared.options + (options.byzantine(in_use) if declared["byzantine"] else ())


def unused_fields(config) -> list:
  """The algorithm-specific fields (those some algorithm declares it ``reads``) that
  ``config.algorithm`` does not read."""
  specific = frozenset().union(*(a["reads"] for a in components.declared("algorithm")))
  return sorted(specific - components.get("algorithm", config.algorithm)["reads"])


def common_hparams(config, opts: dict, **extra) -> dict:
  """The hparams every round reads (server rate, Byzantine clients, the numeric options of every
  declared attack and aggregator, ``l2``) plus ``extra``, as arrays (:func:`as_hparams`); an
  unset numeric option (None in its declaration) enters as NaN."""
  hp = {"server_lr": config.server_lr, "l2": 0.0, "byzantine": config.byzantine}
  for o in options.byzantine():
    if not o.static:
      value = opts.get(o.name, o.default)
      hp[o.name] = float("nan") if value is None else value
  hp.update(extra)
  return as_hparams(hp)


INT_HPARAMS = ("byzantine", "client_class", "canary_seed")


def as_hparams(values: dict) -> dict:
  """Hyper-parameters as the compiled round takes them: int32 arrays for the counts and ids of
  :data:`INT_HPARAMS`, float32 arrays for every other number. A finite number that float32
  cannot hold (``--clip 1e308``) is refused, naming it, instead of becoming inf; so is one
  so close to zero that float32 makes it 0 or a denormal (``--noise-multiplier 1e-300``
  would add no noise at all while its record said some)."""
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


# The run settings that shape a compiled round where they are read (the other settings are
# numbers in its hyper-parameters, or shape only the host's work).
STRUCTURAL = ("sampling", "batch_size", "local_steps", "client_optimizer", "server_optimizer",
              "weighting", "denominator", "attack", "aggregator", "attacker_knowledge")
# The rounds kept, the most recently used last; the least recently used goes beyond this many.
MAX_ROUNDS = 32
_ROUNDS: collections.OrderedDict = collections.OrderedDict()


def byzantine_key(config, opts: Mapping, aggregator: str) -> tuple:
  """What the run's attack and ``aggregator`` give a compiled round's cache key.

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig` (its ``attack``).
    opts: the run's options as read (:func:`read_options`), where the static options' values
      are read (defaults for the missing).
    aggregator: the name of the aggregator the round runs.

  Returns:
    ``(attack key, aggregator key)``: each a name with its static options' values
    (:meth:`fedjax_dp.components.Component.static_key`), hashable.

  Raises:
    ConfigError: for an undeclared attack or aggregator.
  """
  return (components.get("attack", config.attack).static_key(opts),
          components.get("aggregator", aggregator).static_key(opts))


def round_key(config, opts: Mapping, model, *derived) -> tuple:
  """The static structure of a run's round, derived from the declarations.

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig`.
    opts: its options as read (:func:`read_options`).
    model: the :class:`fedjax_dp.models.Model` the round trains.
    *derived: what the builder computes from the data for the round's structure (the
      population, a batch capacity, ...).

  Returns:
    A hashable tuple: the algorithm's static options
    (:meth:`fedjax_dp.components.Component.static_key`), where it takes Byzantine clients the
    attack's and the aggregator's names and static options (:func:`byzantine_key`; the
    aggregator: ``config.aggregator``, else the algorithm's own, its ``aggregator`` trait, else
    the mean), the :data:`STRUCTURAL` settings it reads, ``model`` and ``derived``.
  """
  declared = components.get("algorithm", config.algorithm)
  aggregator = config.aggregator or declared["aggregator"] or "mean"
  byzantine = byzantine_key(config, opts, aggregator) if declared["byzantine"] else ()
  unused = set(unused_fields(config))
  settings = tuple((f, getattr(config, f)) for f in STRUCTURAL if f not in unused)
  return (declared.static_key(opts), byzantine, settings, model) + tuple(derived)


def cached_round(key: tuple, make: Callable):
  """The :class:`fedjax_dp.round.Round` for a static structure ``key`` (:func:`round_key`),
  built once while it is among the :data:`MAX_ROUNDS` most recently used.

  Two runs that differ only in numbers get the same Round, hence the same compiled step.
  """
  if key in _ROUNDS:
    _ROUNDS.move_to_end(key)
  else:
    _ROUNDS[key] = make()
    while len(_ROUNDS) > MAX_ROUNDS:
      _ROUNDS.popitem(last=False)
  return _ROUNDS[key]


def read_options(config) -> dict:
  """The settings (``--set``) of ``config.algorithm``, read against its :func:`option_table`
  (its own options and, where it takes Byzantine clients, those of every declared attack and
  aggregator, the running ones' first).

  Where the algorithm takes Byzantine clients, it refuses the options of an attack or aggregator
  that does not run, and lets the run's aggregator check its cohorts (its ``check_cohort``
  trait, :mod:`fedjax_dp.aggregators.robust`). Every builder reads its settings through this,
  once, before building: a misspelt name, a wrong type, a non-finite or out-of-range value
  fails before compilation instead of being ignored.

  Returns:
    Option name -> value (defaults for the ones not given).

  Raises:
    ConfigError: for an option the algorithm does not take, a bad value, an option of an attack
      or aggregator the run does not use, or cohorts the run's aggregator refuses.
  """
  declared = components.get("algorithm", config.algorithm)
  if not declared["byzantine"]:
    return options.read(config, option_table(config.algorithm))
  in_use = {"attack": config.attack,
            "aggregator": config.aggregator or declared["aggregator"] or "the algorithm's own"}
  opts = options.read(config, option_table(config.algorithm, in_use))
  options.refuse_inapplicable(config.options or {}, in_use)
  known = in_use["aggregator"] in components.names("aggregator")
  check_cohort = (components.get("aggregator", in_use["aggregator"]).traits.get("check_cohort")
                  if known else None)
  if check_cohort is not None:
    fixed = config.sampling == "fixed"
    check_cohort(opts, cohort=(config.cohort_size if fixed
                               else round(config.sampling_prob * config.num_clients)),
                 byzantine=config.byzantine, fixed=fixed)
  return opts
