"""Strict JSON output: non-finite floats are written as ``null`` with the reason beside them.

Python's :func:`json.dumps` writes ``NaN``, ``Infinity`` and ``-Infinity`` by
default, which are not JSON: strict parsers (JavaScript's ``JSON.parse``, jq,
most other languages' libraries) reject the whole document. An infinite epsilon
(no noise) or a diverged loss must still be readable, so :func:`sanitize` writes
such a value as ``null`` and, in the enclosing object, adds ``<key>_nonfinite``
saying which value it was: ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``. A null
then never silently stands for "not computed" when it means "infinite".
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional

import numpy as np

NONFINITE_SUFFIX = "_nonfinite"
LIST_NOTE = "list holds NaN/Infinity values written as null"

_NOTHING = object()  # "no non-finite value here"


def nonfinite_name(x: float) -> str:
  """``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: how Python's json would have written ``x``."""
  if math.isnan(x):
    return "NaN"
  return "Infinity" if x > 0 else "-Infinity"


def _plain(obj: Any) -> Any:
  """numpy (and other array-like) values as the Python values json knows."""
  if isinstance(obj, (bool, int, float, str)) or obj is None:
    return obj
  if isinstance(obj, np.bool_):
    return bool(obj)
  if isinstance(obj, np.integer):
    return int(obj)
  if isinstance(obj, np.floating):
    return float(obj)
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  if hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape"):  # jax arrays
    return np.asarray(obj).tolist()
  return obj


def _clean(obj: Any):
  """``(sanitized obj, note)``; ``note`` is what to write beside it, or ``_NOTHING``."""
  obj = _plain(obj)
  if isinstance(obj, float):
    if math.isfinite(obj):
      return obj, _NOTHING
    return None, nonfinite_name(obj)
  if isinstance(obj, dict):
    return _clean_dict(obj), _NOTHING
  if isinstance(obj, (list, tuple)):
    out, flagged = [], False
    for item in obj:
      value, note = _clean(item)
      out.append(value)
      flagged = flagged or note is not _NOTHING
    return out, (LIST_NOTE if flagged else _NOTHING)
  return obj, _NOTHING


def _clean_key(key: Any) -> Any:
  key = _plain(key)
  if isinstance(key, float) and not math.isfinite(key):
    return nonfinite_name(key)  # a string key is valid JSON
  return key


def _key_text(key: Any) -> str:
  """The text json writes for a dict key (int, float, bool and None keys become strings)."""
  if isinstance(key, str):
    return key
  if key is None or isinstance(key, (bool, int, float)):
    return json.dumps(key)
  return str(key)


def _clean_dict(d: dict) -> dict:
  out, notes = {}, {}
  for k, v in d.items():
    key = _clean_key(k)
    value, note = _clean(v)
    out[key] = value
    if note is not _NOTHING:
      name = _key_text(key)
      notes[name + NONFINITE_SUFFIX] = note
  for k, note in notes.items():
    if k not in out:  # never overwrite a key the caller wrote
      out[k] = note
  return out


def sanitize(obj: Any) -> Any:
  """A copy of ``obj`` that strict JSON can hold; ``obj`` itself is not modified.

  Recursively converts numpy scalars and arrays (and jax arrays) to Python
  values and tuples to lists, and replaces every non-finite float (NaN, +Inf,
  -Inf) by ``None``, because strict JSON parsers reject ``NaN`` and
  ``Infinity``: the value is written as ``null`` and the reason beside it. For
  a dict key ``k`` whose value was non-finite, ``k + "_nonfinite"`` is added
  with ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; for a list (at any depth
  of nested lists) holding non-finite values, ``k + "_nonfinite"`` says
  ``"list holds NaN/Infinity values written as null"``. Dicts inside lists carry
  their own ``_nonfinite`` keys. A non-finite float dict key becomes its name.

  Args:
    obj: Any value json can write once its numpy values are converted.

  Returns:
    The sanitized copy.
  """
  return _clean(obj)[0]


def dumps(obj: Any, *, indent: Optional[int] = None, default: Optional[Callable[[Any], Any]] = None,
          **kwargs) -> str:
  """``json.dumps(sanitize(obj), allow_nan=False)``: strict JSON text.

  Args:
    obj: The value to write (see :func:`sanitize`).
    indent: As for :func:`json.dumps`.
    default: As for :func:`json.dumps`; what it returns is sanitized too (a
      non-finite float it returns becomes ``null``, without a note).
    **kwargs: Other :func:`json.dumps` arguments; ``allow_nan`` is always False.

  Returns:
    The JSON text, with no ``NaN`` or ``Infinity`` in it.
  """
  kwargs["allow_nan"] = False
  wrapped = None if default is None else (lambda o: sanitize(default(o)))
  return json.dumps(sanitize(obj), indent=indent, default=wrapped, **kwargs)
