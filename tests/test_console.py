"""The ``fedjax-dp`` console script answers a help request from the parser's snapshot, without
JAX, with the live parser's exact text; the snapshot is the live parser's."""

import argparse
import json
import pathlib
import subprocess
import sys
import tomllib

import pytest

from fedjax_dp import console
from fedjax_dp.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("run", "sweep", "privacy", "reproduce", "algorithms", "audit", "plot")


def test_the_snapshot_is_the_live_parsers():
  live = json.loads(json.dumps(console.describe(build_parser())))
  assert json.loads(console.SNAPSHOT.read_text()) == live, (
      f"{console.SNAPSHOT.name} is not the command line's parser: write it again with "
      "`make help-snapshot` (or: python -c 'from fedjax_dp import console; "
      "console.write_snapshot()') and commit it")


@pytest.mark.parametrize("width", ("50", "100", "10000"))
def test_every_help_request_prints_the_live_parsers_text(width, monkeypatch):
  monkeypatch.setenv("COLUMNS", width)  # argparse wraps at the terminal's width
  live = build_parser()
  subparsers = next(a for a in live._actions if isinstance(a, argparse._SubParsersAction))
  assert sorted(subparsers.choices) == sorted(SUBCOMMANDS)
  assert console.snapshot_help(["--help"]) == console.snapshot_help(["-h"]) == live.format_help()
  for sub in SUBCOMMANDS:
    text = subparsers.choices[sub].format_help()
    assert console.snapshot_help([sub, "--help"]) == console.snapshot_help([sub, "-h"]) == text


def test_a_help_request_imports_neither_jax_nor_the_command_lines_modules():
  code = ("import sys; from fedjax_dp.console import main; main(['run', '--help']); "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy') "
          "or m in ('fedjax_dp.cli', 'fedjax_dp.config')))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        check=True)
  assert done.stdout.startswith("usage: fedjax-dp run ")
  assert done.stdout.rstrip().endswith("[]"), done.stdout[-300:]


@pytest.mark.parametrize("argv", (
    [], ["run"], ["run", "--rounds", "3", "--help"], ["run", "--help", "--plugin", "mine"],
    ["--plugin", "mine", "--help"], ["--help", "--help"], ["nosuch", "--help"],
    ["run", "--help", "extra"]))
def test_only_an_exact_help_request_is_answered_from_the_snapshot(argv):
  assert console.snapshot_help(argv) is None


def test_installed_plugins_send_help_to_the_live_parser(monkeypatch):
  """An installed package's components are in the live parser's help, not in the snapshot."""
  monkeypatch.setattr(console.importlib.metadata, "entry_points",
                      lambda group: ["a plugin"] if group == console.ENTRY_POINTS else [])
  assert console.snapshot_help(["run", "--help"]) is None


def test_other_commands_run_the_command_line(capsys):
  argv = ["privacy", "--sampling-prob", "0.01", "--noise-multiplier", "1.1", "--rounds", "10",
          "--delta", "1e-5"]
  assert console.main(argv) == 0
  assert json.loads(capsys.readouterr().out)["noise_multiplier"] == 1.1
  assert console.main(["run", "--rounds", "x"]) == 2  # the command line's one-line refusal
  assert "invalid rounds='x'" in capsys.readouterr().err


def test_describe_refuses_what_it_cannot_rebuild():
  parser = argparse.ArgumentParser(prog="p")
  parser.add_mutually_exclusive_group().add_argument("--a")
  with pytest.raises(ValueError, match="mutually exclusive"):
    console.describe(parser)
  parser = argparse.ArgumentParser(prog="p")
  parser.add_argument("--b", type=float, default=float)
  with pytest.raises(ValueError, match="the default of b"):
    console.describe(parser)


def test_the_snapshot_installs_with_the_package_and_is_the_console_script():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())
  assert console.SNAPSHOT.name in project["tool"]["setuptools"]["package-data"]["fedjax_dp"]
  assert project["project"]["scripts"]["fedjax-dp"] == "fedjax_dp.console:main"
