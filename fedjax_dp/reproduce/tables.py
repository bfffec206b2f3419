"""The reproductions' Markdown tables: one writer, one format for mean ± std."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np


def mean_std(mean: Optional[float], std: Optional[float] = None, scale: float = 100.0,
             digits: int = 2) -> str:
  """``"mean ± std"`` of ``scale`` times the values (percent by default) at ``digits`` decimals;
  the mean alone when ``std`` is None; ``"n/a"`` when ``mean`` is None.

  Args:
    mean: the mean (a fraction by default), or None.
    std: the standard deviation, in the mean's units, or None.
    scale: the factor both are written at (100: percent; 1: as they are).
    digits: the decimals written.

  Returns:
    The cell's text.
  """
  if mean is None:
    return "n/a"
  text = f"{scale * mean:.{digits}f}"
  return text if std is None else f"{text} ± {scale * std:.{digits}f}"


def markdown_table(columns: Sequence, rows: Sequence[dict]) -> list:
  """A Markdown table's lines: header, rule and one line per row.

  Args:
    columns: the columns, each a header or a ``(key, header)`` pair when the rows name the
      column otherwise.
    rows: one dict per row from key (or header) to cell: a string, or a value written with
      ``str``; a key a row lacks is an empty cell.
  """
  pairs = [c if isinstance(c, tuple) else (c, c) for c in columns]

  def line(cells):
    return "| " + " | ".join(cells) + " |"

  return ([line(h for _, h in pairs), "|" + "---|" * len(pairs)] +
          [line(str(r.get(k, "")) for k, _ in pairs) for r in rows])


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper, as a signed difference in accuracy points, beside ours.

  Attributes:
    claim: the claim in words ("BLUR+LUS beats DP-FedAvg at epsilon 2").
    paper_gain: the paper's difference in points; its sign is the claimed direction.
    measured: our difference in the same units, or None when this scale does not measure it.
    spread: the standard deviation of our difference over seeds, or None with one seed.
    reason: the likely reason for a gap (measured, not guessed, where the analysis exists).
    sign_only: the paper gives the direction only (a figure whose values are not legible):
      ``paper_gain``'s sign is the claim and its size is not used.
  """
  claim: str
  paper_gain: float
  measured: Optional[float]
  spread: Optional[float] = None
  reason: str = ""
  sign_only: bool = False


def seed_difference(diffs: Sequence[float]) -> tuple:
  """``(measured, spread)`` of a :class:`Claim` from its difference measured once per seed (runs
  paired by seed), in points: their mean, and their sample standard deviation (``ddof=1``),
  None with one seed."""
  d = np.asarray(diffs, float)
  return float(d.mean()), (float(d.std(ddof=1)) if d.size > 1 else None)


def verdict(paper_gain: float, measured: Optional[float], spread: Optional[float] = None,
            sign_only: bool = False) -> str:
  """The verdict on one claimed difference.

  ``"reproduced"``: our difference has the claimed sign, at least half the claimed size (not
  asked when ``sign_only``), and (with seeds) is larger than its spread. ``"partly"``: the
  claimed sign, but smaller than half the claim or within the spread. ``"not reproduced"``: zero
  or the opposite sign. ``"not measured"``: no measurement at this scale.

  Args:
    paper_gain: the paper's difference in points, non-zero; its sign is the claimed direction.
    measured: our difference in points, or None when not measured.
    spread: its standard deviation over seeds, or None with one seed.
    sign_only: judge the direction only, not the size.

  Returns:
    "reproduced", "partly", "not reproduced" or "not measured".

  Raises:
    ValueError: ``paper_gain`` is 0 (with a measurement).
  """
  if measured is None:
    return "not measured"
  if paper_gain == 0:
    raise ValueError("paper_gain: a claim is a non-zero difference")
  along = measured * (1.0 if paper_gain > 0 else -1.0)
  if along <= 0:
    return "not reproduced"
  if (sign_only or along >= 0.5 * abs(paper_gain)) and (spread is None or along > spread):
    return "reproduced"
  return "partly"


def claim_cells(c: Claim) -> dict:
  """One claim's cells as the verdict table prints them: ``claim``, ``paper`` (the paper's
  difference, or its direction "+ (sign only)"), ``ours`` (± spread over seeds; "n/a" when not
  measured), ``gap`` (ours minus the paper's; empty when not measured or sign only),
  ``verdict`` (:func:`verdict`) and ``reason``."""
  def points(x):
    return f"{x:+.2f}"

  ours = "n/a" if c.measured is None else points(c.measured) + (
      "" if c.spread is None else f" ± {c.spread:.2f}")
  paper = ("+" if c.paper_gain > 0 else "-") + " (sign only)" if c.sign_only else points(
      c.paper_gain)
  return {"claim": c.claim, "paper": paper, "ours": ours,
          "gap": "" if c.measured is None or c.sign_only else points(c.measured - c.paper_gain),
          "verdict": verdict(c.paper_gain, c.measured, c.spread, c.sign_only),
          "reason": c.reason}


