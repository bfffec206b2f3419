"""Algorithm settings (``--set NAME=VALUE``): one typed, documented table per algorithm.

Every algorithm declares its settings as :class:`Option` records (name,
default, type, allowed range, meaning) and reads them once, before building,
with :func:`read`: an unknown name, a value of the wrong type, a NaN or
infinite number, or a value out of range is a one-line :class:`ConfigError`
naming the option, the value and what is allowed. The same records describe
the options to users (:func:`describe`).
"""

from __future__ import annotations

from typing import Sequence

from fedjax_dp.components import Option
from fedjax_dp.errors import check


def read(config, table: Sequence[Option]) -> dict:
  """``config.options`` read against ``table``: name -> value (defaults for the unset ones)."""
  by_name = {o.name: o for o in table}
  opts = dict(config.options or {})
  for k in opts:
    check(k in by_name, "option", k,
          f"must be one of {sorted(by_name)} for algorithm {config.algorithm!r}")
  return {name: (o.parse(opts[name]) if name in opts else o.default) for name, o in by_name.items()}


def describe(table: Sequence[Option]) -> list:
  """One ``{"name", "default", "allowed", "help"}`` dict per option, for listings and help."""
  return [o.describe() for o in table]


# Options of every algorithm that takes Byzantine clients: the attack's strengths and the robust
# aggregators' parameters (numbers go into hparams; gm_max_iter, krum_m and cc_iters are loop
# counts and nonfinite_value a choice, part of the round's structure).
BYZANTINE = (
    Option("attack_sigma", 1e4, "std of the gaussian attack's rows", low=0, low_open=True),
    Option("attack_shared", 0, "gaussian: 1 sends one draw from every attacker (the DP-RSA "
           "authors' code), 0 a draw per attacker", kind="int", low=0, high=1),
    Option("attack_scale", -5.0, "factor of the sign_flip attack (the attacker's true row times it)"),
    Option("alie_z", None, "ALIE's shift in standard deviations; unset: the paper's z_max"),
    Option("ipm_epsilon", 0.1, "IPM's factor: attackers send -epsilon * the regular mean",
           low=0, low_open=True),
    Option("nonfinite_value", "nan", "what the nonfinite attack sends", kind="choice",
           choices=("nan", "inf", "mixed")),
)
AGGREGATOR = (
    Option("trim_beta", 0.1, "trimmed_mean: fraction trimmed at each end", low=0, high=0.5,
           high_open=True),
    Option("gm_tol", 1e-6, "geometric_median: Weiszfeld's relative tolerance", low=0, low_open=True),
    Option("gm_max_iter", 100, "geometric_median: at most this many Weiszfeld iterations",
           kind="int", low=1, static=True),
    Option("krum_m", 1, "krum: average of the m best-scored rows (multi-Krum)", kind="int", low=1,
           static=True),
    Option("cc_tau", 1.0, "centered_clipping: radius tau", low=0, low_open=True),
    Option("cc_iters", 1, "centered_clipping: iterations per round", kind="int", low=1,
           static=True),
)
STATIC_AGGREGATOR = ("gm_max_iter", "krum_m", "cc_iters")
# Which attack or aggregator reads each of those options.
OWNERS = {"attack_sigma": ("attack", "gaussian"), "attack_shared": ("attack", "gaussian"),
          "attack_scale": ("attack", "sign_flip"),
          "alie_z": ("attack", "alie"), "ipm_epsilon": ("attack", "ipm"),
          "nonfinite_value": ("attack", "nonfinite"), "trim_beta": ("aggregator", "trimmed_mean"),
          "gm_tol": ("aggregator", "geometric_median"),
          "gm_max_iter": ("aggregator", "geometric_median"), "krum_m": ("aggregator", "krum"),
          "cc_tau": ("aggregator", "centered_clipping"),
          "cc_iters": ("aggregator", "centered_clipping")}


def refuse_inapplicable(given: dict, in_use: dict) -> None:
  """Refuses an attack's or aggregator's option (:data:`OWNERS`) given while another one runs
  (``in_use``: ``{"attack": name, "aggregator": name}``): it would be silently ignored."""
  for name, value in given.items():
    if name in OWNERS:
      kind, owner = OWNERS[name]
      check(in_use[kind] == owner, f"option {name}", value,
            f"is read by the {owner} {kind} only, and this run's {kind} is {in_use[kind]}: "
            "leave it out")
L2 = (Option("l2", 0.004, "u of the master's f_0(x) = (u/2)||x||^2", low=0),)
