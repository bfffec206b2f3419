"""The one table of data sets: what each is and where its files go.

Every per-data-set fact (source, sub-folders and file names under the data
directory, number of classes, example shape, tensorflow-datasets name, default
model) is a field of a :class:`DatasetSpec` in :data:`SPECS`; the loaders, the
error messages and the run configuration read them from here.

Local layout under a data directory (``.gz`` or uncompressed IDX both
accepted); each set's sub-folders are searched in order, then the data
directory itself::

  <data_dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
  <data_dir>/fashion-mnist/  (same file names)
  <data_dir>/emnist/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte.gz
  <data_dir>/cifar10/{train,test}.tar.gz  (members <split>/<class>/<NNNN>.jpg)
  <data_dir>/tff-h5/shakespeare_{train,test}.h5  (TensorFlow Federated's HDF5)
  <data_dir>/tff-h5/fed_emnist_{train,test}.h5, fed_emnist_digitsonly_{train,test}.h5
  <data_dir>/tff-h5/fed_cifar100_{train,test}.h5
  <data_dir>/tff-h5/stackoverflow_{train,test,held_out}.h5  (stackoverflow, stackoverflow_tags)

The TFF sets come with their natural partition (``partition="natural"``): one
client per speaking role of a play (Shakespeare), per writer (EMNIST), TFF's
500 Pachinko-allocated clients (CIFAR-100), per user (StackOverflow). StackOverflow's files
serve two tasks: next-word prediction (``stackoverflow``) and tag prediction
(``stackoverflow_tags``, multi-label: each example's tags among the 500 most used).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

from fedjax_dp.errors import check, check_choice


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One centralized data set.

  Attributes:
    name: Name used by the API and the CLI (``--dataset``).
    source: Key of :data:`fedjax_dp.data.sources.LOCAL`, the module that
      reads the local files: ``"digits"``, ``"idx"``, ``"cifar10"``,
      ``"tff_emnist"``, ``"tff_cifar100"``, ``"tff_shakespeare"``, ``"tff_stackoverflow"`` or
      ``"tff_stackoverflow_tags"``.
    num_classes: Number of classes (for Shakespeare and StackOverflow, tokens: every position
      of a window has a next-token label; for StackOverflow's tags, the tags).
    example_shape: Shape of one example, NHWC without N (Shakespeare: a
      window of 80 token ids; StackOverflow: a sentence of 20; its tag prediction: the ids of
      the first 100 words of a title and sentence).
    default_model: Model used when the configuration names none.
    subdirs: Sub-folders of the data directory searched, in order, before the
      data directory itself.
    files: File names in that folder: for IDX, the train images, train labels,
      test images and test labels (each also accepted with ``.gz``); for
      CIFAR-10 the train and test tarballs; for the TFF sets the train and test files, then
      any other file the set reads (StackOverflow's held-out file, its vocabulary's source).
    tfds_name: tensorflow-datasets name used with ``download=True``; ``None``
      when the set needs no download.
    transposed: Images are stored transposed (EMNIST, both in NIST's IDX
      files and in tfds) and are transposed back on load.
    natural_hint: Where a natural (per-client) partition of this data set
      comes from, for the error message of ``partition="natural"``.
    partitions: The partitions it takes: ``"natural"`` for sets with client
      ids; ``"dirichlet"`` and ``"shards"`` need one label per example.
    natural_clients: The clients of its natural partition (TFF's training files), the
      default ``num_clients`` of a natural partition; None without one, and for StackOverflow,
      whose 342,477 users do not fit in memory (``num_clients`` keeps its default).
    multi_label: Each example has a set of classes (StackOverflow's tags), for a multi-label
      model (:attr:`fedjax_dp.data.FederatedData.multi_label`).
  """
  name: str
  source: str
  num_classes: int
  example_shape: tuple[int, ...]
  default_model: str
  subdirs: tuple[str, ...] = ()
  files: tuple[str, ...] = ()
  tfds_name: Optional[str] = None
  transposed: bool = False
  natural_hint: Optional[str] = None
  partitions: tuple[str, ...] = ("iid", "dirichlet", "shards")
  # The first training labels of the set's canonical release: MNIST's and Fashion-MNIST's
  # files share names and format, so a folder holding the other set's is told by these.
  label_prefix: tuple[int, ...] = ()
  natural_clients: Optional[int] = None
  multi_label: bool = False

  def search_dirs(self, data_dir: Optional[pathlib.Path]) -> list[pathlib.Path]:
    """Folders searched for :attr:`files`, in order; none without a data dir."""
    if data_dir is None:
      return []
    return [data_dir / s for s in self.subdirs] + [data_dir]


