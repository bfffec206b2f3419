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


class TracedCheckError(TypeError):
  """A programming error: :func:`check` was given a traced condition.

  A value inside a compiled function (a hyper-parameter of the compiled round) has no value
  while the function is traced, so no check can read it there. Settings are checked where they
  are read (:class:`fedjax_dp.config.RunConfig`, the algorithms' option tables), before anything
  compiles; a function that builds a piece from a value that may be traced checks it only when
  it is concrete (``if not traced(value): check(...)``).
  """

  def __init__(self, field: str):
    self.field = field
    super().__init__(f"check of {field!r} on a traced value: a value inside a compiled function "
                     "cannot be checked there; check it where the settings are read")


def traced(value: Any) -> bool:
  """Whether ``value`` is a JAX tracer: a value inside a function being compiled (such as a
  hyper-parameter of the compiled round), which has no concrete value to check.

  Python numbers, NumPy arrays and concrete JAX arrays are not traced; a traced value exists
  only once JAX is loaded (this module does not import it).
  """
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(value, jax.core.Tracer)


def check(cond: bool, field: str, value: Any, allowed: str) -> None:
  """Raises :class:`ConfigError` unless ``cond`` holds.

  Args:
    cond: a concrete condition (a Python bool, or a NumPy / concrete JAX boolean).
    field: the setting's name, for the message.
    value: the value given.
    allowed: what is allowed, for the message.

  Raises:
    ConfigError: ``cond`` is false.
    TracedCheckError: ``cond`` is traced (a programming error: see its docstring).
  """
  if traced(cond):
    raise TracedCheckError(field)
  if not cond:
    raise ConfigError(field, value, allowed)


def check_positive(field: str, value: float) -> None:
  check(value is not None and value > 0, field, value, "must be > 0")


def check_open_unit(field: str, value: float) -> None:
  check(value is not None and 0 < value < 1, field, value, "must be in (0, 1)")


def check_choice(field: str, value: Any, choices) -> None:
  choices = list(choices)
  check(value in choices, field, value, f"must be one of {choices}")