def verdict_table(claims: Sequence[Claim]) -> list:
  """A Markdown table with one line per claim: the paper's difference, ours (± spread over
  seeds), the gap (ours minus the paper's), the verdict and the likely reason
  (:func:`claim_cells`). A ``sign_only`` claim shows the paper's direction ("+ (sign only)") and
  no gap."""
  return markdown_table([("claim", "claim"), ("paper", "paper (points)"),
                         ("ours", "ours (points)"), ("gap", "gap"), ("verdict", "verdict"),
                         ("reason", "likely reason")], [claim_cells(c) for c in claims])


def comparison_table(columns: Sequence[tuple]) -> list:
  """A Markdown table of one paper's claims at several scales side by side: one line per claim
  (matched by its text, in the order first met), the paper's difference, then for each scale
  ours (± spread over seeds) and the verdict as :func:`verdict_table` prints them, and whether
  the verdict changed from the first scale to the last ("yes: partly → reproduced", "no"). A
  claim that a scale does not have leaves that scale's cells empty, and its change cell too
  when that scale is the first or the last.

  Args:
    columns: one ``(header, claims)`` pair per scale, in order: the header naming the scale
      (its cells are headed "HEADER: ours" and "HEADER: verdict") and its
      :class:`Claim` s.

  Returns:
    The table's lines.
  """
  cells = [{c.claim: claim_cells(c) for c in claims} for _, claims in columns]
  texts = list(dict.fromkeys(text for at in cells for text in at))
  rows = []
  for text in texts:
    row = {"claim": text, "paper": next(at[text]["paper"] for at in cells if text in at)}
    for i, at in enumerate(cells):
      if text in at:
        row[f"ours{i}"], row[f"verdict{i}"] = at[text]["ours"], at[text]["verdict"]
    first, last = cells[0].get(text), cells[-1].get(text)
    if first is not None and last is not None:
      row["changed"] = ("no" if first["verdict"] == last["verdict"] else
                        f"yes: {first['verdict']} → {last['verdict']}")
    rows.append(row)
  headers = [("claim", "claim"), ("paper", "paper (points)")]
  for i, (header, _) in enumerate(columns):
    headers += [(f"ours{i}", f"{header}: ours (points)"), (f"verdict{i}", f"{header}: verdict")]
  return markdown_table(headers + [("changed", "verdict changed (first → last)")], rows)


def accuracy_comparison_table(keys: Sequence[str], columns: Sequence[tuple]) -> list:
  """A Markdown table of one paper's results at several scales side by side: one line per
  setting (its values at ``keys``, in the order first met), each scale's accuracy (mean ± std
  over seeds, in percent, as :func:`mean_std` writes it) and the change from the first scale to
  the last in points. A setting that a scale did not run leaves that scale's cell empty, and the
  change cell too when that scale is the first or the last.

  Args:
    keys: the fields that tell the settings apart (a reproduction's ``ROW_KEYS``).
    columns: one ``(header, rows)`` pair per scale, in order: the header naming the scale (its
      cells are headed "HEADER: accuracy (%)") and its ``results.json`` rows, each with the
      ``keys``, ``accuracy_mean`` and ``accuracy_std``.

  Returns:
    The table's lines.
  """
  found = [{tuple(r.get(k) for k in keys): r for r in rows} for _, rows in columns]
  settings = list(dict.fromkeys(key for at in found for key in at))
  lines = []
  for key in settings:
    line = {k: "" if v is None else v for k, v in zip(keys, key)}
    for i, at in enumerate(found):
      if key in at:
        line[f"accuracy{i}"] = mean_std(at[key].get("accuracy_mean"), at[key].get("accuracy_std"))
    first, last = found[0].get(key, {}), found[-1].get(key, {})
    if first.get("accuracy_mean") is not None and last.get("accuracy_mean") is not None:
      line["change"] = f"{100 * (last['accuracy_mean'] - first['accuracy_mean']):+.2f}"
    lines.append(line)
  headers = list(keys) + [(f"accuracy{i}", f"{header}: accuracy (%)")
                          for i, (header, _) in enumerate(columns)]
  return markdown_table(headers + [("change", "change (first → last, points)")], lines)
