"""Entry points: load a centralized data set, or split it among clients.

Which set is what, and where its files go, is in the table
:data:`fedjax_dp.data.specs.SPECS`; reading the files is the business of
:mod:`fedjax_dp.data.sources`. Local files come first (a data directory from
the ``data_dir`` argument or the ``FEDJAX_DP_DATA`` environment variable);
TensorFlow Datasets is used only when they are missing and ``download=True``
(CLI ``--download``). TensorFlow is imported only on that path, so offline runs
fail fast with a :class:`~fedjax_dp.errors.ConfigError` instead of hanging on
network retries.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from fedjax_dp.data import partition as partition_lib
from fedjax_dp.data import sources
from fedjax_dp.data import specs
from fedjax_dp.data.federated import CentralDataset, FederatedData
from fedjax_dp.data.sources.common import (
    Request,
    absent_files_message,
    resolve_data_dir,
    subset,
)
from fedjax_dp.errors import ConfigError, check, check_choice

# Stream of np.random.default_rng([seed, _PARTITION_TAG]): the partition,
# independent of the subsets' stream (sources.common.SUBSAMPLE_TAG).
_PARTITION_TAG = 2


def _natural_needs_ids() -> str:
  hints = "; ".join(s.natural_hint for s in specs.SPECS if s.natural_hint)
  others = [p for p in partition_lib.PARTITIONERS if p != "natural"]
  return ("'natural' needs per-example client ids, which centralized data sets "
          f"do not have (use {hints}); choose {', '.join(others[:-1])} or "
          f"{others[-1]}")


def _missing_files_error(spec: specs.DatasetSpec, data_dir, given=None) -> ConfigError:
  """The error for absent local files: ``data_dir`` is the resolved folder (None: none), shown
  as the value, else the ``data_dir`` argument as ``given`` (an empty one resolves to none)."""
  source = sources.LOCAL[spec.source]
  head = absent_files_message(spec, data_dir, source.expected_files(spec),
                              lambda d: source.missing_files(spec, d))
  return ConfigError(
      "data_dir", str(data_dir) if data_dir is not None else given,
      f"{head}; pass download=True (CLI --download) to fetch with "
      f"tensorflow-datasets (needs network and {sources.tfds.INSTALL_HINT})")


def _check_max(field: str, value: Optional[int]) -> None:
  check(value is None or (isinstance(value, (int, np.integer)) and value >= 1),
        field, value, "must be None or an integer >= 1")


def _to_float(a: np.ndarray) -> np.ndarray:
  if a.dtype == np.uint8:
    return a.astype(np.float32) / np.float32(255.0)
  return a.astype(np.float32, copy=False)


def load_central(name: str, data_dir: Optional[str] = None,
                 cache_dir: Optional[str] = None, download: bool = False,
                 max_train: Optional[int] = None,
                 max_test: Optional[int] = None,
                 seed: int = 0) -> CentralDataset:
  """Loads a centralized data set as float32 NHWC arrays in ``[0, 1]``.

  Args:
    name: One of :data:`~fedjax_dp.data.specs.DATASETS`.
    data_dir: Directory with local copies (layout in
      :mod:`fedjax_dp.data.specs`); default ``$FEDJAX_DP_DATA``. ``digits``
      needs none (bundled with scikit-learn).
    cache_dir: Where decoded CIFAR-10 arrays are cached; default
      ``$FEDJAX_DP_CACHE`` or ``~/.cache/fedjax_dp``. Never inside
      ``data_dir``.
    download: When local files are missing, fetch with tensorflow-datasets.
    max_train: Keep a class-balanced random subset of at most this many
      training examples (for fast tests); ``None`` keeps all.
    max_test: Same for the test set.
    seed: Seed of the ``max_train``/``max_test`` subsets. (The digits
      train/test split itself is fixed and does not depend on it.)

  Returns:
    The :class:`CentralDataset`, examples of the spec's ``example_shape``:
    ``digits`` is ``[N, 8, 8, 1]`` (1,438 train, 359 test), MNIST-like sets
    ``[N, 28, 28, 1]``, ``cifar10`` ``[N, 32, 32, 3]``; labels ``int32``.
    Examples keep their source order (CIFAR-10 is sorted by class);
    partitioners shuffle.

  Raises:
    ConfigError: For an unknown name or bad subset size, or when local files
      are missing and ``download`` is false (naming the searched paths).
  """
  spec = specs.get(name)
  _check_max("max_train", max_train)
  _check_max("max_test", max_test)
  ddir = resolve_data_dir(data_dir)
  arrays = sources.LOCAL[spec.source].load(
      spec, Request(data_dir=ddir, cache_dir=cache_dir, max_train=max_train,
                    max_test=max_test, seed=seed))
  if arrays is None:
    if not download:
      raise _missing_files_error(spec, ddir, data_dir)
    arrays = sources.tfds.load(spec)
  tx, ty, ex, ey = arrays
  # Subsets (CIFAR-10 local files were subset before decoding; this is then
  # a no-op because the sizes already fit).
  tr, te = subset(ty, max_train, seed), subset(ey, max_test, seed)
  return CentralDataset(name=name, train_x=_to_float(tx[tr]),
                        train_y=ty[tr].astype(np.int32),
                        test_x=_to_float(ex[te]),
                        test_y=ey[te].astype(np.int32),
                        num_classes=spec.num_classes)


def partition_indices(labels: np.ndarray, num_clients: int, partition: str,
                      rng: np.random.Generator, alpha: float = 0.5,
                      shards_per_client: int = 2,
                      client_ids: Optional[np.ndarray] = None,
                      min_labels: int = 1) -> list[np.ndarray]:
  """Dispatches to a partitioner in :mod:`fedjax_dp.data.partition` by name.

  Args:
    labels: Training labels.
    num_clients: Number of clients.
    partition: One of :data:`~fedjax_dp.data.partition.PARTITIONERS`.
    rng: Source of randomness.
    alpha: Dirichlet concentration (``dirichlet`` only).
    shards_per_client: Shards per client (``shards`` only).
    client_ids: Per-example client ids (``natural`` only).
    min_labels: Minimum distinct labels per client (``shards`` only).

  Returns:
    One index array per client.
  """
  check_choice("partition", partition, partition_lib.PARTITIONERS)
  if partition == "iid":
    return partition_lib.iid(len(labels), num_clients, rng)
  if partition == "dirichlet":
    return partition_lib.dirichlet(labels, num_clients, alpha, rng)
  if partition == "shards":
    return partition_lib.shards(labels, num_clients, shards_per_client, rng, min_labels)
  check(client_ids is not None, "partition", partition, _natural_needs_ids())
  return partition_lib.natural(client_ids)


@dataclasses.dataclass(frozen=True)
class Split:
  """How :func:`load_federated` splits a training set among clients.

  Attributes:
    num_clients: Number of clients, in ``[1, number of training examples]``.
    partition: One of the set's ``partitions``
      (:func:`~fedjax_dp.data.specs.check_partition`): ``"iid"``,
      ``"dirichlet"``, ``"shards"``, or ``"natural"`` for the TFF HDF5 sets
      (their first ``num_clients`` clients, in file order).
    alpha: Dirichlet concentration, ``> 0`` (``dirichlet`` only).
    shards_per_client: Shards per client, ``>= 1`` (``shards`` only).
    min_labels: With ``shards``: every client holds at least this many labels.
  """

  num_clients: int
  partition: str = "iid"
  alpha: float = 0.5
  shards_per_client: int = 2
  min_labels: int = 1


def load_federated(name: str, split: Split, seed: int = 0, data_dir: Optional[str] = None,
                   max_train: Optional[int] = None, max_test: Optional[int] = None,
                   cache_dir: Optional[str] = None, download: bool = False) -> FederatedData:
  """Loads a data set and splits its training set among clients.

  Args:
    name: One of :data:`~fedjax_dp.data.specs.DATASETS`.
    split: How the training set is split among clients.
    seed: Seeds both the subsets and the partition (independent streams).
    data_dir: See :func:`load_central`.
    max_train: See :func:`load_central`.
    max_test: See :func:`load_central`.
    cache_dir: See :func:`load_central`.
    download: See :func:`load_central`.

  Returns:
    The padded :class:`FederatedData`; the test set stays centralized.

  Raises:
    ConfigError: For an unknown name, a partition the set does not have, a bad split or
      subset size, or as :func:`load_central`.
  """
  num_clients, partition = split.num_clients, split.partition
  alpha, shards_per_client = split.alpha, split.shards_per_client
  spec = specs.get(name)
  specs.check_partition(name, partition)
  check(isinstance(num_clients, (int, np.integer)) and num_clients >= 1,
        "num_clients", num_clients, "must be an integer >= 1")
  if partition == "dirichlet":
    check(alpha is not None and alpha > 0, "alpha", alpha, "must be > 0")
  if partition == "shards":
    check(isinstance(shards_per_client, (int, np.integer)) and
          shards_per_client >= 1, "shards_per_client", shards_per_client,
          "must be an integer >= 1")
  if partition == "natural":
    return sources.LOCAL[spec.source].load_natural(spec, Request(
        data_dir=resolve_data_dir(data_dir), cache_dir=cache_dir,
        max_train=max_train, max_test=max_test, seed=seed), num_clients)
  data = load_central(name, data_dir=data_dir, cache_dir=cache_dir,
                      download=download, max_train=max_train,
                      max_test=max_test, seed=seed)
  rng = np.random.default_rng([seed, _PARTITION_TAG])
  parts = partition_indices(data.train_y, num_clients, partition, rng,
                            alpha=alpha, shards_per_client=shards_per_client,
                            min_labels=split.min_labels)
  return FederatedData.from_partition(name, data.train_x, data.train_y, parts,
                                      data.test_x, data.test_y,
                                      data.num_classes, multi_label=spec.multi_label)
