"""JAX's persistent compilation cache, shared by every process of one user on one machine.

A program compiled once (a round, an evaluation) is written to the cache folder and read back by
later processes that compile the same program, instead of compiling it again. The cache is
bounded (:data:`MAX_BYTES`): the first :func:`enable` of a process removes the least recently
used entries beyond the bound (:func:`prune`). JAX's own bound is left off: with it, every
entry written lists and reads every entry of the folder under one file lock, so writing ``n``
programs into a cache costs of the order of ``n**2`` file reads, shared by all the processes
using it. Without it JAX writes an entry in place; a process that reads one while another
still writes it fails to decompress it, warns and compiles the program itself.

Programs that one process runs in several threads at once (a sweep's, :func:`paused`) neither
read nor write the cache: XLA:CPU aborted the process while one thread serialized a program into
the cache and another ran or compiled one.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from typing import Optional

import filelock
import jax
from jax.experimental.compilation_cache import compilation_cache

ENV = "FEDJAX_DP_JAX_CACHE"
OFF = "off"
MAX_BYTES = 4 * 2**30
# JAX's names of a program's files in the cache: the entry, and (written while JAX's own bound
# is on, as earlier versions of this module set it) its last use.
SUFFIXES = ("-cache", "-atime")
_pruned = set()  # the folders this process has pruned
_pauses = 0  # how many paused() blocks are open (enable() does nothing while any is)
_lock = threading.Lock()
_enabled_before = True  # jax_enable_compilation_cache when the first open paused() began


def folder() -> Optional[pathlib.Path]:
  """Where the cache lives: ``$FEDJAX_DP_JAX_CACHE`` (``off`` turns the cache off), else
  ``fedjax_dp/jax`` in ``$XDG_CACHE_HOME`` (default ``~/.cache``).

  Returns:
    The folder, or None when the cache is off.
  """
  chosen = os.environ.get(ENV)
  if chosen is not None and chosen.strip().lower() == OFF:
    return None
  if chosen:
    return pathlib.Path(chosen).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base) / "fedjax_dp" / "jax"


def enable() -> Optional[pathlib.Path]:
  """Turns the cache on for this process, in :func:`folder`, caching every program however
  quickly it compiled; a cache folder already configured in JAX (``jax_compilation_cache_dir``,
  ``JAX_COMPILATION_CACHE_DIR``) is kept. The first call of a process on a folder bounds it to
  :data:`MAX_BYTES` (:func:`prune`), unless a size bound is set in JAX
  (``jax_compilation_cache_max_size``), which JAX then enforces itself. JAX decides at a
  process's first compilation whether it uses the cache; a change made here resets that decision,
  so programs compiled after this call use the cache wherever it is turned on.

  Returns:
    The folder in use, or None when :func:`folder` says the cache is off and JAX has none, or
    while :func:`paused`.
  """
  with _lock:
    if _pauses:
      return None
  settings = {"jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": -1}
  if jax.config.jax_compilation_cache_dir is None:
    chosen = folder()
    if chosen is None:
      return None
    settings["jax_compilation_cache_dir"] = str(chosen)
  changed = {k: v for k, v in settings.items() if getattr(jax.config, k) != v}
  for name, value in changed.items():
    jax.config.update(name, value)
  if changed:
    compilation_cache.reset_cache()
  chosen = pathlib.Path(jax.config.jax_compilation_cache_dir)
  if jax.config.jax_compilation_cache_max_size == -1 and chosen not in _pruned:
    _pruned.add(chosen)
    prune(chosen)
  return chosen


def prune(cache: pathlib.Path, max_bytes: int = MAX_BYTES) -> int:
  """Removes the least recently used programs of the cache folder ``cache`` until the rest hold
  at most ``max_bytes``. A program's last use is the latest access or change time of its files
  (:data:`SUFFIXES`; a file's access time as the file system keeps it). One process prunes a
  folder at a time; a process that finds another pruning it, or cannot write the folder, leaves it
  as it is.

  Args:
    cache: the cache folder (absent: nothing to do).
    max_bytes: the bound, >= 0.

  Returns:
    The number of programs removed.
  """
  if not cache.is_dir():
    return 0
  try:
    with filelock.FileLock(cache / ".prune.lock", blocking=False):
      programs = {}  # name -> [last use, bytes, files]
      for path in cache.iterdir():
        name = next((path.name[:-len(s)] for s in SUFFIXES if path.name.endswith(s)), None)
        if name is None:
          continue
        try:
          st = path.stat()
        except FileNotFoundError:  # removed by JAX or another process meanwhile
          continue
        entry = programs.setdefault(name, [0.0, 0, []])
        entry[0] = max(entry[0], st.st_atime, st.st_mtime)
        entry[1] += st.st_size
        entry[2].append(path)
      total, removed = sum(e[1] for e in programs.values()), 0
      for _, size, files in sorted(programs.values(), key=lambda e: e[0]):
        if total <= max_bytes:
          break
        for path in files:
          path.unlink(missing_ok=True)
        total -= size
        removed += 1
      return removed
  except OSError:  # another process holds the lock (filelock.Timeout), or the folder is read-only
    return 0


@contextlib.contextmanager
def paused():
  """Inside the block, no program reads or writes JAX's persistent compilation cache, and
  :func:`enable` does nothing; after it, the cache is as it was. For programs run in several
  threads of one process at once (:func:`fedjax_dp.sweep.run_configs`).
  """
  global _pauses, _enabled_before
  with _lock:
    _pauses += 1
    if _pauses == 1:
      _enabled_before = jax.config.jax_enable_compilation_cache
      jax.config.update("jax_enable_compilation_cache", False)
      compilation_cache.reset_cache()
  try:
    yield
  finally:
    with _lock:
      _pauses -= 1
      if _pauses == 0:
        jax.config.update("jax_enable_compilation_cache", _enabled_before)
        compilation_cache.reset_cache()
