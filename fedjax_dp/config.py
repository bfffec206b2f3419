"""The run configuration: one frozen dataclass, validated before anything compiles.

Every field can be set from a JSON config file (``--config``) and overridden on
the command line (``--field-name VALUE``); algorithm-specific settings go in
``options`` (``--set name=value``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import numbers
import pathlib
import sys
import typing
from typing import Any, Mapping, Optional

from fedjax_dp import components
from fedjax_dp.data.specs import BY_NAME, SPECS, check_partition
from fedjax_dp.errors import ConfigError, check, check_choice, check_open_unit, check_positive
from fedjax_dp.models import Model, check_conv_dtype, check_labels
from fedjax_dp.paths import is_file
from fedjax_dp.privacy.mechanisms import MAX_NOISE_MULTIPLIER
from fedjax_dp.sampling import check_design

DEFAULT_MODELS = {spec.name: spec.default_model for spec in SPECS}
MAX_ROUNDS = 10**6


def is_nonfinite(value: Any) -> bool:
  """True for a NaN or infinite real number (Python or numpy); False for anything else."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return False
  try:
    return not math.isfinite(value)
  except (TypeError, ValueError, OverflowError):
    return False


def check_finite(field: str, value: Any) -> None:
  """Raises :class:`ConfigError` if ``value`` is a NaN or infinite number (``None`` passes).

  An infinite clip or noise multiplier would otherwise pass ``> 0`` checks and
  end in a NaN model with a reported epsilon.
  """
  check(not is_nonfinite(value), field, value, "must be a finite number")


# What each field type takes, in words (the same in config files and on the command line).
TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
# A noise multiplier above NOISE_WARNING is warned about (one above
# fedjax_dp.privacy.mechanisms.MAX_NOISE_MULTIPLIER is refused).
NOISE_WARNING = 1e3


def noise_warning(z, why: str) -> Optional[str]:
  """What to warn about a noise multiplier ``z`` above :data:`NOISE_WARNING` (``why``: how it was
  chosen), or None."""
  if z is None or z <= NOISE_WARNING:
    return None
  return (f"noise_multiplier={z:.4g} ({why}) is above {NOISE_WARNING:g}: the noise drowns every "
          "update; a larger target epsilon, more clients per round or fewer rounds need less")


def check_noise_multiplier(value: Optional[float]) -> None:
  """Refuses a negative, non-finite or absurd (> :data:`MAX_NOISE_MULTIPLIER`) noise multiplier."""
  check_finite("noise_multiplier", value)
  check(value is None or 0 <= value <= MAX_NOISE_MULTIPLIER, "noise_multiplier", value,
        f"must be in [0, {MAX_NOISE_MULTIPLIER:g}] (a larger one drowns every update)")


def check_type(field: str, value: Any, hint) -> None:
  """Raises :class:`ConfigError` unless ``value`` has the field's type (``hint``).

  Config files are JSON: ``rounds: true``, ``rounds: 2.5`` or ``rounds: "abc"``
  must be refused by name, not read as 1, truncated or met with a traceback.

  Args:
    field: the field's name, which the error names.
    value: the value given.
    hint: the field's type annotation: ``int``, ``float``, ``bool``, ``str`` or
      ``Optional`` of one of them (None then passes); any other type is not checked.

  Raises:
    ConfigError: ``value`` is not of the type (a bool is neither an int nor a float; an int
      is a float).
  """
  args = typing.get_args(hint)
  optional = typing.get_origin(hint) is typing.Union and type(None) in args
  if optional and value is None:
    return
  typ = next(a for a in args if a is not type(None)) if optional else hint
  tail = " or unset (null)" if optional else ""
  if typ not in TYPE_WORDS:
    return
  if typ in (int, float):
    ok = isinstance(value, numbers.Integral if typ is int else numbers.Real) and not isinstance(value, bool)
  else:
    ok = isinstance(value, typ)
  check(ok, field, value, f"must be {TYPE_WORDS[typ]}{tail}")


def _values(module: str, name: str):
  """Reads the allowed values of a field from the code's own tuple ``module.name`` when asked
  (so the help and the validation cannot drift from it; the import waits until then)."""
  def read() -> tuple:
    return tuple(getattr(importlib.import_module(module), name))
  return read


def _declared(kind: str, sort: bool = False):
  """Reads the names of the declared components of ``kind`` when asked (built-in and plugins':
  :func:`fedjax_dp.components.names`), in the order they were declared or ``sort``ed."""
  return lambda: tuple(sorted(components.names(kind)) if sort else components.names(kind))


