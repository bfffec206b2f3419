"""What a run does with its records: one interface for every output of the run loop.

::

  engine.run_group: prepare -> for each round: step -> record -> ReleasePolicy.view -> observers

Each round of each experiment gives one :class:`Record`; every output is an :class:`Observer`
that receives it, in this order: the records a run returns (:class:`History`), ``metrics.jsonl``
(:class:`MetricsFile`), ``metrics.csv`` (:class:`MetricsTable`), TensorBoard events
(:class:`TensorBoard`), a Weights & Biases run (:class:`WandB`), ``norms.npz``
(:class:`NormsFile`), checkpoints (:class:`Checkpoint`), the progress bar
(:class:`ProgressBar`; a sweep's programs share one, :class:`SweepProgress`), ``summary.json``
(:class:`SummaryFile`, last: a folder with a summary holds a whole run), then a user's callback
(:class:`Callback`, ``simulate(on_round=...)``) and own observers (``simulate(observers=[...])``).

The release policy (:class:`ReleasePolicy`) decides what each observer sees: with
``release="all"`` an observer that asks for them (:attr:`Observer.sees_diagnostics`) gets the
raw diagnostics too (the record's ``diagnostics``, the clients' norms, the whole state); with
``release="private"``, or for an observer that does not ask, only what the guarantee covers and
what is public by design (:mod:`fedjax_dp.engine`'s docstring lists which is which).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
from tqdm.auto import tqdm

from fedjax_dp import outputs
from fedjax_dp.jsonio import dumps, sanitize


def leaves(record: dict, prefix: str = "") -> dict:
  """``{"diagnostics": {"update_norm": {"q50": x}}}`` -> ``{"diagnostics.update_norm.q50": x}``:
  each value of ``record`` that is not a dict, by its keys joined by ``.`` (after ``prefix``), in
  the record's order; ``metrics.csv``'s columns, named as :func:`pandas.json_normalize` names
  them."""
  out = {}
  for k, v in record.items():
    if isinstance(v, dict):
      out.update(leaves(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def flat(record: dict) -> dict:
  """``{"diagnostics": {"update_norm": {"q50": x}}}`` -> ``{"update_norm.q50": x}``: the numbers
  (and None) of :func:`leaves`, the diagnostics' without their ``diagnostics.``; a record's names
  as ``RunResult.metrics`` and TensorBoard give them."""
  return {k.removeprefix("diagnostics."): v for k, v in leaves(record).items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) or v is None}


@dataclasses.dataclass(frozen=True)
class Start:
  """What an observer learns before the first round it sees.

  Attributes:
    rounds: the run's rounds ``T``.
    done: rounds done before this process's first (a resumed run's checkpoint round; else 0).
    rows: the records of those rounds (as ``metrics.jsonl`` keeps them).
    log: a resumed run's saved record state (``accuracy``, ``loss``, ``diverged``,
      ``provenance``; :meth:`fedjax_dp.engine.Records.state`), None for a new run.
    arrays: a resumed run's saved arrays (``norms``, ``norm_counts`` where it kept norms).
  """

  rounds: int
  done: int = 0
  rows: tuple = ()
  log: Optional[dict] = None
  arrays: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class Record:
  """One round of one experiment, as an observer sees it.

  Attributes:
    round: the round's number ``r`` (1 to ``T``).
    rounds: the run's rounds ``T``.
    row: the round's record, as ``metrics.jsonl`` holds it; its raw statistics under
      ``diagnostics`` only where the observer sees diagnostics.
    norms: the real clients' pre-clip update norms, in the cohort's order (a raw diagnostic:
      None where the observer does not see diagnostics).
    state: the :class:`fedjax_dp.round.RoundState` after the round (the whole simulation,
      every client's raw state rows included: None where the observer does not see diagnostics,
      and in a group of experiments, which is not checkpointed).
  """

  round: int
  rounds: int
  row: dict
  norms: Optional[np.ndarray] = None
  state: Any = None


class Observer:
  """A receiver of a run's records; each method's default does nothing.

  The run calls :meth:`start` once, then :meth:`round` after every round, then :meth:`finish`
  with the run's :class:`fedjax_dp.engine.RunResult` when every round has run, and
  :meth:`close` at the end whether the run finished or raised. Observers are called in the
  order they are given, after the run's own outputs.

  Attributes:
    sees_diagnostics: whether the observer asks for the raw diagnostics; the release policy
      grants them under ``release="all"`` only (:class:`ReleasePolicy`).
  """

  sees_diagnostics: bool = True

  def start(self, start: Start) -> None:
    """Before the first round this process runs (``start.done`` rounds ran before it)."""

  def round(self, record: Record) -> None:
    """After each round, with its :class:`Record` as the release policy shows it."""

  def finish(self, result) -> None:
    """After the last round, with the run's :class:`fedjax_dp.engine.RunResult`."""

  def close(self) -> None:
    """At the end of the run, finished or not: releases files and threads."""


