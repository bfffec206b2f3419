"""Figures of runs, sweeps and reproductions (``fedjax-dp plot``), built with matplotlib's object
API (no pyplot: no backend is chosen or switched, so a notebook keeps showing figures inline).

* :func:`plot_runs`: test accuracy and epsilon against rounds, one line per run folder
  (``metrics.jsonl``);
* :func:`plot_norms`: the per-round distribution of the clients' pre-clip update norms (median
  and 10-90% band) against the clip bound, from a run's ``norms.npz`` (the style of Cheng et al.
  2022, Fig. 2);
* :func:`plot_frontier`: the privacy-utility frontier, accuracy against epsilon with error bars
  over seeds, one line per method, from ``results.json`` files of ``fedjax-dp sweep`` or of a
  reproduction; rows without an epsilon (non-private baselines) are dotted horizontal lines.

Each writes its figure and returns the matplotlib ``Figure`` (shown inline when it is a
notebook cell's value). The reproductions draw
their figures with the building blocks :class:`Curve`, :func:`plot_curves`,
:func:`plot_quantiles` and :func:`plot_histograms`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Optional, Sequence

from fedjax_dp.errors import ConfigError, check
from fedjax_dp.jsonio import NONFINITE_SUFFIX
from fedjax_dp.paths import is_dir, is_file

KINDS = ("runs", "norms", "frontier")
# Sweep grid axes that move a method along its frontier (not part of its line's label).
PRIVACY_AXES = ("target_epsilon", "noise_multiplier")
# The reproductions' row fields that tell their settings apart (a line's label names those that
# vary among a file's rows).
REPRODUCTION_KEYS = ("method", "table", "dataset", "setting", "partition", "attack", "sparsity")
# A sweep row's non-grid fields (``grid`` repeats the grid values).
_ROW_VALUES = ("accuracy_mean", "accuracy_std", "seeds", "epsilon", "epsilon_seeds_composed",
               "delta_seeds_composed", "seeds_composition", "seeds_privacy_unit", "grid")


@dataclasses.dataclass(frozen=True)
class Curve:
  """One method's line in a panel.

  Attributes:
    label: its legend entry.
    x: the rounds, or the swept setting's values.
    y: the values (mean over seeds).
    err: error bars (std over seeds; an entry None, one seed: no bar) drawn with markers;
      none: a plain line.
    style: the matplotlib line style.
  """

  label: str
  x: Sequence[float]
  y: Sequence[float]
  err: Optional[Sequence[float]] = None
  style: str = "-"


def _panels(n: int, size: tuple, sharey: bool):
  """A figure of ``n`` panels side by side. Built with matplotlib's object API, not pyplot: no
  backend is chosen or switched (a notebook keeps showing its figures inline), and nothing is
  left open."""
  from matplotlib.figure import Figure
  check(n >= 1, "panels", n, "a figure needs at least one panel")
  fig = Figure(figsize=(size[0] * n, size[1]))
  axes = fig.subplots(1, n, sharey=sharey, squeeze=False)
  return fig, axes[0]


def _save(fig, axes, ylabel, path, legend_columns: int = 1, legend_size: int = 8,
          legend_outside: bool = False):
  """Labels the axes (``ylabel``: the first one's, or a sequence of one per axis), adds the
  first axis's legend (inside it, or to the right of the last axis), writes ``path`` and
  returns the figure; :class:`ConfigError` naming ``out`` when ``path`` cannot be written."""
  for ax, label in zip(axes, [ylabel] if isinstance(ylabel, str) else ylabel):
    ax.set_ylabel(label)
  if legend_outside:  # laid out first: the figure grows to the legend (bbox_inches) instead
    fig.tight_layout()
    axes[-1].legend(*axes[0].get_legend_handles_labels(), fontsize=legend_size,
                    ncol=legend_columns, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                    borderaxespad=0.0)
  else:
    axes[0].legend(fontsize=legend_size, ncol=legend_columns)
    fig.tight_layout()
  try:
    fig.savefig(path, dpi=90, bbox_inches="tight" if legend_outside else None)
  except OSError as e:  # a read-only folder or file, a full disk, a name too long
    raise ConfigError("out", str(path), f"cannot be written ({e.strerror or e})") from None
  return fig


def _bars(err: Sequence) -> list:
  """Error bar lengths for matplotlib: an undefined spread (None: one seed) draws no bar."""
  return [math.nan if e is None else e for e in err]


@dataclasses.dataclass(frozen=True)
class Layout:
  """How :func:`curves_figure` lays out its panels and legend.

  Attributes:
    size: one panel's (width, height) in inches.
    sharey: the panels share their y axis.
    legend_columns: the legend's columns.
    legend_size: the legend's font size.
    legend_outside: the legend right of the last panel, off the curves (else inside the first).
  """

  size: tuple = (4.2, 3.4)
  sharey: bool = True
  legend_columns: int = 1
  legend_size: int = 8
  legend_outside: bool = False


def curves_figure(panels: Sequence[tuple], path, *, xlabel: str, ylabel="test accuracy",
                  logx: bool = False, ylim: Optional[tuple] = None, layout: Layout = Layout()):
  """One panel per ``(title, [Curve])`` of ``panels``, side by side; writes ``path`` and returns
  the figure.

  Args:
    panels: ``(title, [Curve])`` per panel.
    path: the image file written.
    xlabel: every panel's x label.
    ylabel: the first panel's label, or a sequence of one per panel.
    logx: a logarithmic x axis.
    ylim: the y axis's ``(low, high)`` (none: matplotlib's).
    layout: the panels' size, shared y axis and legend.

  Returns:
    The matplotlib figure.
  """
  fig, axes = _panels(len(panels), layout.size, layout.sharey)
  for ax, (title, curves) in zip(axes, panels):
    for c in curves:
      if c.err is None:  # a curve of one point (a run evaluated once) is drawn as a mark
        ax.plot(c.x, c.y, c.style, label=c.label, lw=1.3, **({"marker": "o"} if len(c.x) == 1
                                                             else {}))
      else:
        ax.errorbar(c.x, c.y, yerr=_bars(c.err), marker="o", capsize=2, label=c.label,
                    linestyle=c.style)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    if logx:
      ax.set_xscale("log")
    if ylim is not None:
      ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
  return _save(fig, axes, ylabel, path, layout.legend_columns, layout.legend_size,
               layout.legend_outside)


def plot_curves(panels: Sequence[tuple], path, **kwargs):
  """:func:`curves_figure`; returns ``path``."""
  curves_figure(panels, path, **kwargs)
  return path


def quantiles_figure(panels: Sequence[tuple], path, *, clip: Optional[float], ylabel: str,
                     size: tuple = (4.5, 3.4)):
  """Per-round quantiles of the clients' update norms, one panel per entry of ``panels``,
  against the clip bound; writes ``path`` and returns the figure.

  Args:
    panels: ``(title, rounds, {"q10", "q50", "q90": values})`` per panel, each ``values`` one
      per round of ``rounds``.
    path: the image file written.
    clip: the clip bound drawn as a horizontal line; None: none drawn.
    ylabel: the first panel's y label.
    size: each panel's ``(width, height)`` in inches.

  Returns:
    The matplotlib figure.

  Raises:
    ConfigError: ``panels`` is empty, or ``path`` cannot be written (naming ``out``).
  """
  fig, axes = _panels(len(panels), size, True)
  for ax, (title, rounds, q) in zip(axes, panels):
    ax.fill_between(rounds, q["q10"], q["q90"], alpha=0.3, label="10-90% of clients")
    ax.plot(rounds, q["q50"], label="median")
    if clip is not None:
      ax.axhline(clip, color="k", ls="--", lw=1, label=f"clip S={clip:g}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("round")
    ax.xaxis.get_major_locator().set_params(integer=True)
  return _save(fig, axes, ylabel, path)


def plot_quantiles(panels: Sequence[tuple], path, **kwargs):
  """:func:`quantiles_figure`; returns ``path``."""
  quantiles_figure(panels, path, **kwargs)
  return path


def histograms_figure(panels: Sequence[tuple], path, *, clip: Optional[float], xlabel: str,
                      bins: int = 40, size: tuple = (4.5, 3.4)):
  """Step histograms (densities), one panel per entry of ``panels`` (one bin grid per panel),
  against the clip bound; writes ``path`` and returns the figure.

  Args:
    panels: ``(title, [(label, values)])`` per panel: one histogram per series.
    path: the image file written.
    clip: the clip bound drawn as a vertical line; None: none drawn.
    xlabel: every panel's x label.
    bins: the number of bins of each panel's grid, over all its series' values.
    size: each panel's ``(width, height)`` in inches.

  Returns:
    The matplotlib figure.

  Raises:
    ConfigError: ``panels`` is empty, or ``path`` cannot be written (naming ``out``).
  """
  import numpy as np
  fig, axes = _panels(len(panels), size, False)
  for ax, (title, series) in zip(axes, panels):
    edges = np.histogram_bin_edges(np.concatenate([np.asarray(v, float) for _, v in series]), bins)
    for label, values in series:
      ax.hist(values, bins=edges, histtype="step", density=True, lw=1.3, label=label)
    if clip is not None:
      ax.axvline(clip, color="k", ls="--", lw=1, label=f"clip S={clip:g}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7)
  return _save(fig, axes, "density", path, legend_size=7)


def plot_histograms(panels: Sequence[tuple], path, **kwargs):
  """:func:`histograms_figure`; returns ``path``."""
  histograms_figure(panels, path, **kwargs)
  return path


def _check_out(out) -> pathlib.Path:
  """``out`` as a path whose folder exists and whose suffix names an image format."""
  out = pathlib.Path(out)
  check(is_dir(out.parent, "out"), "out", str(out), f"its folder {out.parent} must exist" + (
      " (it is a file)" if is_file(out.parent, "out") else ""))
  check(not is_dir(out, "out"), "out", str(out), "is a folder: name the image file to write")
  from matplotlib.backend_bases import FigureCanvasBase
  # pgf needs a LaTeX installation to write, which nothing here installs
  formats = sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"})
  check(out.suffix[1:].lower() in formats, "out", str(out),
        f"must end in an image format's suffix: one of {['.' + f for f in formats]}")
  return out


def _file_in(folder, name: str, field: str = "dir") -> pathlib.Path:
  """``folder/name``, which must exist (a folder given as ``folder`` must exist too)."""
  folder = pathlib.Path(folder)
  check(is_dir(folder, field), field, str(folder), "must be an existing folder")
  check(is_file(folder / name, field), field, str(folder), f"holds no {name}")
  return folder / name


def _labels(paths: Sequence[pathlib.Path]) -> list:
  """The folders' names, or their whole paths where two names are the same."""
  names = [p.resolve().name for p in paths]
  return names if len(set(names)) == len(names) else [str(p) for p in paths]