def _field(default, help: str, values=None, **kw):
  """A :class:`RunConfig` field with its one-line ``help`` and, for a choice, ``values``
  (:func:`_values`): the CLI's flags and ``--help`` are generated from these."""
  if default is dataclasses.MISSING:
    return dataclasses.field(metadata={"help": help, "values": values}, **kw)
  return dataclasses.field(default=default, metadata={"help": help, "values": values}, **kw)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One simulation. Defaults are the offline quickstart: DP-FedAvg on digits."""

  algorithm: str = _field("dp_fedavg", "the algorithm (fedjax-dp algorithms lists each with its "
                          "paper, privacy unit, --set options and its own defaults of these "
                          "settings, which apply where they are not given)",
                          _declared("algorithm", sort=True))
  # Data.
  dataset: str = _field("digits", "the data set (digits ships with scikit-learn; the others are "
                        "read from --data-dir)", _values("fedjax_dp.data.specs", "DATASETS"))
  data_dir: Optional[str] = _field(None, "folder holding the data files (none: the "
                                   "FEDJAX_DP_DATA environment variable)")
  download: bool = _field(False, "fetch a missing data set with tensorflow-datasets (true/false)")
  partition: str = _field("iid", "how the training set is split into clients (natural only for "
                          "the TFF sets, which have client ids)",
                          _values("fedjax_dp.data.partition", "PARTITIONERS"))
  num_clients: int = _field(700, "number of clients (an int >= 1; a natural partition: at most "
                            "the data set's, which are its default but for stackoverflow's)")
  dirichlet_alpha: float = _field(0.5, "concentration of the dirichlet partition's label mix "
                                  "(> 0; small: skewed)")
  shards_per_client: int = _field(2, "label-sorted shards per client of the shards partition "
                                  "(an int >= 1)")
  min_labels_per_client: int = _field(1, "shards partition: distinct labels each client must "
                                      "hold (in [1, 2 * shards_per_client])")
  max_train: Optional[int] = _field(None, "use at most this many training examples (none: all)")
  max_test: Optional[int] = _field(None, "use at most this many test examples (none: all)")
  # Model.
  model: Optional[str] = _field(  # a declared model's name, or (Python API) a Model
      None, "the model (none: the data set's default, "
      + ", ".join(f"{s.name}: {s.default_model}" for s in SPECS) + ")", _declared("model"))
  conv_impl: str = _field("auto", "how convolutions are computed (same results to float32 "
                          "rounding; speed and memory differ): auto runs each layer by "
                          "winograd on a CPU where it pays (3x3 stride-1 float32 layers of at "
                          "least 32 input channels, an 8x8 output and 64 tiles a batch) and by "
                          "im2col elsewhere; winograd (3x3 stride-1 kernels, float32 only) "
                          "everywhere it applies; the benchmarks' results compare them",
                          _values("fedjax_dp.models", "CONV_IMPLS"))
  compute_dtype: str = _field("float32", "the dtype the model's forward and backward pass "
                              "compute in (parameters and updates stay float32)",
                              _values("fedjax_dp.models", "COMPUTE_DTYPES"))
  # Rounds and sampling.
  rounds: int = _field(50, "number of rounds (an int >= 1)")
  sampling: str = _field("poisson", "how each round's clients are drawn: poisson (each with "
                         "sampling_prob) or fixed (cohort_size without replacement)",
                         _values("fedjax_dp.sampling", "SAMPLINGS"))
  sampling_prob: float = _field(0.1, "poisson sampling: each client's probability per round, "
                                "in (0, 1]")
  cohort_size: Optional[int] = _field(None, "fixed sampling: clients per round (in [1, "
                                      "num_clients]; needed with sampling fixed)")
  capacity: Optional[int] = _field(None, "padded cohort slots of the compiled round (none: "
                                   "a poisson draw exceeds it with probability < 1e-9; grown "
                                   "when exceeded)")
  placement: str = _field("device", "device: every client's data on the accelerator; host: the "
                          "cohort gathered on the host each round (large populations)",
                          _values("fedjax_dp.engine", "PLACEMENTS"))
  client_chunk: Optional[int] = _field(
      None, "run the cohort in blocks of this many vmapped clients on each device, one block "
      "after another (an int >= 1; 0: the whole cohort in one vmap; none: automatic, see "
      "fedjax_dp.experiment.client_blocks: blocks of about 4 on one CPU device (of 1 when a "
      "layer runs by winograd; 4 // D over D CPU devices), the whole cohort on accelerators); with "
      "the noised mean and no attack the round's memory then stays flat in the cohort size, "
      "and a block of padded slots only is skipped; on a CPU, blocks keep small models in "
      "cache and skip a Poisson cohort's padding, for faster rounds")
  devices: Optional[int] = _field(None, "split each round's clients over this many devices "
                                  "(none: every device JAX sees, across processes; an int >= 1)")
  # Client.
  local_steps: int = _field(5, "local steps per client per round (an int >= 1)")
  batch_size: int = _field(4, "examples per local step (an int >= 1)")
  client_optimizer: str = _field("sgd", "the clients' local optimizer",
                                 _values("fedjax_dp.client", "OPTIMIZERS"))
  client_lr: float = _field(0.1, "the clients' learning rate (> 0)")
  weighting: str = _field("uniform", "how client updates are weighted in the mean: uniform or by "
                          "their number of examples", _values("fedjax_dp.round", "WEIGHTINGS"))
  # Server.
  server_optimizer: str = _field("sgd", "the server's optimizer on the aggregate (adam: FedAdam)",
                                 _values("fedjax_dp.client", "OPTIMIZERS"))
  server_lr: float = _field(1.0, "the server's learning rate (> 0)")
  denominator: str = _field("expected", "what the noised sum is divided by: the expected (public) "
                            "cohort size or the realized one (unnoised: refused with poisson "
                            "sampling in private runs)",
                            _values("fedjax_dp.aggregators.base", "DENOMINATORS"))
  # Privacy.
  clip: float = _field(0.5, "L2 bound on each client's update (> 0)")
  noise_multiplier: Optional[float] = _field(
      None, "noise std / clip (in [0, 1e6]; none: calibrated for target_epsilon; giving it "
      "unsets target_epsilon)")
  target_epsilon: Optional[float] = _field(8.0, "epsilon the noise is calibrated for over all "
                                           "rounds (> 0; none: give noise_multiplier)")
  delta: float = _field(1e-5, "delta of the (epsilon, delta) guarantee, in (0, 1)")
  accountant: str = _field("rdp", "the privacy accountant (dp_accounting's RDP or PLD)",
                           _values("fedjax_dp.privacy.ledger", "ACCOUNTANTS"))
  accounting_workers: Optional[int] = _field(
      None, "pld accountant: worker processes that compute the epsilons the rounds report, "
      "with the same values: a user- or worker-level run's ahead of its rounds, an "
      "example-level run's clients' in parallel as each round is accounted (an int >= 0, "
      "started up to one per core or 8, whichever is more; 0: "
      "in the run's own process; none: automatic, 0 on a CPU, whose cores run the rounds, "
      "else one per core but one, at most 8); fedjax_dp.privacy.ahead")
  # Byzantine clients (the last `byzantine` ids) and the server's aggregator.
  byzantine: int = _field(0, "number of Byzantine clients, the last ids (an int in [0, "
                          "num_clients))")
  attack: str = _field("none", "what the Byzantine clients send; strengths via --set",
                       _declared("attack"))
  attacker_knowledge: str = _field(
      "released", "what an attack that reads the regular clients sees (released: what they "
      "release; omniscient: their raw state, which voids the DP guarantee)",
      _values("fedjax_dp.attacks", "KNOWLEDGE"))
  aggregator: Optional[str] = _field(None, "the server's aggregator (none: the algorithm's own); "
                                     "parameters via --set",
                                     _declared("aggregator"))
  # Run.
  seed: int = _field(0, "PRNG seed: same seed, same result (an int in [0, 2**32))")
  data_seed: Optional[int] = _field(None, "seed of the data's split into clients and of its "
                                    "max_train / max_test subsets (none: seed); fixed, the seeds "
                                    "of a sweep train on the same clients (an int in [0, 2**32))")
  eval_every: int = _field(5, "evaluate on the test set every this many rounds and after the last")
  options: Mapping[str, Any] = _field(dataclasses.MISSING, "the algorithm's own settings, "
                                      "name -> value (CLI: --set NAME=VALUE)", default_factory=dict)
  plugins: tuple = _field((), "Python modules imported before the other settings are checked, "
                          "whose imports declare the run's own components (attacks, "
                          "aggregators, algorithms; CLI: --plugin MODULE, repeatable)")

  def __post_init__(self):
    """Loads the plugins, then checks every field, in this order: types and finiteness, then the
    data and model, the cohorts and devices, training, privacy, evaluation and robustness.

    Raises:
      ConfigError: the first field whose value is not allowed, by name.
    """
    # The plugins first: the components they declare are among the values checked below.
    object.__setattr__(self, "plugins", load_plugins(self.plugins))
    self._check_types()
    self._check_data_and_model()
    self._check_cohorts_and_devices()
    self._check_training()
    self._check_privacy()
    check(self.eval_every >= 1, "eval_every", self.eval_every, "must be >= 1")
    self._check_robustness()

  def _check_types(self):
    """Every field has its type and every numeric field is finite, checked before anything
    else."""
    hints = type_hints()
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name != "options" and not isinstance(value, Model):
        check_finite(f.name, value)
        check_type(f.name, value, hints[f.name])

  def _check_data_and_model(self):
    # An empty path names no folder (the loaders would fall back on FEDJAX_DP_DATA silently).
    check(self.data_dir != "", "data_dir", self.data_dir, "must be a folder path, or none (unset: "
          "the FEDJAX_DP_DATA environment variable)")
    check(0 <= self.seed < 2 ** 32, "seed", self.seed, "must be an integer in [0, 2**32)")
    check(self.data_seed is None or 0 <= self.data_seed < 2 ** 32, "data_seed", self.data_seed,
          "must be an integer in [0, 2**32) or unset")
    self._check_choice("algorithm")
    self._check_choice("dataset")
    check_partition(self.dataset, self.partition)
    if not isinstance(self.model, Model):
      self._check_choice("model")
      check_labels(self.model_name, components.get("model", self.model_name).traits.get(
          "multi_label", False), self.dataset, BY_NAME[self.dataset].multi_label)
    self._check_choice("conv_impl")
    self._check_choice("compute_dtype")
    check_conv_dtype(self.conv_impl, self.compute_dtype)
    check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
    check_positive("dirichlet_alpha", self.dirichlet_alpha)
    check(self.shards_per_client >= 1, "shards_per_client", self.shards_per_client, "must be >= 1")
    check(1 <= self.min_labels_per_client <= 2 * self.shards_per_client, "min_labels_per_client",
          self.min_labels_per_client, f"must be in [1, 2 * shards_per_client = {2 * self.shards_per_client}]")
    for f in ("max_train", "max_test"):
      v = getattr(self, f)
      check(v is None or v >= 1, f, v, "must be >= 1 or unset")

  def _check_cohorts_and_devices(self):
    check(1 <= self.rounds <= MAX_ROUNDS, "rounds", self.rounds, f"must be in [1, {MAX_ROUNDS:,}] "
          "(every round's record is kept, and its epsilon accounted)")
    check_design(self.sampling, self.num_clients, self.sampling_prob, self.cohort_size)
    check(self.capacity is None or 1 <= self.capacity <= self.num_clients, "capacity",
          self.capacity, f"must be in [1, num_clients={self.num_clients}] or unset")
    self._check_choice("placement")
    check(self.client_chunk is None or self.client_chunk >= 0, "client_chunk", self.client_chunk,
          "must be an integer >= 1, 0 (the whole cohort at once) or none (automatic)")
    check(self.devices is None or self.devices >= 1, "devices", self.devices,
          "must be an integer >= 1 (or none: every device)")
    check(self.accounting_workers is None or self.accounting_workers >= 0, "accounting_workers",
          self.accounting_workers, "must be an integer >= 0 (or none: automatic)")

  def _check_training(self):
    check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")
    check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
    self._check_choice("client_optimizer")
    check_positive("client_lr", self.client_lr)
    self._check_choice("weighting")
    self._check_choice("server_optimizer")
    check_positive("server_lr", self.server_lr)
    self._check_choice("denominator")

  def _check_privacy(self):
    check_positive("clip", self.clip)
    nm, te = self.noise_multiplier, self.target_epsilon
    check_noise_multiplier(nm)
    check(te is None or te > 0, "target_epsilon", te, "must be > 0")
    check(nm is None or te is None, "noise_multiplier", nm,
          f"must be unset (None) when target_epsilon={te} is set: the ledger calibrates the noise")
    check_open_unit("delta", self.delta)
    self._check_choice("accountant")

  def _check_robustness(self):
    check(isinstance(self.byzantine, int) and 0 <= self.byzantine < self.num_clients, "byzantine",
          self.byzantine, f"must be an int in [0, num_clients={self.num_clients})")
    # "-" may stand for "_" in an attack's name ("sign-flip"); the configuration holds the
    # declared name.
    object.__setattr__(self, "attack", self.attack.replace("-", "_"))
    self._check_choice("attack")
    self._check_choice("attacker_knowledge")
    self._check_choice("aggregator")
    check(isinstance(self.options, Mapping), "options", self.options, "must be a mapping")

  @property
  def split_seed(self) -> int:
    """The seed of the data's split into clients: ``data_seed``, or ``seed`` when unset."""
    return self.seed if self.data_seed is None else self.data_seed

  def _check_choice(self, name: str) -> None:
    """Refuses a value of choice field ``name`` outside :func:`allowed_values` (unset passes for
    an optional field)."""
    value = getattr(self, name)
    if value is not None:  # None in a field that is not optional is refused by its type check
      check_choice(name, value, allowed_values(name))

  @property
  def model_name(self) -> str:
    return getattr(self.model, "name", None) or self.model or DEFAULT_MODELS[self.dataset]

  @property
  def given(self) -> frozenset:
    """The names of the fields the user gave (:func:`make_config`); the others hold the
    defaults, the algorithm's own where it declares one. A configuration built directly
    (``RunConfig(...)``) counts every field as given."""
    return self.__dict__.get("_given", frozenset(_FIELDS))

  def replace(self, **changes) -> "RunConfig":
    """This configuration with ``changes`` given too. A change of ``algorithm``, ``dataset`` or
    ``partition`` resolves the settings not given again (:func:`make_config`): the new
    algorithm's and data set's defaults apply to them."""
    check_keys(changes)
    if any(k in changes and changes[k] != getattr(self, k)
           for k in ("algorithm", "dataset", "partition")):
      given = {name: getattr(self, name) for name in self.given}
      return make_config(given, **changes)
    config = dataclasses.replace(self, **changes)
    object.__setattr__(config, "_given", self.given | set(changes))
    return config

  def to_dict(self) -> dict:
    """The fields as plain values (a :class:`fedjax_dp.models.Model` by its name)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["options"] = dict(self.options)
    d["plugins"] = list(self.plugins)
    d["model"] = None if self.model is None else self.model_name
    return d


def allowed_values(name: str) -> Optional[tuple]:
  """The values :class:`RunConfig` field ``name`` takes, read from the code's own tuple (None:
  the field is not a choice). The validation and the CLI's ``--help`` both read this."""
  read = _FIELDS[name].metadata.get("values")
  return None if read is None else read()