def is_released(name: str, released_metrics) -> bool:
  """Whether a program metric is in ``released_metrics`` (names; a trailing ``*`` is a prefix):
  computed only from the noisy release, so a record keeps it beside the covered values rather
  than under ``diagnostics`` (:func:`fedjax_dp.engine.summarize_round`)."""
  return any(name == r or (r.endswith("*") and name.startswith(r[:-1])) for r in released_metrics)


@dataclasses.dataclass(frozen=True)
class ReleasePolicy:
  """What a run's observers may see (``release``, :data:`fedjax_dp.engine.RELEASES`).

  ``"all"``: an observer that asks for them (:attr:`Observer.sees_diagnostics`) sees the raw
  diagnostics; ``"private"``: no observer does, so what leaves the run is only what the
  guarantee covers and what is public by design.
  """

  mode: str = "all"

  def shows_diagnostics(self, observer: Observer) -> bool:
    """Whether ``observer`` sees the raw diagnostics."""
    return self.mode == "all" and observer.sees_diagnostics

  def view(self, record: Record, observer: Observer) -> Record:
    """``record`` as ``observer`` may see it: without its diagnostics, norms and state unless
    :meth:`shows_diagnostics`."""
    if self.shows_diagnostics(observer):
      return record
    row = {k: v for k, v in record.row.items() if k != "diagnostics"}
    return Record(record.round, record.rounds, row)


class Observers:
  """The observers of one experiment under one :class:`ReleasePolicy`, called in order."""

  def __init__(self, policy: ReleasePolicy, observers: Sequence[Observer]):
    self.policy = policy
    self.observers = list(observers)

  def start(self, start: Start) -> None:
    for o in self.observers:
      o.start(start)

  def round(self, record: Record) -> None:
    for o in self.observers:
      o.round(self.policy.view(record, o))

  def finish(self, result) -> None:
    for o in self.observers:
      o.finish(result)

  def close(self) -> None:
    """Closes every observer; the first error is raised once all are closed."""
    error = None
    for o in self.observers:
      try:
        o.close()
      except BaseException as e:  # pylint: disable=broad-except
        error = error or e
    if error is not None:
      raise error


class History(Observer):
  """The records a run returns (:attr:`fedjax_dp.engine.RunResult.history`)."""

  def __init__(self):
    self.rows = []

  def start(self, start: Start) -> None:
    self.rows = list(start.rows)

  def round(self, record: Record) -> None:
    self.rows.append(record.row)


class Callback(Observer):
  """Calls ``fn(row)`` with each round's record (``simulate(on_round=fn)``)."""

  def __init__(self, fn: Callable[[dict], None]):
    self.fn = fn

  def round(self, record: Record) -> None:
    self.fn(record.row)


