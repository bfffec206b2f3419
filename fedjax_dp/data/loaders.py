"""Loaders for centralized image data sets, from local files or tfds.

Local files come first (a data directory from the ``data_dir`` argument or the
``FEDJAX_DP_DATA`` environment variable); TensorFlow Datasets is used only when
they are missing and ``download=True`` (CLI ``--download``). TensorFlow is
imported only on that path, so offline runs fail fast with a
:class:`~fedjax_dp.errors.ConfigError` instead of hanging on network retries.

Expected local layout (``.gz`` or uncompressed IDX both accepted)::

  <data_dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
  <data_dir>/fashion-mnist/  (same file names)
  <data_dir>/emnist/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte.gz
  <data_dir>/cifar10/{train,test}.tar.gz  (members <split>/<class>/<NNNN>.jpg)

MNIST-like files may also lie directly in ``<data_dir>``.
"""

from __future__ import annotations

import gzip
import io
import os
import pathlib
import tarfile
from typing import Optional

import numpy as np

from fedjax_dp.data import partition as partition_lib
from fedjax_dp.data.federated import CentralDataset, FederatedData
from fedjax_dp.errors import ConfigError, check, check_choice

DATASETS = ("digits", "mnist", "fashion_mnist", "emnist", "cifar10")

DATA_ENV = "FEDJAX_DP_DATA"
CACHE_ENV = "FEDJAX_DP_CACHE"

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog",
                   "frog", "horse", "ship", "truck")

_NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10,
                "emnist": 62, "cifar10": 10}
_TFDS_NAMES = {"mnist": "mnist", "fashion_mnist": "fashion_mnist",
               "emnist": "emnist/byclass", "cifar10": "cifar10"}
_IDX_SUBDIRS = {"mnist": ("mnist",),
                "fashion_mnist": ("fashion-mnist", "fashion_mnist"),
                "emnist": ("emnist", "emnist/gzip")}
_CIFAR_SUBDIRS = ("cifar10", "cifar-10")
# Fixed seed of the digits train/test split: every run evaluates on the same
# test set whatever its ``seed``.
_DIGITS_SPLIT_SEED = 0
_NATURAL_NEEDS_IDS = (
    "'natural' needs per-example client ids, which centralized data sets do "
    "not have (use fedjax_dp.data.tff_h5.load_federated_emnist for "
    "writer-partitioned EMNIST); choose iid, dirichlet or shards")
_SUBSAMPLE_TAG = 1
_PARTITION_TAG = 2


def _idx_names(name: str) -> dict[str, str]:
  prefix = "emnist-byclass-" if name == "emnist" else ""
  return {
      "train_images": f"{prefix}train-images-idx3-ubyte",
      "train_labels": f"{prefix}train-labels-idx1-ubyte",
      "test_images": f"{prefix}{'test' if prefix else 't10k'}-images-idx3-ubyte",
      "test_labels": f"{prefix}{'test' if prefix else 't10k'}-labels-idx1-ubyte",
  }


def resolve_data_dir(data_dir: Optional[str]) -> Optional[pathlib.Path]:
  """Returns ``data_dir``, else ``$FEDJAX_DP_DATA``, else ``None``."""
  d = data_dir if data_dir else os.environ.get(DATA_ENV) or None
  return pathlib.Path(d).expanduser() if d else None


def resolve_cache_dir(cache_dir: Optional[str]) -> pathlib.Path:
  """Returns ``cache_dir``, else ``$FEDJAX_DP_CACHE``, else ``~/.cache/fedjax_dp``."""
  d = cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/fedjax_dp"
  return pathlib.Path(d).expanduser()