def read_metrics(folder) -> list:
  """A run folder's ``metrics.jsonl`` as a list of records (``ConfigError`` if missing, empty,
  not JSON lines, or a line without an integer ``round`` or with a non-numeric
  ``test_accuracy`` or ``epsilon``)."""
  path = _file_in(folder, "metrics.jsonl")
  try:
    text = path.read_text(encoding="utf-8")
  except UnicodeDecodeError:
    raise ConfigError("dir", str(folder), "its metrics.jsonl is not UTF-8 text") from None
  rows = []
  for i, line in enumerate(text.splitlines(), 1):
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      raise ConfigError("dir", str(folder), f"line {i} of metrics.jsonl is not JSON") from None
    check(isinstance(row, dict) and _is_number(row.get("round")) and
          all(row.get(k) is None or _is_number(row[k]) for k in ("test_accuracy", "epsilon")),
          "dir", str(folder), f"line {i} of metrics.jsonl is not a round's record (a numeric "
          "round, and test_accuracy and epsilon numbers or null)")
    rows.append(row)
  check(rows, "dir", str(folder), "its metrics.jsonl holds no rounds")
  check(any(r.get("test_accuracy") is not None for r in rows), "dir", str(folder),
        "its metrics.jsonl holds no evaluated round (no test_accuracy): nothing to draw")
  return rows


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_file(cond, path: pathlib.Path, field: str, value, allowed: str) -> None:
  """Refuses a field read from the file ``path``, named as ``NAME FIELD`` (``results.json
  experiments``, ``norms.npz offsets``), with the file's path in what is allowed."""
  check(cond, f"{path.name} {field}", value, f"{allowed} (in {path})")


