"""Reader for TensorFlow Federated's HDF5 client-data layout.

TFF distributes federated data sets (EMNIST, CIFAR-100, Shakespeare, ...) as HDF5
files with one group per client::

  examples/<client_id>/<feature>   e.g. pixels [n, 28, 28], label [n]
                                   or  image [n, 32, 32, 3] (uint8), label [n]
                                   or  snippets [n] (byte strings)

``h5py`` is imported inside the functions, so importing this module is cheap.
Client ids are listed in the file's order, which for h5py is sorted by name.

Federated Shakespeare becomes next-character prediction at every position
(:func:`shakespeare_windows`): the task of the TFF and FedJAX benchmarks.
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


def _read_all(path, features: Sequence[str], client_fn: Callable,
              max_clients: Optional[int]):
  """Yields ``client_fn`` of each client's features, for clients left non-empty, in file order."""
  with _open(path) as f:
    n = 0
    for cid in f[_ROOT].keys():
      if max_clients is not None and n >= max_clients:
        return
      x, y = client_fn(_read_group(f, path, cid, features))
      if len(y):
        n += 1
        yield x, y


def load_tff_h5_federated(train_path, test_path, features: Sequence[str],
                          client_fn: Callable, num_classes: int,
                          name: str = "tff_h5",
                          max_clients: Optional[int] = None,
                          test_from_clients: bool = True) -> FederatedData:
  """Loads a TFF HDF5 data set with its natural (per-client) partition.

  Args:
    train_path: Training HDF5 file; one client per group.
    test_path: Test HDF5 file; all its clients are concatenated into the
      centralized test set.
    features: Feature names read from each client, e.g. ``("pixels",
      "label")``.
    client_fn: Maps one client's ``{feature: array}`` to its examples ``(x,
      y)`` (model inputs and ``int`` labels, one row per example); a client
      with no rows is dropped (train and test).
    num_classes: Number of classes.
    name: Data set name for the result.
    max_clients: Keep only the first this many (non-empty) training clients,
      in file order; ``None`` keeps all. The test set is not reduced.
    test_from_clients: The test file holds the training clients' own held-out examples (EMNIST's
      writers, Shakespeare's roles: statistics on it are raw, no guarantee covers them); False
      when its clients' examples are apart from every training client's (CIFAR-100's test
      split).

  Returns:
    The padded :class:`FederatedData`, clients in file order, its
    :attr:`~FederatedData.test_from_clients` as given.
  """
  check(max_clients is None or (isinstance(max_clients, (int, np.integer))
                                and max_clients >= 1),
        "max_clients", max_clients, "must be None or an integer >= 1")

  def per_client(field, path, limit):
    """Every non-empty client's ``(x, y)`` of one file, as two lists in file order.

    Args:
      field: The argument the error names ("train_path" or "test_path").
      path: The HDF5 file.
      limit: Keep only the first this many non-empty clients; ``None`` keeps all.

    Raises:
      ConfigError: The file holds no non-empty client.
    """
    xs, ys = [], []
    for x, y in _read_all(path, features, client_fn, limit):
      xs.append(x)
      ys.append(np.asarray(y, dtype=np.int32))
    check(len(xs) >= 1, field, str(path), "must hold at least one non-empty client")
    return xs, ys

  xs, ys = per_client("train_path", train_path, max_clients)
  tx, ty = per_client("test_path", test_path, None)
  counts = [len(y) for y in ys]
  bounds = np.cumsum([0] + counts)
  parts = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(counts))]
  return FederatedData.from_partition(
      name, np.concatenate(xs).astype(np.float32), np.concatenate(ys), parts,
      np.concatenate(tx).astype(np.float32), np.concatenate(ty), num_classes,
      test_from_clients=test_from_clients)


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
  def client_fn(d):
    x, y = np.asarray(d["pixels"], dtype=np.float32)[..., None], np.asarray(d["label"])
    keep = y < 10 if only_digits else slice(None)
    return x[keep], y[keep]

  return load_tff_h5_federated(
      train_path, test_path, ("pixels", "label"), client_fn,
      num_classes=10 if only_digits else 62, name="federated_emnist",
      max_clients=max_clients)


CIFAR100_LABELS = ("label", "coarse_label")


def load_federated_cifar100(train_path, test_path,
                            max_clients: Optional[int] = None,
                            label: str = "label") -> FederatedData:
  """Loads TFF's federated CIFAR-100 (500 training and 100 test clients).

  TFF's ``tff.simulation.datasets.cifar100`` splits CIFAR-100 by the Pachinko Allocation Method
  (a two-level Dirichlet: per client over the 20 coarse labels with concentration 0.1, then
  within a coarse label over its fine labels with 10), 100 examples per client; each client
  holds ``image`` (``uint8`` ``[n, 32, 32, 3]``), ``label`` (fine, 0..99) and ``coarse_label``
  (0..19), both ``int64``. Images become ``float32`` in ``[0, 1]`` (``x / 255``) at their full
  32x32: no crop, flip or per-channel normalization (TFF's baselines train on random 24x24
  crops and test on the central crop).

  Args:
    train_path: ``fed_cifar100_train.h5``.
    test_path: ``fed_cifar100_test.h5``; all its clients form the test set.
    max_clients: Keep only the first this many clients (file order: client ids sorted as
      strings, ``"0", "1", "10", "100", ...``).
    label: ``"label"`` (100 classes) or ``"coarse_label"`` (20).

  Returns:
    The padded :class:`FederatedData` named ``"cifar100"``. Its test set is CIFAR-100's test
    split, which no training client holds (TFF's 100 test clients partition it), so it is not
    ``test_from_clients``.

  Raises:
    ConfigError: For a ``label`` not in :data:`CIFAR100_LABELS`, or a client whose
      labels do not match its images.
  """
  check(label in CIFAR100_LABELS, "label", label, f"must be one of {list(CIFAR100_LABELS)}")

  def client_fn(d):
    x = np.asarray(d["image"], dtype=np.float32) / 255.0
    y = np.asarray(d[label]).reshape(-1)
    check(len(y) == len(x), label, y.shape,
          f"must hold one label per image ({len(x)} images)")
    return x, y

  return load_tff_h5_federated(
      train_path, test_path, ("image", label), client_fn,
      num_classes=100 if label == "label" else 20, name="cifar100",
      max_clients=max_clients, test_from_clients=False)


