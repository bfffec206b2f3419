"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

* (The tutorials ``docs/tutorials/NAME.ipynb`` are links to the committed notebooks
  ``notebooks/NAME.ipynb``, rendered by mkdocs-jupyter with their committed outputs, never
  executed.)
* ``benchmarks/RESULTS.md`` and the records it links (``benchmarks/results/*``) become pages
  and files under ``benchmarks/``.
* A line ``<!-- fedjax-dp-help: SUBCOMMAND -->`` in a page is replaced by that subcommand's
  ``--help`` (``-``: the main parser's), read from the command line's own parser, and ``<!-- fedjax-dp-output: ARGS -->`` by
  the output of ``fedjax-dp ARGS`` (e.g. ``algorithms``), so the reference cannot drift from
  the code.
* A line ``<!-- fedjax-dp-attributes: MODULE.NAME -->`` is replaced by the ``Attributes:`` of that
  object's docstring as it reads at run time (``RunConfig``'s, completed from its fields).
* A Sphinx role in a docstring (``:class:`X```, ``:func:`X```, ...) shows as its code span alone.
"""

import contextlib
import importlib
import inspect
import io
import os
import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[1]
HELP = re.compile(r"^<!-- fedjax-dp-help: (\S+) -->$", re.M)
OUTPUT = re.compile(r"^<!-- fedjax-dp-output: (.+?) -->$", re.M)
WIDTH = "100"  # argparse's line width


def on_files(files, config):
  """Adds the benchmarks' results to the site's files."""
  bench = ROOT / "benchmarks"
  for path in [bench / "RESULTS.md", *sorted((bench / "results").glob("*"))]:
    if path.is_file():
      uri = path.relative_to(ROOT).as_posix()
      files.append(File.generated(config, uri, abs_src_path=str(path)))
  return files


def _parser():
  from fedjax_dp.cli import build_parser  # pylint: disable=import-outside-toplevel
  return build_parser()


def _subparser(name):
  parser = _parser()
  for action in parser._actions:  # pylint: disable=protected-access
    if getattr(action, "choices", None) and name in action.choices:
      return action.choices[name]
  raise KeyError(f"no subcommand {name!r} in fedjax-dp's parser")


def _help(name: str) -> str:
  """``fedjax-dp NAME --help`` as the parser formats it (``-`` for the main parser)."""
  old = os.environ.get("COLUMNS")
  os.environ["COLUMNS"] = WIDTH
  try:
    parser = _parser() if name == "-" else _subparser(name)
    return parser.format_help()
  finally:
    if old is None:
      del os.environ["COLUMNS"]
    else:
      os.environ["COLUMNS"] = old


def _output(args: str) -> str:
  """The standard output of ``fedjax-dp ARGS``; a non-zero exit fails the build."""
  from fedjax_dp.cli import main  # pylint: disable=import-outside-toplevel
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    rc = main(args.split())
  if rc != 0:
    raise RuntimeError(f"fedjax-dp {args}: exit {rc}")
  return out.getvalue()


def _block(text: str) -> str:
  return "```text\n" + text.rstrip() + "\n```"


ATTRIBUTES = re.compile(r"^<!-- fedjax-dp-attributes: ([\w.]+) -->$", re.M)


def _attributes(path: str) -> str:
  """The ``Attributes:`` section of the docstring that object ``path`` has at run time (a
  docstring completed from declarations, which the static reader does not see), as a list."""
  module, name = path.rsplit(".", 1)
  doc = inspect.getdoc(getattr(importlib.import_module(module), name)) or ""
  section = doc.split("\nAttributes:\n", 1)[1]
  items = re.findall(r"^  (\w+): (.*)$", section, re.M)
  return "**Attributes:**\n\n" + "\n".join(f"- `{k}`: {v}" for k, v in items) + "\n"


def on_page_markdown(markdown, page, config, files):
  """Fills in the generated command-line references and run-time attribute lists."""
  del page, config, files
  markdown = HELP.sub(lambda m: _block(_help(m.group(1))), markdown)
  markdown = ATTRIBUTES.sub(lambda m: _attributes(m.group(1)), markdown)
  return OUTPUT.sub(lambda m: _block(_output(m.group(1))), markdown)


# A Sphinx role in a docstring (":class:`X`", ":func:`X`", ...) reaches the page as the role's
# name before the code span; the reader sees the name alone, as code.
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj|const):(<code>)")


def on_page_content(html, page, config, files):
  """Drops the Sphinx role names that the docstrings' code spans carry."""
  return _ROLE.sub(r"\1", html)