def field_help(name: str) -> str:
  """Field ``name``'s one-line help with its default and, for a choice, its allowed values."""
  f = _FIELDS[name]
  default = f.default_factory() if f.default is dataclasses.MISSING else f.default
  default = ("none" if default is None else default if isinstance(default, str)
             else json.dumps(default))
  values = allowed_values(name)
  tail = "" if values is None else "; one of: " + ", ".join(values)
  return f"{f.metadata['help']} (default: {default}{tail})"


_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# The fields' contract, read from their declarations (help and default; the allowed values of a
# choice, read from the components' registry, are in field_help and the command line's help), so
# that help(RunConfig) and the API reference cannot drift from the flags.
RunConfig.__doc__ += "\n\n  Attributes:\n" + "".join(
    f"    {f.name}: {f.metadata['help']} (default: "
    f"{'computed' if f.default is dataclasses.MISSING else f.default!r})\n"
    for f in _FIELDS.values())


@functools.cache
def type_hints() -> dict:
  """Field name -> :class:`RunConfig`'s annotation, evaluated once (not per configuration built:
  a sweep builds one per grid point and seed)."""
  return typing.get_type_hints(RunConfig)


def field_types() -> dict:
  """Field name -> the Python type a string value converts to."""
  hints = type_hints()
  out = {}
  for f in dataclasses.fields(RunConfig):
    t = hints[f.name]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    out[f.name] = args[0] if args and typing.get_origin(t) is typing.Union else t
  return out


