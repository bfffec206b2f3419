"""The documentation's examples run: the README's and every ``docs/**/*.md`` page's Python
examples as written (at their stated, small sizes), and every shell command of their ```bash
blocks and every concrete `fedjax-dp ...` in their paragraphs through :func:`fedjax_dp.cli.main`
at a tiny size.

Commands run in order (the README, then the pages by path) in one working folder, as a reader
would type them, with ``--rounds 2``, at most 60 clients, 200 test examples (and 3,000 training
examples of a real data set) and fewer audit trials; ``../shared/data`` is replaced by the
``shared_data_dir`` fixture (the block is skipped when it is absent). A block preceded by the
HTML comment ``<!-- not run in tests: REASON -->`` (an install, a server, the test suite itself, a
reproduction at its measured scale), which the renderers hide, is skipped with that reason; any
other line must be a ``fedjax-dp`` command.
"""

import json
import math
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README, then every page of the documentation site, in a fixed order.
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!-- not run in tests: (.+?) -->$")


def _name(path: pathlib.Path) -> str:
  return path.relative_to(ROOT).as_posix()


def _python_block(path: pathlib.Path, heading: str) -> str:
  """The first ```python block after the heading line ``# heading`` (any level) in ``path``."""
  text = path.read_text()
  m = re.search(rf"^#+ {re.escape(heading)}$", text, re.M)
  assert m, f"no heading {heading!r} in {_name(path)}"
  block = re.search(r"```python\n(.*?)```", text[m.end():], re.S)
  assert block, f"no python block after {heading!r} in {_name(path)}"
  return block.group(1)


def test_readme_python_example_runs_and_reports_its_privacy():
  pytest.importorskip("pandas")
  code = _python_block(README, "From Python").replace("rounds=20", "rounds=2")
  scope = {}
  exec(compile(code, "README", "exec"), scope)
  s = scope["result"].summary
  assert s["rounds"] == 2 and s["formal_guarantee"] is True
  assert s["epsilon"] == pytest.approx(4.0, rel=1e-3)
  rows = scope["sweep"].rows
  assert [r["target_epsilon"] for r in rows] == [2.0, 8.0]
  assert all(0 <= r["accuracy_mean"] <= 1 and r["seeds"] == 2 for r in rows)


def test_write_your_own_algorithm_example_runs_and_derives_its_privacy(capsys):
  scope = {}
  page = ROOT / "docs" / "how-to" / "own-algorithm.md"
  exec(compile(_python_block(page, "Write your own algorithm"), _name(page), "exec"), scope)
  s = scope["result"].summary
  assert s["formal_guarantee"] is True and 0 < s["epsilon"] < math.inf
  assert 0.0 <= s["final_accuracy"] <= 1.0 and s["rounds"] == 10
  assert s["noise_multiplier"] == pytest.approx(1.0)
  # The same round with a median: no piece adds noise, so no guarantee.
  import dataclasses
  import fedjax_dp
  median = dataclasses.replace(scope["rnd"], aggregator=lambda hp: fedjax_dp.aggregators.robust.get(
      "coordinate_median"))
  r = fedjax_dp.simulate(round=median, num_clients=200, rounds=1,
                         hparams={"mu": 0.1, "client_lr": 0.1, "clip": 0.5,
                                  "noise_multiplier": 1.0})
  assert r.summary["formal_guarantee"] is False and r.summary["epsilon"] is None


def test_json_settings_blocks_are_valid_config_files(tmp_path):
  from fedjax_dp.algorithms import refuse_unused
  from fedjax_dp.config import load_config_file, make_config
  blocks = [b for path in DOCS for b in re.findall(r"```json\n(.*?)```", path.read_text(), re.S)]
  assert blocks
  for i, text in enumerate(blocks):
    path = tmp_path / f"{i}.json"
    path.write_text(text)
    settings = load_config_file(str(path))
    refuse_unused(make_config(settings), set(settings))  # every setting given is read


