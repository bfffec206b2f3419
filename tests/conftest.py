"""Shared pytest fixtures."""

import os
import pathlib
import shutil
import tempfile

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]
_CACHE_MADE = pytest.StashKey[str]()
_TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"

# Property-based tests (tests/test_hostile.py) try the same examples every run, so a suite's
# result does not depend on the draw; FEDJAX_DP_HYPOTHESIS=explore draws new ones (a failure
# prints the seed that replays it, --hypothesis-seed N).
from hypothesis import settings  # noqa: E402

settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile("explore" if os.environ.get("FEDJAX_DP_HYPOTHESIS") == "explore"
                      else "fixed")


def pytest_configure(config):
  """A relative ``$FEDJAX_DP_DATA`` is made absolute once, from the directory pytest started in:
  notebooks and README commands run in other working directories. JAX's persistent compilation
  cache (on by default in every run) lives in a folder of this test session's own, unless the
  environment names one (``FEDJAX_DP_JAX_CACHE``, ``off`` included): the session starts with it
  empty, as CI does, its processes (the xdist workers and the commands they start) share it,
  and the user's cache is left alone. The process that made it removes it at the end.

  The tests' programs are compiled with XLA's backend (LLVM) optimizations off,
  ``--xla_backend_optimization_level=0``, unless ``$XLA_FLAGS`` sets that level: the suite is
  bound by compilation, and a test's programs run for milliseconds. The results are the same
  computations, rounded as the unoptimized code rounds them; no test compares a float with one
  computed under other flags (bit-identity tests compare runs of one session)."""
  if os.environ.get("FEDJAX_DP_DATA"):
    os.environ["FEDJAX_DP_DATA"] = str(pathlib.Path(os.environ["FEDJAX_DP_DATA"]).resolve())
  if "FEDJAX_DP_JAX_CACHE" not in os.environ:  # xdist's workers inherit the controller's
    folder = tempfile.mkdtemp(prefix="fedjax_dp_test_jax_cache_")
    os.environ["FEDJAX_DP_JAX_CACHE"] = folder
    config.stash[_CACHE_MADE] = folder
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_backend_optimization_level" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_TEST_XLA_FLAGS}".strip()


def pytest_collection_modifyitems(items):
  """The tests marked ``heavy`` (a minute or so of one core, in one process that pytest cannot
  split) run first: the xdist workers take tests in this order, so the longest ones start while
  many short ones are left to even out the workers' ends. The rest keep their order."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def pytest_unconfigure(config):
  folder = config.stash.get(_CACHE_MADE, None)
  if folder is not None:
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """The offline copies of real data sets (``$FEDJAX_DP_DATA``).

  Defaults to ``<repo>/../shared/data``, which a fresh clone does not have;
  tests using it are skipped, saying how to enable them, when the directory is
  absent. Tests that need one data set also skip when its sub-folder is absent.
  """
  d = pathlib.Path(os.environ.get("FEDJAX_DP_DATA") or
                   _REPO.parent / "shared" / "data")
  if not d.is_dir():
    pytest.skip(f"real data sets not found at {d}: set FEDJAX_DP_DATA to a folder holding mnist/ "
                "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-...), fashion-mnist/ "
                "(same names), cifar10/ (train.tar.gz, test.tar.gz) or tff-h5/ "
                "(shakespeare_train.h5, shakespeare_test.h5) to run the tests on real data")
  return d


@pytest.fixture
def interrupt_at_round(monkeypatch):
  """``interrupt_at_round(n)``: Ctrl-C (KeyboardInterrupt) while round ``n`` is being summarized
  (``monkeypatch.undo()`` in the test removes it)."""
  import fedjax_dp.engine
  real = fedjax_dp.engine.summarize_round

  def interrupt(n):
    count = [0]

    def summarize(*a, **k):
      count[0] += 1
      if count[0] == n:
        raise KeyboardInterrupt
      return real(*a, **k)

    monkeypatch.setattr(fedjax_dp.engine, "summarize_round", summarize)

  return interrupt


@pytest.fixture
def count_compiles():
  """``count_compiles() -> (events, stop)``: a list that grows by one per XLA backend compilation
  until ``stop()`` unregisters the listener."""
  from jax import monitoring

  def start():
    events = []

    def listener(event, duration, **kwargs):
      if event == "/jax/core/compile/backend_compile_duration":
        events.append(event)

    monitoring.register_event_duration_secs_listener(listener)
    return events, lambda: monitoring.unregister_event_duration_listener(listener)

  return start


def _takes_a_file(folder: pathlib.Path) -> bool:
  """Whether this process can create a file in ``folder`` (one is made and removed)."""
  import tempfile
  try:
    fd, probe = tempfile.mkstemp(dir=folder)
  except OSError:
    return False
  os.close(fd)
  os.unlink(probe)
  return True


@pytest.fixture
def unwritable():
  """``unwritable(folder)``: no file can be created in ``folder`` until the test ends. Its mode
  is made read-only; where that does not stop this process (root ignores it), the folder is
  made immutable (``chattr +i``); where neither does, the test is skipped, saying why. Undone
  when the test ends, so that its temporary folder can be removed."""
  import shutil
  import subprocess
  undo = []

  def make(folder):
    folder = pathlib.Path(folder)
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    undo.append(lambda: folder.chmod(mode))
    if _takes_a_file(folder) and shutil.which("chattr") and subprocess.run(
        ["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
      undo.append(lambda: subprocess.run(["chattr", "-i", str(folder)], check=True))
    if _takes_a_file(folder):
      pytest.skip(f"{folder} takes files even read-only (root) and cannot be made immutable "
                  "here (chattr +i): no folder refuses this process's writes")

  yield make
  for step in reversed(undo):
    step()
