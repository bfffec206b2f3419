"""The package installs like a library: a wheel built with ``python -m build`` (no warning)
installs into a fresh virtual environment, from the package registry, and its ``fedjax-dp``
command runs there, away from this checkout. Slow (it installs JAX and the rest):
``make test-slow``."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _env() -> dict:
  """This process's environment without what would make the checkout importable or silence
  the build's warnings: the commands see only what they install."""
  return {k: v for k, v in os.environ.items()
          if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")}


def _ran(argv, cwd, **kwargs) -> str:
  """Runs ``argv``; its stdout and stderr, after checking it exited 0."""
  p = subprocess.run([str(a) for a in argv], cwd=cwd, env=_env(), capture_output=True,
                     text=True, **kwargs)
  out = p.stdout + p.stderr
  assert p.returncode == 0, f"{argv}: exit {p.returncode}\n{out[-4000:]}"
  return out


@pytest.mark.slow
def test_a_built_wheel_installs_in_a_fresh_environment_and_runs(tmp_path):
  pytest.importorskip("build", reason="needs build: pip install -e '.[test]'")
  # The sources the build reads, copied: a build in the checkout would leave build/ there, whose
  # files from an earlier build could stand in for one the package lacks.
  src = tmp_path / "src"
  shutil.copytree(ROOT / "fedjax_dp", src / "fedjax_dp",
                  ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(ROOT / name, src / name)
  log = _ran([sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", src],
             tmp_path)
  assert not re.search(r"warn|deprecat", log, re.I), log
  [wheel] = (tmp_path / "dist").glob("fedjax_dp-*.whl")

  venv = tmp_path / "venv"
  _ran([sys.executable, "-m", "venv", venv], tmp_path)
  _ran([venv / "bin" / "pip", "install", "-q", "-c", ROOT / "constraints.txt", wheel], tmp_path,
       timeout=1800)
  where = _ran([venv / "bin" / "python", "-c", "import fedjax_dp; print(fedjax_dp.__file__)"],
               tmp_path)
  assert where.strip().startswith(str(venv)), where
  assert "usage: fedjax-dp" in _ran([venv / "bin" / "fedjax-dp", "--help"], tmp_path)
  _ran([venv / "bin" / "fedjax-dp", "run", "--rounds", "1", "--no-progress", "--output-dir",
        "run"], tmp_path)
  assert (tmp_path / "run" / "summary.json").is_file()