def test_python_api_example_runs_with_a_flax_module():
  pytest.importorskip("pandas")
  page = ROOT / "docs" / "how-to" / "python.md"
  code = _python_block(page, "From Python").replace("rounds=20", "rounds=2")
  scope = {}
  exec(compile(code, _name(page), "exec"), scope)
  result = scope["result"]
  assert result.summary["model"]["name"] == "Net"
  assert result.summary["config"]["run"]["model"] == "Net"
  assert result.summary["data"]["name"] == "digits"
  acc = result.metrics["test_accuracy"]
  assert acc.shape == (2,) and 0 <= acc[-1] <= 1
  df = result.to_dataframe()
  assert list(df.index) == [1, 2] and "epsilon" in df.columns and "train_loss" in df.columns
  assert df.index.dtype == "int64"


# Files the README's commands assume the reader has.
READER_FILES = {"my.json": {"clip": 0.3, "target_epsilon": 4.0}}
TINY = {"--rounds": 2, "--max-test": 200}
MAX_CLIENTS = 60


def _split_comment(line: str) -> tuple:
  """``command  # comment`` -> (command, comment)."""
  m = re.search(r"(^|\s)#\s", line)
  return (line, "") if m is None else (line[:m.start()].strip(), line[m.end():].strip())


def _not_run(text: str, start: int):
  """The reason of the ``<!-- not run in tests: REASON -->`` line right before the block that
  starts at ``start`` (blank lines between allowed), or None."""
  before = [line for line in text[:start].splitlines() if line.strip()]
  m = MARKER.match(before[-1].strip()) if before else None
  return m.group(1) if m else None


def _bash_blocks() -> list:
  """Each ```bash block of the documentation as (its file and line, the reason it is not run or
  None, [(command, comment)]); continued lines joined."""
  blocks = []
  for path in DOCS:
    text = path.read_text()
    for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M):
      commands, pending = [], ""
      for line in m.group(1).splitlines():
        if line.rstrip().endswith("\\"):
          pending += line.rstrip()[:-1] + " "
          continue
        commands.append(_split_comment(pending + line))
        pending = ""
      where = f"{_name(path)}:{text.count(chr(10), 0, m.start()) + 1}"
      blocks.append((where, _not_run(text, m.start()), commands))
  return blocks


def _prose(text: str) -> str:
  """The text outside code blocks and HTML comments."""
  return re.sub(r"<!--.*?-->", "", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.S)


def _inline_commands() -> list:
  """The `fedjax-dp ...` spans of the documentation's text outside code blocks, in order, once
  each."""
  spans = [c for path in DOCS for c in re.findall(r"`(fedjax-dp [^`]*)`", _prose(path.read_text()))]
  return list(dict.fromkeys(" ".join(c.split()) for c in spans))


def _is_synopsis(command: str) -> bool:
  """A usage line with placeholders (DIR, PAPER, NAME, [optional], a|b, ...), not a command."""
  return bool(re.search(r"\b[A-Z]{2,}\b|\[|\||\.\.\.", command))


def _set(argv: list, flag: str, value) -> None:
  if flag in argv:
    argv[argv.index(flag) + 1] = str(value)
  else:
    argv += [flag, str(value)]


def _tiny(argv: list, data_dir) -> list:
  """The command at a tiny size, reading real data from ``data_dir``."""
  argv = [str(data_dir) if a == "../shared/data" else a for a in argv]
  if argv[0] in ("run", "sweep"):
    for flag, value in TINY.items():
      _set(argv, flag, value)
    clients = min(int(argv[argv.index("--num-clients") + 1]) if "--num-clients" in argv else 700,
                  MAX_CLIENTS)
    _set(argv, "--num-clients", clients)
    if "--cohort-size" in argv:
      _set(argv, "--cohort-size", min(int(argv[argv.index("--cohort-size") + 1]), clients))
    if "--data-dir" in argv and "natural" not in argv:  # natural partitions refuse --max-train
      _set(argv, "--max-train", 3000)
  if argv[0] == "audit" and "--mechanism" in argv:
    _set(argv, "--trials", 4000)
  return argv


