"""Component declarations and the one registry they fill.

Every algorithm, aggregator and attack declares itself once, in its own module, with
:func:`declare`: its name, its reference (the paper), its options (:class:`Option`: type,
default, allowed range, help, and whether it is *static*, shaping the compiled round, or
*numeric*, going into the round's hyper-parameters), the kind-specific facts the rest of the
package reads (``traits``, e.g. whether an attack reads the regular clients' rows) and how it is
built. Everything else is derived from the registry: the command line's choices and ``--help``,
``fedjax-dp algorithms``, the refusal of settings a run does not read, sweep axes, the
hyper-parameter subtree and the compile-cache key (:meth:`Component.static_key`).

The built-in components are declared by the modules of :data:`BUILTIN`, imported the first time
a kind is looked up (this module sits below them, so it names them instead of importing them).
A user's own components are declared the same way in any module, loaded by
:func:`load_plugins` (the command line's ``--plugin MODULE``) or through the Python entry-point
group :data:`ENTRY_POINTS` of an installed package.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import math
import types
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from fedjax_dp.errors import ConfigError, check, check_choice

KINDS = ("algorithm", "aggregator", "attack", "model")
# The modules that declare each kind's built-in components.
BUILTIN = {
    # In the order `fedjax-dp algorithms` lists them.
    "algorithm": tuple(f"fedjax_dp.algorithms.{m}" for m in (
        "dp_fedavg", "spfl", "adp_fl", "ae_dpfl", "blur_lus", "ddgauss", "robust_sgd", "rsa")),
    "aggregator": ("fedjax_dp.aggregators.robust",),
    "attack": ("fedjax_dp.attacks",),
    "model": ("fedjax_dp.models",),
}
ENTRY_POINTS = "fedjax_dp.plugins"
OPTION_KINDS = ("float", "int", "choice")
_NONFINITE_WORDS = ("inf", "+inf", "-inf", "nan", "+nan", "-nan", "infinity", "+infinity",
                    "-infinity")


@dataclasses.dataclass(frozen=True)
class Option:
  """One setting of a component (``--set NAME=VALUE``).

  Attributes:
    name: the setting's name, unique among the options of the components one run combines.
    default: its value when not set (None: unset, see ``help``).
    help: what it means, in one line.
    kind: "float", "int" or "choice".
    low, high: the allowed range of a number (None: unbounded).
    low_open, high_open: exclude the bound itself.
    choices: the allowed values of a "choice".
    static: True when the value shapes the compiled round (a loop count, a choice): it is part
      of the compile-cache key and reaches the builder as a Python value. False: a number that
      goes into the round's hyper-parameters, so changing it never recompiles. A choice is
      always static.
  """

  name: str
  default: Any
  help: str
  kind: str = "float"
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  choices: tuple = ()
  static: bool = False

  def __post_init__(self):
    check(self.kind in OPTION_KINDS, f"option {self.name} kind", self.kind,
          f"must be one of {list(OPTION_KINDS)}")
    if self.kind == "choice":  # a text value cannot be a hyper-parameter array
      object.__setattr__(self, "static", True)

  @property
  def allowed(self) -> str:
    """What the option takes, in words."""
    if self.kind == "choice":
      text = f"one of {list(self.choices)}"
    else:
      text = "an integer" if self.kind == "int" else "a finite number"
      lo = None if self.low is None else f"{'(' if self.low_open else '['}{self.low:g}"
      hi = None if self.high is None else f"{self.high:g}{')' if self.high_open else ']'}"
      if lo and hi:
        text += f" in {lo}, {hi}"
      elif lo:
        text += f" {'>' if self.low_open else '>='} {self.low:g}"
      elif hi:
        text += f" {'<' if self.high_open else '<='} {self.high:g}"
    return text + (" or unset (null)" if self.default is None else "")

  def parse(self, value):
    """``value`` checked against the type and range.

    Returns:
      The value as the component reads it: an int for "int", a float for "float", the value
      itself for a "choice", None for unset.

    Raises:
      ConfigError: naming the option, the value and :attr:`allowed`, for a value of the wrong
        type, a NaN or infinite number, a value out of range, or None where the option has a
        default.
    """
    field = f"option {self.name}"
    if value is None:
      check(self.default is None, field, value, f"must be {self.allowed}")
      return None
    if self.kind == "choice":
      check(value in self.choices, field, value, f"must be {self.allowed}")
      return value
    if isinstance(value, str) and value.strip().lower() in _NONFINITE_WORDS:
      raise ConfigError(field, value, "must be a finite number")
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    check(is_number, field, value, f"must be {self.allowed}")
    check(math.isfinite(value), field, value, "must be a finite number")
    if self.kind == "int":
      check(float(value).is_integer(), field, value, f"must be {self.allowed}")
      value = int(value)
    else:
      value = float(value)
    ok = ((self.low is None or (value > self.low if self.low_open else value >= self.low)) and
          (self.high is None or (value < self.high if self.high_open else value <= self.high)))
    check(ok, field, value, f"must be {self.allowed}")
    return value

  def describe(self) -> dict:
    """``{"name", "default", "allowed", "help"}``, for listings and help."""
    return {"name": self.name, "default": self.default, "allowed": self.allowed,
            "help": self.help}


@dataclasses.dataclass(frozen=True)
class Component:
  """A declared component: what :func:`declare` records and :func:`get` returns.

  Attributes:
    kind: one of :data:`KINDS`.
    name: its name (``--algorithm``, ``--aggregator``, ``--attack``).
    build: how it is built; the signature is the kind's contract (the module that consumes the
      kind documents it).
    reference: the paper or source it implements.
    about: one line saying what it is, for listings.
    options: its settings, in the order they are listed.
    traits: the kind-specific facts it declares (read-only).
    module: the module that declared it.
  """

  kind: str
  name: str
  build: Callable
  reference: str = ""
  about: str = ""
  options: tuple = ()
  traits: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  module: str = ""

  def __getitem__(self, trait: str) -> Any:
    """The declared trait ``trait`` (KeyError if the component did not declare it)."""
    return self.traits[trait]

  @property
  def defaults(self) -> dict:
    """Option name -> default."""
    return {o.name: o.default for o in self.options}

  def values(self, numeric: Mapping[str, Any], static: Mapping[str, Any]) -> dict:
    """The keyword arguments of :attr:`build`: each numeric option's value from ``numeric`` (a
    round's hyper-parameters), each static option's from ``static``, a missing one at its
    default; names of other options are ignored. A Python value (number, text, None) is checked
    by :meth:`Option.parse`; any other (an array, a traced value inside the compiled round)
    passes as it is.

    Raises:
      ConfigError: for a Python value its option does not allow.
    """
    out = {}
    for o in self.options:
      given = static if o.static else numeric
      value = given.get(o.name, o.default)
      python = value is None or isinstance(value, (bool, int, float, str))
      out[o.name] = o.parse(value) if python else value
    return out

  def static_key(self, values: Mapping[str, Any]) -> tuple:
    """The part of ``values`` that shapes the compiled round: ``(kind, name, ((option,
    value), ...))`` over the static options, hashable by construction."""
    return (self.kind, self.name,
            tuple((o.name, values.get(o.name, o.default)) for o in self.options if o.static))


_REGISTRY: dict = {kind: {} for kind in KINDS}
_LOADED: set = set()


def register(component: Component) -> Component:
  """Adds ``component`` to the registry and returns it.

  Raises:
    ConfigError: for an unknown kind; for a name that another module already declared for the
      same kind; for an option name that a component of another kind declares with another
      meaning (one run's ``--set`` names would then be ambiguous).
  """
  check(component.kind in KINDS, "component kind", component.kind, f"must be one of {list(KINDS)}")
  same = _REGISTRY[component.kind].get(component.name)
  check(same is None or same.module == component.module, f"{component.kind} name",
        component.name, f"is already declared by {same and same.module}: choose another name")
  for option in component.options:
    for kind, declared in _REGISTRY.items():
      for other in declared.values():
        clash = next((o for o in other.options if o.name == option.name), None)
        check(kind == component.kind or clash is None or clash == option,
              f"{component.kind} {component.name}'s option", option.name,
              f"is already an option of {kind} {other.name} with another meaning: rename it")
  _REGISTRY[component.kind][component.name] = component
  return component


def declare(kind: str, name: str, *, reference: str = "", about: str = "",
            options: Sequence[Option] = (), **traits) -> Callable[[Callable], Callable]:
  """A decorator that declares the decorated ``build`` function as component ``name``.

  Args:
    kind: one of :data:`KINDS`.
    name: the component's name.
    reference: the paper or source it implements.
    about: one line saying what it is.
    options: its settings.
    **traits: the kind-specific facts it declares.

  Returns:
    A decorator that registers the component (:func:`register`) and returns ``build``
    unchanged.
  """
  def decorate(build: Callable) -> Callable:
    register(Component(kind, name, build, reference, about, tuple(options),
                       types.MappingProxyType(dict(traits)), build.__module__))
    return build
  return decorate


def _load(kind: str) -> None:
  """Imports the modules that declare ``kind``'s built-in components and, once, the installed
  plugins of :data:`ENTRY_POINTS`."""
  if kind in _LOADED:
    return
  _LOADED.add(kind)
  for module in BUILTIN[kind]:
    importlib.import_module(module)
  if "entry points" not in _LOADED:
    _LOADED.add("entry points")
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
      point.load()


def get(kind: str, name: str) -> Component:
  """The component ``name`` of ``kind``.

  Args:
    kind: one of :data:`KINDS` ("algorithm", "aggregator", "attack", ...).
    name: a declared name of that kind (a plugin's too, once loaded).

  Returns:
    Its :class:`Component` (name, reference, options, traits and build).

  Raises:
    ConfigError: naming ``kind``, ``name``, the declared names and the closest of them, if
      none is declared.
  """
  check(kind in KINDS, "component kind", kind, f"must be one of {list(KINDS)}")
  _load(kind)
  check_choice(kind, name, names(kind))
  return _REGISTRY[kind][name]


def names(kind: str) -> tuple:
  """The names of ``kind``'s components, in the order they were declared.

  Args:
    kind: one of :data:`KINDS`.

  Returns:
    A tuple of names.
  """
  _load(kind)
  return tuple(_REGISTRY[kind])


def declared(kind: str) -> tuple:
  """``kind``'s components, in the order they were declared."""
  _load(kind)
  return tuple(_REGISTRY[kind].values())


def load_plugins(modules: Iterable[str]) -> None:
  """Imports each of ``modules`` (dotted names), whose imports declare their components.

  Args:
    modules: dotted module names (``--plugin MODULE``), importable from ``sys.path``.

  Raises:
    ConfigError: naming the module, if it cannot be imported.
  """
  for module in modules:
    # A relative name (".x", ".."), which import_module refuses with a TypeError, is not one.
    check(isinstance(module, str) and all(part.isidentifier() for part in module.split(".")),
          "plugin", module, "must be the dotted name of an importable Python module")
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ConfigError("plugin", module, f"must be an importable Python module ({e})") from None