# TFF's Shakespeare vocabulary: the 86 characters of the "Federated Learning for
# Text Generation" tutorial (tensorflow.org/federated/tutorials/
# federated_learning_for_text_generation), in its order, as
# google-research/federated's utils/datasets/shakespeare_dataset.py numbers
# them: pad 0, the characters 1..86, out-of-vocabulary 87, beginning of
# snippet 88, end of snippet 89 (90 tokens). Characters are bytes: a byte
# outside the vocabulary (any non-ASCII byte) is OOV.
SHAKESPEARE_CHARS = (
    b"dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquy"
    b"AEIMQUY]!%)-159\r")
PAD, OOV, BOS, EOS = 0, 87, 88, 89
# A target that counts in no loss or metric: fedjax_dp.models.IGNORE, not
# imported so that this module stays free of JAX (a test checks they agree).
IGNORE = -1
SHAKESPEARE_VOCAB_SIZE = 90
SEQUENCE_LENGTH = 80  # McMahan et al., AISTATS 2017
_BYTE_TO_ID = np.full(256, OOV, dtype=np.int32)
_BYTE_TO_ID[np.frombuffer(SHAKESPEARE_CHARS, np.uint8)] = np.arange(1, 87)


def shakespeare_windows(snippets: Sequence[bytes],
                        length: int = SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
  """One client's snippets as next-character examples ``(x, y)``, each ``[n, length]``.

  The snippets become one token stream, each as ``BOS, characters, EOS``; the
  stream without its last token is cut into windows of ``length`` inputs ``x``
  and the stream without its first token into the aligned targets ``y``
  (``y[i, t]`` is the token after ``x[i, t]``), so every token but the first
  is a target exactly once (FedJAX's split; TFF's drops the last token of each
  window of ``length + 1``), and window ``i``'s last target is window ``i + 1``'s first
  input: under example-level DP one character belongs to two examples. The last window is
  padded: inputs with :data:`PAD`, targets with :data:`IGNORE`. For example,
  with ``length=3``, ``[b"ABCD", b"E"]`` gives ``x = [[BOS, A, B], [C, D,
  EOS], [BOS, E, PAD]]`` and ``y = [[A, B, C], [D, EOS, BOS], [E, EOS,
  IGNORE]]``.

  Args:
    snippets: The client's byte strings.
    length: Window length, ``>= 1``.

  Returns:
    ``int32`` inputs and targets; ``n = ceil((tokens - 1) / length)`` (0 for
    no snippets).
  """
  check(isinstance(length, (int, np.integer)) and length >= 1, "length", length,
        "must be an integer >= 1")
  stream = np.concatenate(
      [np.concatenate([[BOS], _BYTE_TO_ID[np.frombuffer(s, np.uint8)], [EOS]])
       for s in snippets] or [np.zeros(1, np.int32)]).astype(np.int32)
  n = -(-(len(stream) - 1) // length)
  x = np.full(n * length, PAD, np.int32)
  y = np.full(n * length, IGNORE, np.int32)
  x[:len(stream) - 1], y[:len(stream) - 1] = stream[:-1], stream[1:]
  return x.reshape(n, length), y.reshape(n, length)


def load_federated_shakespeare(train_path, test_path,
                               max_clients: Optional[int] = None,
                               length: int = SEQUENCE_LENGTH) -> FederatedData:
  """Loads TFF's federated Shakespeare (one client per speaking role of a play).

  Each client's snippets become :func:`shakespeare_windows`; inputs are token
  ids stored as ``float32`` ``[n, length]``, labels ``int32`` ``[n, length]``
  over the :data:`SHAKESPEARE_VOCAB_SIZE` tokens. The real files have 715
  clients, 30,249 training and 4,657 test windows of 80.

  Args:
    train_path: ``shakespeare_train.h5``.
    test_path: ``shakespeare_test.h5``; all its clients form the test set.
    max_clients: Keep only the first this many clients (file order).
    length: Window length.

  Returns:
    The padded :class:`FederatedData` named ``"shakespeare"``.
  """
  return load_tff_h5_federated(
      train_path, test_path, ("snippets",),
      lambda d: shakespeare_windows(d["snippets"], length),
      num_classes=SHAKESPEARE_VOCAB_SIZE, name="shakespeare",
      max_clients=max_clients)
