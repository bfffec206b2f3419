"""TensorFlow Federated's HDF5 files: federated Shakespeare, EMNIST, CIFAR-100 and StackOverflow
(next-word and tag prediction).

These sets carry their natural partition (one client per speaking role, per
writer, TFF's Pachinko-allocated CIFAR-100 clients, per user): :func:`load_natural` returns it as a :class:`FederatedData`;
:func:`load` pools every client's examples, for the partitions that ignore
the clients. tensorflow-datasets does not have them, so there is no download
fallback: the files are those ``tff.simulation.datasets`` downloads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data import tff_h5
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.data.sources.common import (Arrays, Request, absent_files_message, missing_files,
                                           subset)
from fedjax_dp.data.specs import DatasetSpec
from fedjax_dp.errors import ConfigError, check


# StackOverflow's test users read: the first this many of its test file (204,088 in all).
SO_TEST_CLIENTS = 1000


def expected_files(spec: DatasetSpec) -> list[str]:
  """The HDF5 file names (train, test, then any other), for error messages."""
  return list(spec.files)


def paths(spec: DatasetSpec, data_dir):
  """The data set's HDF5 files, in :attr:`~DatasetSpec.files`' order (train, test, ...), in the
  first of ``spec.search_dirs(data_dir)`` that holds them all; :class:`ConfigError` naming the
  folders searched when none does."""
  searched = spec.search_dirs(data_dir)
  for d in searched:
    files = tuple(d / f for f in spec.files)
    if all(f.is_file() for f in files):
      return files
  head = absent_files_message(spec, data_dir, expected_files(spec),
                              lambda d: missing_files(spec, d))
  raise ConfigError(
      "data_dir", str(data_dir) if data_dir is not None else None,
      f"{head} (TensorFlow Federated's HDF5 files, as "
      "tff.simulation.datasets downloads them; tensorflow-datasets has none)")


def _read(spec: DatasetSpec, request: Request, max_clients) -> FederatedData:
  train, test, *others = paths(spec, request.data_dir)
  if spec.source == "tff_stackoverflow_tags":
    return tff_h5.load_federated_stackoverflow_tags(
        train, test, others[0], max_clients, max_test_clients=SO_TEST_CLIENTS,
        tag_vocab_size=spec.num_classes, length=spec.example_shape[0])
  if spec.source == "tff_stackoverflow":
    return tff_h5.load_federated_stackoverflow(
        train, test, others[0], max_clients, max_test_clients=SO_TEST_CLIENTS,
        vocab_size=spec.num_classes - 4, length=spec.example_shape[0])
  if spec.source == "tff_shakespeare":
    return tff_h5.load_federated_shakespeare(train, test, max_clients,
                                             spec.example_shape[0])
  if spec.source == "tff_cifar100":
    return tff_h5.load_federated_cifar100(train, test, max_clients)
  return tff_h5.load_federated_emnist(train, test, max_clients,
                                      only_digits=spec.num_classes == 10)


def load(spec: DatasetSpec, request: Request) -> Arrays:
  """Every training client's examples pooled, in file order, and the test set.

  Raises:
    ConfigError: When the files are missing (naming the searched folders).
  """
  fd = _read(spec, request, None)
  real = np.arange(fd.max_examples)[None, :] < fd.counts[:, None]
  return fd.x[real], fd.y[real], fd.test_x, fd.test_y


def load_natural(spec: DatasetSpec, request: Request, num_clients: int) -> FederatedData:
  """The first ``num_clients`` clients of the training file, in file order.

  ``request.max_test`` keeps a random subset of the test examples (class-
  balanced for EMNIST and CIFAR-100, uniform for Shakespeare's windows and StackOverflow's
  sentences, which are read from the first :data:`SO_TEST_CLIENTS` test users); ``max_train`` is
  refused, since the clients' data is what they hold.

  Args:
    spec: The data set's spec (a TFF set).
    request: What the load asks (data directory, test subset size, seed).
    num_clients: How many clients to keep, ``>= 1``.

  Returns:
    The :class:`FederatedData` of those clients, with their test examples.

  Raises:
    ConfigError: For missing files, ``max_train``, or ``num_clients`` above
      the number of (non-empty) clients in the file.
  """
  check(request.max_train is None, "max_train", request.max_train,
        "must be unset with partition='natural': a client's data is what it "
        "holds (num_clients takes fewer clients)")
  fd = _read(spec, request, num_clients)
  check(fd.num_clients == num_clients, "num_clients", num_clients,
        f"must be <= {fd.num_clients}, the clients of {spec.name} "
        f"({spec.files[0]})")
  keep = subset(fd.test_y, request.max_test, request.seed)
  # EMNIST's and Shakespeare's test files hold the same writers' held-out examples
  # (test_from_clients, as loaded); CIFAR-100's hold its test split.
  return dataclasses.replace(fd, test_x=fd.test_x[keep], test_y=fd.test_y[keep])
