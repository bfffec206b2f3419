"""Array containers for centralized and federated data sets.

Everything here is plain NumPy on the host. The engine moves the arrays (or a
cohort's rows of them) to the accelerator itself.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from fedjax_dp.errors import ConfigError, check


class CentralDataset(NamedTuple):
  """A centralized data set, split into train and test.

  Attributes:
    name: Data set name, e.g. ``"mnist"``.
    train_x: ``float32`` images, NHWC, values in ``[0, 1]``.
    train_y: ``int32`` labels in ``[0, num_classes)``, ``[num_train]`` or, for
      a sequence task, one label per position ``[num_train, *label_shape]``
      (:data:`fedjax_dp.models.IGNORE` marks positions that count nowhere).
    test_x: ``float32`` test images, same layout as ``train_x``.
    test_y: ``int32`` test labels.
    num_classes: Number of classes.
  """
  name: str
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int


@dataclasses.dataclass
class FederatedData:
  """Client data as dense padded arrays plus per-client counts.

  Client ``i`` owns rows ``x[i, :counts[i]]`` and ``y[i, :counts[i]]``; rows
  beyond ``counts[i]`` are padding (zeros in ``x``, label 0 in ``y``) and must
  be masked out by the consumer. Padding to ``max_examples`` lets a round over
  a cohort compile once. Memory is ``num_clients * max_examples`` examples, so
  a very skewed partition (small Dirichlet ``alpha``) costs more than the data.

  Attributes:
    name: Data set name.
    x: ``float32`` array ``[num_clients, max_examples, *example_shape]``.
    y: ``int32`` array ``[num_clients, max_examples, *label_shape]``;
      ``label_shape`` is ``()`` for classification and e.g. ``(80,)`` for
      next-character prediction at every position of an 80-character input.
    counts: ``int32`` array ``[num_clients]``, real examples per client, each
      ``>= 1``.
    test_x: Centralized ``float32`` test inputs ``[num_test, *example_shape]``.
    test_y: Centralized ``int32`` test labels ``[num_test, *label_shape]``.
    num_classes: Number of classes.
    test_from_clients: the test set holds the clients' own held-out examples (a natural
      partition: TFF's test files are the same writers'), so statistics on it are raw
      statistics of their private data, which no guarantee covers; False for a test set
      apart from every client's data.
    multi_label: each example has a set of classes (StackOverflow's tags): ``label_shape`` is
      ``(T,)``, an example's class ids padded with :data:`fedjax_dp.models.IGNORE`, for a
      multi-label model (:attr:`fedjax_dp.models.Model.multi_label`).
  """
  name: str
  x: np.ndarray
  y: np.ndarray
  counts: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  test_from_clients: bool = False
  multi_label: bool = False

  def __post_init__(self):
    self.counts = np.asarray(self.counts, dtype=np.int32)
    check(self.x.ndim >= 2, "x", self.x.shape,
          "must be [num_clients, max_examples, ...]")
    check(self.y.shape[:2] == self.x.shape[:2], "y", self.y.shape,
          f"must start with x.shape[:2]={self.x.shape[:2]}")
    check(self.counts.shape == (self.x.shape[0],), "counts",
          self.counts.shape, f"must have shape ({self.x.shape[0]},)")
    if self.counts.size:
      check(int(self.counts.min()) >= 1, "counts", int(self.counts.min()),
            "every client needs >= 1 example")
      check(int(self.counts.max()) <= self.x.shape[1], "counts",
            int(self.counts.max()), f"must be <= max_examples={self.x.shape[1]}")
    check(self.test_x.shape[1:] == self.x.shape[2:], "test_x",
          self.test_x.shape, f"must have example shape {self.x.shape[2:]}")
    check(self.test_y.shape == self.test_x.shape[:1] + self.y.shape[2:], "test_y",
          self.test_y.shape, f"must be [num_test, *label_shape] = "
          f"{self.test_x.shape[:1] + self.y.shape[2:]}")
    check(self.num_classes >= 1, "num_classes", self.num_classes, "must be >= 1")

  @property
  def num_clients(self) -> int:
    """Number of clients."""
    return int(self.x.shape[0])

  def rows(self, ids: np.ndarray) -> tuple:
    """``(x, y, counts)`` of the clients ``ids`` (a cohort's rows, gathered on the host)."""
    return self.x[ids], self.y[ids], self.counts[ids]

  @property
  def max_examples(self) -> int:
    """Padded number of examples per client."""
    return int(self.x.shape[1])

  @property
  def example_shape(self) -> tuple[int, ...]:
    """Shape of one example, e.g. ``(28, 28, 1)``."""
    return tuple(self.x.shape[2:])

  @property
  def total_examples(self) -> int:
    """Number of real (unpadded) training examples over all clients."""
    return int(self.counts.sum())

  @classmethod
  def from_partition(cls, name: str, x: np.ndarray, y: np.ndarray,
                     client_indices: Sequence[np.ndarray], test_x: np.ndarray,
                     test_y: np.ndarray, num_classes: int, **traits) -> "FederatedData":
    """Builds padded client arrays from per-client example indices.

    Args:
      name: Data set name.
      x: Training inputs ``[num_examples, *example_shape]``.
      y: Training labels ``[num_examples, *label_shape]``.
      client_indices: One integer index array into ``x``/``y`` per client, as
        returned by the functions in :mod:`fedjax_dp.data.partition`. The
        order within a client is kept.
      test_x: Centralized test inputs.
      test_y: Centralized test labels.
      num_classes: Number of classes.
      **traits: the data set's flags, passed to the class: ``test_from_clients`` (the test set
        is the clients' own held-out data) and ``multi_label`` (each example has a set of
        classes); both False by default.

    Returns:
      The padded :class:`FederatedData`.

    Raises:
      ConfigError: If there are no clients, a client is empty or an index is
        out of range.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    check(len(client_indices) >= 1, "num_clients", len(client_indices),
          "must be >= 1")
    check(x.shape[0] == y.shape[0], "y", y.shape,
          f"must have as many rows as x ({x.shape[0]})")
    idx = [np.asarray(i, dtype=np.int64).reshape(-1) for i in client_indices]
    counts = np.array([len(i) for i in idx], dtype=np.int32)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
      raise ConfigError("client_indices", f"client {int(empty[0])} is empty",
                        "every client needs >= 1 example")
    flat = np.concatenate(idx)
    check(flat.min() >= 0 and flat.max() < x.shape[0], "client_indices",
          f"[{flat.min()}, {flat.max()}]", f"must index [0, {x.shape[0]})")
    num_clients, max_examples = len(idx), int(counts.max())
    px = np.zeros((num_clients, max_examples) + x.shape[1:], dtype=np.float32)
    py = np.zeros((num_clients, max_examples) + y.shape[1:], dtype=np.int32)
    for c, i in enumerate(idx):
      px[c, :len(i)] = x[i]
      py[c, :len(i)] = y[i]
    return cls(name=name, x=px, y=py, counts=counts,
               test_x=np.asarray(test_x, dtype=np.float32),
               test_y=np.asarray(test_y, dtype=np.int32),
               num_classes=int(num_classes), **traits)

  def client_examples(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns client ``i``'s unpadded ``(x_i, y_i)`` (views, not copies)."""
    check(0 <= i < self.num_clients, "client", i,
          f"must be in [0, {self.num_clients})")
    n = int(self.counts[i])
    return self.x[i, :n], self.y[i, :n]

  def label_histogram(self) -> np.ndarray:
    """Per-client label counts, ``int64`` ``[num_clients, num_classes]`` (every
    label position of a sequence counts; negative labels, ignored ones, do not)."""
    mask = np.arange(self.max_examples)[None, :] < self.counts[:, None]
    hist = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
    rows = np.broadcast_to(np.arange(self.num_clients).reshape((-1,) + (1,) * (self.y.ndim - 1)),
                           self.y.shape)[mask].reshape(-1)
    labels = self.y[mask].reshape(-1)
    np.add.at(hist, (rows[labels >= 0], labels[labels >= 0]), 1)
    return hist
