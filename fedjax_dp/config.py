"""The run configuration: one frozen dataclass, validated before anything compiles.

Every field can be set from a JSON config file (``--config``) and overridden on
the command line (``--field-name VALUE``); algorithm-specific settings go in
``options`` (``--set name=value``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import pathlib
import typing
from typing import Any, Mapping, Optional

from fedjax_dp.aggregators.base import DENOMINATORS
from fedjax_dp.data.specs import SPECS, check_partition
from fedjax_dp.engine import PLACEMENTS
from fedjax_dp.errors import ConfigError, check, check_choice, check_open_unit, check_positive
from fedjax_dp.privacy.ledger import ACCOUNTANTS
from fedjax_dp.round import WEIGHTINGS
from fedjax_dp.sampling import SAMPLINGS

DEFAULT_MODELS = {spec.name: spec.default_model for spec in SPECS}


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
# A noise multiplier above MAX_NOISE_MULTIPLIER is refused (it drowns every update, and the
# accountants overflow on its square); one above NOISE_WARNING is warned about.
MAX_NOISE_MULTIPLIER = 1e6
NOISE_WARNING = 1e3


def check_noise_multiplier(value: Optional[float]) -> None:
  """Refuses a negative, non-finite or absurd (> :data:`MAX_NOISE_MULTIPLIER`) noise multiplier."""
  check_finite("noise_multiplier", value)
  check(value is None or 0 <= value <= MAX_NOISE_MULTIPLIER, "noise_multiplier", value,
        f"must be in [0, {MAX_NOISE_MULTIPLIER:g}] (a larger one drowns every update)")


def check_type(field: str, value: Any, hint) -> None:
  """Raises :class:`ConfigError` unless ``value`` has the field's type (``hint``).

  Config files are JSON: ``rounds: true``, ``rounds: 2.5`` or ``rounds: "abc"``
  must be refused by name, not read as 1, truncated or met with a traceback.
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


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One simulation. Defaults are the offline quickstart: DP-FedAvg on digits."""

  algorithm: str = "dp_fedavg"
  # Data.
  dataset: str = "digits"
  data_dir: Optional[str] = None
  download: bool = False
  partition: str = "iid"
  num_clients: int = 700
  dirichlet_alpha: float = 0.5
  shards_per_client: int = 2
  min_labels_per_client: int = 1
  max_train: Optional[int] = None
  max_test: Optional[int] = None
  # Model.
  model: Optional[str] = None  # a name of fedjax_dp.models.MODELS, or (Python API) a Model
  conv_impl: str = "im2col"
  # Rounds and sampling.
  rounds: int = 50
  sampling: str = "poisson"
  sampling_prob: float = 0.1
  cohort_size: Optional[int] = None
  capacity: Optional[int] = None
  placement: str = "device"
  client_chunk: Optional[int] = dataclasses.field(default=None, metadata={
      "help": "run the cohort in blocks of this many vmapped clients, one block after another "
              "(default: all at once; an int >= 1); with the noised mean and no attack the "
              "round's memory then stays flat in the cohort size"})
  devices: Optional[int] = dataclasses.field(default=None, metadata={
      "help": "split each round's clients over this many devices (default: every device JAX "
              "sees, across processes; an int >= 1)"})
  # Client.
  local_steps: int = 5
  batch_size: int = 4
  client_optimizer: str = "sgd"
  client_lr: float = 0.1
  weighting: str = "uniform"
  # Server.
  server_optimizer: str = "sgd"
  server_lr: float = 1.0
  denominator: str = "expected"
  # Privacy.
  clip: float = 0.5
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = 8.0
  delta: float = 1e-5
  accountant: str = "rdp"
  # Byzantine clients (the last `byzantine` ids) and the server's aggregator.
  byzantine: int = dataclasses.field(default=0, metadata={
      "help": "number of Byzantine clients, the last ids (default 0; an int in [0, num_clients))"})
  attack: str = dataclasses.field(default="none", metadata={
      "help": "what the Byzantine clients send (default none; one of none, gaussian, sign_flip, "
              "sample_duplication, alie, ipm, nonfinite); strengths via --set"})
  attacker_knowledge: str = dataclasses.field(default="released", metadata={
      "help": "what an attack that reads the regular clients sees (default released: what they "
              "release; omniscient: their raw state, which voids the DP guarantee)"})
  aggregator: Optional[str] = dataclasses.field(default=None, metadata={
      "help": "the server's aggregator (default: the algorithm's own; one of mean, sign_vote, "
              "sign_sum, geometric_median, coordinate_median, trimmed_mean, krum, "
              "centered_clipping); parameters via --set"})
  # Run.
  seed: int = 0
  eval_every: int = 5
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    from fedjax_dp.algorithms import ALGORITHMS
    from fedjax_dp.client import OPTIMIZERS
    from fedjax_dp.data import DATASETS
    from fedjax_dp.models import CONV_IMPLS, MODELS
    # Every field has its type and every numeric field is finite, checked before anything else.
    from fedjax_dp.models import Model
    hints = typing.get_type_hints(RunConfig)
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name != "options" and not isinstance(value, Model):
        check_finite(f.name, value)
        check_type(f.name, value, hints[f.name])
    check(0 <= self.seed < 2 ** 32, "seed", self.seed, "must be an integer in [0, 2**32)")
    check_choice("algorithm", self.algorithm, sorted(ALGORITHMS))
    check_choice("dataset", self.dataset, DATASETS)
    check_partition(self.dataset, self.partition)
    if self.model is not None and not isinstance(self.model, Model):
      check_choice("model", self.model, MODELS)
    check_choice("conv_impl", self.conv_impl, CONV_IMPLS)
    check(self.num_clients >= 1, "num_clients", self.num_clients, "must be >= 1")
    check_positive("dirichlet_alpha", self.dirichlet_alpha)
    check(self.shards_per_client >= 1, "shards_per_client", self.shards_per_client, "must be >= 1")
    check(1 <= self.min_labels_per_client <= 2 * self.shards_per_client, "min_labels_per_client",
          self.min_labels_per_client, f"must be in [1, 2 * shards_per_client = {2 * self.shards_per_client}]")
    for f in ("max_train", "max_test"):
      v = getattr(self, f)
      check(v is None or v >= 1, f, v, "must be >= 1 or unset")
    check(self.rounds >= 1, "rounds", self.rounds, "must be >= 1")
    check_choice("sampling", self.sampling, SAMPLINGS)
    if self.sampling == "poisson":
      p = self.sampling_prob
      check(p is not None and 0 < p <= 1, "sampling_prob", p, "must be in (0, 1]")
    else:
      check(self.cohort_size is not None and 1 <= self.cohort_size <= self.num_clients,
            "cohort_size", self.cohort_size,
            f"must be in [1, num_clients={self.num_clients}] with sampling='fixed'")
    check(self.capacity is None or 1 <= self.capacity <= self.num_clients, "capacity",
          self.capacity, f"must be in [1, num_clients={self.num_clients}] or unset")
    check_choice("placement", self.placement, PLACEMENTS)
    check(self.client_chunk is None or self.client_chunk >= 1, "client_chunk", self.client_chunk,
          "must be an integer >= 1 (or none: the whole cohort at once)")
    check(self.devices is None or self.devices >= 1, "devices", self.devices,
          "must be an integer >= 1 (or none: every device)")
    check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")
    check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
    check_choice("client_optimizer", self.client_optimizer, OPTIMIZERS)
    check_positive("client_lr", self.client_lr)
    check_choice("weighting", self.weighting, WEIGHTINGS)
    check_choice("server_optimizer", self.server_optimizer, OPTIMIZERS)
    check_positive("server_lr", self.server_lr)
    check_choice("denominator", self.denominator, DENOMINATORS)
    check_positive("clip", self.clip)
    nm, te = self.noise_multiplier, self.target_epsilon
    check_noise_multiplier(nm)
    check(te is None or te > 0, "target_epsilon", te, "must be > 0")
    check(nm is None or te is None, "noise_multiplier", nm,
          f"must be unset (None) when target_epsilon={te} is set: the ledger calibrates the noise")
    check_open_unit("delta", self.delta)
    check_choice("accountant", self.accountant, ACCOUNTANTS)
    check(self.eval_every >= 1, "eval_every", self.eval_every, "must be >= 1")
    from fedjax_dp.attacks import ATTACKS, KNOWLEDGE
    from fedjax_dp.aggregators.robust import NAMES
    check(isinstance(self.byzantine, int) and 0 <= self.byzantine < self.num_clients, "byzantine",
          self.byzantine, f"must be an int in [0, num_clients={self.num_clients})")
    # "sign-flip" is accepted for "sign_flip"; the configuration holds the canonical name.
    object.__setattr__(self, "attack", self.attack.replace("-", "_"))
    check_choice("attack", self.attack, ATTACKS)
    check_choice("attacker_knowledge", self.attacker_knowledge, KNOWLEDGE)
    if self.aggregator is not None:
      check_choice("aggregator", self.aggregator, NAMES)
    check(isinstance(self.options, Mapping), "options", self.options, "must be a mapping")

  @property
  def model_name(self) -> str:
    return getattr(self.model, "name", None) or self.model or DEFAULT_MODELS[self.dataset]

  def replace(self, **changes) -> "RunConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """The fields as plain values (a :class:`fedjax_dp.models.Model` by its name)."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["options"] = dict(self.options)
    d["model"] = None if self.model is None else self.model_name
    return d