# ----------------------------------------------------------------------- IDX

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4",
               0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path) -> np.ndarray:
  """Reads one IDX file (gzip-compressed or raw, detected by content).

  Args:
    path: File path.

  Returns:
    The array with the file's shape and dtype (native byte order).
  """
  path = pathlib.Path(path)
  with open(path, "rb") as f:
    compressed = f.read(2) == b"\x1f\x8b"
  opener = gzip.open if compressed else open
  with opener(path, "rb") as f:
    data = f.read()
  check(len(data) >= 4 and data[:2] == b"\x00\x00" and data[2] in _IDX_DTYPES,
        "idx_file", str(path), "must be an IDX file (magic 0x0000<type><ndim>)")
  ndim = data[3]
  dims = np.frombuffer(data, dtype=">i4", count=ndim, offset=4)
  dtype = np.dtype(_IDX_DTYPES[data[2]])
  offset = 4 + 4 * ndim
  size = int(np.prod(dims)) if ndim else 1
  check(len(data) - offset == size * dtype.itemsize, "idx_file", str(path),
        f"payload size must match header dims {tuple(int(d) for d in dims)}")
  arr = np.frombuffer(data, dtype=dtype, count=size, offset=offset)
  return arr.reshape(tuple(int(d) for d in dims)).astype(dtype.newbyteorder("="))


def load_idx(images_path, labels_path) -> tuple[np.ndarray, np.ndarray]:
  """Reads an IDX image file and its IDX label file.

  Args:
    images_path: ``*-images-idx3-ubyte[.gz]``.
    labels_path: ``*-labels-idx1-ubyte[.gz]``.

  Returns:
    ``(x, y)``: ``x`` as stored (``uint8`` ``[N, H, W]`` for MNIST-like data),
    ``y`` as ``int32`` ``[N]``.
  """
  x = read_idx(images_path)
  y = read_idx(labels_path).astype(np.int32).reshape(-1)
  check(x.shape[0] == y.shape[0], "labels_path", str(labels_path),
        f"must hold {x.shape[0]} labels (one per image), found {y.shape[0]}")
  return x, y


def _find_file(d: pathlib.Path, stem: str) -> Optional[pathlib.Path]:
  for cand in (d / f"{stem}.gz", d / stem):
    if cand.is_file():
      return cand
  return None


def _missing_files_error(name: str, data_dir, searched, expected) -> ConfigError:
  where = ", ".join(str(s) for s in searched) if searched else "(none)"
  hint = ("" if data_dir is not None else
          f"no data directory given: pass data_dir (--data-dir) or set "
          f"${DATA_ENV}; ")
  return ConfigError(
      "data_dir", str(data_dir) if data_dir is not None else None,
      f"{hint}no local {name} files found; searched {where} for "
      f"{', '.join(expected)}; pass download=True (CLI --download) to fetch "
      "with tensorflow-datasets (needs network and "
      "pip install 'fedjax_dp[tfds]')")


def _load_idx_dataset(name: str, data_dir: Optional[pathlib.Path]):
  """Returns (train_x, train_y, test_x, test_y) uint8 NHWC, or None if absent."""
  if data_dir is None:
    return None
  names = _idx_names(name)
  for sub in _IDX_SUBDIRS[name] + ("",):
    d = data_dir / sub if sub else data_dir
    found = {k: _find_file(d, v) for k, v in names.items()}
    if all(found.values()):
      tx, ty = load_idx(found["train_images"], found["train_labels"])
      ex, ey = load_idx(found["test_images"], found["test_labels"])
      if name == "emnist":
        # NIST stores EMNIST images transposed relative to MNIST.
        tx, ex = tx.transpose(0, 2, 1), ex.transpose(0, 2, 1)
      return tx[..., None], ty, ex[..., None], ey
  return None


def _idx_searched(name: str, data_dir: Optional[pathlib.Path]):
  if data_dir is None:
    return [], []
  dirs = [data_dir / s for s in _IDX_SUBDIRS[name]] + [data_dir]
  return dirs, [f"{v}[.gz]" for v in _idx_names(name).values()]


# --------------------------------------------------------------- subsampling


