"""Paper reproductions, by name: ``fedjax-dp reproduce NAME --scale small --output-dir DIR``.

Each entry is ``"module:function"``; the function takes
``(scale, output_dir, data_dir, seeds, threads)`` and returns an exit status. Each module also has
``render(output_dir)``: it rewrites ``results.md`` and the figures from an earlier run's
``results.json`` and ``runs.jsonl`` without running anything (``fedjax-dp reproduce NAME
--render --output-dir DIR``), so new tables and verdicts apply to saved results. Both end with
one line, alike for every paper, naming the files written
(:func:`fedjax_dp.reproduce.runner.wrote`: ``wrote A, B, C``, a run's with ``in N s``).
"""

from __future__ import annotations

import importlib
import json
import pathlib

from fedjax_dp.errors import ConfigError, check, check_choice
from fedjax_dp.reproduce.runner import RESULT_FILES
from fedjax_dp.sweep import check_threads

REPRODUCTIONS: dict = {
    "cheng2022": "fedjax_dp.reproduce.cheng2022:run",
    "cheng2022-norms": "fedjax_dp.reproduce.blur_norms:run",
    "spfl2024": "fedjax_dp.reproduce.spfl2024:run",
    "zhu2022": "fedjax_dp.reproduce.zhu2022:run",
}


def scales(paper: str) -> dict:
  """Scale name -> one line saying what it runs (data sets, clients, rounds, seeds, presets),
  read from the paper module's ``SCALES``."""
  module = importlib.import_module(REPRODUCTIONS[paper].split(":")[0])
  return {name: _describe(settings) for name, settings in module.SCALES.items()}


def _describe(settings: dict) -> str:
  """A scale's settings in a few words (a run configuration may sit under ``config``)."""
  s = {**settings.get("config", {}), **settings}
  parts = []
  if "datasets" in s or "dataset" in s:
    parts.append("+".join(s.get("datasets", (s.get("dataset"),))))
  if "presets" in s:
    parts.append("presets " + ", ".join(s["presets"]))
  parts += [f"{s[k]} {word}" for k, word in (("max_train", "training examples"),
                                             ("num_clients", "clients"), ("rounds", "rounds"),
                                             ("seeds", "seeds")) if s.get(k) is not None]
  return ", ".join(parts)


def finished_a_run(folder) -> bool:
  """Whether a reproduction in ``folder`` has finished a run (``runs.jsonl`` holds a record)."""
  path = pathlib.Path(folder) / "runs.jsonl"
  return path.is_file() and b"\n" in path.read_bytes()


def own_files(paper: str, folder) -> list:
  """What an earlier reproduction of ``paper`` left in ``folder`` that a new one replaces
  (``--overwrite``): its result files (:data:`fedjax_dp.reproduce.runner.RESULT_FILES`), the
  runs' folder and its figures (PNGs named after the paper, ``cheng2022_*.png``)."""
  figures = sorted(p.name for p in pathlib.Path(folder).glob(f"{paper.split('-')[0]}_*.png"))
  return [*RESULT_FILES, "runs", *figures]


def run_reproduction(paper: str, scale: str, output_dir: str, data_dir=None, seeds=None,
                     threads=None) -> int:
  """Runs ``paper``'s reproduction at ``scale`` (``fedjax-dp reproduce``).

  Args:
    paper: one of :data:`REPRODUCTIONS`.
    scale: one of the paper module's ``SCALES`` (:func:`scales`).
    output_dir: the folder its results are written to.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each setting (None: the scale's).
    threads: compiled programs run at once (:func:`fedjax_dp.sweep.threads_for`; None:
      automatic).

  Returns:
    The reproduction's exit status.

  Raises:
    ConfigError: an unknown paper or scale, a bad ``seeds`` or ``threads``, or as the run.
  """
  check_choice("paper", paper, sorted(REPRODUCTIONS))
  check_threads(threads)
  module, fn = REPRODUCTIONS[paper].split(":")
  return getattr(importlib.import_module(module), fn)(
      scale=scale, output_dir=output_dir, data_dir=data_dir, seeds=seeds, threads=threads)


def render_reproduction(paper: str, output_dir: str) -> int:
  """Rewrites ``results.md`` and the figures of ``paper``'s reproduction in ``output_dir`` from
  its ``results.json`` and ``runs.jsonl``; files of another paper's reproduction are refused by
  field (``--output-dir``), before anything is written."""
  check_choice("paper", paper, sorted(REPRODUCTIONS))
  out = pathlib.Path(output_dir)
  for name in ("results.json", "runs.jsonl"):
    check((out / name).is_file(), "--output-dir", output_dir,
          f"must hold the {name} of an earlier `fedjax-dp reproduce {paper}` to --render")
  try:  # the reproduction that wrote the folder, when its results.json names it
    other = json.loads((out / "results.json").read_text()).get("reproduction", paper)
  except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
    other = paper  # refused below, by the module's own reader
  check(other == paper, "--output-dir", output_dir,
        f"holds the results of `fedjax-dp reproduce {other}`, not {paper}: rewrite them with "
        f"`fedjax-dp reproduce {other} --render --output-dir {output_dir}`")
  module = importlib.import_module(REPRODUCTIONS[paper].split(":")[0])
  try:
    return module.render(output_dir)
  except ConfigError:
    raise
  except (KeyError, TypeError, ValueError, AttributeError) as e:  # another paper's files
    raise ConfigError("--output-dir", output_dir,
                      f"does not hold files of `fedjax-dp reproduce {paper}` that --render can "
                      f"read ({type(e).__name__}: {e})") from None
