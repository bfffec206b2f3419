"""Sweeps: a grid of settings times seeds, run as few compiled programs as the grid allows.

::

  sweep(config, grid={"clip": [0.1, 0.3], "lambda": [0.1, 0.4]}, seeds=3)

Every grid point is a :class:`fedjax_dp.config.RunConfig` (a grid name is a
configuration field or one of the algorithm's ``--set`` options), run with
seeds ``config.seed, config.seed + 1, ...``, which share one split of the data into clients
(the base configuration's ``split_seed``, recorded as each experiment's ``data_seed``) unless
``vary_split`` gives each seed its own. Each experiment is built as its
single run would be (its own sampler, noise calibrated to its
own ``target_epsilon``, its own accounting), so every bad value is refused
before anything compiles. Experiments whose rounds share one static structure
(the same :class:`fedjax_dp.round.Round`, rounds, evaluation period and data
shapes) form a group, and a group runs as *one* compiled program ``vmap``-ed
over a leading experiment axis (:func:`fedjax_dp.engine.run_group`): numbers
such as clip bounds, noise levels, lambda or sparsity are data, so they vary
inside a group; settings that change shapes or loop counts (the algorithm, the
model, local steps, batch size, the number of clients) start new groups. On one
CPU device the groups run at once in threads (:func:`threads_for`), one after
another elsewhere. Each experiment's results equal its single run with the same
seed, up to floating-point reassociation.

Memory: a group holds one copy of the clients' data when its experiments share
a data set and one per distinct data set otherwise (``vary_split``: seeds partition the data
differently), plus one model state per experiment; programs running at once in
threads share one device copy of a data set (:func:`fedjax_dp.engine.placed_arrays`)
and hold their states each (``threads=1`` holds one group's at a time).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import math
import numbers
import os
import threading
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fedjax_dp import algorithms, compilation, engine, outputs
from fedjax_dp.algorithms import options as algorithm_options
from fedjax_dp.config import RunConfig, field_types, make_config, parse_option, parse_value
from fedjax_dp.engine import Experiment, RunOptions
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.experiment import (check_from_config, client_blocks, load_data, recorded_config,
                                  options_for)
from fedjax_dp.jsonio import dumps
from fedjax_dp.observers import SweepProgress
from fedjax_dp.stats import seed_stats
from fedjax_dp.privacy.ledger import PrivacyLedger
from fedjax_dp.round import check_devices, one_cpu_device

# Everything a sweep writes in its folder.
SWEEP_FILES = ("results.json", "results.csv", "experiments")
# What results.json's fields are, beside each experiment's own summary (which has its release block).
SWEEP_RELEASE = {
    "covered_by_guarantee": [
        "rows.accuracy_mean and rows.accuracy_std: functions of the test accuracies of the "
        "models of all the row's seeds, so covered by those runs' composed guarantee "
        "(rows.epsilon_seeds_composed at rows.delta_seeds_composed, for rows.seeds_privacy_unit: "
        "one example where the seeds split the data into clients differently), not by one run's "
        "rows.epsilon; each experiment's own results are covered by its summary's. Not on a "
        "natural partition, whose test set is the clients' own held-out data: there the "
        "accuracies are raw (each summary's release block says so)",
        "rows one at a time, not together: under release 'all' the experiments of one seed "
        "share its draws (cohorts, and noise scaled by each one's multiplier), so rows can be "
        "combined to cancel the noise (two noise levels give back the noise-free model) and "
        "no composition of the rows' guarantees covers the whole file; under release "
        "'private' every experiment draws its own secret randomness, and the experiments "
        "compose (basic composition over all of them covers the file)"],
    "public_by_design": ["rows' grid values and grid", "rows.seeds",
                         "rows.epsilon (each run's own, the largest over the seeds)",
                         "rows.epsilon_seeds_composed, rows.delta_seeds_composed, "
                         "rows.seeds_composition (how they were composed: the runs' accountant, "
                         "basic composition, or basic composition of group privacy for 2)",
                         "rows.seeds_privacy_unit",
                         "experiments' values, group and output_dir",
                         "experiments' seed: secret under release 'all' (it fixes the noise; "
                         "each summary's release.randomness)"],
    "diagnostics": ["groups (experiments per compiled program and their seconds, which overlap "
                    "where programs ran at once)", "seconds: raw timings (they follow the "
                    "realized cohorts), not covered by any guarantee; left out under release "
                    "'private'", "threads (programs run at once)"],
}
# The RunConfig fields that choose and split the data set (load_data's arguments).
DATA_FIELDS = ("dataset", "num_clients", "partition", "split_seed", "data_dir", "dirichlet_alpha",
               "shards_per_client", "max_train", "max_test", "download", "min_labels_per_client")


def seeds_composed(epsilon: Optional[float], delta: Optional[float], seeds: int,
                   ledgers: Optional[Sequence] = None, same_data: bool = True,
                   relation: Optional[str] = None, split_reads_labels: bool = False) -> dict:
  """``{epsilon_seeds_composed, delta_seeds_composed, seeds_composition, seeds_privacy_unit}``:
  what covers a statistic of ``seeds`` runs (a row's mean and std over seeds), each
  ``(epsilon, delta)``-DP.

  ``same_data``: the runs trained on one data set split into the same clients. Then the unit is
  the runs' own (one client's data set): with every run's
  :class:`fedjax_dp.privacy.ledger.PrivacyLedger` (``ledgers``) all their rounds are composed by
  the runs' own accountant (:meth:`PrivacyLedger.joint`) and epsilon is read at the runs'
  ``delta`` (``seeds_composition``: "rdp" or "pld"); otherwise (a run whose epsilon is not one
  ledger's, e.g. SP-FL's largest over clients) basic composition (Dwork and Roth 2014, Thm.
  3.16): ``(k epsilon, k delta)``, an upper bound whatever each run's mechanism ("basic").

  Otherwise (each seed splits the data into clients differently) no client is common to the
  runs, and the unit is one example, which sits in one client of each run: changing it replaces
  that client's data set in every run. Under the runs' ``relation`` "replace_one" that is their
  own neighbour, composed as above; under "add_remove" a replaced client is one removed and one
  added, so each run is ``(2 epsilon, (1 + e^epsilon) delta)``-DP for it (group privacy) and the
  seeds compose by basic composition ("basic, group of 2"). That holds only where the split
  ignores the examples' labels (``split_reads_labels`` False: the iid partition of the whole
  data set): a split by labels (shards, dirichlet) or of a class-balanced subset (``max_train``)
  moves examples between many clients when one example's label changes (measured on 6,000
  labels: 20-21 of 100 clients' data sets under shards, 93-99 under dirichlet, none under iid),
  so no bound follows from the runs' guarantees and the epsilon and delta are None,
  ``seeds_composition`` saying why. All None for a row without a guarantee.

  Args:
    epsilon: each run's epsilon (the largest over the runs), None without a guarantee.
    delta: the runs' delta.
    seeds: how many runs.
    ledgers: each run's :class:`fedjax_dp.privacy.ledger.PrivacyLedger`, None where its epsilon
      is not one ledger's (then basic composition).
    same_data: the runs trained on the same clients (one split).
    relation: the runs' neighbouring relation (their summaries' ``neighbouring_relation``).
    split_reads_labels: the split into clients depends on the examples' labels.
  """
  if epsilon is None or delta is None:
    return {"epsilon_seeds_composed": None, "delta_seeds_composed": None,
            "seeds_composition": None, "seeds_privacy_unit": None}
  if not same_data and split_reads_labels:
    return {"epsilon_seeds_composed": None, "delta_seeds_composed": None,
            "seeds_composition": (
                "none: the seeds split the data into clients differently and the split reads the "
                "labels (partition shards or dirichlet, or a class-balanced max_train subset), so "
                "one example's change moves many examples between clients and no bound follows "
                "from the runs' guarantees; share one split (a sweep without vary_split, or "
                "data_seed) for a bound"),
            "seeds_privacy_unit": None}
  unit = {"seeds_privacy_unit": "the runs' own" if same_data else
          "one example (the seeds split the data into clients differently)"}
  # Example-level runs report "replace_one (one example of one client; ...)": their neighbour.
  if not same_data and not str(relation).startswith("replace_one"):
    return {"epsilon_seeds_composed": seeds * 2 * epsilon,
            "delta_seeds_composed": seeds * (1 + math.exp(epsilon)) * delta,
            "seeds_composition": "basic, group of 2", **unit}
  if ledgers is not None and all(l is not None for l in ledgers):
    joint = PrivacyLedger.joint(ledgers)
    return {"epsilon_seeds_composed": joint.epsilon(delta), "delta_seeds_composed": delta,
            "seeds_composition": joint.accountant, **unit}
  return {"epsilon_seeds_composed": seeds * epsilon, "delta_seeds_composed": seeds * delta,
          "seeds_composition": "basic", **unit}


def _split_reads_labels(config) -> bool:
  """Whether the split into clients depends on the examples' labels (:func:`seeds_composed`)."""
  return config.partition != "iid" or config.max_train is not None