def _shown(a):
  """An array read from a file as an error shows it: its values when few, else its type."""
  return a.tolist() if a.size <= 8 else f"{a.dtype} array of shape {a.shape}"


def plot_runs(dirs: Sequence, out):
  """Test accuracy (evaluated rounds) and, when any run has one, epsilon against rounds: one line
  per run folder of ``dirs``; writes ``out`` and returns the figure.

  Args:
    dirs: run folders (``simulate(output_dir=...)``, ``fedjax-dp run --out``), at least one.
    out: the image file to write; its folder must exist and its suffix name an image format
      (``.png``, ``.pdf``, ``.svg``, ...).

  Returns:
    The matplotlib ``Figure`` (shown inline as a notebook cell's value).

  Raises:
    ConfigError: no folder, a folder without a readable ``metrics.jsonl``
      (:func:`read_metrics`), or a bad ``out``.
  """
  check(len(dirs) >= 1, "dir", list(dirs), "give at least one run folder")
  out = _check_out(out)
  paths = [pathlib.Path(d) for d in dirs]
  runs = [read_metrics(p) for p in paths]
  acc, eps = [], []
  for label, rows in zip(_labels(paths), runs):
    ev = [r for r in rows if r.get("test_accuracy") is not None]
    acc.append(Curve(label, [r["round"] for r in ev], [r["test_accuracy"] for r in ev]))
    pr = [r for r in rows if r.get("epsilon") is not None]
    if pr:
      eps.append(Curve(label, [r["round"] for r in pr], [r["epsilon"] for r in pr]))
  panels = [("test accuracy", acc)] + ([("privacy spent", eps)] if eps else [])
  return curves_figure(panels, out, xlabel="round", layout=Layout(sharey=False),
                       ylabel=["test accuracy", "epsilon"][:len(panels)])