def balanced_subset(labels: np.ndarray, n: Optional[int],
                    rng: np.random.Generator) -> np.ndarray:
  """Deterministic class-balanced random subset of ``n`` indices.

  Classes take turns (in random order within each class), so class counts
  differ by at most one until a class runs out.

  Args:
    labels: Integer labels.
    n: Subset size; ``None`` or ``>= len(labels)`` keeps everything.
    rng: Source of randomness.

  Returns:
    Sorted ``int64`` indices (the source order is kept).
  """
  labels = np.asarray(labels).reshape(-1)
  if n is None or n >= labels.shape[0]:
    return np.arange(labels.shape[0], dtype=np.int64)
  perm = rng.permutation(labels.shape[0])
  lab = labels[perm]
  order = np.argsort(lab, kind="stable")
  counts = np.bincount(np.searchsorted(np.unique(lab), lab))
  starts = np.repeat(np.cumsum(counts) - counts, counts)
  rank = np.empty(labels.shape[0], dtype=np.int64)
  rank[order] = np.arange(labels.shape[0]) - starts
  # Ties within a rank are broken by the random permutation.
  pick = perm[np.argsort(rank, kind="stable")[:n]]
  return np.sort(pick).astype(np.int64)


def _check_max(field: str, value: Optional[int]) -> None:
  check(value is None or (isinstance(value, (int, np.integer)) and value >= 1),
        field, value, "must be None or an integer >= 1")


# -------------------------------------------------------------------- digits


def _load_digits():
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  d = load_digits()
  x = d.images.astype(np.float32) / 16.0
  y = d.target.astype(np.int32)
  rng = np.random.default_rng(_DIGITS_SPLIT_SEED)
  test = []
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    test.append(idx[:int(round(0.2 * len(idx)))])
  is_test = np.zeros(len(y), dtype=bool)
  is_test[np.concatenate(test)] = True
  return x[~is_test, ..., None], y[~is_test], x[is_test, ..., None], y[is_test]


# ------------------------------------------------------------------- CIFAR-10


def _cifar_dir(data_dir: Optional[pathlib.Path]) -> Optional[pathlib.Path]:
  if data_dir is None:
    return None
  for d in [data_dir / s for s in _CIFAR_SUBDIRS] + [data_dir]:
    if (d / "train.tar.gz").is_file() and (d / "test.tar.gz").is_file():
      return d
  return None