def parse_value(field: str, text: str, typ) -> Any:
  """Converts a command-line string for ``field``; 'none' unsets optional fields. A number is
  written in ASCII digits (Python would read the full-width ``２`` as 2).

  Args:
    field: the field's name, which the error names.
    text: the string given; "none" or "null" (any case) is None.
    typ: the type to convert to (:func:`field_types`): ``bool`` takes 1/true/yes or
      0/false/no (any case), ``int`` and ``float`` what ``int(text)`` and ``float(text)`` read
      from ASCII text; any other type keeps the text.

  Returns:
    The converted value, or None.

  Raises:
    ConfigError: ``text`` is not a value of ``typ``.
  """
  if text.lower() in ("none", "null"):
    return None
  if typ in (int, float) and not text.isascii():
    raise ConfigError(field, text, f"must be {TYPE_WORDS[typ]}, written in ASCII digits")
  try:
    if typ is bool:
      if text.lower() in ("1", "true", "yes"):
        return True
      if text.lower() in ("0", "false", "no"):
        return False
      raise ValueError(text)
    if typ in (int, float):
      return typ(text)
    return text
  except ValueError:
    raise ConfigError(field, text, f"must be {TYPE_WORDS[typ]}") from None


def read_json(text: str, field: str, value: Any, **kwargs) -> Any:
  """``json.loads(text, **kwargs)``, refusing what Python's JSON reader cannot take, as one
  :class:`ConfigError` naming ``field`` and ``value`` (where ``text`` came from): an integer of
  more digits than Python converts (``sys.get_int_max_str_digits()``), and arrays or objects
  nested deeper than Python's recursion limit lets the reader go.

  Args:
    text: the JSON text.
    field: the field the error names.
    value: what the error shows as the given value (e.g. the file's path).
    **kwargs: passed to ``json.loads`` (not ``parse_int``).

  Returns:
    The decoded value.

  Raises:
    ConfigError: an integer of too many digits, or nesting too deep.
    json.JSONDecodeError: ``text`` is not JSON.
  """
  limit = sys.get_int_max_str_digits()

  def integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    check(not limit or digits <= limit, field, value, f"holds an integer of {digits} digits: "
          f"Python reads integers of at most {limit}")
    return int(text)

  try:
    return json.loads(text, parse_int=integer, **kwargs)
  except RecursionError:  # raised by the reader itself, at its first level past the limit
    raise ConfigError(field, value, "nests arrays or objects deeper than Python's JSON reader "
                      f"goes (about {sys.getrecursionlimit()} levels)") from None


