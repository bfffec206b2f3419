"""Paper reproductions, by name: ``fedjax-dp reproduce NAME --scale small --output-dir DIR``.

Each entry is ``"module:function"``; the function takes
``(scale, output_dir, data_dir, seeds, threads, resume)`` and returns an exit status (``resume``:
continue the reproduction in ``output_dir``, running only the runs ``runs.jsonl`` has no record
of: :func:`fedjax_dp.reproduce.runner.run_jobs`). Each module also has
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
from typing import Optional

from fedjax_dp.errors import ConfigError, check, check_choice
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.reproduce.runner import ARGUMENTS, RESULT_FILES, num_seeds
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


def _arguments(paper: str, scale: str, seeds, data_dir) -> dict:
  """What a reproduction of ``paper`` runs (its jobs follow from these alone), checked: the scale,
  the seeds (the scale's where None) and the data folder as given."""
  module = importlib.import_module(REPRODUCTIONS[paper].split(":")[0])
  check_choice("scale", scale, sorted(module.SCALES))
  return {"paper": paper, "scale": scale, "seeds": num_seeds(seeds, module.SCALES[scale]["seeds"]),
          "data_dir": data_dir}


def resumed_arguments(paper: str, output_dir, given: dict) -> dict:
  """The arguments the reproduction in ``output_dir`` began with (its ``reproduction.json``,
  :data:`fedjax_dp.reproduce.runner.ARGUMENTS`), with ``"finished"``; a value of ``given``
  (``scale``, ``seeds``, ``data_dir``; None: left out) that differs from them is refused.

  Args:
    paper: the paper ``--resume`` was given with.
    output_dir: the reproduction's folder.
    given: the arguments given with ``--resume``, by name (None: left out).

  Returns:
    ``{"paper", "scale", "seeds", "data_dir", "finished"}`` as recorded.

  Raises:
    ConfigError: naming ``resume`` when the folder holds no reproduction that can be resumed (or
      one of another paper, or a damaged file), else the field given that differs.
  """
  path = pathlib.Path(output_dir) / ARGUMENTS
  check(path.is_file(), "resume", str(output_dir), f"holds no {ARGUMENTS} (the arguments a "
        "reproduction records as it begins): no reproduction to resume there; start one with "
        "--output-dir (--overwrite to replace an earlier one's files)")
  try:
    recorded = json.loads(path.read_bytes())
  except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    recorded = None
  check(isinstance(recorded, dict) and set(recorded) == {"paper", "scale", "seeds", "data_dir",
                                                         "finished"},
        "resume", str(path), "is not the arguments of a reproduction (changed or damaged): "
        "start the reproduction again with --overwrite")
  check(recorded["paper"] == paper, "paper", paper, f"differs from the reproduction in "
        f"{output_dir}, of {recorded['paper']}: resume that one with fedjax-dp reproduce "
        f"{recorded['paper']} --resume {output_dir}")
  for name, value in given.items():
    check(value is None or value == recorded[name], name, value, f"differs from the resumed "
          f"reproduction's {name}={recorded[name]!r} ({path}): leave it out, or give that value")
  return recorded


def run_reproduction(paper: str, scale: Optional[str], output_dir: str, data_dir=None, seeds=None,
                     threads=None, resume: bool = False) -> int:
  """Runs ``paper``'s reproduction at ``scale`` (``fedjax-dp reproduce``), or continues the one in
  ``output_dir`` (``resume``, ``fedjax-dp reproduce --resume``).

  A new reproduction records its paper, scale, seeds and data folder in ``output_dir`` as it
  begins (``reproduction.json``, written atomically; ``"finished"`` once it has ended); a resumed
  one runs with them, runs only the runs its ``runs.jsonl`` has no record of, and then writes its
  results from every record, as the reproduction uninterrupted would have. A finished one resumed
  runs and writes nothing, saying so.

  Args:
    paper: one of :data:`REPRODUCTIONS`.
    scale: one of the paper module's ``SCALES`` (:func:`scales`); None: "small", or the resumed
      reproduction's.
    output_dir: the folder its results are written to.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``, or the resumed
      reproduction's).
    seeds: the seeds of each setting (None: the scale's, or the resumed reproduction's).
    threads: compiled programs run at once (:func:`fedjax_dp.sweep.threads_for`; None:
      automatic); a resumed reproduction may use others.
    resume: continue the reproduction in ``output_dir``.

  Returns:
    The reproduction's exit status.

  Raises:
    ConfigError: an unknown paper or scale, a bad ``seeds`` or ``threads``, a resume that
      differs from the reproduction it continues (:func:`resumed_arguments`), or as the run.
  """
  check_choice("paper", paper, sorted(REPRODUCTIONS))
  check_threads(threads)
  out = pathlib.Path(output_dir)
  if resume:
    args = resumed_arguments(paper, out, {"scale": scale, "seeds": seeds, "data_dir": data_dir})
    if args.pop("finished"):
      print(f"{out} holds a finished reproduction of {paper} (scale {args['scale']}, "
            f"{args['seeds']} seed(s)): nothing to resume, its files are as they were")
      return 0
  else:
    args = _arguments(paper, scale or "small", seeds, data_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / ARGUMENTS, json.dumps({**args, "finished": False}) + "\n")
  module, fn = REPRODUCTIONS[paper].split(":")
  status = getattr(importlib.import_module(module), fn)(
      scale=args["scale"], output_dir=output_dir, data_dir=args["data_dir"], seeds=args["seeds"],
      threads=threads, resume=resume)
  if status == 0:
    write_text_atomic(out / ARGUMENTS, json.dumps({**args, "finished": True}) + "\n")
  return status


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
