"""JAX's persistent compilation cache, shared by every process of one user on one machine.

A program compiled once (a round, an evaluation) is written to the cache folder and read back by
later processes that compile the same program, instead of compiling it again. The cache is
bounded (:data:`MAX_BYTES`, least recently used entries go first); bounding it also makes JAX
take a file lock around each read and write, so processes running at once never read an entry
another is still writing.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional

import jax
from jax.experimental.compilation_cache import compilation_cache

ENV = "FEDJAX_DP_JAX_CACHE"
OFF = "off"
MAX_BYTES = 4 * 2**30


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
    The folder in use, or None when :func:`folder` says the cache is off and JAX has none.
  """
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