def parse_option(text, name: str):
  """The value of the algorithm option ``name`` as given on the command line (``--set
  NAME=VALUE``, a sweep's grid): a JSON value (number, boolean, null) when it parses as one,
  else the text itself; values that are not text pass through.

  Raises:
    ConfigError: naming the option, for JSON that Python cannot read (:func:`read_json`).
  """
  if not isinstance(text, str):
    return text
  try:
    return read_json(text, f"option {name}", text)
  except json.JSONDecodeError:
    return text


def _unique_keys(pairs, path: Optional[str] = None) -> dict:
  """A JSON object whose keys are each given once (JSON lets the last of two win silently): a key
  given twice is refused as the field, with its second value and the config file ``path``."""
  out = {}
  where = "the config file" if path is None else f"the config file {path}"
  for k, v in pairs:
    if k in out:
      raise ConfigError(k, v, f"is given twice in one object of {where} (first {out[k]!r}, then "
                        f"{v!r}): give each key once")
    out[k] = v
  return out


def check_keys(keys) -> None:
  """Refuses a setting name that is not a :class:`RunConfig` field (a config file's key, a keyword
  of :func:`make_config`, :meth:`RunConfig.replace` or ``fedjax_dp.simulate``), naming the
  unknown one(s) and the field names."""
  unknown = [k for k in keys if k not in _FIELDS]
  check(not unknown, "config key", unknown[0] if len(unknown) == 1 else unknown,
        f"must be one of {sorted(_FIELDS)}")