def same_clients(datas: Sequence) -> bool:
  """Whether data sets hold the same clients' data (the same arrays, client by client; the
  small arrays first, so different splits are told apart without reading every input)."""
  first = datas[0]
  return all(d is first or all(np.array_equal(getattr(d, f), getattr(first, f))
                               for f in ("counts", "y", "x")) for d in datas[1:])


def parse_grid(*texts: str) -> dict:
  """``"clip=0.1,0.3 lambda=0.1,0.4"`` -> ``{"clip": ["0.1", "0.3"], "lambda": ["0.1", "0.4"]}``.

  Several texts (``--grid`` given more than once) give the axes of all of them together, as one
  text with their axes would. Values stay strings here; :func:`plan` converts them by the
  field's type (or, for options, as JSON numbers and words).

  Raises:
    ConfigError: naming ``grid``, for an item that is not ``NAME=V1,V2,...``, an axis named
      twice (in one text or in two), a value named twice or empty, and no axis at all.
  """
  grid = {}
  for item in " ".join(texts).split():
    check("=" in item, "grid", item, "each axis must look like NAME=V1,V2,... (axes separated by spaces)")
    name, values = item.split("=", 1)
    name = name.replace("-", "_")
    check(name != "", "grid", item, "an axis needs a name before '='")
    check(name not in grid, "grid", name, "names an axis twice")
    vals = [v for v in values.split(",")]
    check(all(v.strip() for v in vals), "grid", item, "every value must be non-empty")
    check(len({v.strip() for v in vals}) == len(vals), "grid", item,
          "names a value twice (the same experiments would run twice)")
    grid[name] = vals
  check(grid, "grid", " ".join(texts), "must name at least one axis, e.g. 'clip=0.1,0.3'")
  return grid


