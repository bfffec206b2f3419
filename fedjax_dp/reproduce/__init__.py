"""Paper reproductions, by name: ``fedjax-dp reproduce NAME --scale small --output-dir DIR``.

Each entry is ``"module:function"``; the function takes
``(scale, output_dir, data_dir, seeds, threads, resume)`` and returns an exit status (``resume``:
continue the reproduction in ``output_dir``, running only the runs ``runs.jsonl`` has no record
of: :func:`fedjax_dp.reproduce.runner.run_jobs`). Each module also has
``render(output_dir)``: it rewrites ``results.md`` and the figures from an earlier run's
``results.json`` and ``runs.jsonl`` without running anything (``fedjax-dp reproduce NAME
--render --output-dir DIR``), so new tables and verdicts apply to saved results. Both end with
one line, alike for every paper, naming the files written
(:func:`fedjax_dp.reproduce.runner.wrote`: ``wrote A, B, C``, a run's with ``in N s``). The
papers of :data:`SAVED_CLAIMS` read a finished reproduction's claims back from its folder, so
that reproductions at several scales are compared verdict by verdict
(:func:`compare_reproductions`, ``fedjax-dp reproduce NAME --compare DIR DIR ...``).
"""

from __future__ import annotations

import importlib
import json
import pathlib
from typing import Optional, Sequence

from fedjax_dp.errors import ConfigError, check, check_choice
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.reproduce.runner import ARGUMENTS, RESULT_FILES, num_seeds
from fedjax_dp.reproduce.tables import accuracy_comparison_table, comparison_table
from fedjax_dp.sweep import check_threads