# A nested configuration (:func:`nest`) follows the algorithm: the run's own settings in "run",
# the algorithm's in "algorithm", which nests its aggregator's and its attack's.
RUN, ALGORITHM = "run", "algorithm"
AGGREGATOR, ATTACK = "algorithm.aggregator", "algorithm.attack"
_ATTACK_FIELDS = frozenset({"attack", "byzantine", "attacker_knowledge"})


def algorithm_fields() -> frozenset:
  """The fields that some declared algorithm reads (the union of their ``reads`` traits:
  ``clip``, ``local_steps``, ...); each exists only for the algorithms that read it."""
  return frozenset().union(*(a["reads"] for a in components.declared("algorithm")))


def block(name: str) -> str:
  """The block of a nested configuration that field ``name`` sits in: :data:`ALGORITHM` for the
  settings an algorithm reads (:func:`algorithm_fields`), :data:`AGGREGATOR` for ``aggregator``,
  :data:`ATTACK` for ``attack``, ``byzantine`` and ``attacker_knowledge``, else :data:`RUN`."""
  if name in ("algorithm", "options") or name in algorithm_fields():
    return ALGORITHM
  return AGGREGATOR if name == "aggregator" else ATTACK if name in _ATTACK_FIELDS else RUN


def _option_block(name: str, settings: Mapping) -> str:
  """The block of option ``name``: the running attack's or aggregator's (the algorithm's own
  where ``aggregator`` is none) where it declares the option, else the algorithm's."""
  algorithm = settings.get("algorithm", _FIELDS["algorithm"].default)
  own = (components.get("algorithm", algorithm)["aggregator"]
         if algorithm in components.names("algorithm") else None)
  running = ((ATTACK, "attack", settings.get("attack", _FIELDS["attack"].default)),
             (AGGREGATOR, "aggregator", settings.get("aggregator") or own or "mean"))
  for where, kind, component in running:
    if component in components.names(kind) and any(
        o.name == name for o in components.get(kind, component).options):
      return where
  return ALGORITHM