def _decode_cifar_tar(path: pathlib.Path, max_n: Optional[int], seed: int):
  """Decodes (a balanced subset of) one CIFAR-10 JPEG tarball to uint8."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with tarfile.open(path, "r:gz") as tar:
    members = []
    for m in tar.getmembers():
      parts = m.name.split("/")
      if m.isfile() and m.name.endswith(".jpg") and len(parts) >= 2:
        check(parts[-2] in CIFAR10_CLASSES, "cifar10_member", m.name,
              f"class folder must be one of {list(CIFAR10_CLASSES)}")
        members.append(m)
    members.sort(key=lambda m: (CIFAR10_CLASSES.index(m.name.split("/")[-2]),
                                m.name))
    labels = np.array([CIFAR10_CLASSES.index(m.name.split("/")[-2])
                       for m in members], dtype=np.int32)
    pick = balanced_subset(labels, max_n,
                           np.random.default_rng([seed, _SUBSAMPLE_TAG]))
    chosen = [members[i] for i in pick]
    # Read in archive order so the gzip stream is only ever seeked forward.
    pos = {m.offset_data: k for k, m in enumerate(chosen)}
    x = np.zeros((len(chosen), 32, 32, 3), dtype=np.uint8)
    for m in sorted(chosen, key=lambda m: m.offset_data):
      with Image.open(io.BytesIO(tar.extractfile(m).read())) as img:
        x[pos[m.offset_data]] = np.asarray(img.convert("RGB"))
  return x, labels[pick]


def _cached_cifar_split(src: pathlib.Path, split: str, max_n: Optional[int],
                        seed: int, cache_dir: pathlib.Path):
  """Loads a decoded split from the cache, decoding and caching on a miss."""
  tag = "all" if max_n is None else f"n{max_n}-seed{seed}"
  cache = cache_dir / f"cifar10-{split}-{tag}.npz"
  size = src.stat().st_size
  if cache.is_file():
    try:
      with np.load(cache) as z:
        if int(z["source_size"]) == size:
          return z["x"], z["y"]
    except (OSError, ValueError, KeyError):
      pass  # Corrupt or stale cache: rebuild it below.
  x, y = _decode_cifar_tar(src, max_n, seed)
  try:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
      np.savez(f, x=x, y=y, source_size=np.int64(size))
    os.replace(tmp, cache)
  except OSError:
    pass  # A read-only cache only costs speed.
  return x, y


# ---------------------------------------------------------------------- tfds


def _load_tfds(name: str):
  """Fetches a data set with tensorflow-datasets (imported only here)."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError(
        "download", True,
        f"fetching {name} needs tensorflow-datasets, which is not installed: "
        "pip install 'fedjax_dp[tfds]' (or provide local files via data_dir)"
    ) from e
  out = []
  for split in ("train", "test"):
    ds = tfds.load(_TFDS_NAMES[name], split=split, batch_size=-1,
                   as_supervised=True)
    x, y = tfds.as_numpy(ds)
    x = np.asarray(x, dtype=np.uint8)
    if name == "emnist":  # tfds keeps NIST's transposed EMNIST images.
      x = x.transpose(0, 2, 1, 3)
    out += [x, np.asarray(y, dtype=np.int32)]
  return tuple(out)


# ---------------------------------------------------------------- public API


def load_central(name: str, data_dir: Optional[str] = None,
                 cache_dir: Optional[str] = None, download: bool = False,
                 max_train: Optional[int] = None,
                 max_test: Optional[int] = None,
                 seed: int = 0) -> CentralDataset:
  """Loads a centralized data set as float32 NHWC arrays in ``[0, 1]``.

  Args:
    name: One of :data:`DATASETS`.
    data_dir: Directory with local copies (see the module docstring); default
      ``$FEDJAX_DP_DATA``. ``digits`` needs none (bundled with scikit-learn).
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
    The :class:`CentralDataset`: ``digits`` is ``[N, 8, 8, 1]`` (1,438 train,
    359 test), MNIST-like sets ``[N, 28, 28, 1]``, ``cifar10``
    ``[N, 32, 32, 3]``; labels ``int32``. Examples keep their source order
    (CIFAR-10 is sorted by class); partitioners shuffle.

  Raises:
    ConfigError: For an unknown name or bad subset size, or when local files
      are missing and ``download`` is false (naming the searched paths).
  """
  check_choice("dataset", name, DATASETS)
  _check_max("max_train", max_train)
  _check_max("max_test", max_test)
  ddir = resolve_data_dir(data_dir)
  sub_rng = lambda: np.random.default_rng([seed, _SUBSAMPLE_TAG])

  if name == "digits":
    tx, ty, ex, ey = _load_digits()
  elif name == "cifar10":
    cdir = _cifar_dir(ddir)
    if cdir is not None:
      cdir_res = cdir.resolve()
      cache = resolve_cache_dir(cache_dir)
      check(not (cache.resolve() == cdir_res or
                 cdir_res in cache.resolve().parents), "cache_dir", str(cache),
            f"must not be inside the data directory {cdir} (read-only in CI)")
      tx, ty = _cached_cifar_split(cdir / "train.tar.gz", "train", max_train,
                                   seed, cache)
      ex, ey = _cached_cifar_split(cdir / "test.tar.gz", "test", max_test,
                                   seed, cache)
    elif download:
      tx, ty, ex, ey = _load_tfds(name)
    else:
      searched = ([ddir / s for s in _CIFAR_SUBDIRS] + [ddir]) if ddir else []
      raise _missing_files_error(name, ddir, searched,
                                 ["train.tar.gz", "test.tar.gz"])
  else:
    arrays = _load_idx_dataset(name, ddir)
    if arrays is None:
      if not download:
        searched, expected = _idx_searched(name, ddir)
        raise _missing_files_error(name, ddir, searched, expected)
      arrays = _load_tfds(name)
    tx, ty, ex, ey = arrays

  # Subsets (CIFAR-10 local files were subset before decoding; this is then
  # a no-op because the sizes already fit).
  tr = balanced_subset(ty, max_train, sub_rng())
  te = balanced_subset(ey, max_test, sub_rng())
  tx, ty, ex, ey = tx[tr], ty[tr], ex[te], ey[te]

  def to_float(a):
    if a.dtype == np.uint8:
      return a.astype(np.float32) / np.float32(255.0)
    return a.astype(np.float32, copy=False)

  return CentralDataset(name=name, train_x=to_float(tx),
                        train_y=ty.astype(np.int32), test_x=to_float(ex),
                        test_y=ey.astype(np.int32),
                        num_classes=_NUM_CLASSES[name])


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
  check(client_ids is not None, "partition", partition, _NATURAL_NEEDS_IDS)
  return partition_lib.natural(client_ids)