class MetricsFile(Observer):
  """``metrics.jsonl`` in ``folder``, one row per round, flushed as it goes
  (:class:`fedjax_dp.outputs.MetricsFile`: the earlier run's files are removed when the first
  row is written; a resumed run appends)."""

  def __init__(self, folder: pathlib.Path):
    self.folder = folder
    self.file = outputs.MetricsFile(folder)

  def start(self, start: Start) -> None:
    if start.log is not None:
      self.file = outputs.MetricsFile(self.folder, append=True)

  def round(self, record: Record) -> None:
    self.file.write(dumps(record.row) + "\n")
    self.file.flush()

  def close(self) -> None:
    self.file.close()


class MetricsTable(Observer):
  """``metrics.csv`` in ``folder``: ``metrics.jsonl``'s rows as a table, a line per round under a
  header, flushed as it goes.

  Each row is written as ``metrics.jsonl`` holds it (:func:`fedjax_dp.jsonio.sanitize`: a
  non-finite value empty, with its ``_nonfinite`` note), its nested values in columns of their
  own (:func:`leaves`), an empty cell where a round has no value (test accuracy between
  evaluations): the table is :func:`pandas.json_normalize` of ``metrics.jsonl``'s rows, and this
  observer sees what the release policy shows :class:`MetricsFile` (its diagnostics under
  ``release="all"`` only). A row that adds a column writes the file again, whole and atomically
  (:func:`fedjax_dp.outputs.write_text_atomic`), under the wider header. Attached after
  :class:`MetricsFile`, whose first row removed an earlier run's files; a resumed run writes the
  rows ``metrics.jsonl`` keeps (``Start.rows``) before its own, so each round is in the table
  once, as in an uninterrupted run's.
  """

  def __init__(self, folder: pathlib.Path):
    self.path = pathlib.Path(folder) / outputs.METRICS_CSV
    self.file = outputs.MetricsFile(folder, append=True, name=outputs.METRICS_CSV)
    self.rows, self.columns = [], {}

  def start(self, start: Start) -> None:
    self.rows = [leaves(sanitize(row)) for row in start.rows]
    if self.rows:
      self._write_whole()

  def round(self, record: Record) -> None:
    row = leaves(sanitize(record.row))
    self.rows.append(row)
    if row.keys() <= self.columns.keys():
      self.file.write(outputs.csv_text([[row.get(c) for c in self.columns]]))
      self.file.flush()
    else:
      self._write_whole()

  def _write_whole(self) -> None:
    """The file, every row so far under the header of every column so far."""
    self.columns = dict.fromkeys(c for row in self.rows for c in row)
    self.file.close()  # the next row is appended to the new file
    outputs.write_text_atomic(self.path, outputs.csv_text(
        [list(self.columns), *([row.get(c) for c in self.columns] for row in self.rows)]))

  def close(self) -> None:
    self.file.close()


class SummaryFile(Observer):
  """``summary.json`` in ``folder``, written (atomically) when the run has finished: the run
  attaches it after its other outputs, so a folder with a summary holds a whole run."""

  def __init__(self, folder: pathlib.Path):
    self.folder = folder

  def finish(self, result) -> None:
    outputs.write_text_atomic(self.folder / outputs.SUMMARY,
                              dumps(result.summary, indent=2, default=str) + "\n")


def scalars(row: dict) -> dict:
  """A record's numbers as TensorBoard and W&B log them at step ``row["round"]``:
  ``{"test_accuracy": a, "epsilon": e, ..., "diagnostics/update_norm.q50": x, ...}``, tagged by
  their ``metrics.jsonl`` names (:func:`flat`), the diagnostics (where the row holds them) under
  ``diagnostics/``; the round and the values that are None left out."""
  out = flat({k: v for k, v in row.items() if k not in ("round", "diagnostics")})
  out.update({f"diagnostics/{k}": v for k, v in flat(row.get("diagnostics", {})).items()})
  return {k: v for k, v in out.items() if v is not None}


# The metrics TensorBoard's HParams dashboard compares runs by (scalars every run logs).
HPARAMS_METRICS = ("test_accuracy", "epsilon")