def nest(settings: Mapping) -> dict:
  """Flat settings (field name -> value, the options under ``options``) nested as they follow
  the algorithm: ``{"run": {...}, "algorithm": {"name": ..., <the settings it reads and its
  options>, "aggregator": {"name": ..., <its options>}, "attack": {"name": ..., "byzantine":
  ..., "attacker_knowledge": ..., <its options>}}}``. Each option sits with the running
  component that declares it; a block with nothing in it is left out. :func:`unnest` inverts
  it.

  Args:
    settings: field name -> value, as :meth:`RunConfig.to_dict` gives them (the settings a run
      does not read already left out, as the summary records them).
  """
  out = {RUN: {}, ALGORITHM: {}, AGGREGATOR: {}, ATTACK: {}}
  for name, value in settings.items():
    if name == "options":
      for option, v in (value or {}).items():
        out[_option_block(option, settings)][option] = v
    else:
      where = block(name)
      out[where]["name" if name == where.rsplit(".")[-1] else name] = value
  out = {where: dict(sorted(items.items(), key=lambda kv: kv[0] != "name"))
         for where, items in out.items()}  # the component's name first
  for where in (AGGREGATOR, ATTACK):
    if out[where]:
      out[ALGORITHM][where.rsplit(".")[-1]] = out[where]
  return {where: out[where] for where in (RUN, ALGORITHM) if out[where]}


def is_nested(settings: Mapping) -> bool:
  """Whether ``settings`` is a nested configuration (:func:`nest`) rather than a flat one."""
  return RUN in settings or isinstance(settings.get(ALGORITHM), Mapping)


def unnest(nested: Mapping) -> dict:
  """The flat settings of a nested configuration (:func:`nest`).

  Raises:
    ConfigError: for a block that is not an object, a key outside the blocks, a field in another
      field's block (naming the block it belongs in), or an option given in two blocks.
  """
  unknown = sorted(set(nested) - {RUN, ALGORITHM})
  check(not unknown, "config key", unknown, f"must be {RUN!r} or {ALGORITHM!r} in a nested "
        "configuration (settings of the run, and of the algorithm with its aggregator and attack)")
  flat, options = {}, {}

  def read(where: str, items: Any) -> None:
    check(isinstance(items, Mapping), where, items, "must be a JSON object of settings")
    for key, value in items.items():
      path = f"{where}.{key}"
      if where != RUN and key in ("aggregator", "attack") and isinstance(value, Mapping):
        read(path, value)
      elif where != RUN and key == "name":
        flat[where.rsplit(".")[-1]] = value
      elif key in _FIELDS and key != "options":
        check(block(key) == where, path, value, f"belongs in {block(key)} (a nested "
              "configuration holds each setting in the block of what reads it)")
        flat[key] = value
      else:
        check(where != RUN, path, value, f"must be a setting of the run, one of "
              f"{sorted(k for k in _FIELDS if block(k) == RUN)} (the algorithm's options go in "
              f"{ALGORITHM})")
        check(key not in options, path, value, f"is also given as {options.get(key)!r}: give "
              "each option once")
        options[key] = value

  for where in (RUN, ALGORITHM):
    read(where, nested.get(where, {}))
  if options:
    flat["options"] = options
  return flat