@dataclasses.dataclass(frozen=True)
class Point:
  """One experiment of a sweep: its grid values, its seed and its configuration."""

  values: dict
  seed: int
  config: Any

  @property
  def name(self) -> str:
    """``grid point clip=0.1 lambda=0.4, seed 3`` (for errors)."""
    return f"{_grid_point(self.values)}, seed {self.seed}"


def _grid_point(values: Mapping) -> str:
  return "grid point " + " ".join(f"{k}={v}" for k, v in values.items())


@contextlib.contextmanager
def _naming(where: Optional[str]):
  """A :class:`ConfigError` raised inside says ``where`` (a sweep's grid point) it arose."""
  try:
    yield
  except ConfigError as e:
    if where is None:
      raise
    raise ConfigError(e.field, e.value, f"{e.allowed} (at the {where})") from None


# The most experiments one sweep plans (each is built before anything runs).
MAX_EXPERIMENTS = 100_000


def check_grid(grid: Mapping[str, Sequence]) -> dict:
  """Refuses a grid that is not a mapping axis name -> list or tuple of values (a string would
  be read character by character, a number not at all); returns it as a dict of lists (a
  one-dimensional numpy array's values as Python numbers)."""
  check(isinstance(grid, Mapping), "grid", grid,
        "must be a mapping of axis name -> list of values, e.g. {'clip': [0.1, 0.3]}")
  out = {}
  for name, values in grid.items():
    if isinstance(values, np.ndarray) and values.ndim == 1:
      values = values.tolist()
    check(isinstance(values, Sequence) and not isinstance(values, (str, bytes)),
          f"grid[{name!r}]", values, "must be a list or tuple of the axis's values, e.g. "
          f"[0.1, 0.3], not a {type(values).__name__}")
    out[name] = list(values)
  return out


def check_config(config, unset_ok: bool = False) -> None:
  """Refuses a base configuration that is not a :class:`fedjax_dp.config.RunConfig` (nor None,
  with ``unset_ok``: :func:`sweep`'s quickstart)."""
  check(isinstance(config, RunConfig) or (unset_ok and config is None), "config", config,
        "must be a RunConfig" + (" or None (the quickstart)" if unset_ok else "")
        + ": fedjax_dp.config.make_config(**settings) makes one from a dict")


def check_axes(grid: Mapping[str, Sequence]) -> None:
  """Refuses the names that cannot be grid axes (before any setting is read)."""
  check("seed" not in grid, "grid", "seed", "seeds are not a grid axis: use seeds (--seeds N)")
  for name in ("options", "output_dir", "plugins"):
    check(name not in grid, "grid", name, "cannot be a grid axis")


