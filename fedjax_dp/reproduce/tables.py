"""The reproductions' Markdown tables: one writer, one format for mean ± std."""

from __future__ import annotations

from typing import Optional, Sequence


def mean_std(mean: Optional[float], std: Optional[float] = None, scale: float = 100.0,
             digits: int = 2) -> str:
  """``"mean ± std"`` of ``scale`` times the values (percent by default) at ``digits`` decimals;
  the mean alone when ``std`` is None; ``"n/a"`` when ``mean`` is None."""
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
