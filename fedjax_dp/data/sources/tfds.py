"""Download through tensorflow-datasets (CLI ``--download``).

The fallback when a set's local files are missing and ``download=True``.
TensorFlow is imported only inside :func:`load`, so importing this module (and
every offline run) stays free of it.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.data.sources.common import Arrays
from fedjax_dp.data.specs import DatasetSpec
from fedjax_dp.errors import ConfigError

INSTALL_HINT = "pip install 'fedjax_dp[tfds]'"


def load(spec: DatasetSpec) -> Arrays:
  """Fetches ``spec.tfds_name`` with tensorflow-datasets (imported only here).

  Args:
    spec: A spec with a ``tfds_name``.

  Returns:
    ``(train_x, train_y, test_x, test_y)``: ``uint8`` NHWC images (transposed
    back when ``spec.transposed``) and ``int32`` labels.

  Raises:
    ConfigError: If tensorflow-datasets is not installed.
  """
  try:
    import tensorflow_datasets as tf_datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(
        "download", True,
        f"fetching {spec.name} needs tensorflow-datasets, which is not "
        f"installed: {INSTALL_HINT} (or provide local files via data_dir)"
    ) from e
  out = []
  for split in ("train", "test"):
    ds = tf_datasets.load(spec.tfds_name, split=split, batch_size=-1,
                          as_supervised=True)
    x, y = tf_datasets.as_numpy(ds)
    x = np.asarray(x, dtype=np.uint8)
    if spec.transposed:
      x = x.transpose(0, 2, 1, 3)
    out += [x, np.asarray(y, dtype=np.int32)]
  return tuple(out)
