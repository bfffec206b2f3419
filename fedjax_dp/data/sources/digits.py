"""scikit-learn's bundled 8x8 digits (1,797 images): no files, no download."""

from __future__ import annotations

import numpy as np

from fedjax_dp.data.sources import common
from fedjax_dp.data.sources.common import Arrays, Request
from fedjax_dp.data.specs import DatasetSpec

# Fixed seed of the train/test split: every run evaluates on the same test set
# whatever its ``seed``.
SPLIT_SEED = 0
TEST_FRACTION = 0.2


def load(spec: DatasetSpec, request: Request) -> Arrays:
  """Returns the digits as ``float32`` in ``[0, 1]``, split 80/20 per class.

  Args:
    spec: The ``digits`` spec.
    request: Unused: scikit-learn bundles the data, the entry point takes the
      subsets and the split is fixed (:data:`SPLIT_SEED`).

  Returns:
    ``(train_x, train_y, test_x, test_y)``, images ``[N, 8, 8, 1]``.
  """
  del spec, request
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  d = load_digits()
  x = d.images.astype(np.float32) / 16.0
  y = d.target.astype(np.int32)
  rng = np.random.default_rng(SPLIT_SEED)
  test = []
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    test.append(idx[:int(round(TEST_FRACTION * len(idx)))])
  is_test = np.zeros(len(y), dtype=bool)
  is_test[np.concatenate(test)] = True
  return x[~is_test, ..., None], y[~is_test], x[is_test, ..., None], y[is_test]


def expected_files(spec: DatasetSpec) -> list[str]:
  """None: the digits need no files."""
  del spec
  return []


missing_files = common.missing_files  # none: the digits need no files