def load_config_file(path: str) -> dict:
  """The settings of the JSON file ``path``, flat (field name -> value, options under
  ``options``): a flat object, or a nested one (:func:`unnest`), such as the ``config`` a run's
  summary records.

  Raises:
    ConfigError: for a file that cannot be read or is not a JSON object (or is JSON that Python
      cannot read: :func:`read_json`), a key given twice in one object, or a key that is not a
      setting.
  """
  p = pathlib.Path(path)
  check(is_file(p, "config"), "config", path, "must be an existing JSON file")
  try:
    d = read_json(p.read_text(encoding="utf-8"), "config", path,
                  object_pairs_hook=functools.partial(_unique_keys, path=str(path)))
  except UnicodeDecodeError as e:
    raise ConfigError("config", path, f"must be UTF-8 text (byte {e.start} is not)") from None
  except json.JSONDecodeError as e:
    raise ConfigError("config", path, f"must be valid JSON ({e})") from None
  except OSError as e:
    raise ConfigError("config", path, f"must be a readable file ({e.strerror or e})") from None
  check(isinstance(d, dict), "config", path, "must hold a JSON object")
  unread = d.pop("not_used", [])
  if is_nested(d):
    d = unnest(d)
  check(isinstance(d.get("options", {}), (dict, type(None))), "options", d.get("options"),
        "must be a JSON object of algorithm settings, e.g. {\"lambda\": 0.4}")
  known = {f.name for f in dataclasses.fields(RunConfig)}
  # A run's summary.json lists under config.not_used the settings it left unread; that object is
  # a config file as written, and the list sets nothing.
  check(isinstance(unread, list) and all(isinstance(k, str) and k in known for k in unread),
        "not_used", unread,
        "must be a list of setting names (as a summary's config records them); it sets nothing")
  check_keys(d)
  return d


def load_plugins(plugins) -> tuple:
  """Imports ``plugins`` (:func:`fedjax_dp.components.load_plugins`), whose declarations join
  the registry.

  Returns:
    The module names as a tuple.

  Raises:
    ConfigError: for a value that is not a list of module names, or a module that cannot be
      imported.
  """
  check(isinstance(plugins, (list, tuple)) and all(isinstance(m, str) and m for m in plugins),
        "plugins", plugins, "must be a list of Python module names (dotted, e.g. "
        "[\"my_components\"])")
  components.load_plugins(plugins)
  return tuple(plugins)


def make_config(base: Optional[Mapping] = None, **overrides) -> RunConfig:
  """A validated :class:`RunConfig` from the settings given: a base mapping (field name ->
  value, or nested as :func:`nest` gives it; None: nothing) plus overrides. Every setting is
  resolved here: what is given wins; a field not given takes the algorithm's own default (its
  ``defaults`` trait, :func:`fedjax_dp.algorithms.base.algorithm`: DDGauss runs fixed-size
  cohorts), else the data set's (:func:`data_defaults`: a natural partition's clients), else the
  field's default. The configuration remembers what was given (:attr:`RunConfig.given`).

  Args:
    base: field name -> value (or nested as :func:`nest` gives it), or None.
    **overrides: field name -> value, applied over ``base`` (``options``: the algorithm's,
      aggregator's and attack's ``--set`` options, name -> value).

  Returns:
    The :class:`RunConfig`.

  Raises:
    ConfigError: for a base that is not a mapping (a :class:`RunConfig` included), an unknown
      field name, or a value :class:`RunConfig` refuses.
  """
  if isinstance(base, RunConfig):
    raise ConfigError("base", base, "must be a mapping of settings (field name -> value) or None, "
                      "not a RunConfig: use its .replace(**settings) to change one")
  check(base is None or isinstance(base, Mapping), "base", base,
        "must be a mapping of settings (field name -> value, e.g. {\"rounds\": 20}) or None "
        "(the defaults)")
  d = unnest(base) if base is not None and is_nested(base) else dict(base or {})
  d.update({k: v for k, v in overrides.items()})
  check_keys(d)
  load_plugins(d.get("plugins", ()))  # a plugin's algorithm declares its defaults
  try:
    config = RunConfig(**{**algorithm_defaults(d.get("algorithm", _FIELDS["algorithm"].default)),
                          **data_defaults(d), **d})
  except TypeError as e:
    raise ConfigError("config", sorted(d), str(e)) from None
  object.__setattr__(config, "_given", frozenset(d))
  return config


def data_defaults(settings: Mapping) -> dict:
  """The run settings the data set implies: a natural partition's ``num_clients`` is its
  data set's clients (:attr:`fedjax_dp.data.specs.DatasetSpec.natural_clients`), not the
  field's default."""
  spec = BY_NAME.get(settings.get("dataset", _FIELDS["dataset"].default))
  natural = settings.get("partition") == "natural" and spec is not None
  return {"num_clients": spec.natural_clients} if natural and spec.natural_clients else {}


def algorithm_defaults(name) -> dict:
  """The run settings algorithm ``name`` declares defaults for (its ``defaults`` trait); {} for
  a name that is not a declared algorithm (:class:`RunConfig` refuses it by name)."""
  if not isinstance(name, str) or name not in components.names("algorithm"):
    return {}
  return dict(components.get("algorithm", name)["defaults"])
