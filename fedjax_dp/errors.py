"""User-facing configuration errors.

Every invalid input is reported as a :class:`ConfigError` that names the field,
the value and what is allowed. The CLI turns it into one line on stderr and
exit status 2, before anything is compiled or written.
"""

from __future__ import annotations

import sys
from typing import Any


class ConfigError(ValueError):
  """Invalid user input: ``field``, ``value`` and what is ``allowed``."""

  def __init__(self, field: str, value: Any, allowed: str):
    self.field = field
    self.value = value
    self.allowed = allowed
    super().__init__(f"invalid {field}={value!r}: {allowed}")


class NoiseWarning(UserWarning):
  """A noise multiplier so large that the noise drowns every update (the run goes on: the
  command line prints it in one line, before the first round)."""


def check(cond: bool, field: str, value: Any, allowed: str) -> None:
  """Raises :class:`ConfigError` unless ``cond`` holds.

  A condition on a traced value (a hyper-parameter inside a compiled round,
  where pieces are built from ``hparams``) cannot be decided there and is
  skipped: hyper-parameters are validated on the host before building (the
  configuration and the algorithms' options).
  """
  try:
    ok = bool(cond)
  except Exception as e:  # pylint: disable=broad-except
    jax = sys.modules.get("jax")  # a traced condition exists only once jax is loaded
    if jax is not None and isinstance(e, jax.errors.ConcretizationTypeError):
      return
    raise
  if not ok:
    raise ConfigError(field, value, allowed)


def check_positive(field: str, value: float) -> None:
  check(value is not None and value > 0, field, value, "must be > 0")


def check_open_unit(field: str, value: float) -> None:
  check(value is not None and 0 < value < 1, field, value, "must be in (0, 1)")


def check_choice(field: str, value: Any, choices) -> None:
  choices = list(choices)
  check(value in choices, field, value, f"must be one of {choices}")
