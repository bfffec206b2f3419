"""Summary statistics that the outputs report, computed on the host with NumPy.

:func:`seed_stats`: a setting run with several seeds gives one value per seed (a final
accuracy, a loss); its mean and sample standard deviation are what the rows of
:func:`fedjax_dp.sweep.sweep` and of the paper reproductions (:mod:`fedjax_dp.reproduce`) show.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from fedjax_dp.errors import check


def seed_stats(values: Sequence[Optional[float]], name: str = "accuracy") -> dict:
  """The mean and sample standard deviation of one value per seed.

  Args:
    values: one value per seed; a missing value (None) counts as NaN, and a NaN (a diverged
      seed) makes both statistics NaN: it is never dropped.
    name: the prefix of the keys.

  Returns:
    ``{NAME_mean, NAME_std, seeds}``: the mean, the sample standard deviation (``ddof=1``;
    None for one finite seed, where it is undefined: a spread of 0 would claim a precision one
    seed cannot show) and the number of seeds.

  Raises:
    ConfigError: ``values`` is empty.
  """
  a = np.array([math.nan if v is None else v for v in values], dtype=float)
  check(len(a) >= 1, "values", len(a), "need one value per seed, at least one")
  std = float(a.std(ddof=1)) if len(a) > 1 else (None if np.isfinite(a[0]) else math.nan)
  return {f"{name}_mean": float(a.mean()), f"{name}_std": std, "seeds": len(a)}