def _run(command: str, expected: int, data_dir, capsys) -> str:
  """Runs one README command (``fedjax-dp ...``) at the tiny size; returns its stdout."""
  from fedjax_dp.cli import main
  words = shlex.split(command)
  assert words[0] == "fedjax-dp", (
      f"a shell command the tests cannot run, in a block not marked not run in tests: {command}")
  argv = _tiny(words[1:], data_dir)
  capsys.readouterr()
  try:
    rc = main(argv)
  except SystemExit as e:  # --help
    rc = e.code
  out, err = capsys.readouterr()
  assert rc == expected, f"{command}\n-> fedjax-dp {shlex.join(argv)}: exit {rc}\n{err[-2000:]}"
  if argv[0] == "run":
    folder = (argv[argv.index("--output-dir") + 1] if "--output-dir" in argv else
              argv[argv.index("--resume") + 1] if "--resume" in argv else "runs/quickstart")
    s = json.loads(pathlib.Path(folder, "summary.json").read_text())
    assert s["rounds"] == 2 and 0 <= s["final_accuracy"] <= 1
  if argv[0] == "plot":
    assert pathlib.Path(argv[argv.index("--out") + 1]).stat().st_size > 0
  if argv[0] == "privacy":
    assert json.loads(out)["formal_guarantee"] is True
  return out


def _reader_folder(d: pathlib.Path) -> pathlib.Path:
  """``d``, made, holding the files the commands assume the reader has."""
  d.mkdir(parents=True, exist_ok=True)
  for name, content in READER_FILES.items():
    (d / name).write_text(json.dumps(content))
  return d


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """The folder the documentation's inline commands run in; each bash block runs in a folder of
  its own under it. A block is self-contained (it reads only what it writes): under ``pytest -n``
  the blocks may run in different processes, and two pages may show the same command."""
  return _reader_folder(tmp_path_factory.mktemp("readme"))


BLOCKS = _bash_blocks()


@pytest.mark.parametrize("where,not_run,commands", BLOCKS, ids=[w for w, _, _ in BLOCKS])
def test_bash_block_runs_at_a_tiny_size(where, not_run, commands, workdir, monkeypatch, request,
                                        capsys):
  if not_run is not None:
    pytest.skip(f"{where}: {not_run}")
  monkeypatch.chdir(_reader_folder(workdir / re.sub(r"\W", "_", where)))
  to_run = [(c, why) for c, why in commands if c]
  data_dir = (request.getfixturevalue("shared_data_dir")
              if any("../shared/data" in c for c, _ in to_run) else None)
  for command, why in to_run:
    _run(command, 1 if "must fail (exit 1)" in why else 0, data_dir, capsys)


def test_inline_commands_run_or_are_in_a_bash_block(workdir, monkeypatch, capsys):
  """A concrete `fedjax-dp ...` in the text is one of the bash blocks' commands (the same words in
  order, e.g. `fedjax-dp reproduce zhu2022 --scale small`), tested or marked there, or runs here;
  synopses with placeholders are not commands."""
  block_commands = [shlex.split(c) for _, _, commands in BLOCKS for c, _ in commands]

  def in_a_block(words):
    def subsequence(seq):
      it = iter(seq)
      return all(w in it for w in words)
    return any(subsequence(b) for b in block_commands)

  monkeypatch.chdir(workdir)
  ran = []
  for i, command in enumerate(_inline_commands()):
    words = shlex.split(command)
    if _is_synopsis(command) or in_a_block(words):
      continue
    if words[1] == "run" and "--output-dir" not in words:  # not into an earlier run's folder
      command += f" --output-dir runs/inline{i}"
    _run(command, 0, None, capsys)
    ran.append(command)
  assert ran  # e.g. `fedjax-dp algorithms`, `fedjax-dp run --release private`


def test_readers_never_see_not_run_in_tests():
  """"not run in tests" is said only in the hidden marker, never in text a reader sees."""
  for path in DOCS:
    text = path.read_text()
    visible = re.sub(r"^<!-- not run in tests: .+? -->$", "", text, flags=re.M)
    assert "not run in tests" not in visible, _name(path)
    for line in text.splitlines():
      if "<!-- not run in tests" in line:
        assert MARKER.match(line.strip()), f"{_name(path)}: a malformed marker: {line}"


def test_markers_precede_bash_blocks():
  """Each marker is followed by a ```bash block, so none is silently ignored."""
  for path in DOCS:
    text = path.read_text()
    for m in re.finditer(r"^<!-- not run in tests: .+? -->\n(\s*\n)*(.*)$", text, re.M):
      assert m.group(2) == "```bash", f"{_name(path)}: a marker before {m.group(2)!r}"