def field_types() -> dict:
  """Field name -> the Python type a string value converts to."""
  hints = typing.get_type_hints(RunConfig)
  out = {}
  for f in dataclasses.fields(RunConfig):
    t = hints[f.name]
    args = [a for a in typing.get_args(t) if a is not type(None)]
    out[f.name] = args[0] if args and typing.get_origin(t) is typing.Union else t
  return out


def parse_value(field: str, text: str, typ) -> Any:
  """Converts a command-line string for ``field``; 'none' unsets optional fields."""
  if text.lower() in ("none", "null"):
    return None
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


def load_config_file(path: str) -> dict:
  p = pathlib.Path(path)
  check(p.is_file(), "config", path, "must be an existing JSON file")
  try:
    d = json.loads(p.read_text(encoding="utf-8"))
  except UnicodeDecodeError as e:
    raise ConfigError("config", path, f"must be UTF-8 text (byte {e.start} is not)") from None
  except json.JSONDecodeError as e:
    raise ConfigError("config", path, f"must be valid JSON ({e})") from None
  except OSError as e:
    raise ConfigError("config", path, f"must be a readable file ({e.strerror or e})") from None
  check(isinstance(d, dict), "config", path, "must hold a JSON object")
  check(isinstance(d.get("options", {}), (dict, type(None))), "options", d.get("options"),
        "must be a JSON object of algorithm settings, e.g. {\"lambda\": 0.4}")
  known = {f.name for f in dataclasses.fields(RunConfig)}
  for k in d:
    check(k in known, "config key", k, f"must be one of {sorted(known)}")
  return d


def make_config(base: Optional[Mapping] = None, **overrides) -> RunConfig:
  """A validated :class:`RunConfig` from a base mapping plus overrides."""
  d = dict(base or {})
  d.update({k: v for k, v in overrides.items()})
  try:
    return RunConfig(**d)
  except TypeError as e:
    raise ConfigError("config", sorted(d), str(e)) from None