def hparams_of(config: Optional[dict]) -> dict:
  """A recorded configuration (nested, :func:`fedjax_dp.config.nest`) as TensorBoard
  hyper-parameters: ``{"algorithm/clip": 0.5, "algorithm/attack/name": "none", ...}``, each a
  number, a bool or text (None as "none", a list as its text); ``not_used`` left out."""
  out = {}
  for key, value in (config or {}).items():
    if key == "not_used":
      continue
    if isinstance(value, dict):
      out.update({f"{key}/{k}": v for k, v in hparams_of(value).items()})
    else:
      out[key] = (value if isinstance(value, (bool, int, float, str)) else
                  "none" if value is None else str(value))
  return out


class TensorBoard(Observer):
  """TensorBoard event files in ``folder/tensorboard/``: each record's numbers as scalars at
  step ``round``, tagged by their ``metrics.jsonl`` names (diagnostics under ``diagnostics/``,
  with a histogram of the clients' update norms), and the run's configuration as hyper-parameters
  (:func:`hparams_of`), so that the HParams dashboard compares runs by their
  :data:`HPARAMS_METRICS`. Opened at the first round, after ``metrics.jsonl``, whose first write
  removed an earlier run's files.

  Args:
    folder: the run's folder.
    config: the run's recorded configuration (none: no hyper-parameters are written).
    private: the run's release is "private": every value's wall time is 0, so the events say
      nothing of how long a round took.
  """

  def __init__(self, folder: pathlib.Path, config: Optional[dict] = None, private: bool = False):
    self.folder = folder
    self.hparams = hparams_of(config)
    self.walltime = 0.0 if private else None
    self.writer = None
    self.resumed_from = None

  def start(self, start: Start) -> None:
    self.resumed_from = start.done if start.log is not None else None

  def round(self, record: Record) -> None:
    if self.writer is None:
      # Needs the optional tensorboardX (checked with the run's options): imported on use.
      from tensorboardX import SummaryWriter
      # A resumed run's file has a name of its own: tensorboardX names a file by the second it
      # opens it and truncates a file of that name (one the checkpoint's run opened that second).
      suffix = "" if self.resumed_from is None else f".resumed-{self.resumed_from}"
      self.writer = SummaryWriter(str(self.folder / outputs.TENSORBOARD), flush_secs=10,
                                  filename_suffix=suffix)
      if self.hparams:
        from tensorboardX.summary import hparams
        for summary in hparams(self.hparams, dict.fromkeys(HPARAMS_METRICS, 0.0)):
          self.writer.file_writer.add_summary(summary, walltime=self.walltime)
    step = record.round
    if "diagnostics" in record.row and record.norms is not None and record.norms.size:
      self.writer.add_histogram("diagnostics/update_norm", record.norms, step,
                                walltime=self.walltime)
    for tag, v in scalars(record.row).items():
      self.writer.add_scalar(tag, v, step, walltime=self.walltime)

  def flush(self) -> None:
    """Writes the events so far to disk (before a checkpoint that holds their rounds)."""
    if self.writer is not None:
      self.writer.flush()

  def finish(self, result) -> None:
    self.close()  # every event on disk before summary.json marks the run finished

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()
      self.writer = None


