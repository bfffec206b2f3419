"""The ``fedjax-dp`` console script: a help request answered at once, every other command run by
:mod:`fedjax_dp.cli`.

The command line's parser is built from the settings' field metadata and the declared components,
whose modules import JAX: seconds before it could print a word. ``fedjax-dp --help`` and
``fedjax-dp SUBCOMMAND --help`` (or ``-h``) are answered instead from :data:`SNAPSHOT`, a
description of that parser (each parser's text, argument groups and arguments) that
:func:`write_snapshot` takes from the live one: argparse rebuilds the parsers from it and formats
the help exactly as the live parser does, at the terminal's width. This module imports neither
JAX nor the modules that build the parser. A help request with any other argument (a plugin's
``--plugin MODULE`` among them), or any while an installed package declares plugins (the
entry-point group :data:`fedjax_dp.components.ENTRY_POINTS`, whose components the help lists),
goes to the live parser.

``tests/test_console.py`` fails when the snapshot is not the live parser's; ``make help-snapshot``
writes it again.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import sys
from typing import Optional, Sequence

from fedjax_dp.components import ENTRY_POINTS

SNAPSHOT = pathlib.Path(__file__).with_name("_help.json")
HELP_FLAGS = ("-h", "--help")
# The attributes of an argument that its help reads, as argparse.Action takes them.
_ARGUMENT = ("option_strings", "dest", "nargs", "const", "default", "choices", "required", "help",
             "metavar")


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The ``fedjax-dp`` command: prints the help of ``argv`` from the snapshot when it is a help
  request this module answers (:func:`snapshot_help`), else runs :func:`fedjax_dp.cli.main`.

  Args:
    argv: the arguments (default: the process's, ``sys.argv[1:]``).

  Returns:
    The exit status (:mod:`fedjax_dp.cli`'s).
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  text = snapshot_help(argv)
  if text is not None:
    sys.stdout.write(text)
    return 0
  # Lazy, for start-up time: the command line's modules import JAX, which a help request skips.
  from fedjax_dp import cli  # pylint: disable=import-outside-toplevel
  return cli.main(argv)


def snapshot_help(argv: Sequence[str], snapshot: pathlib.Path = SNAPSHOT) -> Optional[str]:
  """The help text that ``fedjax-dp argv`` prints, formatted from the snapshot.

  Args:
    argv: the command's arguments.
    snapshot: the parser's description (:func:`write_snapshot`'s file).

  Returns:
    The help text; None when ``argv`` is not exactly ``--help`` or ``SUBCOMMAND --help`` (``-h``
    alike), names a subcommand the snapshot lacks, or an installed package declares plugins:
    the live parser answers those.
  """
  asks = (len(argv) == 1 and argv[0] in HELP_FLAGS
          or len(argv) == 2 and argv[1] in HELP_FLAGS and not argv[0].startswith("-"))
  if not asks or importlib.metadata.entry_points(group=ENTRY_POINTS):
    return None
  described = json.loads(snapshot.read_text())
  if len(argv) == 2:
    described = described["subcommands"]["parsers"].get(argv[0])
  return None if described is None else rebuild(described).format_help()


def describe(parser: argparse.ArgumentParser) -> dict:
  """What ``parser``'s help shows, as JSON-able data: its program name, usage, description,
  epilog and formatter; its argument groups; each argument's attributes (:data:`_ARGUMENT`) and
  group; and its subcommands (in a group of their own), each one's listed help and own
  description.

  Args:
    parser: a parser whose help is formatted by argparse's own formatters.

  Returns:
    That description, JSON-able; :func:`rebuild` makes a parser with the same help from it.

  Raises:
    ValueError: for what :func:`rebuild` cannot rebuild: a formatter class that is not
      argparse's, a mutually exclusive group, subcommands outside a group of their own, an
      argument whose default JSON cannot hold.
  """
  # pylint: disable=protected-access
  formatter = parser.formatter_class
  groups = parser._action_groups
  where = {id(a): i for i, g in enumerate(groups) for a in g._group_actions}
  subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
  for fails, what in ((getattr(argparse, formatter.__name__, None) is not formatter,
                       f"formatter {formatter!r} is not argparse's"),
                      (parser._mutually_exclusive_groups, "it has a mutually exclusive group"),
                      (any(where[id(a)] < 2 for a in subcommands),
                       "its subcommands have no group of their own (add_subparsers(title=...))")):
    if fails:
      raise ValueError(f"parser {parser.prog!r} cannot be described: {what}")
  out = {"prog": parser.prog, "usage": parser.usage, "description": parser.description,
         "epilog": parser.epilog, "formatter_class": formatter.__name__,
         "add_help": any(isinstance(a, argparse._HelpAction) for a in parser._actions),
         "groups": [{"title": g.title, "description": g.description} for g in groups[2:]],
         "arguments": []}
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      listed = {a.dest: a.help for a in action._choices_actions}
      out["subcommands"] = {
          "group": where[id(action)], "dest": action.dest, "metavar": action.metavar,
          "required": action.required, "help": action.help,
          "parsers": {name: {**({"help": listed[name]} if name in listed else {}),
                             **describe(sub)} for name, sub in action.choices.items()}}
    elif not isinstance(action, argparse._HelpAction):  # add_help makes it
      argument = {k: getattr(action, k) for k in _ARGUMENT}
      try:
        json.dumps(argument["default"])
      except TypeError:
        raise ValueError(f"parser {parser.prog!r} cannot be described: the default of "
                         f"{action.dest}, {action.default!r}, is not JSON") from None
      out["arguments"].append({"group": where[id(action)], **argument})
  return out


def rebuild(described: dict) -> argparse.ArgumentParser:
  """A parser whose help is that of the parser :func:`describe` gave ``described`` for.

  Args:
    described: :func:`describe`'s data, as JSON holds it.

  Returns:
    A parser that formats that help, at the terminal's width as argparse does; it parses
    nothing (its arguments store nothing, their types are not kept).
  """
  return _fill(argparse.ArgumentParser(**_settings(described)), described)


def _settings(described: dict) -> dict:
  """The :class:`argparse.ArgumentParser` arguments of the parser ``described``."""
  return {"prog": described["prog"], "usage": described["usage"],
          "description": described["description"], "epilog": described["epilog"],
          "add_help": described["add_help"],
          "formatter_class": getattr(argparse, described["formatter_class"])}


def _fill(parser: argparse.ArgumentParser, described: dict) -> argparse.ArgumentParser:
  """``parser`` (as made from :func:`_settings`) with the groups, arguments and subcommands
  ``described``."""
  # pylint: disable=protected-access
  subcommands = described.get("subcommands")
  groups = [parser._positionals, parser._optionals]
  for i, group in enumerate(described["groups"], start=2):
    if subcommands is not None and subcommands["group"] == i:  # add_subparsers makes its group
      action = parser.add_subparsers(
          title=group["title"], description=group["description"], dest=subcommands["dest"],
          metavar=subcommands["metavar"], required=subcommands["required"],
          help=subcommands["help"])
      for name, sub in subcommands["parsers"].items():
        listed = {"help": sub["help"]} if "help" in sub else {}
        _fill(action.add_parser(name, **listed, **_settings(sub)), sub)
    else:
      parser.add_argument_group(group["title"], group["description"])
    groups.append(parser._action_groups[-1])
  for argument in described["arguments"]:
    groups[argument["group"]]._add_action(argparse.Action(**{k: argument[k] for k in _ARGUMENT}))
  return parser


def write_snapshot(path: pathlib.Path = SNAPSHOT) -> None:
  """Writes :func:`describe` of the live ``fedjax-dp`` parser to ``path`` (``make
  help-snapshot``), as JSON.

  Raises:
    ValueError: as :func:`describe`, for a parser it cannot describe.
  """
  # Lazy: the live parser's modules import JAX, which this module's help requests skip.
  from fedjax_dp.cli import build_parser  # pylint: disable=import-outside-toplevel
  path.write_text(json.dumps(describe(build_parser()), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
  sys.exit(main())