def plan(config, grid: Mapping[str, Sequence], seeds: int = 1, vary_split: bool = False) -> list:
  """Every grid point times seed, as :class:`Point` s (grid order, then seeds).

  A grid name is a :class:`RunConfig` field (its values converted by the
  field's type) or, otherwise, one of the algorithm's options (``--set``; its values
  checked by the algorithm when built); a name that is neither is refused here. Giving ``target_epsilon`` unsets ``noise_multiplier``
  and the other way round, as on the command line.

  Args:
    config: the base :class:`RunConfig`.
    grid: axis name -> values (strings are converted by the field's type).
    seeds: seeds per grid point: ``config.seed``, ``config.seed + 1``, ...
    vary_split: each seed splits the data into clients by its own seed (``data_seed`` unset);
      False: a grid point's seeds share its split (``data_seed``: the point's ``split_seed``,
      its ``data_seed`` or else the base seed), so that a row's mean over seeds is covered
      for the runs' own privacy unit (:func:`seeds_composed`).

  Raises:
    ConfigError: on a bad grid, setting, option or number of seeds, and for ``vary_split``
      beside a ``data_seed`` (which fixes the split).
  """
  types = field_types()
  check_config(config)
  check(isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1, "seeds", seeds,
        "must be an integer >= 1")
  grid = check_grid(grid)
  check_axes(grid)
  _check_axis_names(config, grid, types)
  check(isinstance(vary_split, bool), "vary_split", vary_split, "must be True or False")
  check(config.seed + seeds <= 2 ** 32, "seeds", seeds, f"runs seeds {config.seed} to "
        f"{config.seed + seeds - 1}, past the largest seed 2**32 - 1: lower seed or seeds")
  grid = {k: [(parse_value(k, v, types[k]) if isinstance(v, str) else v) if k in types
              else parse_option(v, k) for v in values] for k, values in grid.items()}
  for k, v in grid.items():
    check(len(v) >= 1, "grid", k, "needs at least one value")
    check(len({json.dumps(x, sort_keys=True) for x in v}) == len(v), "grid", k,
          f"repeats a value ({v}): each experiment would run twice")
  count = math.prod(len(v) for v in grid.values()) * seeds
  check(count <= MAX_EXPERIMENTS, "seeds", seeds, f"with the grid's "
        f"{count // seeds} points makes {count} experiments, more than one sweep runs (at most "
        f"{MAX_EXPERIMENTS}): split the grid into several sweeps")
  return [point for combo in itertools.product(*grid.values())
          for point in _points(config, grid, dict(zip(grid, combo)), types, seeds, vary_split)]


def _check_axis_names(config, grid: Mapping[str, Sequence], types: Mapping) -> None:
  """Refuses a grid name that is neither a run setting (a field in ``types``) nor an option of
  every algorithm the grid runs."""
  names = list(grid.get("algorithm", [config.algorithm]))
  own = {a: {o.name for o in algorithms.option_table(a)} for a in names}
  for name in grid:
    if name in types:
      continue
    which = ("algorithm " + repr(names[0]) if len(names) == 1 else
             "the grid's algorithms " + ", ".join(map(repr, names)))
    check(any(name in o for o in own.values()), "grid", name,
          f"is neither a run setting (a field of `fedjax-dp run`: see its --help) nor an option "
          f"of {which} (one of {sorted(set().union(*own.values()))})")
    unread = [a for a in names if name not in own[a]]
    check(not unread, "grid", name, f"is not an option of {', '.join(map(repr, unread))}: "
          "its values would run the same experiment of those algorithms once per value; sweep them "
          "separately")


def _points(config, grid: Mapping[str, Sequence], values: dict, types: Mapping,
            seeds: int, vary_split: bool) -> list:
  """The :class:`Point` s of one grid point (``values``: axis -> value), one per seed, on one
  split of the data unless ``vary_split`` (:func:`plan`). Giving ``target_epsilon`` unsets
  ``noise_multiplier`` and the other way round; an axis the point does not read is refused."""
  fields, options = {}, dict(config.options)
  for given, other in (("target_epsilon", "noise_multiplier"),
                       ("noise_multiplier", "target_epsilon")):
    if given in grid and other not in grid:
      fields[other] = None
  for name, v in values.items():
    if name in types:
      fields[name] = v
    else:
      options[name] = v
  with _naming(_grid_point(values)):
    point = config.replace(**fields, options=options)
  unread = algorithms.unread_fields(point)
  for name in fields:  # an axis this point does not read would run it once per value
    check(name not in grid or name not in unread or fields[name] is None, "grid", name,
          f"{unread.get(name)}: at the {_grid_point(values)} its values would run the same "
          "experiment; sweep the points that read it separately")
  check(not vary_split or point.data_seed is None, "vary_split", vary_split,
        f"gives each seed its own split of the data into clients, and data_seed="
        f"{point.data_seed} fixes one (at the {_grid_point(values)}): leave one of them out")
  split = {} if vary_split else {"data_seed": point.split_seed}
  return [Point(values, config.seed + s, point.replace(seed=config.seed + s, **split))
          for s in range(seeds)]


def _data_key(config) -> tuple:
  return tuple(getattr(config, f) for f in DATA_FIELDS)


def _shape_key(data) -> tuple:
  """What must agree for experiments to share a group: the data's shapes and types."""
  return tuple((a.shape, str(a.dtype)) for a in (data.x, data.y, data.counts, data.test_x,
                                                  data.test_y))