def read_norms(folder) -> dict:
  """A run folder's ``norms.npz``: ``round``, ``norms`` (a list of one array per round) and
  ``clip`` (None without a clip bound). ``ConfigError`` if it is missing or not an npz file,
  lacks one of these arrays, or one of them has a type or shape a run does not write (the field
  is named ``norms.npz FIELD``)."""
  import zipfile
  import numpy as np
  path = _file_in(folder, "norms.npz")
  try:
    with np.load(path, allow_pickle=False) as z:
      rounds, offsets, flat, clip = (z[k] for k in ("round", "offsets", "norms", "clip"))
  except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
    raise ConfigError("dir", str(folder), f"its norms.npz is not one a run writes "
                      f"(round, offsets, norms, clip): {type(e).__name__}") from None
  real = "iuf"  # integers and floats (not booleans, complex numbers or strings)
  _check_file(clip.size == 1 and clip.dtype.kind in real, path, "clip", _shown(clip),
              "must be one number, the clip bound (NaN: none)")
  _check_file(flat.ndim == 1 and flat.dtype.kind in real, path, "norms", _shown(flat),
              "must be a 1-D array of numbers: every round's clients' norms, one after another")
  _check_file(offsets.ndim == 1 and offsets.dtype.kind in "iu" and len(offsets) >= 1
              and offsets[0] == 0 and bool(np.all(offsets[1:] >= offsets[:-1]))
              and offsets[-1] == len(flat), path, "offsets", _shown(offsets),
              f"must be a 1-D array of integers rising from 0 to the number of norms "
              f"({len(flat)}): where each round's norms start, then their end")
  _check_file(rounds.ndim == 1 and rounds.dtype.kind in real and len(rounds) == len(offsets) - 1,
              path, "round", _shown(rounds), f"must be a 1-D array of numbers, one per round "
              f"({len(offsets) - 1} by offsets)")
  clip = float(clip.item())
  return {"round": rounds, "norms": [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])],
          "clip": None if math.isnan(clip) else clip}


def plot_norms(folder, out):
  """The clients' pre-clip update norms per round (median and the 10-90% band) against the clip
  bound, from ``folder/norms.npz``; writes ``out`` and returns the figure.

  Args:
    folder: a run folder holding ``norms.npz`` (written by a run with an output folder under
      release "all").
    out: the image file to write; its folder must exist and its suffix name an image format
      (``.png``, ``.pdf``, ``.svg``, ...).

  Returns:
    The matplotlib ``Figure``.

  Raises:
    ConfigError: a missing or malformed ``norms.npz`` (:func:`read_norms`), or a bad ``out``.
  """
  # Lazy: engine imports JAX, which reading and plotting files does not need.
  from fedjax_dp.engine import quantiles
  out = _check_out(out)
  z = read_norms(folder)
  q = {k: [] for k in ("q10", "q50", "q90")}
  for n in z["norms"]:
    for k, v in quantiles(n).items():
      q[k].append(v)
  title = f"{_labels([pathlib.Path(folder)])[0]}: {len(z['round'])} rounds"
  return quantiles_figure([(title, z["round"], q)], out, clip=z["clip"], ylabel="update norm")


