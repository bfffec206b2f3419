"""User-facing configuration errors.

Every invalid input is reported as a :class:`ConfigError` that names the field,
the value and what is allowed. The CLI turns it into one line on stderr and
exit status 2, before anything is compiled or written.

Checks are made where settings are read, on concrete values; :func:`check` refuses a traced
condition (:class:`TracedCheckError`). The compiled round checks nothing at run time, and needs
no ``jax.experimental.checkify``: its hyper-parameters are those validated settings as arrays,
and the numbers it computes itself (adaptive clip bounds) scale the noise they are released
with, so the privacy accounting does not rest on their range.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any, Callable, Iterable, Optional


class ConfigError(ValueError):
  """Invalid user input: ``field``, ``value`` and what is ``allowed``."""

  def __init__(self, field: str, value: Any, allowed: str):
    self.field = field
    self.value = value
    self.allowed = allowed
    super().__init__(f"invalid {field}={value!r}: {allowed}")


class RunWarning(UserWarning):
  """A setting that runs but is likely not what the user means (the run goes on: the command
  line prints it in one line, before the first round)."""


class NoiseWarning(RunWarning):
  """A noise multiplier so large that the noise drowns every update."""


class SizeWarning(RunWarning):
  """A size that makes the run far slower than it needs to be (a batch many times larger than
  every client's data set)."""


class TracedCheckError(TypeError):
  """A programming error: :func:`check` was given a traced condition.

  A value inside a compiled function (a hyper-parameter of the compiled round) has no value
  while the function is traced, so no check can read it there. Settings are checked where they
  are read (:class:`fedjax_dp.config.RunConfig`, the algorithms' option tables), before anything
  compiles; a function that builds a piece from a value that may be traced checks it with
  :func:`check_unless_traced`.
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


def check_unless_traced(ok: Callable[[Any], Any], field: str, value: Any, allowed: str) -> None:
  """Raises :class:`ConfigError` unless ``ok(value)``; a traced ``value`` is not checked.

  For the pieces built both from a caller's numbers and, inside the compiled round, from its
  hyper-parameters: there the value is traced, and the setting it comes from was checked where
  the settings are read, before anything compiled. A JAX array is read as a NumPy array (inside
  a function being compiled, even an operation on a concrete JAX array is traced).

  Args:
    ok: the condition, a function of the (host) value.
    field, value, allowed: as :func:`check`'s.

  Raises:
    ConfigError: ``ok(value)`` is false for a value that is not traced.
  """
  if traced(value):
    return
  jax = sys.modules.get("jax")
  if jax is not None and isinstance(value, jax.Array):
    value = jax.device_get(value)
  check(ok(value), field, value, allowed)


def check_positive(field: str, value: float) -> None:
  check(value is not None and value > 0, field, value, "must be > 0")


def check_open_unit(field: str, value: float) -> None:
  check(value is not None and 0 < value < 1, field, value, "must be in (0, 1)")


def closest(word: Any, choices: Iterable) -> Optional[str]:
  """The text among ``choices`` closest to ``word`` (:func:`difflib.get_close_matches`: a
  similarity ratio of at least 0.6), for a "did you mean" beside a refused name or flag.

  Args:
    word: what was given; only text is matched.
    choices: what is allowed; its items that are not text are left out.

  Returns:
    The closest choice, or None when ``word`` is not text or no choice is close.
  """
  if not isinstance(word, str):
    return None
  close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1)
  return close[0] if close else None


def check_choice(field: str, value: Any, choices: Iterable) -> None:
  """Raises :class:`ConfigError` unless ``value`` is one of ``choices``.

  Args:
    field: the setting's name, for the message.
    value: the value given.
    choices: the allowed values, listed in the message in their order.

  Raises:
    ConfigError: ``value`` is not among ``choices``; the message lists them and, for a
      misspelt name, suggests the closest (:func:`closest`): ``must be one of ['dp_fedavg',
      ...] (did you mean 'dp_fedavg'?)``.
  """
  choices = list(choices)
  allowed = value in choices
  close = None if allowed else closest(value, choices)
  check(allowed, field, value,
        f"must be one of {choices}" + ("" if close is None else f" (did you mean {close!r}?)"))
