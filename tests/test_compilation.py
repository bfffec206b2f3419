"""The persistent compilation cache: where it lives, how it is turned off, and that a second
process reads what the first compiled."""

import os
import pathlib
import subprocess
import sys
import time

import filelock

from fedjax_dp import compilation

_PROGRAM = """
import jax, jax.numpy as jnp
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()  # compiled before the cache is on
from fedjax_dp import compilation
print("folder", compilation.enable())
jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(5)).block_until_ready()
print("hits", len(hits))
print("bound", jax.config.jax_compilation_cache_max_size)
"""


def _run(env):
  out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True,
                       check=True).stdout
  return dict(line.split(" ", 1) for line in out.splitlines())


def test_folder_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv(compilation.ENV, "OFF")
  assert compilation.folder() is None
  monkeypatch.setenv(compilation.ENV, str(tmp_path / "c"))
  assert compilation.folder() == tmp_path / "c"
  monkeypatch.delenv(compilation.ENV)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert compilation.folder() == tmp_path / "x" / "fedjax_dp" / "jax"


def test_a_second_process_reads_the_program_the_first_compiled(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env[compilation.ENV] = str(tmp_path / "cache")
  # A program beyond the bound, unused for a day: the first process removes it (a sparse file,
  # so the test writes no gigabytes).
  (tmp_path / "cache").mkdir()
  old = tmp_path / "cache" / "jit_old-cache"
  with open(old, "wb") as f:
    f.truncate(compilation.MAX_BYTES + 1)
  os.utime(old, (time.time() - 86400,) * 2)
  first = _run(env)
  assert pathlib.Path(first["folder"]) == tmp_path / "cache" and not old.exists()
  # JAX's own bound stays off, so JAX neither locks nor keeps a last-use file per program.
  assert first["hits"] == "0" and first["bound"] == "-1"
  names = {p.name for p in (tmp_path / "cache").iterdir()}
  assert any(n.endswith("-cache") for n in names)
  assert ".lockfile" not in names and not any(n.endswith("-atime") for n in names)
  assert int(_run(env)["hits"]) > 0
  env[compilation.ENV] = "off"
  assert _run(env) == {"folder": "None", "hits": "0", "bound": "-1"}


def _program(cache, name, size, last_use, suffix="-cache"):
  path = cache / f"{name}{suffix}"
  path.write_bytes(b"x" * size)
  os.utime(path, (last_use, last_use))
  return path


def test_prune_removes_the_least_recently_used_programs_beyond_the_bound(tmp_path):
  cache = tmp_path / "cache"
  assert compilation.prune(cache, 0) == 0  # no folder yet
  cache.mkdir()
  a = [_program(cache, "jit_a", 100, 1000), _program(cache, "jit_a", 8, 5000, "-atime")]
  b = _program(cache, "jit_b", 100, 2000)
  c = _program(cache, "jit_c", 100, 3000)
  other = cache / "notes.txt"
  other.write_text("not a program")
  # 308 bytes: b is the least recently used (a's last use is its -atime file's, 5000).
  assert compilation.prune(cache, 250) == 1
  assert not b.exists() and all(p.exists() for p in a) and c.exists()
  assert compilation.prune(cache, 208) == 0
  # While another process prunes the folder, this one leaves it alone.
  with filelock.FileLock(cache / ".prune.lock"):
    assert compilation.prune(cache, 0) == 0
  assert compilation.prune(cache, 0) == 2
  assert not any(p.exists() for p in a + [c]) and other.exists()


def test_a_cache_folder_the_process_cannot_write_is_left_as_it_is(tmp_path, monkeypatch):
  kept = _program(tmp_path, "jit_a", 100, 1000)

  def read_only(path, **kwargs):
    raise PermissionError(13, "Permission denied", str(path))

  monkeypatch.setattr(filelock, "FileLock", read_only)
  assert compilation.prune(tmp_path, 0) == 0 and kept.exists()


def test_a_run_keeps_its_programs_in_the_cache_unless_told_not_to(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  main = "import sys; from fedjax_dp.cli import main; sys.exit(main(sys.argv[1:]))"
  for flags, kept in (([], True), (["--no-compilation-cache"], False)):
    cache = tmp_path / f"cache{len(flags)}"
    env[compilation.ENV] = str(cache)
    subprocess.run([sys.executable, "-c", main, "run", "--rounds", "1", "--num-clients", "20",
                    "--no-progress", "--output-dir", str(tmp_path / f"run{len(flags)}"), *flags],
                   env=env, check=True, capture_output=True)
    assert (cache.is_dir() and any(n.name.startswith("jit_") for n in cache.iterdir())) == kept


_PAUSED = """
import os, jax, jax.numpy as jnp
from fedjax_dp import compilation
folder = compilation.enable()
entries = lambda: len([n for n in (os.listdir(folder) if folder.is_dir() else [])
                       if n.startswith("jit_")])
with compilation.paused():
  assert compilation.enable() is None
  jax.jit(lambda x: jnp.cos(x) * 2)(jnp.ones(4)).block_until_ready()
print("inside", entries())
jax.jit(lambda x: jnp.tan(x) * 5)(jnp.ones(6)).block_until_ready()
print("after", entries())
"""


def test_programs_compiled_while_paused_stay_out_of_the_cache(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env[compilation.ENV] = str(tmp_path / "cache")
  out = subprocess.run([sys.executable, "-c", _PAUSED], env=env, capture_output=True, text=True,
                       check=True).stdout
  counts = {k: int(v) for k, v in (line.split(" ", 1) for line in out.splitlines())}
  assert counts["inside"] == 0 and counts["after"] > 0  # nothing written inside, then again
