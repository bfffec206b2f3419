"""Reader for TensorFlow Federated's HDF5 client-data layout.

TFF distributes federated data sets (EMNIST, Shakespeare, ...) as HDF5 files
with one group per client::

  examples/<client_id>/<feature>   e.g. pixels [n, 28, 28], label [n]
                                   or  snippets [n] (byte strings)

``h5py`` is imported inside the functions, so importing this module is cheap.
Client ids are listed in the file's order, which for h5py is sorted by name.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from fedjax_dp.data.federated import FederatedData
from fedjax_dp.errors import ConfigError, check

_ROOT = "examples"


def _open(path):
  import h5py  # pylint: disable=g-import-not-at-top
  try:
    f = h5py.File(path, "r")
  except (OSError, FileNotFoundError) as e:
    raise ConfigError("path", str(path),
                      f"must be a readable HDF5 file ({e})") from e
  if _ROOT not in f:
    f.close()
    raise ConfigError("path", str(path),
                      f"must be a TFF HDF5 file with a top-level '{_ROOT}' "
                      "group of clients")
  return f


def _read_group(f, path, client_id: str,
                features: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
  group = f[_ROOT].get(client_id)
  check(group is not None, "client_id", client_id,
        f"must be a client of {path}")
  names = list(group.keys()) if features is None else list(features)
  missing = [n for n in names if n not in group]
  check(not missing, "feature", missing[0] if missing else None,
        f"must be one of {list(group.keys())} (client {client_id!r} of {path})")
  return {n: group[n][()] for n in names}


def client_ids(path) -> list[str]:
  """Returns the client ids of a TFF HDF5 file, in file (name) order."""
  with _open(path) as f:
    return list(f[_ROOT].keys())


def read_client(path, client_id: str,
                features: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
  """Reads one client's features as arrays.

  Args:
    path: TFF HDF5 file.
    client_id: A client id from :func:`client_ids`.
    features: Feature names to read; default all of the client's features.

  Returns:
    ``{feature: array}`` as stored (byte strings stay ``bytes``).
  """
  with _open(path) as f:
    return _read_group(f, path, client_id, features)


def _read_all(path, feature_x: str, feature_y: str,
              example_filter, max_clients: Optional[int]):
  """Yields (client_id, x, y) for non-empty clients, in file order."""
  with _open(path) as f:
    n = 0
    for cid in f[_ROOT].keys():
      if max_clients is not None and n >= max_clients:
        return
      d = _read_group(f, path, cid, [feature_x, feature_y])
      x, y = d[feature_x], d[feature_y]
      if example_filter is not None:
        keep = np.asarray(example_filter(x, y), dtype=bool)
        x, y = x[keep], y[keep]
      if len(y):
        n += 1
        yield cid, x, y


def load_tff_h5_federated(train_path, test_path, feature_x: str,
                          feature_y: str, num_classes: int,
                          name: str = "tff_h5",
                          max_clients: Optional[int] = None,
                          example_filter: Optional[Callable] = None,
                          x_fn: Optional[Callable] = None) -> FederatedData:
  """Loads a TFF HDF5 data set with its natural (per-client) partition.

  Args:
    train_path: Training HDF5 file; one client per group.
    test_path: Test HDF5 file; all its clients are concatenated into the
      centralized test set.
    feature_x: Input feature name, e.g. ``"pixels"``.
    feature_y: Label feature name, e.g. ``"label"``.
    num_classes: Number of classes.
    name: Data set name for the result.
    max_clients: Keep only the first this many (non-empty) training clients,
      in file order; ``None`` keeps all. The test set is not reduced.
    example_filter: Optional ``(x, y) -> bool mask`` applied to each client's
      examples (train and test); clients left empty are dropped.
    x_fn: Optional map of each client's raw inputs to model inputs.

  Returns:
    The padded :class:`FederatedData`, clients in file order.
  """
  check(max_clients is None or (isinstance(max_clients, (int, np.integer))
                                and max_clients >= 1),
        "max_clients", max_clients, "must be None or an integer >= 1")
  x_fn = x_fn or (lambda a: a)

  def per_client(field, path, limit):
    xs, ys = [], []
    for _, x, y in _read_all(path, feature_x, feature_y, example_filter, limit):
      xs.append(x_fn(x))
      ys.append(np.asarray(y, dtype=np.int32).reshape(-1))
    check(len(xs) >= 1, field, str(path), "must hold at least one non-empty client")
    return xs, ys

  xs, ys = per_client("train_path", train_path, max_clients)
  tx, ty = per_client("test_path", test_path, None)
  counts = [len(y) for y in ys]
  bounds = np.cumsum([0] + counts)
  parts = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(counts))]
  return FederatedData.from_partition(
      name, np.concatenate(xs).astype(np.float32), np.concatenate(ys), parts,
      np.concatenate(tx).astype(np.float32), np.concatenate(ty), num_classes)


def load_federated_emnist(train_path, test_path,
                          max_clients: Optional[int] = None,
                          only_digits: bool = False) -> FederatedData:
  """Loads TFF's federated EMNIST (one client per writer).

  Pixels are kept exactly as TFF stores them: ``float32`` in ``[0, 1]`` with
  **1.0 as background** (white paper, dark ink), i.e. inverted relative to
  MNIST; use ``1 - x`` for MNIST polarity. Images become ``[n, 28, 28, 1]``.

  Args:
    train_path: ``fed_emnist_train.h5`` (or ``fed_emnist_digitsonly_train.h5``).
    test_path: The matching test file; all its writers form the test set.
    max_clients: Keep only the first this many writers (file order).
    only_digits: Keep only labels ``< 10`` (10 classes) and drop writers left
      without examples; otherwise 62 classes (digits, upper, lower case).

  Returns:
    The padded :class:`FederatedData` named ``"federated_emnist"``.
  """
  return load_tff_h5_federated(
      train_path, test_path, "pixels", "label",
      num_classes=10 if only_digits else 62, name="federated_emnist",
      max_clients=max_clients,
      example_filter=(lambda x, y: np.asarray(y) < 10) if only_digits else None,
      x_fn=lambda x: np.asarray(x, dtype=np.float32)[..., None])