@dataclasses.dataclass
class SweepResult:
  """A finished sweep.

  Attributes:
    rows: one per grid point: the grid values, ``accuracy_mean``, ``accuracy_std`` (sample std
      over seeds; None with one seed; of the recall at 5 where a multi-label model's
      ``accuracy_metric`` says so), ``seeds``, ``epsilon`` (each run's own, the largest over
      its seeds; None without accounting), ``epsilon_seeds_composed``,
      ``delta_seeds_composed`` and ``seeds_composition`` (what covers the mean and std over
      seeds, and how it was composed: :func:`seeds_composed`),
      and ``grid``, the grid values again (an axis named like one of these fields, e.g.
      DP-RSA's ``epsilon`` option, is found only there).
    experiments: one per experiment, in plan order: its grid values, seed, group and
      :class:`fedjax_dp.engine.RunResult` (``result``).
    groups: one per compiled program: the experiments it ran and its seconds.
    seconds: the whole sweep's.
    points: the plan (:func:`plan`), in order.
    threads: how many programs ran at once (:func:`run_configs`).
    release: the experiments' release ("all" or "private").
  """

  rows: list
  experiments: list
  groups: list
  seconds: float
  points: list
  threads: int
  release: str = "all"

  def to_json(self) -> dict:
    """``results.json``'s content: the rows, each experiment's summary and per-round metrics;
    under release "private" without the timings (raw diagnostics, as the experiments' own)."""
    exps = [{k: v for k, v in e.items() if k != "result"}
            | {"summary": e["result"].summary, "metrics": e["result"].history}
            for e in self.experiments]
    private = self.release == "private"
    groups = [{k: v for k, v in g.items() if not (private and k == "seconds")}
              for g in self.groups]
    return {"rows": self.rows, "experiments": exps, "groups": groups,
            **({} if private else {"seconds": self.seconds}), "threads": self.threads,
            "release": SWEEP_RELEASE}

  def to_csv(self) -> str:
    """``results.csv``'s content: one line per grid point (:attr:`rows`), a column per grid axis
    (by its name) then ``accuracy_mean``, ``accuracy_std``, ``accuracy_metric`` (what the two
    measure: "accuracy", or a multi-label model's "recall_at_5"), ``seeds``, ``epsilon``,
    ``epsilon_seeds_composed``, ``delta_seeds_composed`` and ``seeds_composition`` (empty
    where None)."""
    axes = list(dict.fromkeys(k for row in self.rows for k in row["grid"]))
    columns = ["accuracy_mean", "accuracy_std", "accuracy_metric", "seeds", "epsilon",
               "epsilon_seeds_composed", "delta_seeds_composed", "seeds_composition"]
    defaults = {"accuracy_metric": "accuracy"}
    return outputs.csv_text([axes + columns, *([row["grid"].get(a) for a in axes]
                                               + [row.get(c, defaults.get(c)) for c in columns]
                                               for row in self.rows)])


MAX_AUTO_THREADS = 8


def check_threads(threads) -> None:
  """Refuses a ``threads`` that is neither unset (automatic) nor an integer >= 1."""
  check(threads is None or (isinstance(threads, int) and not isinstance(threads, bool)
                            and threads >= 1), "threads", threads,
        "must be an integer >= 1 or unset (automatic)")


def threads_for(requested: Optional[int], devices: Sequence[Optional[int]]) -> int:
  """Programs that :func:`run_configs` runs at once for ``requested`` (None: automatic), where
  ``devices`` are the configurations' ``devices`` fields.

  Automatic: on one CPU device (every configuration's), one per core this process may use, at
  most :data:`MAX_AUTO_THREADS`: a round of small models leaves most of a core idle, and XLA
  runs programs called from different threads at the same time, so programs in threads use
  the cores a single program leaves idle (the sweep benchmarks measure it). Elsewhere one: a
  vmapped group fills an accelerator, and several devices share a program's clients.
  """
  check_threads(requested)
  if requested is not None:
    return requested
  if not all(one_cpu_device(d) for d in devices):
    return 1
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(MAX_AUTO_THREADS, cores or 1, len(devices)))


@dataclasses.dataclass(frozen=True)
class Programs:
  """How a sweep runs its experiments as compiled programs (checked by :func:`programs_at_once`
  before any data set loads).

  Attributes:
    group_size: at most this many experiments per program (an integer >= 1; None: every
      experiment that shares a round, :func:`run_configs`).
    threads: programs run at once (an integer >= 1; None: :func:`threads_for`'s default, one
      per core on one CPU device, else one).
  """

  group_size: Optional[int] = None
  threads: Optional[int] = None


def programs_at_once(group_size: Optional[int], threads: Optional[int],
                     devices: Sequence[Optional[int]]) -> int:
  """Checks ``group_size`` and returns :func:`threads_for` ``(threads, devices)``.

  Args:
    group_size: at most this many experiments per program (an integer >= 1, or None: no limit).
    threads: programs run at once (None: automatic).
    devices: the configurations' ``devices`` fields.

  Raises:
    ConfigError: naming ``group_size`` or ``threads`` when it is not an integer >= 1 or None.
  """
  check(group_size is None or (isinstance(group_size, numbers.Integral)
                               and not isinstance(group_size, bool) and group_size >= 1),
        "group_size", group_size,
        "must be an integer >= 1 or unset (no limit)")
  return threads_for(threads, devices)


@dataclasses.dataclass(frozen=True)
class Task:
  """One configuration for :func:`run_configs` to run.

  Attributes:
    config: its :class:`fedjax_dp.config.RunConfig`.
    data: its :class:`fedjax_dp.data.FederatedData`.
    output_dir: where its ``metrics.jsonl`` and ``summary.json`` go (None: not written).
    name: what to call it in an error (a sweep's grid point), None: nothing added.
  """

  config: Any
  data: Any
  output_dir: Optional[str] = None
  name: Optional[str] = None