class WandB(Observer):
  """A Weights & Biases run in project ``project`` (the optional ``wandb`` package:
  ``pip install 'fedjax_dp[wandb]'``): the run's configuration as the W&B run's config (nested
  as ``summary.json`` records it, ``not_used`` left out), each record's numbers at step
  ``round`` under their TensorBoard tags (:func:`scalars`: the diagnostics only where the
  release policy shows them), and when the run has finished the summary's top-level values
  (``final_accuracy``, ``epsilon``, ...). It captures no console output. A resumed run's W&B run
  is a new one, holding every round (the checkpoint's rows first). Where W&B writes, and whether
  it uploads, are W&B's own settings (``WANDB_DIR``, ``WANDB_MODE=offline``, ``wandb login``).

  Args:
    project: the W&B project.
    config: the run's recorded configuration.
    private: the run's release is "private". W&B stamps each row with the wall time it was
      logged and the seconds since its run began, so the rows are held and logged together
      once the run has finished (nothing is logged of a run that does not finish), with W&B's
      system metrics and machine metadata off: W&B's times then say when the run ended, not
      how long a round took.
  """

  def __init__(self, project: str, config: Optional[dict] = None, private: bool = False):
    self.project = project
    self.config = {k: v for k, v in (config or {}).items() if k != "not_used"}
    self.private = private
    self.run = None
    self.held = []  # (step, values) not yet logged

  def start(self, start: Start) -> None:
    self.held = [(row["round"], scalars(row)) for row in start.rows]

  def round(self, record: Record) -> None:
    self.held.append((record.round, scalars(record.row)))
    if not self.private:
      self._log()

  def _log(self) -> None:
    """Opens the W&B run (once) and logs the rows held."""
    if self.run is None:
      # The optional wandb (checked with the run's options): imported on use, so that a run
      # without W&B neither needs the package nor waits for its import.
      import wandb
      self.run = wandb.init(project=self.project, config=self.config, reinit="create_new",
                            settings=wandb.Settings(console="off", x_disable_stats=self.private,
                                                    x_disable_meta=self.private))
    for step, values in self.held:
      self.run.log(values, step=step)
    self.held = []

  def finish(self, result) -> None:
    self._log()
    self.run.summary.update({k: v for k, v in result.summary.items()
                             if isinstance(v, (bool, int, float, str))})
    self.run.finish()
    self.run = None

  def close(self) -> None:
    if self.run is not None:  # the run did not finish: W&B marks it failed
      self.run.finish(exit_code=1)
      self.run = None


class NormsFile(Observer):
  """``norms.npz`` in ``folder``, written at the end of the run: arrays ``round`` ``[R]``
  (int32), ``offsets`` ``[R + 1]`` (int64), ``norms`` (float32, every round's real clients'
  pre-clip update norms one after another: round ``round[i]``'s are
  ``norms[offsets[i]:offsets[i + 1]]``) and ``clip`` (the clip bound ``clip``; NaN without
  one). Raw diagnostics: the run attaches it under ``release="all"`` only."""

  def __init__(self, folder: pathlib.Path, clip: Optional[float]):
    self.folder = folder
    self.clip = clip
    self.norms = []

  def start(self, start: Start) -> None:
    if start.arrays is not None:
      arrays = start.arrays
      self.norms = np.split(arrays["norms"], np.cumsum(arrays["norm_counts"])[:-1])

  def round(self, record: Record) -> None:
    self.norms.append(record.norms.astype(np.float32))

  def state(self) -> dict:
    """The norms so far, as a checkpoint keeps them (``norms``, ``norm_counts``)."""
    return {"norms": np.concatenate(self.norms).astype(np.float32),
            "norm_counts": np.array([len(n) for n in self.norms], np.int64)}

  def finish(self, result) -> None:
    rounds = np.array([rec["round"] for rec in result.history], np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(n) for n in self.norms])]).astype(np.int64)
    clip = np.float64(np.nan if self.clip is None else self.clip)

    def write(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, round=rounds, offsets=offsets, norms=np.concatenate(self.norms), clip=clip)
    outputs.write_atomic(self.folder / outputs.NORMS, write)


class Checkpoint(Observer):
  """Saves the run through ``checkpointer`` (:class:`fedjax_dp.checkpoint.Checkpointer`) after
  every ``every`` rounds and the last: the round's whole state, the experiment's sampler and
  accounting, ``records``' state and ``norms``' (a :class:`NormsFile`, or None), with the
  TensorBoard events of those rounds flushed first (``tensorboard``, or None)."""

  def __init__(self, checkpointer, experiment, records, norms: Optional[NormsFile] = None,
               tensorboard: Optional[TensorBoard] = None):
    self.checkpointer = checkpointer
    self.experiment = experiment
    self.records = records
    self.norms = norms
    self.tensorboard = tensorboard

  def round(self, record: Record) -> None:
    if not self.checkpointer.due(record.round, record.rounds):
      return
    if self.tensorboard is not None:  # the events of the rounds this checkpoint holds are on disk
      self.tensorboard.flush()
    self.checkpointer.save(record.round, record.state, self.experiment, self.records.state(),
                           {} if self.norms is None else self.norms.state())

  def close(self) -> None:
    self.checkpointer.close()


