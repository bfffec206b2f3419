"""The reproductions' shared runner: jobs in, one record per run out.

A reproduction lists its runs as :class:`Job` s (a configuration and the labels
that identify the run), and :func:`run_jobs` runs them in order on their data
set, logs ``[i/n] NAME: acc=... (s)``, appends each run's record to
``runs.jsonl`` as the run ends and returns the records. A record is the job's
labels, the fields the reproduction reads from the run, the run's seconds (and its
process's, which :func:`wall_seconds` sums over a resumed reproduction's processes) and
its per-round ``history`` (round, test accuracy, and the raw diagnostics under
``"diagnostics"``: pre-clip norms, losses, ...; they are not covered by any
epsilon). :func:`group_by` and :func:`fedjax_dp.stats.seed_stats` then turn
records into the rows of the results (mean and sample std over seeds). With ``resume``,
:func:`run_jobs` continues an interrupted reproduction: the jobs whose records ``runs.jsonl``
already holds are not run again.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fedjax_dp.engine import experiments_vmapped
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.provenance import environment
from fedjax_dp.sweep import MAX_EXPERIMENTS, Task, run_configs

# The arguments a reproduction began with (fedjax_dp.reproduce.run_reproduction), which --resume
# continues it with.
ARGUMENTS = "reproduction.json"
# What a reproduction writes in its --output-dir besides plots and each run's own folder: a folder
# holding one of these holds an earlier reproduction (kept unless --overwrite).
RESULT_FILES = ("results.json", "results_partial.json", "results.md", "runs.jsonl", ARGUMENTS)


@dataclasses.dataclass(frozen=True)
class Job:
  """One run of a reproduction.

  Attributes:
    config: the run's :class:`fedjax_dp.config.RunConfig`.
    labels: what identifies the run; they open its record, in this order.
    name: the run's name in the progress log (default: the labels, ``key=value``).
    data: the key of the data set it runs on (jobs with one key share one loaded data set).
    output_dir: where the run writes ``metrics.jsonl`` and ``summary.json`` (none: not written).
  """

  config: Any
  labels: dict
  name: Optional[str] = None
  data: Any = None
  output_dir: Optional[str] = None

  def describe(self) -> str:
    return self.name or " ".join(f"{k}={v}" for k, v in self.labels.items())


def num_seeds(seeds, default: int) -> int:
  """``seeds`` (``--seeds``), or the scale's ``default`` when not given: an integer from 1 to
  :data:`fedjax_dp.sweep.MAX_EXPERIMENTS` (the runs' seeds are 0 to ``seeds - 1``, far below
  2**32), refused before anything is built or run."""
  n = default if seeds is None else seeds
  check(isinstance(n, int) and not isinstance(n, bool), "seeds", seeds, "must be an integer >= 1")
  check(n >= 1, "seeds", seeds, "must be >= 1")
  check(n <= MAX_EXPERIMENTS, "seeds", seeds, f"must be at most {MAX_EXPERIMENTS}: every "
        "setting's runs are planned before anything runs")
  return n


def simulate_jobs(jobs: Sequence[Job], data, done: Callable, threads: Optional[int] = None) -> None:
  """Runs ``jobs`` on ``data`` as sweeps do (:func:`fedjax_dp.sweep.run_configs`: those that
  share a compiled round run as one vmapped program, ``threads`` of them at once) and calls
  ``done(indices, results, setups, seconds)`` as each group of them ends. On a CPU, where a
  group's runs would run one after another inside its program
  (:func:`fedjax_dp.engine.experiments_vmapped`), each run is a group of its own: the same
  compiled step and the same bits, and each run's record is kept as it ends, so that an
  interrupted reproduction loses at most the runs in progress.

  Args:
    jobs: the runs, all on ``data``.
    data: the loaded data set (:class:`fedjax_dp.data.FederatedData`).
    done: ``(indices, results, setups, seconds)`` callback: indices into ``jobs`` of a group
      that ended, their :class:`fedjax_dp.engine.RunResult` s, :class:`fedjax_dp.algorithms.Setup`
      s and the group's own wall time.
    threads: compiled programs run at once (None: automatic, :func:`fedjax_dp.sweep.threads_for`).
  """
  run_configs([Task(j.config, data, j.output_dir) for j in jobs], on_group=done,
              group_size=None if experiments_vmapped() else 1, threads=threads)


@dataclasses.dataclass(frozen=True)
class Kept:
  """What a run's record keeps of its per-round history (:func:`history`).

  Attributes:
    diagnostics: the raw diagnostics kept in each round (None: all of them).
    evaluated_only: keep only the rounds whose test accuracy was evaluated, so that the record of
      a run of thousands of rounds stays a few kilobytes (its curve, and the diagnostics of the
      rounds on it).
  """

  diagnostics: Optional[Sequence[str]] = None
  evaluated_only: bool = False


def history(rounds: Sequence[dict], kept: Kept = Kept()) -> list:
  """A run's per-round records: round, test accuracy where evaluated, and its raw diagnostics.

  Args:
    rounds: the run's rounds (:attr:`fedjax_dp.engine.RunResult.history`), or the ``history``
      of a record that kept more of them.
    kept: which rounds and diagnostics are kept.

  Returns:
    One ``{"round", "test_accuracy" (where evaluated), "diagnostics"}`` per kept round.
  """
  out = []
  for h in rounds:
    if kept.evaluated_only and "test_accuracy" not in h:
      continue
    d = h.get("diagnostics", {})
    keep = d if kept.diagnostics is None else {k: d[k] for k in kept.diagnostics if k in d}
    out.append({"round": h["round"],
                **({"test_accuracy": h["test_accuracy"]} if "test_accuracy" in h else {}),
                "diagnostics": keep})
  return out


@dataclasses.dataclass(frozen=True)
class Execution:
  """How :func:`run_jobs` runs its jobs and reports their progress.

  Attributes:
    execute: ``(jobs, data, done, threads=)`` runs jobs on one data set and calls
      ``done(indices, results, setups, seconds)`` as some of them end (default:
      :func:`simulate_jobs`; ``setups`` and ``seconds`` may be left out).
    threads: compiled programs run at once (``fedjax-dp reproduce --threads``;
      :func:`fedjax_dp.sweep.threads_for`; default: one per core on one CPU device, else one).
    log: where the progress lines go.
    resume: keep the records already in ``runs.jsonl`` and run only the jobs that have none
      (:func:`earlier_records`; ``fedjax-dp reproduce --resume``): the records
      :func:`run_jobs` returns, and those its ``on_record`` gets, include the earlier ones.
  """

  execute: Callable = simulate_jobs
  threads: Optional[int] = None
  log: Callable[[str], Any] = print
  resume: bool = False


class _Records:
  """The records of :func:`run_jobs`'s jobs, kept in the jobs' order as their groups end; each
  is appended to ``runs_path`` (unless None) and logged, and ``on_record`` (unless None) gets
  the records finished so far after each group."""

  def __init__(self, jobs: Sequence[Job], record: Callable, runs_path, kept: Kept,
               on_record: Optional[Callable], log: Callable, earlier: Mapping[int, dict]):
    self.jobs, self.record, self.runs_path, self.log = jobs, record, runs_path, log
    self.kept, self.on_record = kept, on_record
    self.by_job = [earlier.get(i) for i in range(len(jobs))]
    self.finished, self.t0 = list(earlier.values()), time.perf_counter()
    self.started = datetime.datetime.now(datetime.timezone.utc).isoformat()

  def done_for(self, segment: Sequence[int]) -> Callable:
    """The ``done(indices, results, setups, seconds)`` of the jobs ``segment`` (indices into the
    jobs), run as one call of ``execute``; a record's seconds are the wall time of its group."""
    t = [time.perf_counter()]

    def done(indices, results, setups=None, seconds=None):
      """Keeps the records of a group that ended.

      Args:
        indices: indices into ``segment`` of the group's jobs.
        results: their :class:`fedjax_dp.engine.RunResult` s, in the same order.
        setups: unused.
        seconds: the group's own wall time (None: the time since the previous group of
          ``segment`` ended, the same where groups run one at a time).
      """
      del setups
      since, t[0] = time.perf_counter() - t[0], time.perf_counter()
      seconds = since if seconds is None else seconds
      for k, result in zip(indices, results):
        self._keep(segment[k], result, seconds, len(indices))
      if self.on_record is not None:
        self.on_record(list(self.finished))

    return done

  def _keep(self, i: int, result, seconds: float, group: int) -> None:
    job = self.jobs[i]
    rec = {**job.labels, **self.record(job, result), "seconds": seconds,
           "process": {"started": self.started, "seconds": time.perf_counter() - self.t0},
           "history": history(result.history, self.kept)}
    self.by_job[i] = rec
    self.finished.append(rec)
    if self.runs_path is not None:
      with open(self.runs_path, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")
    acc = rec.get("accuracy")
    acc = f"{acc:.4f}" if isinstance(acc, (float, np.floating)) else acc
    self.log(f"[{len(self.finished)}/{len(self.jobs)}] {job.describe()}: acc={acc} (group of "
             f"{group}: {seconds:.1f}s, total {time.perf_counter() - self.t0:.0f}s)")


def _normal(value):
  """``value`` as its record in ``runs.jsonl`` reads back (tuples as lists, ...)."""
  return json.loads(json.dumps(value, default=str))


def earlier_records(jobs: Sequence[Job], runs_path, log: Callable[[str], Any]) -> dict:
  """The records ``runs_path`` holds of ``jobs``, by job index: a record is a job's when its
  values at the job's labels are the labels, and it is checked to be a finished run's (its
  ``"seconds"`` and ``"history"``). A last line cut short (the process was killed while writing
  it) is removed from the file, with one line to ``log``: its run runs again. Records of no job
  are left as they are (the runs of another call on the same file).

  Args:
    jobs: the reproduction's runs.
    runs_path: its ``runs.jsonl`` (missing: no records).
    log: where the line on a dropped last line goes.

  Returns:
    ``{job index: record}``, in the order the records appear in the file.

  Raises:
    ConfigError: naming ``resume`` and the file, when a whole line is not a finished run's
      record, or a job has two records.
    ValueError: two jobs have the same labels.
  """
  path = pathlib.Path(runs_path)
  data = path.read_bytes() if path.is_file() else b""
  whole = data.rfind(b"\n") + 1
  if whole < len(data):
    log(f"{path}: its last line was cut short ({len(data) - whole} bytes: the reproduction was "
        "stopped while writing it): dropped, its run runs again")
    os.truncate(path, whole)
  keys = {tuple(job.labels) for job in jobs}
  index = {json.dumps(_normal(job.labels), sort_keys=True): i for i, job in enumerate(jobs)}
  if len(index) < len(jobs):
    raise ValueError("jobs share labels, which must tell each run apart to find its record")
  found = {}
  for n, line in enumerate(data[:whole].splitlines(), 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
      rec, why = None, f"not JSON ({type(e).__name__}: {str(e)[:80]})"
    else:
      why = None if isinstance(rec, dict) and {"seconds", "history"} <= set(rec) else (
          "not a finished run's record (no seconds and history)")
    if why is not None:
      raise ConfigError("resume", str(path), f"has a line {n} that is {why}: the file was changed "
                        "or damaged; remove that line (its run then runs again) or start the "
                        "reproduction again with --overwrite")
    for k in keys:
      i = index.get(json.dumps({key: rec.get(key) for key in k}, sort_keys=True))
      if i is not None and all(key in rec for key in k):
        check(i not in found, "resume", str(path), f"holds two records of the run "
              f"{jobs[i].describe()} (lines {found.get(i, {}).get('line')} and {n}): it mixes "
              "runs; keep one of them, or start the reproduction again with --overwrite")
        found[i] = {"line": n, "record": rec}
        break
  return {i: f["record"] for i, f in found.items()}


def run_jobs(jobs: Sequence[Job], record: Callable[[Job, Any], dict], *,
             load_data: Callable[[Any], Any], runs_path=None, append: bool = False,
             kept: Kept = Kept(), on_record: Optional[Callable[[list], None]] = None,
             execution: Execution = Execution()) -> list:
  """Runs ``jobs`` and returns their records, in the jobs' order.

  Jobs that follow one another on one data set are run together by ``execution.execute``
  (by default as sweeps: those that share a compiled round run as one vmapped
  program), and each record is written as its group ends. A job's results depend on its own
  configuration and data set only (its seed fixes every draw), so a job left out
  (``execution.resume``) changes none of the others': bit for bit on a CPU, where a program's
  runs run one after another; on an accelerator, where they are vmapped, a job grouped
  differently may differ by floating-point rounding.

  Args:
    jobs: the runs.
    record: ``(job, result) -> dict``, the fields a reproduction keeps of a run (its
      ``"accuracy"`` among them); the record is the job's labels, these fields, ``"seconds"``
      (the wall time of the group it ran in), ``"process"`` (when the process that ran it
      started, and its seconds since then as the record was written: :func:`wall_seconds`) and
      ``"history"`` (see :func:`history`).
    load_data: ``key -> data set``, called for the first job and whenever a job's ``data`` key
      differs from the previous job's (one data set is held at a time).
    runs_path: the ``runs.jsonl`` each record is appended to as its run ends (none: not written).
    append: keep the records already in ``runs_path`` (else it starts empty, unless
      ``execution.resume``).
    kept: what each record keeps of the run's history (default: every round, every diagnostic).
    on_record: called with the records so far after each group (to write partial results).
    execution: how the jobs run and report their progress.

  Returns:
    One record per job, in the jobs' order.
  """
  earlier = {}
  if runs_path is not None:
    pathlib.Path(runs_path).parent.mkdir(parents=True, exist_ok=True)
    if execution.resume:
      earlier = earlier_records(jobs, runs_path, execution.log)
      execution.log(f"resumed: {len(earlier)} of {len(jobs)} runs were done, "
                    f"{len(jobs) - len(earlier)} to run")
    elif not append:
      pathlib.Path(runs_path).write_text("")
  records = _Records(jobs, record, runs_path, kept, on_record, execution.log, earlier)
  segments = []  # consecutive jobs with one data key, less those done
  for i, job in enumerate(jobs):
    if not segments or job.data != jobs[i - 1].data:
      segments.append([])
    if i not in earlier:
      segments[-1].append(i)
  for segment in filter(None, segments):
    data = None  # the previous data set can go before the next one loads
    data = load_data(jobs[segment[0]].data)
    execution.execute([jobs[i] for i in segment], data, records.done_for(segment),
                      threads=execution.threads)
  return records.by_job


def wall_seconds(records: Sequence[dict]) -> float:
  """The wall time of the processes that ran ``records``: for each process (a record's
  ``process.started``), the seconds from its start to its last record, summed. A reproduction
  stopped and resumed counts each process up to its last finished group (the time of a group cut
  short is not in it); records without ``process`` add nothing.

  Args:
    records: run records (:func:`run_jobs`' or ``runs.jsonl``'s).

  Returns:
    The seconds, 0.0 for no records.
  """
  last = {}
  for r in records:
    p = r.get("process")
    if p is not None:
      last[p["started"]] = max(last.get(p["started"], 0.0), float(p["seconds"]))
  return sum(last.values(), 0.0)


def group_by(records: Sequence[dict], keys: Sequence[str]) -> dict:
  """``{tuple of the records' values at keys: [records]}``, in order of first appearance."""
  groups = {}
  for r in records:
    groups.setdefault(tuple(r[k] for k in keys), []).append(r)
  return groups


def wrote(paths: Sequence, seconds: Optional[float] = None) -> str:
  """The line that a reproduction and its ``--render`` end with, alike for every paper:
  ``wrote A, B, C``, the paths of the files written in the order written (None, a figure with
  nothing to draw, is left out), then `` in N s`` for a reproduction that ran for ``seconds``."""
  line = "wrote " + ", ".join(str(p) for p in paths if p is not None)
  return line if seconds is None else f"{line} in {seconds:.0f} s"


# A run's test accuracy where the test set is the clients' own held-out data (a natural
# partition, FederatedData.test_from_clients): raw, as the run's summary.json says.
ACCURACY_FROM_CLIENTS = {
    "accuracy (each run's test accuracy)": "computed on the clients' own held-out examples (the "
                                           "natural partition's test file, the same writers): "
                                           "a raw statistic of their data, not covered"}


def identity(paper: str) -> dict:
  """The ``reproduction`` and ``provenance`` fields of a reproduction's ``results.json``: which
  paper, and the library, package versions, devices and source tree that ran it
  (:func:`fedjax_dp.provenance.environment`; public by design)."""
  return {"reproduction": paper, "provenance": environment()}


def release(diagnostics: Mapping[str, str], test_from_clients: bool = False) -> dict:
  """A reproduction's ``results.json`` ``release`` block: what its private runs' guarantees
  cover, what is public by design and, from ``diagnostics`` (field -> what it is), the raw
  statistics that no guarantee covers. ``test_from_clients``: the runs' test set is their
  clients' own data, so their accuracies are raw (:data:`ACCURACY_FROM_CLIENTS`) and nothing in
  the file is covered."""
  return {
      "covered_by_guarantee": [] if test_from_clients else [
          "each run's test accuracies: post-processing of its released model; a row's mean and "
          "std over seeds read every seed's model, so they are covered by the seeds' composed "
          "guarantee, not by one run's: basic composition, k epsilon and k delta for k seeds, for "
          "the runs' own unit where the seeds share one split into clients. Where each seed "
          "splits the data differently (data_seed unset) the unit common to them is one "
          "example, which replaces one client's data in each run: the same for runs under "
          "replace-one, and under add/remove group privacy for 2 composed the same way (2k "
          "epsilon, k (1 + e^epsilon) delta); only where the split ignores the labels (the iid "
          "partition of the whole data set): a split by labels gives no bound "
          "(fedjax_dp.sweep.seeds_composed)",
          "rows one at a time, not together: the runs of one seed in different rows share its "
          "draws (cohorts, and noise scaled by each run's multiplier), so rows can be combined "
          "to cancel the noise and no composition of the rows' guarantees covers the whole "
          "file"],
      "public_by_design": ["the settings but the seeds, the paper's numbers, each run's epsilon "
                           "and noise multiplier (functions of the public settings)",
                           "provenance (the library, package versions, devices and source tree "
                           "that ran it)"],
      "randomness": "the seeds are secret, not public: a run's seed fixes every draw of its "
                    "mechanism, the noise included (fedjax_dp.engine.RANDOMNESS); they are "
                    "recorded so that the reproduction can be re-run",
      # Raw, unnoised statistics: not covered by any guarantee.
      "diagnostics": {"timings (seconds, wall_seconds)": "raw, as every run's",
                      **(ACCURACY_FROM_CLIENTS if test_from_clients else {}), **diagnostics},
  }


def read_records(output_dir, rows: Sequence[dict], keys: Sequence[str],
                 prepare: Callable[[dict], dict] = lambda r: r) -> list:
  """The run records of ``output_dir``'s ``runs.jsonl`` (each through ``prepare``), checked
  against ``rows`` (its ``results.json``'s): a row, told apart by its values at ``keys``,
  summarizes exactly ``row["seeds"]`` records. A truncated, doubled or mixed ``runs.jsonl``
  would render tables and verdicts that disagree with the rows, so it is refused (field
  ``--output-dir``) before anything is written. The records come in the rows' order, each row's
  by seed (``runs.jsonl`` holds them as the runs ended, which programs running at once reorder),
  so that tables keep the rows' order and seeds pair by position; records of a setting without
  a row (one an interrupted run had not finished) come last, kept for the module to skip.

  Args:
    output_dir: the reproduction's folder, holding ``runs.jsonl``.
    rows: the rows of its ``results.json``, each with the ``keys`` and ``"seeds"``.
    keys: the fields that tell a row's records apart.
    prepare: applied to each record as read (e.g. to fill in a field older files lack).

  Returns:
    The records, in the rows' order, each row's by ``"seed"``.

  Raises:
    ConfigError: naming ``--output-dir``, when a row's records are not exactly its seeds.
  """
  path = pathlib.Path(output_dir) / "runs.jsonl"
  records = [prepare(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
  order = {tuple(row[k] for k in keys): i for i, row in enumerate(rows)}
  records.sort(key=lambda r: (order.get(tuple(r[k] for k in keys), len(order)), r.get("seed", 0)))
  found = group_by(records, keys)
  for row in rows:
    key = tuple(row[k] for k in keys)
    n = len(found.get(key, ()))
    check(n == row["seeds"], "--output-dir", str(output_dir),
          f"holds a runs.jsonl with {n} record(s) of the row {dict(zip(keys, key))}, whose "
          f"results.json row says {row['seeds']} seed(s): runs.jsonl is truncated or mixes "
          f"runs, and the tables would not match results.json; restore the run's own runs.jsonl "
          f"or run the reproduction again")
  return records