def run_configs(tasks: Sequence[Task], options: Optional[RunOptions] = None, *, log=None,
                on_group=None, group_size: Optional[int] = None,
                threads: Optional[int] = None) -> tuple:
  """Runs configurations, those that share a round as one program each; returns
  ``(results, groups)``: a :class:`fedjax_dp.engine.RunResult` per task, in order,
  and one record per group (``experiments``: their indices, ``seconds``).

  Every task's configuration is built on its data set before anything runs (so a bad
  value stops the whole batch before compiling). Groups:
  the same :class:`fedjax_dp.round.Round`, rounds, evaluation period, placement, client chunk,
  devices, accounting workers and data shapes
  (:func:`fedjax_dp.engine.run_group`).

  Args:
    tasks: the configurations, their data sets, output folders and names (:class:`Task`).
    options: the run options they share (:class:`fedjax_dp.engine.RunOptions`: release,
      progress: one display for every group, :class:`fedjax_dp.observers.SweepProgress`);
      each group's evaluation period, placement, client chunk,
      devices and accounting workers are its configurations'
      (:func:`fedjax_dp.experiment.options_for`).
    log: gets one line per group as it ends (written past the progress bar).
    on_group: ``on_group(indices, results, setups, seconds)`` is called as each group ends (the
      :class:`fedjax_dp.algorithms.Setup` s it ran, and its own wall time, which with several
      threads overlaps other groups').
    group_size: at most this many experiments per program (a larger group runs as several;
      equal sizes share one compilation); default: no limit.
    threads: programs run at once, each in its own thread (:func:`threads_for`; default: one
      per core on one CPU device, else one); with fewer groups than threads, each group runs
      in as many parts (near-equal, so that equal parts share one compilation), and
      ``on_group`` is called as each ends, in that order, from the caller's thread. With one
      thread the programs run in the caller's thread; with several, in threads of their own,
      which do not see the caller's thread-local JAX settings (``with
      jax.default_device(...)`` and the like: use ``jax.config.update`` or ``threads=1``).

  Returns:
    ``(results, groups)``; a group's record says whether its experiments ran ``side_by_side``
    (vmapped) or one after another inside its program
    (:func:`fedjax_dp.engine.experiments_vmapped`).
  """
  options = options or RunOptions()
  check_from_config(options)
  threads = programs_at_once(group_size, threads, [t.config.devices for t in tasks])
  built = []
  for t in tasks:
    with _naming(t.name):
      built.append(algorithms.build(t.config, t.data))
  groups = _groups(tasks, built, group_size, threads)
  results, records = [None] * len(tasks), [None] * len(groups)
  stop = threading.Event()
  progress = None  # one display for every program, which its groups' runs report to
  if options.progress or options.progress_every is not None:
    progress = SweepProgress(sum(t.config.rounds for t in tasks), len(groups),
                             None if options.progress else options.progress_every,
                             options.release == "private")
    options = dataclasses.replace(options, progress=False, progress_every=None)

  def run_one(members):
    tg = time.perf_counter()
    first, program = tasks[members[0]].config, built[members[0]].program
    shown = [] if progress is None else [progress.observer(len(members))]
    experiments = [Experiment(built[i].hparams, tasks[i].data, built[i].sampler,
                              tasks[i].config.seed, built[i].accounting, tasks[i].output_dir,
                              recorded_config(tasks[i].config),
                              observers=shown if i == members[0] else ()) for i in members]
    done = engine.run_group(program, experiments, first.rounds,
                            options=options_for(first, program, options), stop=stop)
    return done, time.perf_counter() - tg

  def finish(g, done, seconds):
    """Keeps group ``g``'s results and record, gives its line to the display or ``log`` and
    calls ``on_group``.

    Args:
      g: the group's index.
      done: its experiments' :class:`fedjax_dp.engine.RunResult` s.
      seconds: its wall time.
    """
    members, first = groups[g], tasks[groups[g][0]].config
    for i, res in zip(members, done):
      results[i] = res
    records[g] = {"experiments": list(members), "seconds": seconds,
                  "side_by_side": len(members) > 1 and engine.experiments_vmapped()}
    # A private release prints no timing (a raw diagnostic).
    line = (f"[group {g + 1}/{len(groups)}] {len(members)} experiments of {first.algorithm}"
            + ("" if options.release == "private" else f": {seconds:.1f}s"))
    if progress is not None:
      progress.program_done(log, line)
    elif log is not None:
      log(line)
    if on_group is not None:
      on_group(members, done, [built[i] for i in members], seconds)

  try:
    _in_threads(groups, threads, run_one, finish, stop)
  finally:
    if progress is not None:
      progress.close()
  return results, records