# A private run's tqdm bar: the rounds without elapsed time or rate.
_PRIVATE_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"


class _Progress(Observer):
  """What a progress display shows beside the round: the last evaluation's test accuracy (a
  resumed run's from its checkpoint until it evaluates again), in :attr:`accuracy`, or the
  headline metric that takes its place, named :attr:`metric` (``"recall@5"`` for a multi-label
  model: :data:`fedjax_dp.models.METRIC_LABELS`)."""

  accuracy: Optional[float] = None
  metric: str = "accuracy"

  def start(self, start: Start) -> None:
    if start.log is not None:
      self.accuracy = start.log["accuracy"]

  def round(self, record: Record) -> None:
    if "test_accuracy" in record.row:
      self.accuracy = record.row["test_accuracy"]


class ProgressBar(_Progress):
  """A tqdm progress bar of the run's rounds, showing the last test accuracy, the epsilon and
  (a diagnostic, where the policy shows it) the clients' raw training loss; ``experiments``:
  how many the bar's program runs (shown when more than one); ``private``: the run's release is
  "private", so the bar shows no time (neither elapsed nor per round)."""

  def __init__(self, experiments: int = 1, private: bool = False, metric: str = "accuracy"):
    self.experiments = experiments
    self.format = _PRIVATE_BAR if private else None
    self.bar = None
    self.metric = metric

  def start(self, start: Start) -> None:
    super().start(start)
    self.bar = tqdm(total=start.rounds, initial=start.done, unit="round", dynamic_ncols=True,
                    desc="compiling the round", bar_format=self.format)

  def round(self, record: Record) -> None:
    super().round(record)
    if self.bar.desc:  # the first round ran: it compiled
      self.bar.set_description_str("", refresh=False)
    row = record.row
    post = {"acc" if self.metric == "accuracy" else self.metric:
            f"{self.accuracy:.4f}" if self.accuracy is not None else "-"}
    diag = row.get("diagnostics", {})
    if diag.get("train_loss") is not None:  # the clients' raw loss, a diagnostic
      post["raw loss"] = f"{diag['train_loss']:.3f}"
    if row.get("epsilon") is not None:
      post["eps"] = f"{row['epsilon']:.2f}"
    if self.experiments > 1:
      post["experiments"] = self.experiments
    self.bar.set_postfix(post, refresh=False)
    self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


class ProgressLines(_Progress):
  """A run's progress as lines, where no bar shows it (``fedjax-dp run --no-progress``): one at
  each round that ends ``every`` seconds or more after the run began or the last line,
  ``round r/T: test accuracy a, epsilon e, s s`` (what the policy releases; the accuracy of the
  last evaluation, or ``test recall@5 a`` for a multi-label model; the first line's time
  includes compiling the round). A run shorter than ``every`` prints none: its command's last
  line reports it.

  Args:
    every: seconds between lines (> 0).
    experiments: how many experiments the lines' program runs (said when more than one).
    private: the run's release is "private": the lines say no time.
    write: where each line goes (default: stderr).
    clock: seconds, for the spacing (default: :func:`time.monotonic`).
    metric: the name of the headline metric shown (:attr:`_Progress.metric`).
  """

  def __init__(self, every: float, experiments: int = 1, private: bool = False,
               write: Callable[[str], Any] = _to_stderr, clock: Callable[[], float] = time.monotonic,
               metric: str = "accuracy"):
    self.every, self.write, self.clock, self.private = every, write, clock, private
    self.metric = metric
    self.tag = f" ({experiments} experiments)" if experiments > 1 else ""
    self.began = self.last = None

  def start(self, start: Start) -> None:
    super().start(start)
    self.began = self.last = self.clock()

  def round(self, record: Record) -> None:
    super().round(record)
    row = record.row
    now = self.clock()
    if now - self.last < self.every:
      return
    self.last = now
    parts = ([] if self.accuracy is None else [f"test {self.metric} {self.accuracy:.4f}"]) + (
        [] if row.get("epsilon") is None else [f"epsilon {row['epsilon']:.3f}"])
    elapsed = [] if self.private else [f"{now - self.began:.1f} s"]
    self.write(f"round {record.round}/{record.rounds}{self.tag}: " + ", ".join(parts + elapsed))


