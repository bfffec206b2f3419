"""JAX's persistent compilation cache, shared by every process of one user on one machine.

A program compiled once (a round, an evaluation) is written to the cache folder and read back by
later processes that compile the same program, instead of compiling it again. The cache is
bounded (:data:`MAX_BYTES`, least recently used entries go first); bounding it also makes JAX
take a file lock around each read and write, so processes running at once never read an entry
another is still writing.

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

import jax
from jax.experimental.compilation_cache import compilation_cache

ENV = "FEDJAX_DP_JAX_CACHE"
OFF = "off"
MAX_BYTES = 4 * 2**30
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
  ``JAX_COMPILATION_CACHE_DIR``) is kept, and so is a size bound already set. JAX decides at a
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
  if jax.config.jax_compilation_cache_max_size == -1:
    settings["jax_compilation_cache_max_size"] = MAX_BYTES
  changed = {k: v for k, v in settings.items() if getattr(jax.config, k) != v}
  for name, value in changed.items():
    jax.config.update(name, value)
  if changed:
    compilation_cache.reset_cache()
  return pathlib.Path(jax.config.jax_compilation_cache_dir)


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
