"""A PLD run's per-round epsilons, computed by worker processes ahead of the rounds.

A run reports epsilon after every round. With the PLD accountant each report costs
dp_accounting one core's work (it self-composes the round's privacy loss distribution and
reads epsilon off it, a pure-Python loop over the distribution, longer as the rounds grow),
so on an accelerator, where a round is much shorter, the accounting sets the round rate. The
event that :class:`fedjax_dp.privacy.accounting.LedgerAccounting` composes does not depend on the
round's draw, so every epsilon the run will report is known when it starts
(:meth:`fedjax_dp.privacy.ledger.PrivacyLedger.upcoming`): :class:`Ahead` hands them, in
round order, to worker processes (:func:`main`: a fresh interpreter that imports the
ledger and dp_accounting, never JAX or the caller's script). An example-level run
(:class:`fedjax_dp.privacy.example_level.ExampleLevelAccounting`), whose clients' ledgers
follow the cohorts (a report can ask for dozens of new epsilons), gives them what each
round's report is about to compute, which they compute in parallel. The workers compute each with the function the ledger calls itself
(:func:`fedjax_dp.privacy.ledger._composed_epsilon`) on the same arguments. So a report is
the same number with workers or without; the ledger takes a worker's value when it has one
and computes it itself otherwise (a worker that fails or is stopped costs time, never a
different value).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Optional, Sequence

from fedjax_dp.errors import check
from fedjax_dp.privacy import ledger

# Workers a run on an accelerator starts when it does not say (the rest of the cores stay free).
MAX_AUTO_WORKERS = 8


def workers_for(requested: Optional[int], platform: str) -> int:
  """Worker processes for ``requested`` (None: automatic) on a JAX ``platform``.

  Automatic: none on a CPU, whose cores run the rounds (a worker would compete with them);
  elsewhere one per core but one, at most :data:`MAX_AUTO_WORKERS`. A number requested
  (validated with the configuration, and by engine.run_group) starts at most one per core or
  :data:`MAX_AUTO_WORKERS`, whichever is more: each is a Python process, and a run stored
  with more resumes on a smaller machine.

  Args:
    requested: the workers asked for (``>= 0``), or None for the automatic choice.
    platform: the JAX platform the rounds run on ("cpu", "gpu", "tpu", ...).

  Returns:
    The number of worker processes to start, ``>= 0``.
  """
  if requested is not None:
    return min(requested, max(MAX_AUTO_WORKERS, os.cpu_count() or 1))
  if platform == "cpu":
    return 0
  return max(0, min(MAX_AUTO_WORKERS, (os.cpu_count() or 1) - 1))


class Ahead:
  """Up to ``workers`` worker processes computing epsilons that a run's ledgers will report.

  :meth:`submit` queues the arguments of ``_composed_epsilon`` (each computed once, however
  many ledgers will ask for it: a sweep's seeds share theirs) and registers a future of each
  in :data:`fedjax_dp.privacy.ledger.AHEAD`, where the ledger looks first; :meth:`close`
  stops the workers and takes back what is left. The workers start with the first key
  submitted (a run that submits none starts none: ``started`` says). ``computed``: how many
  values the workers returned.
  """

  def __init__(self, workers: int):
    check(workers >= 1, "accounting_workers", workers, "must be >= 1 to start workers")
    self.workers = workers
    self.computed = 0
    self._lock = threading.Lock()
    self._keys = []
    self._next = itertools.count()
    self._workers = []
    self._home = {}  # a set of events (and relation, accountant, delta) -> its worker
    self._started = False

  @property
  def started(self) -> int:
    """How many workers started (none before the first key)."""
    return len(self._workers)

  def _start(self) -> None:
    # The workers find this package where this process did (last, so it shadows nothing).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    command = [sys.executable, "-c", f"import sys; sys.path.append({root!r}); "
               f"import {__name__} as worker; worker.main()"]
    for _ in range(self.workers):
      try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
      except OSError:  # no process to start: those started (if any) do the work
        break
      pending = {}  # task number -> future
      reader = threading.Thread(target=self._read, args=(proc, pending), daemon=True)
      reader.start()
      self._workers.append((proc, pending, reader))

  def submit(self, keys: Sequence[tuple]) -> None:
    """Queues ``keys`` in this order. A worker builds each event's privacy loss distribution
    the first time it composes it (the costly step) and keeps it, so when the keys compose at least
    as many distinct sets of events as there are workers (an example-level report: one per
    example count) each set goes to one worker, the same every time; fewer sets (a user-level
    run's rounds: one) are spread over the workers in turn."""
    fresh = [k for k in dict.fromkeys(keys) if k not in ledger.AHEAD]
    if not fresh:
      return
    if not self._started:
      self._started = True
      self._start()
    if not self._workers:  # none could start: the ledgers compute their own
      return
    events = {k: tuple(e for e, _ in k[0]) + k[1:] for k in fresh}
    by_events = len(set(events.values())) >= len(self._workers)
    for key in fresh:
      if by_events:
        if events[key] not in self._home:  # the worker with the fewest sets so far
          load = [0] * len(self._workers)
          for w in self._home.values():
            load[w] += 1
          self._home[events[key]] = load.index(min(load))
        w = self._home[events[key]]
      else:  # in turn: the count of keys sent so far
        w = len(self._keys) % len(self._workers)
      self._send(w, key)

  def _send(self, w: int, key: tuple) -> None:
    future = Future()
    ledger.AHEAD[key] = future
    self._keys.append(key)
    task = next(self._next)
    proc, pending, _ = self._workers[w]
    with self._lock:
      pending[task] = future
    try:
      pickle.dump((task, key), proc.stdin)
      proc.stdin.flush()
    except OSError:  # the worker is gone: the ledger computes this one itself
      self._fail(pending, task)

  def _read(self, proc, pending: dict) -> None:
    """Sets each future as its worker answers; when the worker ends, fails what it left."""
    try:
      while True:
        task, ok, value = pickle.load(proc.stdout)
        with self._lock:
          future = pending.pop(task, None)
          self.computed += ok
        if future is None:  # failed already, when it could not be sent
          continue
        if ok:
          future.set_result(value)
        else:
          future.set_exception(RuntimeError(value))
    except (EOFError, OSError, ValueError, pickle.UnpicklingError):
      pass
    with self._lock:
      tasks = list(pending)
    for task in tasks:
      self._fail(pending, task)

  def _fail(self, pending: dict, task: int) -> None:
    with self._lock:
      future = pending.pop(task, None)
    if future is not None and not future.done():
      future.set_exception(RuntimeError("the accounting worker stopped"))

  def close(self) -> None:
    """Stops the workers (their queued epsilons are not computed) and takes the futures
    back out of :data:`fedjax_dp.privacy.ledger.AHEAD`."""
    for proc, _, _ in self._workers:
      proc.kill()
    for proc, _, reader in self._workers:
      proc.wait()
      reader.join()  # it has read the end of the worker's answers
      for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
          pipe.close()
    for key in self._keys:
      ledger.AHEAD.pop(key, None)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _serve(stdin, stdout) -> None:
  """A worker: reads ``(task, key)`` pairs as they come and answers ``(task, ok, value)`` in
  order (a reader thread keeps the pipe drained so the run never waits to queue work). It
  exits as soon as its input ends: the run closed it, or ended."""
  import queue
  tasks = queue.Queue()

  def read():
    try:
      while True:
        tasks.put(pickle.load(stdin))
    except (EOFError, OSError, pickle.UnpicklingError):
      os._exit(0)  # pylint: disable=protected-access

  threading.Thread(target=read, daemon=True).start()
  while True:
    task, key = tasks.get()
    try:
      with ledger.accounting(key[2]):
        answer = (task, True, ledger._composed_epsilon(*key))  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      answer = (task, False, f"{type(e).__name__}: {e}")
    pickle.dump(answer, stdout)
    stdout.flush()


def main() -> None:
  """A worker process's entry (:class:`Ahead` starts it): answers on the original stdout;
  anything a library prints goes to stderr instead."""
  answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  _serve(sys.stdin.buffer, answers)