class SweepProgress:
  """One progress display for all the programs of a sweep (:func:`fedjax_dp.sweep.run_configs`),
  which may run at once in threads: a tqdm bar of every experiment's rounds together, or, where
  no bar shows it (``every`` given), a line at each round that ends ``every`` seconds or more
  after the sweep began or the last line, ``sweep: n/N experiment rounds, p/P programs done,
  s s``. Each program reports through its own :meth:`observer`; :meth:`program_done` counts the
  programs that ended and prints their line without breaking the bar. Safe to call from several
  threads.

  Args:
    rounds: every experiment's rounds together (the display's total).
    programs: the compiled programs the sweep runs.
    every: None: a bar; else seconds between lines (> 0).
    private: the experiments' release is "private": the display says no time.
    write: where each line goes (default: stderr).
    clock: seconds, for the spacing (default: :func:`time.monotonic`).
  """

  def __init__(self, rounds: int, programs: int, every: Optional[float] = None,
               private: bool = False, write: Callable[[str], Any] = _to_stderr,
               clock: Callable[[], float] = time.monotonic):
    self.total, self.programs, self.every = rounds, programs, every
    self.private, self.write, self.clock = private, write, clock
    self.done = self.ended = 0
    self.lock = threading.Lock()
    self.began = self.last = clock()
    self.bar = None
    if every is None:
      self.bar = tqdm(total=rounds, unit="round", dynamic_ncols=True, desc="compiling the rounds",
                      bar_format=_PRIVATE_BAR if private else None)
      self.bar.set_postfix_str(self._programs(), refresh=False)

  def _programs(self) -> str:
    return f"{self.ended}/{self.programs} programs done"

  def observer(self, experiments: int) -> Observer:
    """The observer of a program that runs ``experiments`` experiments, given to its first
    experiment: each of its rounds counts ``experiments`` rounds."""
    return _SweepPart(self, experiments)

  def advance(self, rounds: int) -> None:
    """Counts ``rounds`` more experiment rounds."""
    with self.lock:
      self.done += rounds
      if self.bar is not None:
        if self.bar.desc:  # a round ran: it compiled
          self.bar.set_description_str("", refresh=False)
        self.bar.update(rounds)
        return
      now = self.clock()
      if now - self.last >= self.every:
        self.last = now
        took = "" if self.private else f", {now - self.began:.1f} s"
        self.write(f"sweep: {self.done}/{self.total} experiment rounds, {self._programs()}{took}")

  def program_done(self, say: Optional[Callable[[str], Any]] = None,
                   line: Optional[str] = None) -> None:
    """Counts a program that ended, and gives ``say`` its ``line`` (with the bar cleared while
    it is written, then drawn again below it)."""
    with self.lock:
      self.ended += 1
      if self.bar is not None:
        self.bar.set_postfix_str(self._programs(), refresh=False)
      if say is not None:
        with (tqdm.external_write_mode(file=sys.stderr) if self.bar is not None
              else contextlib.nullcontext()):
          say(line)
      if self.bar is not None:
        self.bar.refresh()

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


class _SweepPart(Observer):
  """What one program of a sweep reports to its :class:`SweepProgress`: its rounds, each counting
  its ``experiments``."""

  sees_diagnostics = False

  def __init__(self, progress: SweepProgress, experiments: int):
    self.progress, self.experiments = progress, experiments

  def round(self, record: Record) -> None:
    self.progress.advance(self.experiments)