def _sweep_algorithms(path: pathlib.Path, experiments) -> set:
  """The algorithms (their names; None where a summary names none) of a sweep's
  ``experiments``, each ``{"summary": {"config": {"algorithm": NAME}}}``."""
  _check_file(isinstance(experiments, list), path, "experiments", experiments,
              "must be a list of the sweep's experiments (objects)")
  out = set()
  for i, e in enumerate(experiments):
    _check_file(isinstance(e, dict), path, f"experiments[{i}]", e, "must be an object")
    summary = e.get("summary", {})
    _check_file(isinstance(summary, dict), path, f"experiments[{i}].summary", summary,
                "must be an object")
    config = summary.get("config") or {}
    _check_file(isinstance(config, dict), path, f"experiments[{i}].summary.config", config,
                "must be an object or null")
    algorithm = config.get("algorithm")
    if isinstance(algorithm, dict):  # nested as the settings follow the algorithm
      algorithm = algorithm.get("name")
    _check_file(algorithm is None or isinstance(algorithm, str), path,
                f"experiments[{i}].summary.config.algorithm", algorithm, "must be a name or null")
    out.add(algorithm)
  return out


def _frontier_lines(path: pathlib.Path) -> dict:
  """``label -> [(epsilon or None, accuracy_mean, accuracy_std)]`` from one ``results.json``
  (an accuracy written as null, a diverged point's NaN, is NaN: no point drawn)."""
  try:
    doc = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError):
    raise ConfigError("dir", str(path), "is not a JSON file") from None
  rows = doc.get("rows") if isinstance(doc, dict) else None
  check(isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows), "dir",
        str(path), "needs 'rows' (a sweep's or a reproduction's results.json)")
  for field in ("epsilon", "accuracy_mean", "accuracy_std"):
    check(all(field in r for r in rows), "dir", str(path), f"every row needs {field!r}")
  for i, r in enumerate(rows):
    for field, allowed in (("accuracy_mean", "must be a number or null (NaN)"),
                           ("accuracy_std", "must be a number or null (one seed, or NaN)")):
      _check_file(r[field] is None or _is_number(r[field]), path, f"rows[{i}].{field}", r[field],
                  allowed)
  if "experiments" in doc:  # a sweep: rows hold the grid values, the algorithm is in the configs
    keys = [k for k in rows[0] if k not in _ROW_VALUES and k not in PRIVACY_AXES
            and not k.endswith(NONFINITE_SUFFIX)]
    algorithms = _sweep_algorithms(path, doc["experiments"])
    base = [str(a) for a in sorted(algorithms - {None})] if "algorithm" not in keys else []
    plain = "algorithm"
  else:  # a reproduction: the setting fields that vary among its rows
    keys = [k for k in REPRODUCTION_KEYS
            if k == "method" or len({json.dumps(r.get(k)) for r in rows}) > 1]
    base, plain = [], "method"
  lines = {}
  for r in rows:
    named = [str(r[k]) if k == plain else f"{k}={r[k]}" for k in keys if r.get(k) is not None]
    label = ", ".join(base + named) or "run"
    e = r["epsilon"]
    if isinstance(e, dict):  # SP-FL's per-class epsilons: the largest over classes and clients
      worst = [v.get("max") if isinstance(v, dict) else None for v in e.values()]
      e = max(worst) if worst and all(_is_number(w) for w in worst) else "several"
    if e is None or _is_number(e):
      mean = math.nan if r["accuracy_mean"] is None else r["accuracy_mean"]
      lines.setdefault(label, []).append((e, mean, r["accuracy_std"]))
  return lines