def _idx_files(prefix: str, test: str) -> tuple[str, ...]:
  return tuple(f"{prefix}{split}-{kind}-ubyte" for split in ("train", test)
               for kind in ("images-idx3", "labels-idx1"))


_MNIST_FILES = _idx_files("", "t10k")

SPECS = (
    DatasetSpec("digits", "digits", 10, (8, 8, 1), "digits_cnn"),
    DatasetSpec("mnist", "idx", 10, (28, 28, 1), "cnn2", subdirs=("mnist",),
                files=_MNIST_FILES, tfds_name="mnist",
                label_prefix=(5, 0, 4, 1, 9, 2, 1, 3, 1, 4, 3, 5, 3, 6, 1, 7)),
    DatasetSpec("fashion_mnist", "idx", 10, (28, 28, 1), "cnn2",
                subdirs=("fashion-mnist", "fashion_mnist"), files=_MNIST_FILES,
                tfds_name="fashion_mnist",
                label_prefix=(9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9, 5, 5, 7, 9)),
    DatasetSpec("emnist", "idx", 62, (28, 28, 1), "cnn2",
                subdirs=("emnist", "emnist/gzip"),
                files=_idx_files("emnist-byclass-", "test"),
                tfds_name="emnist/byclass", transposed=True,
                natural_hint="dataset federated_emnist for writer-partitioned "
                "EMNIST (TFF's HDF5 files)"),
    DatasetSpec("cifar10", "cifar10", 10, (32, 32, 3), "cnn2",
                subdirs=("cifar10", "cifar-10"),
                files=("train.tar.gz", "test.tar.gz"), tfds_name="cifar10"),
    DatasetSpec("shakespeare", "tff_shakespeare", 90, (80,), "char_lstm",
                subdirs=("tff-h5", "shakespeare"),
                files=("shakespeare_train.h5", "shakespeare_test.h5"),
                partitions=("natural", "iid"), natural_clients=715),
    DatasetSpec("federated_emnist", "tff_emnist", 62, (28, 28, 1), "cnn2",
                subdirs=("tff-h5", "fed_emnist"),
                files=("fed_emnist_train.h5", "fed_emnist_test.h5"),
                partitions=("natural", "iid", "dirichlet", "shards"), natural_clients=3400),
    DatasetSpec("federated_emnist_digits", "tff_emnist", 10, (28, 28, 1), "cnn2",
                subdirs=("tff-h5", "fed_emnist_digitsonly", "fed_emnist"),
                files=("fed_emnist_digitsonly_train.h5",
                       "fed_emnist_digitsonly_test.h5"),
                partitions=("natural", "iid", "dirichlet", "shards"), natural_clients=3383),
    DatasetSpec("cifar100", "tff_cifar100", 100, (32, 32, 3), "resnet18_gn",
                subdirs=("tff-h5", "fed_cifar100"),
                files=("fed_cifar100_train.h5", "fed_cifar100_test.h5"),
                partitions=("natural", "iid", "dirichlet", "shards"), natural_clients=500),
    DatasetSpec("stackoverflow", "tff_stackoverflow", 10_004, (20,), "word_lstm",
                subdirs=("tff-h5", "stackoverflow"),
                files=("stackoverflow_train.h5", "stackoverflow_test.h5",
                       "stackoverflow_held_out.h5"),
                partitions=("natural", "iid")),
    DatasetSpec("stackoverflow_tags", "tff_stackoverflow_tags", 500, (100,), "bow_lr",
                subdirs=("tff-h5", "stackoverflow"),
                files=("stackoverflow_train.h5", "stackoverflow_test.h5",
                       "stackoverflow_held_out.h5"),
                partitions=("natural", "iid"), multi_label=True),
)

BY_NAME = {s.name: s for s in SPECS}

DATASETS = tuple(BY_NAME)


def get(name: str) -> DatasetSpec:
  """Returns the spec of data set ``name``.

  Raises:
    ConfigError: Naming the known data sets, for an unknown ``name``.
  """
  check_choice("dataset", name, DATASETS)
  return BY_NAME[name]


def check_partition(name: str, partition: str) -> None:
  """Refuses a partition that data set ``name`` does not take.

  Raises:
    ConfigError: One line naming the partition, the ones the set takes and
      the sets with a natural partition.
  """
  allowed = get(name).partitions
  natural = ", ".join(s.name for s in SPECS if "natural" in s.partitions)
  check(partition in allowed, "partition", partition,
        f"must be one of {list(allowed)} for dataset={name} (natural "
        f"partitions: {natural})")