REPRODUCTIONS: dict = {
    "cheng2022": "fedjax_dp.reproduce.cheng2022:run",
    "cheng2022-norms": "fedjax_dp.reproduce.blur_norms:run",
    "spfl2024": "fedjax_dp.reproduce.spfl2024:run",
    "zhu2022": "fedjax_dp.reproduce.zhu2022:run",
}
# The papers whose verdicts can be compared across scales: "module:function", the function
# taking a finished reproduction's folder and returning its claims
# (:class:`fedjax_dp.reproduce.tables.Claim` s) as its results.md's verdict table shows them.
SAVED_CLAIMS: dict = {
    "cheng2022": "fedjax_dp.reproduce.cheng2022:saved_claims",
    "spfl2024": "fedjax_dp.reproduce.spfl2024:saved_claims",
    "zhu2022": "fedjax_dp.reproduce.zhu2022:saved_claims",
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
  parts += [f"{s[k]} {one if s[k] == 1 else many}"
            for k, one, many in (("max_train", "training example", "training examples"),
                                 ("num_clients", "client", "clients"),
                                 ("rounds", "round", "rounds"),
                                 ("batch_size", "example a batch", "examples a batch"),
                                 ("seeds", "seed", "seeds")) if s.get(k) is not None]
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
  other = _written_by(_results_doc(out), paper)  # another's is refused by the module's reader
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


def _results_doc(folder: pathlib.Path):
  """``folder/results.json`` parsed; None where it is not JSON."""
  try:
    return json.loads((folder / "results.json").read_text())
  except (json.JSONDecodeError, UnicodeDecodeError):
    return None


def _written_by(doc, default: str) -> str:
  """The paper whose reproduction wrote the results document ``doc`` (:func:`_results_doc`;
  its ``reproduction`` field); ``default`` where it names none or is not a JSON object."""
  return doc.get("reproduction", default) if isinstance(doc, dict) else default


def compare_reproductions(paper: str, folders: Sequence) -> str:
  """The verdicts of ``paper``'s finished reproductions in ``folders`` (at different scales) side
  by side (``fedjax-dp reproduce PAPER --compare DIR DIR ...``), each folder's claims read back
  by the paper module's ``saved_claims`` (:data:`SAVED_CLAIMS`) as its ``results.md`` shows them.

  A folder counts as finished when its ``reproduction.json`` says so; one without it (results
  copied out of the folder that ran them, as ``docs/results/`` holds them) when it holds
  ``results.md`` beside ``results.json``: a reproduction writes results.md once its runs are done.

  Args:
    paper: one of :data:`SAVED_CLAIMS`.
    folders: two or more folders of finished reproductions of ``paper``, in the order of their
      columns (the smallest scale first, so that the last column says what changed at the
      largest).

  Returns:
    Markdown: a line naming each column's folder, the verdicts' table
    (:func:`fedjax_dp.reproduce.tables.comparison_table`, each scale headed by its
    ``results.json``'s scale and seeds), the accuracy of each setting at each scale
    (:func:`fedjax_dp.reproduce.tables.accuracy_comparison_table`, the settings told apart by
    the paper module's ``ROW_KEYS``), and a line for each folder whose several seeds give no
    spread because it holds no ``runs.jsonl`` (its verdicts are on the means alone).

  Raises:
    ConfigError: naming ``paper`` for one without claims to read back, else ``--compare`` for
      fewer than two folders or a folder that does not hold a finished reproduction of
      ``paper`` that its module can read.
  """
  check_choice("paper", paper, sorted(SAVED_CLAIMS))
  check(len(folders) >= 2, "--compare", list(folders), "needs two or more folders of finished "
        f"reproductions of {paper} (its scales, the smallest first)")
  module, fn = SAVED_CLAIMS[paper].split(":")
  saved_claims = getattr(importlib.import_module(module), fn)
  columns, accuracies, named, notes = [], [], [], []
  for folder in folders:
    header, seeds, rows = _finished_scale(paper, pathlib.Path(folder))
    try:
      claims = saved_claims(folder)
    except ConfigError as e:  # the module's reader names the folder as --render's --output-dir
      raise ConfigError("--compare", folder, e.allowed) from None
    except (KeyError, TypeError, ValueError, AttributeError, OSError) as e:
      raise ConfigError("--compare", folder, f"does not hold files of `fedjax-dp reproduce "
                        f"{paper}` that --compare can read ({type(e).__name__}: {e})") from None
    columns.append((header, claims))
    accuracies.append((header, rows))
    named.append(f"{header}: {folder}")
    measured = [c for c in claims if c.measured is not None]
    if (seeds > 1 and measured and all(c.spread is None for c in measured)
        and not (pathlib.Path(folder) / "runs.jsonl").is_file()):
      notes.append(f"* {header} ({folder}): no spread over its {seeds} seeds: the folder holds "
                   "no runs.jsonl (each seed's record), so its verdicts are on the means alone")
  lines = [f"Verdicts of {paper}'s reproductions side by side (differences in points); columns: "
           + "; ".join(named), ""] + comparison_table(columns)
  accuracy = accuracy_comparison_table(importlib.import_module(module).ROW_KEYS, accuracies)
  lines += ["", "Accuracy of each setting side by side (mean ± std over seeds):", ""] + accuracy
  return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _finished_scale(paper: str, folder: pathlib.Path) -> tuple:
  """``(header, seeds, rows)`` of the finished reproduction of ``paper`` in ``folder``: "SCALE,
  N seed(s)" from its ``results.json`` (the scale at the top or in its settings), N, and the
  file's rows (one per setting, each with its ``accuracy_mean`` and ``accuracy_std``), the file
  read once.

  Raises:
    ConfigError: naming ``--compare``, for a folder without results.json, of another paper, or
      not finished (:func:`compare_reproductions`).
  """
  where = str(folder)
  check((folder / "results.json").is_file(), "--compare", where,
        f"holds no results.json: not the folder of a finished `fedjax-dp reproduce {paper}`")
  doc = _results_doc(folder)
  other = _written_by(doc, paper)
  check(other == paper, "--compare", where, f"holds the results of `fedjax-dp reproduce "
        f"{other}`, not {paper}: compare it with folders of {other}")
  arguments = folder / ARGUMENTS
  if arguments.is_file():
    try:
      recorded = json.loads(arguments.read_bytes())
      recorded_paper, finished = recorded["paper"], recorded["finished"]
    except (ValueError, KeyError, TypeError):  # JSONDecodeError and UnicodeDecodeError included
      raise ConfigError("--compare", where, f"holds a {ARGUMENTS} that is not the arguments of "
                        "a reproduction (changed or damaged)") from None
    check(recorded_paper == paper, "--compare", where, f"holds a reproduction of "
          f"{recorded_paper} ({ARGUMENTS}), not {paper}: compare it with folders of "
          f"{recorded_paper}")
    check(finished is True, "--compare", where, f"holds a reproduction that has not finished "
          f"({ARGUMENTS}: \"finished\": {json.dumps(finished)}): its results.json holds only the "
          f"runs done; continue it with fedjax-dp reproduce {paper} --resume {where}")
  else:
    check((folder / "results.md").is_file(), "--compare", where, f"holds results.json but "
          f"neither {ARGUMENTS} nor results.md: not known to be a finished reproduction (one "
          "writes results.md once its runs are done)")
  try:
    settings = doc.get("settings") or {}
    scale, seeds = doc.get("scale", settings.get("scale")), int(settings["seeds"])
    rows = doc["rows"]
  except (ValueError, KeyError, TypeError, AttributeError):
    raise ConfigError("--compare", where, "holds a results.json without its scale's settings "
                      "(seeds) or rows: not the results of a finished `fedjax-dp reproduce "
                      f"{paper}`") from None
  return f"{scale}, {seeds} seed{'' if seeds == 1 else 's'}", seeds, rows