def plot_frontier(paths: Sequence, out):
  """Accuracy against epsilon, one line per method (error bars: std over seeds), from
  ``results.json`` files (a path or the folder holding it) of ``fedjax-dp sweep`` or a
  reproduction. Rows whose epsilon is null (no guarantee) are dotted horizontal lines; a row
  with per-class epsilons (SP-FL's ``{class: {"max", "median"}}``) is drawn at the largest, its
  worst-case client's. Writes ``out`` and returns the figure.

  Args:
    paths: ``results.json`` files or the folders holding them (``sweep(...,
      run_options=RunOptions(output_dir=DIR))`` writes ``DIR/results.json``), at least one;
      with several, each line's label starts with its folder's.
    out: the image file to write; its folder must exist and its suffix name an image format
      (``.png``, ``.pdf``, ``.svg``, ...).

  Returns:
    The matplotlib ``Figure``.

  Raises:
    ConfigError: no path, a missing or malformed ``results.json``, files holding no row with a
      numeric epsilon, or a bad ``out``.
  """
  check(len(paths) >= 1, "dir", list(paths), "give at least one results.json or its folder")
  out = _check_out(out)
  files = [pathlib.Path(p) if is_file(p, "dir") else _file_in(p, "results.json")
           for p in paths]
  curves, baselines = [], []
  for prefix, f in zip(_labels([f.parent for f in files]), files):
    for label, points in _frontier_lines(f).items():
      label = f"{prefix}: {label}" if len(files) > 1 else label
      private = sorted((p for p in points if p[0] is not None), key=lambda p: p[0])
      if private:
        curves.append(Curve(label, *zip(*private)))
      baselines += [(f"{label} (no DP)", acc) for e, acc, _ in points if e is None]
  check(curves, "dir", ", ".join(str(f) for f in files),
        "holds no row with a numeric epsilon: nothing to draw against epsilon")
  import matplotlib
  fig, axes = _panels(1, (6.0, 4.2), True)
  ax = axes[0]
  colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, c in enumerate(curves):  # past the colour cycle, the next marker: no two lines alike
    ax.errorbar(c.x, c.y, yerr=_bars(c.err), marker="os^Dv"[i // len(colors) % 5], capsize=2,
                label=c.label)
  for i, (label, acc) in enumerate(baselines, len(curves)):  # colors go on after the curves'
    ax.axhline(acc, ls=":", lw=1.2, color=colors[i % len(colors)], label=label)
  ax.set_xlabel("epsilon")
  ax.set_title("privacy-utility frontier", fontsize=9)
  ax.grid(alpha=0.3)
  return _save(fig, axes, "test accuracy", out, legend_size=7, legend_outside=True)


def detect_kind(dirs: Sequence) -> str:
  """``fedjax-dp plot``'s default kind: "frontier" when a path is or holds a ``results.json``,
  "norms" for one folder holding ``norms.npz``, else "runs"."""
  paths = [pathlib.Path(d) for d in dirs]
  if any(p.name == "results.json" or is_file(p / "results.json", "dir") for p in paths):
    return "frontier"
  if len(paths) == 1 and is_file(paths[0] / "norms.npz", "dir"):
    return "norms"
  return "runs"


def add_parser(sub) -> None:
  """The ``plot`` subcommand."""
  p = sub.add_parser("plot", help="draw runs (accuracy and epsilon per round), a run's update "
                     "norms against its clip bound, or a privacy-utility frontier, as an image")
  p.add_argument("dirs", nargs="+", metavar="DIR",
                 help="run folders (metrics.jsonl, norms.npz) or sweep/reproduction folders "
                 "(results.json, or the file itself)")
  p.add_argument("--out", required=True, metavar="FILE.png",
                 help="the image to write (its suffix picks the format: .png, .pdf, .svg, ...)")
  p.add_argument("--kind", choices=KINDS,
                 help="runs: test accuracy and epsilon against rounds, one line per folder; "
                 "norms: one run's per-round update norms against the clip bound (norms.npz); "
                 "frontier: accuracy against epsilon per method (results.json). Default: "
                 "frontier if a DIR holds results.json, norms for one DIR with norms.npz, "
                 "else runs")


def command(args) -> int:
  """Runs ``fedjax-dp plot``: writes the figure, prints its path."""
  kind = args.kind or detect_kind(args.dirs)
  if kind == "runs":
    plot_runs(args.dirs, args.out)
  elif kind == "norms":
    check(len(args.dirs) == 1, "dir", args.dirs, "--kind norms draws one run folder")
    plot_norms(args.dirs[0], args.out)
  else:
    plot_frontier(args.dirs, args.out)
  print(f"wrote {args.out} ({kind})")
  return 0