def load_federated(name: str, num_clients: int, partition: str = "iid",
                   seed: int = 0, data_dir: Optional[str] = None,
                   alpha: float = 0.5, shards_per_client: int = 2,
                   max_train: Optional[int] = None,
                   max_test: Optional[int] = None,
                   cache_dir: Optional[str] = None,
                   download: bool = False, min_labels: int = 1) -> FederatedData:
  """Loads a data set and splits its training set among clients.

  Args:
    name: One of :data:`DATASETS`.
    num_clients: Number of clients, in ``[1, number of training examples]``.
    partition: ``"iid"``, ``"dirichlet"`` or ``"shards"`` (``"natural"`` needs
      client ids, which only the TFF HDF5 loaders have).
    seed: Seeds both the subsets and the partition (independent streams).
    data_dir: See :func:`load_central`.
    alpha: Dirichlet concentration, ``> 0``.
    shards_per_client: Shards per client, ``>= 1``.
    max_train: See :func:`load_central`.
    max_test: See :func:`load_central`.
    cache_dir: See :func:`load_central`.
    download: See :func:`load_central`.
    min_labels: With ``shards``: every client holds at least this many labels.

  Returns:
    The padded :class:`FederatedData`; the test set stays centralized.
  """
  check_choice("dataset", name, DATASETS)
  check_choice("partition", partition, partition_lib.PARTITIONERS)
  check(isinstance(num_clients, (int, np.integer)) and num_clients >= 1,
        "num_clients", num_clients, "must be an integer >= 1")
  if partition == "dirichlet":
    check(alpha is not None and alpha > 0, "alpha", alpha, "must be > 0")
  if partition == "shards":
    check(isinstance(shards_per_client, (int, np.integer)) and
          shards_per_client >= 1, "shards_per_client", shards_per_client,
          "must be an integer >= 1")
  check(partition != "natural", "partition", partition, _NATURAL_NEEDS_IDS)
  data = load_central(name, data_dir=data_dir, cache_dir=cache_dir,
                      download=download, max_train=max_train,
                      max_test=max_test, seed=seed)
  rng = np.random.default_rng([seed, _PARTITION_TAG])
  parts = partition_indices(data.train_y, num_clients, partition, rng,
                            alpha=alpha, shards_per_client=shards_per_client,
                            min_labels=min_labels)
  return FederatedData.from_partition(name, data.train_x, data.train_y, parts,
                                      data.test_x, data.test_y,
                                      data.num_classes)
