"""Algorithm settings (``--set NAME=VALUE``): one typed, documented table per algorithm.

Every algorithm declares its settings as :class:`Option` records (name,
default, type, allowed range, meaning) and reads them once, before building,
with :func:`read`: an unknown name, a value of the wrong type, a NaN or
infinite number, or a value out of range is a one-line :class:`ConfigError`
naming the option, the value and what is allowed. The same records describe
the options to users (:func:`describe`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from fedjax_dp import components
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


# The kinds whose options every algorithm that takes Byzantine clients reads.
BYZANTINE_KINDS = ("attack", "aggregator")


def byzantine(in_use: Optional[Mapping] = None) -> tuple:
  """The options of every declared attack and aggregator (:mod:`fedjax_dp.components`), each
  name once: the ``--set`` options of every algorithm that takes Byzantine clients. Numeric ones
  go into the round's hyper-parameters, static ones (loop counts, choices) into its structure and
  compile-cache key.

  Args:
    in_use: ``{"attack": name, "aggregator": name}`` of a run: their options come first, so that
      a name that two components of one kind declare is read as the running one declares it. By
      default (and for a name that is not declared) the order is the declarations'.
  """
  out = {}
  for kind in BYZANTINE_KINDS:
    running = (in_use or {}).get(kind)
    first = [components.get(kind, running)] if running in components.names(kind) else []
    for component in first + list(components.declared(kind)):
      for o in component.options:
        out.setdefault(o.name, o)
  return tuple(out.values())


def refuse_inapplicable(given: Mapping, in_use: Mapping) -> None:
  """Refuses an attack's or aggregator's option given while none of the components that declare
  it runs (``in_use``: ``{"attack": name, "aggregator": name}``): it would be silently ignored.

  Raises:
    ConfigError: naming the option, its value, the components that read it and the run's one.
  """
  for name, value in given.items():
    for kind in BYZANTINE_KINDS:
      owners = [c.name for c in components.declared(kind)
                if any(o.name == name for o in c.options)]
      check(not owners or in_use[kind] in owners, f"option {name}", value,
            f"is read by the {' or '.join(owners)} {kind} only, and this run's {kind} is "
            f"{in_use[kind]}: leave it out")


L2 = (Option("l2", 0.004, "u of the master's f_0(x) = (u/2)||x||^2", low=0),)