def _groups(tasks: Sequence[Task], built: Sequence, group_size: Optional[int],
            threads: int) -> list:
  """The tasks' indices by compiled program: those with the same round (the built ``Setup`` s'
  program), rounds, evaluation period, placement, client blocks, devices, accounting workers and
  data shapes; at most ``group_size`` each, and split into near-equal parts where there are
  fewer groups than ``threads``, so that every thread has one."""
  groups = {}
  for i, (t, setup) in enumerate(zip(tasks, built)):
    c = t.config
    key = (id(setup.program), c.rounds, c.eval_every, c.placement,
           client_blocks(c, setup.program.model, setup.program.model_batch), c.devices,
           c.accounting_workers, _shape_key(t.data))
    groups.setdefault(key, []).append(i)
  if group_size is not None:
    groups = {(key, k): members[k:k + group_size] for key, members in groups.items()
              for k in range(0, len(members), group_size)}
  groups = list(groups.values())
  if 0 < len(groups) < threads:  # each group in parts, so that every thread has one
    parts = -(-threads // len(groups))
    groups = [[int(i) for i in part] for members in groups
              for part in np.array_split(members, min(parts, len(members)))]
  return groups


def _in_threads(groups: list, threads: int, run_one, finish, stop: threading.Event) -> None:
  """``finish(g, *run_one(groups[g]))`` for every group: in the caller's thread with one
  thread (under its thread-local JAX settings), else ``threads`` programs at once (the first
  ``threads`` groups, then each as one ends), ``finish`` called in the caller's thread as each
  ends; the first failure (or Ctrl-C here) sets ``stop``, which ends the others before their
  next round, and is raised. Programs in threads neither read nor write JAX's persistent
  compilation cache (:func:`fedjax_dp.compilation.paused`)."""
  if threads == 1:
    for g, members in enumerate(groups):
      finish(g, *run_one(members))
    return
  # Programs running in threads at once stay out of the compilation cache (compilation.paused).
  with compilation.paused(), concurrent.futures.ThreadPoolExecutor(threads) as pool:
    futures = {pool.submit(run_one, members): g for g, members in enumerate(groups)}
    try:
      for future in concurrent.futures.as_completed(futures):
        finish(futures[future], *future.result())
    except BaseException:
      stop.set()
      for future in futures:
        future.cancel()
      raise


def sweep(config=None, grid: Optional[Mapping[str, Sequence]] = None, seeds: int = 1, *,
          run_options: Optional[RunOptions] = None, programs: Optional[Programs] = None,
          load=None, log=None, vary_split: bool = False) -> SweepResult:
  """Runs every grid point times seed; experiments that share a round run as one program.

  Args:
    config: the base :class:`RunConfig` (default: the quickstart).
    grid: axis name -> values (strings are converted by the field's type).
    seeds: seeds per grid point: ``config.seed``, ``config.seed + 1``, ...; they share one split
      of the data into clients (:func:`plan`).
    run_options: the run options (:class:`fedjax_dp.engine.RunOptions`): ``release`` ("all" or
      "private"), ``progress`` and ``progress_every`` (one display for the whole sweep,
      :class:`fedjax_dp.observers.SweepProgress`), and ``output_dir``: if given, each
      experiment writes ``experiments/NNN/metrics.jsonl`` and ``summary.json`` there, and the
      sweep ``results.json`` (:meth:`SweepResult.to_json`) and ``results.csv``
      (:meth:`SweepResult.to_csv`); ``overwrite`` replaces an earlier
      sweep's files there (they are moved aside while the sweep runs and deleted when it has
      finished; a sweep that fails or is interrupted leaves them as they were); without it a
      folder holding ``results.json`` or ``experiments/`` is refused before anything loads.
      A sweep is not checkpointed, and its experiments' evaluation period, placement, client
      chunk, devices and accounting workers are their configurations'.
    load: ``config -> FederatedData`` (default: :func:`fedjax_dp.experiment.load_data`);
      called once per distinct data set (data fields and seed).
    log: where one line per finished group goes (default: nowhere).
    programs: how the experiments are grouped into compiled programs and how many run at once
      (:class:`Programs`; default: ``Programs()``).
    vary_split: each seed splits the data into clients by its own seed (:func:`plan`); a row's
      mean over seeds is then covered for one example (:func:`seeds_composed`).

  Returns:
    The :class:`SweepResult`.

  Raises:
    ConfigError: on a bad grid, setting or option, before any data set loads.
  """
  options = run_options or RunOptions()
  points = _checked_plan(config, grid, seeds, options, vary_split)
  programs = programs or Programs()
  threads = programs_at_once(programs.group_size, programs.threads,
                             [p.config.devices for p in points])
  folder = (contextlib.nullcontext() if options.output_dir is None else
            outputs.claimed(options.output_dir, overwrite=options.overwrite, results=SWEEP_FILES))
  with folder as out:  # None: nothing is written
    t0 = time.perf_counter()
    datasets = {}
    for p in points:  # one load per distinct data set
      key = _data_key(p.config)
      if key not in datasets:
        datasets[key] = (load or load_data)(p.config)

    # An earlier sweep's files stay until this one has finished (an interrupted or failed sweep
    # leaves them as they were, and its own partial files go).
    with (contextlib.nullcontext() if out is None else outputs.replacing(out, SWEEP_FILES, True)):
      ledgers = [None] * len(points)  # each run's PrivacyLedger, where its epsilon is one ledger's

      def keep_ledgers(members, done, setups, seconds):
        """Keeps each run's ledger (:func:`run_configs`' ``on_group``).

        Args:
          members: the group's experiments (indices).
          done: their results (unused).
          setups: their :class:`fedjax_dp.algorithms.Setup` s.
          seconds: the group's wall time (unused).
        """
        del done, seconds
        for i, setup in zip(members, setups):
          ledgers[i] = getattr(setup.accounting, "ledger", None)

      tasks = [Task(p.config, datasets[_data_key(p.config)],
                    None if out is None else str(out / "experiments" / f"{i:03d}"), p.name)
               for i, p in enumerate(points)]
      results, group_records = run_configs(
          tasks, dataclasses.replace(options, output_dir=None, overwrite=False), log=log,
          on_group=keep_ledgers, group_size=programs.group_size,
                                 threads=threads)
      experiments = _experiments(points, results, group_records, out is not None)
      rows = _rows(points, experiments, datasets, ledgers, seeds)
      # The programs that ran at once: no more threads than programs.
      result = SweepResult(rows, experiments, group_records, time.perf_counter() - t0, points,
                           min(threads, len(group_records)), options.release)
      if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        outputs.write_text_atomic(out / "results.csv", result.to_csv())
        outputs.write_text_atomic(out / "results.json",
                                  dumps(result.to_json(), indent=2, default=str) + "\n")
    return result


def _experiments(points: Sequence[Point], results: Sequence, groups: Sequence[dict],
                 written: bool) -> list:
  """:attr:`SweepResult.experiments`: each point's values, seed, group, folder (``written``:
  ``experiments/NNN``) and :class:`fedjax_dp.engine.RunResult`."""
  group_of = {i: g for g, rec in enumerate(groups) for i in rec["experiments"]}
  return [{"values": p.values, "seed": p.seed, "group": group_of[i],
           "output_dir": f"experiments/{i:03d}" if written else None, "result": r}
          for i, (p, r) in enumerate(zip(points, results))]


def _checked_plan(config, grid: Optional[Mapping[str, Sequence]], seeds: int,
                  options: RunOptions, vary_split: bool = False) -> list:
  """:func:`plan` of ``config`` (default: the quickstart), with ``options``, every point's
  algorithm options and device count checked before any data set loads."""
  check_from_config(options)
  check(not options.checkpointed, "checkpoint_every", options.checkpoint_every,
        "a sweep is not checkpointed (its experiments run as one vmapped program): run an "
        "experiment alone with checkpoint_every")
  check_config(config, unset_ok=True)
  config = make_config() if config is None else config
  # plan refuses a grid that is not a mapping of lists and an axis a point does not read.
  points = plan(config, {} if grid is None else grid, seeds, vary_split)
  for p in points:
    algorithm_options.read(p.config, algorithms.option_table(p.config.algorithm))
    check_devices(p.config.devices)
  return points


def _rows(points: Sequence[Point], experiments: list, datasets: Mapping, ledgers: Sequence,
          seeds: int) -> list:
  """:attr:`SweepResult.rows`: one per grid point, over its ``seeds`` consecutive experiments
  (their data sets, ``datasets`` by :func:`_data_key`, and ``ledgers``)."""
  rows, shared = [], {}  # shared: the row's data keys -> same_clients (one check per set)
  for c in range(0, len(points), seeds):
    keys = tuple(_data_key(p.config) for p in points[c:c + seeds])
    if keys not in shared:
      shared[keys] = same_clients([datasets[k] for k in keys])
    block = experiments[c:c + seeds]
    summaries = [e["result"].summary for e in block]
    eps = [s.get("epsilon") for s in summaries]
    eps = None if any(e is None for e in eps) else max(eps)
    # A multi-label model's final_accuracy is its recall at 5 (its summaries' accuracy_metric).
    metric = ({"accuracy_metric": summaries[0]["accuracy_metric"]}
              if "accuracy_metric" in summaries[0] else {})
    rows.append({**block[0]["values"], **seed_stats([s["final_accuracy"] for s in summaries]),
                 **metric,
                 # The largest epsilon among the seeds (they differ only where it depends
                 # on data).
                 "epsilon": eps, **seeds_composed(
                     eps, summaries[0].get("delta"), len(block), ledgers[c:c + seeds],
                     shared[keys],
                     summaries[0].get("neighbouring_relation"),
                     _split_reads_labels(points[c].config)),
                 "grid": dict(block[0]["values"])})
  return rows
