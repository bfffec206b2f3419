"""Algorithms by name. Each module composes shared pieces; none copies the round.

Every algorithm declares itself once, in its own module (:func:`base.algorithm`, on
:func:`fedjax_dp.components.declare`): its name, paper, options and traits (privacy unit, the
settings it reads, its own defaults, ...). The registry imports the algorithm modules that
:data:`fedjax_dp.components.BUILTIN` names, in the order it lists them, the first time it is
asked for an algorithm; everything here is derived from it.

A builder takes ``(config, data)`` and returns a :class:`Setup`: the program
(a :class:`fedjax_dp.round.Round`, the static structure of the one round),
its hyper-parameters (``hparams``: every number the round uses, as arrays),
its host-side sampler and its privacy accounting.
"""

from __future__ import annotations

from fedjax_dp import components
from fedjax_dp.algorithms.base import (INT_HPARAMS, NONE, Setup, as_hparams, cached_round,
                                       common_hparams, option_table, read_options, round_key,
                                       unused_fields)
from fedjax_dp.errors import check
from fedjax_dp.attacks import get as get_attack
from fedjax_dp.data.specs import BY_NAME
from fedjax_dp.models import is_convolutional

__all__ = ["INT_HPARAMS", "Setup", "as_hparams", "build", "cached_round", "choosing_knowledge",
           "common_hparams", "option_table", "read_options", "refuse_unused", "round_key",
           "unread_by_settings", "unread_fields", "unused_fields"]


def unread_fields(config) -> dict:
  """The fields ``config`` leaves unread, each with why: not read by its algorithm
  (:func:`unused_fields`) or by the run's other settings (:func:`unread_by_settings`)."""
  reads = components.get("algorithm", config.algorithm)["reads"]
  out = {name: f"is not used by algorithm {config.algorithm!r}: leave it out (of the settings "
               f"that depend on the algorithm, it reads {sorted(reads) or 'none'})"
         for name in unused_fields(config)}
  out.update({name: f"is not used: {why}; leave it out"
              for name, why in unread_by_settings(config).items()})
  return out


def refuse_unused(config, given, others=()) -> None:
  """Refuses a setting given (a flag, a config file's key, a keyword of
  :func:`fedjax_dp.simulate`) that ``config.algorithm`` does not read: it would otherwise run as
  if it applied (``clip`` for DP-RSA, ``target_epsilon`` for FedAvg).

  Args:
    config: the run's :class:`fedjax_dp.config.RunConfig`.
    given: the names of the fields given (a container of str); unsetting one (None) is always
      allowed.
    others: the configurations the same settings also run with (a sweep's grid points): a
      setting counts as read when one of them reads it.

  Raises:
    ConfigError: naming the first field given that none of them reads, and why
      (:func:`unread_fields`).
  """
  unread_elsewhere = [unread_fields(c) for c in others]
  for name, why in unread_fields(config).items():
    check(name not in given or getattr(config, name) is None
          or any(name not in u for u in unread_elsewhere), name, getattr(config, name), why)


def choosing_knowledge() -> tuple:
  """The algorithms whose attacks' knowledge can be chosen (their ``chooses_knowledge`` trait):
  their attacks read what the regular workers release or, if told, their raw state
  (attacker_knowledge); the others fix it: the FedAvg family releases only a noised aggregate,
  so its attackers read raw updates, and the DP-SGD family and the robust baselines upload
  what they release."""
  return tuple(a.name for a in components.declared("algorithm") if a["chooses_knowledge"])


def unread_by_settings(config) -> dict:
  """The fields that the run's other settings leave unread, each with the reason."""
  declared = components.get("algorithm", config.algorithm)
  no_byzantine = "there are no Byzantine clients (byzantine 0)" if config.byzantine == 0 else None
  no_attack = "there is no attack (attack none)" if config.attack == "none" else no_byzantine
  knowledge = no_attack or (
      f"attack {config.attack!r} reads no regular client"
      if not get_attack(config.attack).reads_honest else
      None if declared["chooses_knowledge"] else
      f"algorithm {config.algorithm!r} fixes what its attacks read (only "
      f"{', '.join(choosing_knowledge())} let it be chosen; the summary's attacker_knowledge "
      "says what was read)")
  unnoised = (f"the aggregator {config.aggregator!r} adds no noise (only the noised mean does, "
              "and the run has no guarantee)"
              if declared["central_noise"] and config.aggregator not in (None, "mean")
              else None)
  without = (None if declared["unaccounted"] is None
             else declared["unaccounted"](dict(config.options or {})))
  unaccounted = (f"algorithm {config.algorithm!r} has no privacy mechanism, so nothing is "
                 "accounted" if declared["privacy_unit"] == NONE else
                 f"{without}, so nothing is accounted" if without else unnoised)
  workers_unused = ("the rdp accountant's epsilons take milliseconds and are computed in the "
                    "run's process" if config.accountant == "rdp" else None)
  only = lambda partition: (f"partition is {config.partition} (only {partition} reads it)"
                            if config.partition != partition else None)
  spec = BY_NAME.get(config.dataset)
  no_files = (f"dataset {config.dataset!r} is bundled with scikit-learn (no files are read)"
              if spec is not None and not spec.files else None)
  no_download = (f"dataset {config.dataset!r} has no tensorflow-datasets download"
                 if spec is not None and spec.tfds_name is None else None)
  no_conv = (f"model {config.model_name!r} has no convolution"
             if config.model_name in components.names("model")
             and not is_convolutional(config.model_name) else None)
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
  """The :class:`Setup` of ``config.algorithm`` on ``data`` (its declared builder)."""
  return components.get("algorithm", config.algorithm).build(config, data)
