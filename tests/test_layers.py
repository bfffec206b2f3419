"""The package's layers (pyproject.toml's import-linter contract) are kept: no module imports one
above its own layer, directly or through others, function-local imports included."""

import os
import pathlib
import pkgutil
import subprocess
import sys
import tomllib

import fedjax_dp

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINT = ("import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())")


def _lint(config: pathlib.Path) -> subprocess.CompletedProcess:
  """``lint-imports`` on this checkout's package with ``config``, no cache."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
  return subprocess.run([sys.executable, "-c", LINT, str(config), "--no-cache"],
                        cwd=ROOT, env=env, capture_output=True, text=True)


def _contract() -> dict:
  return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_layers_are_kept():
  done = _lint(ROOT / "pyproject.toml")
  assert done.returncode == 0, done.stdout + done.stderr
  assert "1 kept, 0 broken" in done.stdout


def test_every_module_of_the_package_has_a_layer():
  """A new module is placed in the layers, not left outside the contract."""
  (contract,) = _contract()["contracts"]
  named = {name.strip().strip("()") for layer in contract["layers"] for name in layer.split("|")}
  modules = {m.name for m in pkgutil.iter_modules(fedjax_dp.__path__)}
  assert modules <= named, f"modules in no layer: {sorted(modules - named)}"


def test_an_upward_import_breaks_the_contract(tmp_path):
  """The check finds real imports: with the round below the transforms it imports, it fails and
  names the import."""
  config = tmp_path / "inverted.toml"
  config.write_text('[tool.importlinter]\nroot_package = "fedjax_dp"\n\n'
                    '[[tool.importlinter.contracts]]\nname = "inverted"\ntype = "layers"\n'
                    'containers = ["fedjax_dp"]\nlayers = ["transforms", "round"]\n')
  done = _lint(config)
  assert done.returncode == 1, done.stdout + done.stderr
  assert "fedjax_dp.round is not allowed to import fedjax_dp.transforms" in done.stdout
