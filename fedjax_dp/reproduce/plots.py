"""The reproductions' figures, as PNG files: curves per method, norm quantiles against a clip.

:func:`plot_curves` draws one panel per setting with one curve per method:
test accuracy against rounds, or against a swept setting (epsilon, clients per
round, ...) with error bars over seeds. :func:`plot_quantiles` draws the
per-round quantiles of the clients' update norms against the clip bound.
matplotlib runs with its Agg backend, chosen inside these functions only.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from fedjax_dp.errors import check


@dataclasses.dataclass(frozen=True)
class Curve:
  """One method's line in a panel.

  Attributes:
    label: its legend entry.
    x: the rounds, or the swept setting's values.
    y: the values (mean over seeds).
    err: error bars (std over seeds) drawn with markers; none: a plain line.
    style: the matplotlib line style.
  """

  label: str
  x: Sequence[float]
  y: Sequence[float]
  err: Optional[Sequence[float]] = None
  style: str = "-"


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _panels(plt, n: int, size: tuple, sharey: bool):
  check(n >= 1, "panels", n, "a figure needs at least one panel")
  fig, axes = plt.subplots(1, n, figsize=(size[0] * n, size[1]), sharey=sharey, squeeze=False)
  return fig, axes[0]


def _save(plt, fig, axes, ylabel: str, path, legend_columns: int = 1, legend_size: int = 8):
  """Labels the first axis, adds its legend, writes ``path`` and closes the figure."""
  axes[0].set_ylabel(ylabel)
  axes[0].legend(fontsize=legend_size, ncol=legend_columns)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def plot_curves(panels: Sequence[tuple], path, *, xlabel: str, ylabel: str = "test accuracy",
                logx: bool = False, ylim: Optional[tuple] = None, size: tuple = (4.2, 3.4),
                sharey: bool = True, legend_columns: int = 1, legend_size: int = 8):
  """One panel per ``(title, [Curve])`` of ``panels``, side by side; writes ``path``, returns it."""
  plt = _pyplot()
  fig, axes = _panels(plt, len(panels), size, sharey)
  for ax, (title, curves) in zip(axes, panels):
    for c in curves:
      if c.err is None:
        ax.plot(c.x, c.y, c.style, label=c.label, lw=1.3)
      else:
        ax.errorbar(c.x, c.y, yerr=c.err, marker="o", capsize=2, label=c.label,
                    linestyle=c.style)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    if logx:
      ax.set_xscale("log")
    if ylim is not None:
      ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
  return _save(plt, fig, axes, ylabel, path, legend_columns, legend_size)


def plot_quantiles(panels: Sequence[tuple], path, *, clip: float, ylabel: str,
                   size: tuple = (4.5, 3.4)):
  """Per-round quantiles of the clients' update norms, one panel per ``(title, rounds,
  {"q10", "q50", "q90": values})`` of ``panels``, against the clip bound ``clip``; writes
  ``path``, returns it."""
  plt = _pyplot()
  fig, axes = _panels(plt, len(panels), size, True)
  for ax, (title, rounds, q) in zip(axes, panels):
    ax.fill_between(rounds, q["q10"], q["q90"], alpha=0.3, label="10-90% of clients")
    ax.plot(rounds, q["q50"], label="median")
    ax.axhline(clip, color="k", ls="--", lw=1, label=f"clip S={clip:g}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("round")
  return _save(plt, fig, axes, ylabel, path)
