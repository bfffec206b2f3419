"""``fedjax-dp --help``: every flag of every subcommand says what it does, its default and, for a
choice, exactly the values the code accepts."""

import dataclasses
import re

import pytest

from fedjax_dp.cli import build_parser, main
from fedjax_dp.config import RunConfig
from fedjax_dp.errors import ConfigError

SUBCOMMANDS = ("run", "sweep", "privacy", "reproduce", "algorithms", "audit", "plot")


def _help(capsys, monkeypatch, *argv) -> str:
  monkeypatch.setenv("COLUMNS", "10000")  # one line per entry: no wrapping inside names
  with pytest.raises(SystemExit) as done:
    main([*argv, "--help"])
  assert done.value.code == 0
  return capsys.readouterr().out


def _entries(text: str) -> dict:
  """The option and positional entries of a help text: first word (``--flag``, ``-h``, a
  positional's name) -> the rest of the entry (metavar and description, wrapping joined)."""
  out, key, section = {}, None, False
  for line in text.splitlines():
    if re.match(r"^\S.*:$", line):  # a section header ("options:", "positional arguments:")
      section = line in ("options:", "positional arguments:") or line.endswith("):")
      key = None
    elif section and re.match(r"^  \S", line):
      first = line.split()[0].rstrip(",")
      key = first
      out[key] = line.strip()[len(first):]
    elif section and key is not None and line.startswith("   "):
      out[key] += " " + line.strip()
    elif not line.strip():
      key = None
  return {k: " ".join(v.split()) for k, v in out.items()}


def _actions(sub: str) -> dict:
  """Subcommand ``sub``'s argparse actions by their first option string (a positional: its
  metavar or name)."""
  parser = build_parser()._subparsers._group_actions[0].choices[sub]
  return {(a.option_strings[0] if a.option_strings else a.metavar or a.dest): a
          for a in parser._actions}


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_option_has_a_description_and_its_default(sub, capsys, monkeypatch):
  entries = _entries(_help(capsys, monkeypatch, sub))
  actions = _actions(sub)
  assert set(entries) == set(actions)  # the parse found every flag and positional
  for name, text in entries.items():
    a = actions[name]
    description = text
    if a.option_strings and a.nargs != 0:  # drop the metavar
      description = text[len(a.metavar or a.dest.upper()) + 1:] if a.choices is None else \
          text.split(" ", 1)[-1]
    assert len(description.split()) >= 2, (sub, name, text)
    flag_only = a.nargs == 0  # --overwrite, --json, -h: no value, no default to state
    if not flag_only and not a.required and a.option_strings:
      assert "default" in description.lower(), (sub, name, text)


def test_top_level_help_is_plain_text_listing_every_subcommand(capsys, monkeypatch):
  text = _help(capsys, monkeypatch)
  assert "``" not in text
  for sub in SUBCOMMANDS:
    assert re.search(rf"^    {sub}\b", text, re.M), sub


def _expected_values() -> dict:
  """Each choice field of RunConfig -> the tuple of the code that decides it."""
  from fedjax_dp.aggregators.base import DENOMINATORS
  from fedjax_dp import components
  from fedjax_dp.attacks import KNOWLEDGE
  from fedjax_dp.client import OPTIMIZERS
  from fedjax_dp.data.partition import PARTITIONERS
  from fedjax_dp.data.specs import SPECS
  from fedjax_dp.engine import PLACEMENTS
  from fedjax_dp.models import CONV_IMPLS
  from fedjax_dp.privacy.ledger import ACCOUNTANTS
  from fedjax_dp.round import WEIGHTINGS
  from fedjax_dp.sampling import SAMPLINGS
  expected = {
      "algorithm": sorted(components.names("algorithm")), "dataset": [s.name for s in SPECS],
      "partition": PARTITIONERS, "model": components.names("model"), "conv_impl": CONV_IMPLS, "sampling": SAMPLINGS,
      "placement": PLACEMENTS, "client_optimizer": OPTIMIZERS, "server_optimizer": OPTIMIZERS,
      "weighting": WEIGHTINGS, "denominator": DENOMINATORS, "accountant": ACCOUNTANTS,
      "attack": components.names("attack"), "attacker_knowledge": KNOWLEDGE,
      "aggregator": components.names("aggregator")}
  if "compute_dtype" in {f.name for f in dataclasses.fields(RunConfig)}:
    from fedjax_dp.models import COMPUTE_DTYPES
    expected["compute_dtype"] = COMPUTE_DTYPES
  return {k: list(v) for k, v in expected.items()}


@pytest.mark.parametrize("sub", ("run", "sweep"))
def test_config_flags_list_the_codes_own_values_and_the_fields_default(sub, capsys, monkeypatch):
  entries = _entries(_help(capsys, monkeypatch, sub))
  expected = _expected_values()
  listed = {}
  for f in dataclasses.fields(RunConfig):
    if f.name in ("options", "plugins"):  # --set NAME=VALUE and --plugin MODULE, repeatable
      continue
    text = entries["--" + f.name.replace("_", "-")]
    default = "none" if f.default is None else str(f.default).lower()
    assert re.search(rf"\(default: {re.escape(default)}[;)]", text), (f.name, text)
    m = re.search(r"; one of: ([^)]*)\)$", text)
    if m:
      listed[f.name] = m.group(1).split(", ")
  assert listed == expected


def test_every_config_field_has_help_and_refuses_values_outside_its_list():
  for f in dataclasses.fields(RunConfig):
    assert len(f.metadata.get("help", "").split()) >= 3, f.name
  for name in _expected_values():
    with pytest.raises(ConfigError) as e:
      RunConfig(**{name: "bogus"})
    assert e.value.field == name


def test_algorithm_flag_points_to_the_algorithms_listing(capsys, monkeypatch):
  assert "fedjax-dp algorithms" in _entries(_help(capsys, monkeypatch, "run"))["--algorithm"]


def test_reproduce_help_lists_every_papers_scales(capsys, monkeypatch):
  import importlib
  from fedjax_dp.reproduce import REPRODUCTIONS
  text = _help(capsys, monkeypatch, "reproduce")
  for paper, ref in REPRODUCTIONS.items():
    module = importlib.import_module(ref.split(":")[0])
    for scale in module.SCALES:
      line = re.search(rf"^  {paper} --scale {re.escape(scale)}: (.+)$", text, re.M)
      assert line, (paper, scale)
      assert "rounds" in line.group(1) or "presets" in line.group(1), (paper, scale)
