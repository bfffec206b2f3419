"""Output folders: checked before anything runs, written so that nothing already there is lost.

* :func:`check_output_dir` refuses, with one :class:`ConfigError` naming
  ``output_dir``, a path that is a file, that cannot be created (a parent is a
  file) or where no file can be written (``/proc``, ``/sys``, read-only), and,
  unless overwriting, a folder that holds an earlier result; with or without
  overwriting, a folder holding the ``.earlier-*/`` files a killed command set aside.
* :class:`MetricsFile` creates ``metrics.jsonl`` only when the first round's
  record is written, and removes the earlier run's files at that moment: a run
  that stops before its first round leaves the folder as it was, and an
  interrupted overwrite never leaves an old ``summary.json`` beside new rows.
* :func:`write_atomic` (and :func:`write_text_atomic`) writes a temporary file
  in the same folder and renames it over the target, so a reader (or a crash)
  never sees half a ``summary.json``, ``norms.npz`` or ``results.json``.
* :func:`sole_writer` lets one process at a time write a folder: a second command into it
  (two ``--resume`` of one run, two ``--overwrite``) is refused in one line naming the process
  that holds it. :func:`claimed` holds a command's folder so, then checks it.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import os
import pathlib
import shutil
import sys
import tempfile
import types
from typing import Callable, Iterable, Iterator, Optional, Sequence

import filelock

from fedjax_dp.errors import ConfigError, check
from fedjax_dp.paths import absolute

METRICS = "metrics.jsonl"
METRICS_CSV = "metrics.csv"  # metrics.jsonl's rows as a table (fedjax_dp.observers.MetricsTable)
SUMMARY = "summary.json"
NORMS = "norms.npz"
TENSORBOARD = "tensorboard"  # a folder of TensorBoard event files
CHECKPOINTS = "checkpoints"  # a folder of orbax checkpoints (fedjax_dp.checkpoint)
RUN_FILES = (METRICS, METRICS_CSV, SUMMARY, NORMS, TENSORBOARD, CHECKPOINTS)  # all a run writes
# The hidden folder where :func:`replacing` keeps the earlier files until the new ones are whole.
ASIDE_PREFIX = ".earlier-"
# The files that mark each command's folder. A folder holds one kind: a sweep or a reproduction
# is never written beside a run (or each other), even with --overwrite, which replaces only a
# command's own files.
KIND_MARKERS = {"a run": (METRICS, SUMMARY), "a sweep": ("experiments",),
                "a reproduction": ("runs.jsonl", "results.md")}


# Where the folders' locks live: outside the folders, so that an output folder holds only results.
LOCKS = pathlib.Path(tempfile.gettempdir()) / "fedjax_dp-locks"


@contextlib.contextmanager
def sole_writer(folder) -> Iterator[None]:
  """During the block, this process is the only one writing ``folder`` (resolved; a
  :class:`filelock.FileLock` keyed by its path, in :data:`LOCKS`, released when the block ends
  or the process dies).

  Raises:
    ConfigError: naming ``output_dir`` and the process holding the folder, when another one
      does: it is refused before it writes anything.
  """
  path = str(absolute(folder).resolve())
  LOCKS.mkdir(parents=True, exist_ok=True)
  name = hashlib.sha256(path.encode()).hexdigest()[:32]
  lock, holder = filelock.FileLock(LOCKS / f"{name}.lock"), LOCKS / f"{name}.holder"
  try:
    lock.acquire(timeout=0)
  except filelock.Timeout:
    who = holder.read_text(errors="replace").strip() if holder.exists() else "another process"
    raise ConfigError("output_dir", str(folder), f"is being written by {who}: wait for it to "
                      "end, or choose another directory") from None
  try:
    holder.write_text(f"process {os.getpid()} ({' '.join(sys.argv)[:200]})")
    yield
  finally:
    holder.unlink(missing_ok=True)
    lock.release()


@contextlib.contextmanager
def claimed(path, *, overwrite: bool, results: Sequence[str] = RUN_FILES,
            resume: bool = False) -> Iterator[pathlib.Path]:
  """The output folder ``path`` of one command: this process's during the block
  (:func:`sole_writer`), checked once it is (:func:`check_output_dir` with ``overwrite`` and the
  command's ``results``; not for a ``resume``, whose folder holds the run it continues).

  Args:
    path: the output folder (a ``str`` or path).
    overwrite: whether earlier files among ``results`` may be replaced.
    results: the names of the files the command writes (default: a run's).
    resume: the command continues the run in ``path``: the folder is not checked.

  Yields:
    The folder as checked (resolved where it has ``..``; as given with ``resume``).

  Raises:
    ConfigError: as :func:`sole_writer` and :func:`check_output_dir`, before anything is written.
  """
  with sole_writer(path):
    yield (pathlib.Path(path) if resume else
           check_output_dir(path, overwrite=overwrite, results=results))


def _nearest_existing(path: pathlib.Path, field: str, given: str) -> pathlib.Path:
  """The nearest of the absolute ``path`` and its parents that exists (a name too long to look
  up does not: :func:`_check_lengths` then refuses it).

  Raises:
    ConfigError: naming ``field`` and its value ``given`` (``path`` as given), when the file
      system cannot look a name up (a folder that may not be entered), so that what the command
      would create there could not be created either.
  """
  def exists(p: pathlib.Path) -> bool:
    try:
      os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
      return False
    except OSError as e:
      if e.errno == errno.ENAMETOOLONG:
        return False
      raise ConfigError(field, given, f"cannot be looked up: {p} ({e.strerror or e})") from None
    return True
  return next(p for p in (path, *path.parents) if exists(p))


def _check_lengths(path: pathlib.Path, existing: pathlib.Path, field: str, given: str) -> None:
  """Refuses the absolute ``path`` (``given``, for ``field``) where it is longer, or a name in it
  below the folder ``existing`` is, than the file system of ``existing`` allows: nothing could
  be created there."""
  def limit(name: str) -> int:
    try:
      return os.pathconf(existing, name)
    except OSError:  # a file system that does not say: no limit checked here
      return -1
  names, longest = limit("PC_NAME_MAX"), limit("PC_PATH_MAX")
  for part in path.relative_to(existing).parts:
    size = len(os.fsencode(part))
    check(names < 0 or size <= names, field, given, f"has a name of {size} bytes, longer than "
          f"the {names} bytes a name may have on this file system")
  size = len(os.fsencode(path))
  check(longest < 0 or size < longest, field, given, f"is {size} bytes long as an absolute "
        f"path, longer than the {longest - 1} bytes a path may have on this file system")


def check_writable(path, field: str = "output_dir") -> pathlib.Path:
  """``path`` as a folder that exists or can be created, and in which a file can be written.

  Nothing is created: the check writes and removes a probe file in the
  nearest folder that exists. A path with ``..`` in it is resolved first and returned resolved
  (``missing/../prior`` is ``prior``, whose results the checks then see, and writing there
  creates no ``missing/``).

  Raises:
    ConfigError: naming ``field`` (the setting that gave ``path``) and ``path``, when it is
      empty, a file or under one, relative to a current folder that was deleted, longer (or a
      name in it) than the file system allows, or no file can be written there (read-only).
  """
  check(str(path).strip() != "", field, str(path),
        "must name a folder (an empty path would write into the current folder)")
  out = pathlib.Path(path)
  full = absolute(out, field)
  if ".." in out.parts:
    out = full = full.resolve()
  existing = _nearest_existing(full, field, str(out))
  _check_lengths(full, existing, field, str(out))
  if existing == full:
    check(full.is_dir(), field, str(out), "is a file, not a folder")
  else:
    check(existing.is_dir(), field, str(out),
          f"cannot be created: {existing} is a file, not a folder")
  try:
    fd, probe = tempfile.mkstemp(dir=existing, prefix=".fedjax-dp-probe-")
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise ConfigError(field, str(out),
                      f"no file can be written in {existing} ({e.strerror or e})") from None
  return out


def holds_result(path: pathlib.Path) -> bool:
  """Whether ``path`` is an earlier result (an empty file, e.g. a run stopped before its first
  round by an older version, is not)."""
  return os.path.lexists(path) and not (path.is_file() and path.stat().st_size == 0)


def check_output_dir(path, *, overwrite: bool, results: Sequence[str] = RUN_FILES) -> pathlib.Path:
  """:func:`check_writable`; no other command's results (:data:`KIND_MARKERS`) and, unless
  ``overwrite``, no earlier result among ``results`` (the command's own files).

  Args:
    path: the output folder (a ``str`` or path).
    overwrite: whether earlier files among ``results`` may be replaced.
    results: the names of the files the command writes (default: a run's).

  Returns:
    The folder (resolved where ``path`` has ``..``).

  Raises:
    ConfigError: naming ``output_dir``: as :func:`check_writable`; the folder holds a result set
      aside by a killed command, another command's results, or (without ``overwrite``) one of
      ``results``.
  """
  out = check_writable(path)
  aside = min(out.glob(f"{ASIDE_PREFIX}*"), default=None) if out.is_dir() else None
  if aside is not None:
    raise ConfigError("output_dir", str(out),
                      f"holds {aside.name}/, an earlier result set aside by a command killed while "
                      f"replacing it: move its files back into {out} and remove it, or remove it")
  for kind, markers in KIND_MARKERS.items():
    for name in markers:
      check(name in results or not holds_result(out / name), "output_dir", str(out),
            f"holds {name} of {kind}: another command's results; choose another directory")
  if not overwrite:
    for name in results:
      check(not holds_result(out / name), "output_dir", str(out),
            f"already holds {name} from an earlier run: choose another directory or pass "
            "--overwrite (overwrite=True from Python)")
  return out


def remove(folder, names: Sequence[str]) -> None:
  """Removes the files (and folders, with what they hold) ``names`` of ``folder`` that exist."""
  for name in names:
    path = pathlib.Path(folder, name)
    if path.is_dir() and not path.is_symlink():
      shutil.rmtree(path)
    else:
      path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing(folder, names: Sequence[str], whole: bool = False,
              started: Optional[Callable[[pathlib.Path], bool]] = None):
  """For a command that replaces its files ``names`` in ``folder`` (``--overwrite``).

  The earlier files are moved aside. If the block raises before any new result exists
  (``started(folder)``; default: any of ``names`` holds one; bad input, missing data), they
  come back and a folder the block created is removed again: a refused command loses nothing.
  Otherwise the earlier files are deleted. ``whole``: the new files are worth keeping only whole
  (a sweep, which cannot resume), so a block that raises at any point leaves the earlier files
  as they were and its own partial ones go.

  Args:
    folder: the command's output folder (created by the block if missing).
    names: the names of the files and folders the command writes there.
    whole: keep the new files only if the block completes.
    started: whether the block has begun writing results, given the folder; None: whether
      any of ``names`` holds one (:func:`holds_result`).

  Yields:
    A namespace whose ``restored`` says, once the block has raised, whether the folder was put
    back as it was.
  """
  folder = pathlib.Path(folder)
  created = not folder.exists()
  earlier = [n for n in names if os.path.lexists(folder / n)]
  aside = pathlib.Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=folder)) if earlier else None
  for n in earlier:
    os.replace(folder / n, aside / n)
  outcome = types.SimpleNamespace(restored=False)
  try:
    yield outcome
  except BaseException:
    begun = (started(folder) if started is not None else
             any(holds_result(folder / n) for n in names))
    if whole or not begun:
      remove(folder, names)  # empty leftovers, e.g. a runs.jsonl opened before the data failed
      for n in earlier:
        os.replace(aside / n, folder / n)
      if created and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
      outcome.restored = True
    raise
  finally:
    if aside is not None:
      shutil.rmtree(aside, ignore_errors=True)


def write_atomic(path, write: Callable[[pathlib.Path], None]) -> None:
  """Calls ``write(tmp)`` on a temporary file in ``path``'s folder, then ``os.replace`` s it over
  ``path``: ``path`` holds either its old content or all of the new, never a part."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    write(tmp)
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise


def write_text_atomic(path, text: str) -> None:
  """Writes ``text`` to ``path`` atomically (:func:`write_atomic`)."""
  write_atomic(path, lambda tmp: tmp.write_text(text))


def csv_text(rows: Iterable[Sequence]) -> str:
  """``rows`` as CSV (:mod:`csv`'s default dialect), a line each ending in ``\\n``, an empty cell
  for None."""
  text = io.StringIO()
  csv.writer(text, lineterminator="\n").writerows(["" if v is None else v for v in row]
                                                  for row in rows)
  return text.getvalue()


class MetricsFile:
  """A run's ``metrics.jsonl`` (or its file ``name``), opened when the first record is written.

  At that moment the folder is created and the earlier run's files
  (:data:`RUN_FILES`) are removed; before it nothing is touched. With
  ``append`` (a resumed run; a file written beside ``metrics.jsonl``, after it) the rows are
  appended and nothing is removed. After :meth:`close`, a write opens the file again and appends.
  """

  def __init__(self, folder, append: bool = False, name: str = METRICS):
    self.folder = check_writable(folder)
    self.append = append
    self.name = name
    self._file = None

  def write(self, text: str) -> None:
    if self._file is None:
      self.folder.mkdir(parents=True, exist_ok=True)
      if not self.append:
        remove(self.folder, RUN_FILES)
      self._file = open(self.folder / self.name, "a" if self.append else "w")
      self.append = True  # the earlier run's files are gone: a later opening appends
    self._file.write(text)

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
