"""IDX files (LeCun's format): MNIST, Fashion-MNIST and NIST's EMNIST.

Each set's four files (:attr:`DatasetSpec.files`) are looked up in
:meth:`DatasetSpec.search_dirs` order, each file as ``<name>.gz`` first, then
uncompressed ``<name>``; the first folder holding all four wins.
"""

from __future__ import annotations

import gzip
import math
import pathlib
from typing import Optional

import numpy as np

from fedjax_dp.data.sources.common import Arrays, Request, reading
from fedjax_dp.data.specs import SPECS, DatasetSpec
from fedjax_dp.errors import ConfigError, check

_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4",
           0x0D: ">f4", 0x0E: ">f8"}
_SUFFIXES = (".gz", "")


def read_idx(path) -> np.ndarray:
  """Reads one IDX file (gzip-compressed or raw, detected by content).

  Args:
    path: File path.

  Returns:
    The array with the file's shape and dtype (native byte order).
  """
  path = pathlib.Path(path)
  with reading(path):
    with open(path, "rb") as f:
      compressed = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if compressed else open
    with opener(path, "rb") as f:
      data = f.read()
  check(len(data) >= 4 and data[:2] == b"\x00\x00" and data[2] in _DTYPES,
        "data_file", str(path), "must be an IDX file (magic 0x0000<type><ndim>)")
  ndim = data[3]
  offset = 4 + 4 * ndim
  check(len(data) >= offset, "data_file", str(path), f"is truncated: no room for {ndim} header dims")
  dims = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
  dtype = np.dtype(_DTYPES[data[2]])
  size = math.prod(dims)
  check(min(dims, default=0) >= 0 and len(data) - offset == size * dtype.itemsize, "data_file",
        str(path), f"payload size must match header dims {dims}")
  arr = np.frombuffer(data, dtype=dtype, count=size, offset=offset)
  return arr.reshape(dims).astype(dtype.newbyteorder("="))


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
  y = read_idx(labels_path)
  check(y.ndim == 1 and x.ndim >= 1 and x.shape[0] == y.shape[0], "data_file", str(labels_path),
        f"must hold one label per image of {images_path} ({x.shape[:1]}), found shape {y.shape}")
  return x, y.astype(np.int32)


def _checked(spec: DatasetSpec, images_path, labels_path) -> tuple[np.ndarray, np.ndarray]:
  """:func:`load_idx`, with the images' shape and the labels' range checked against ``spec``."""
  x, y = load_idx(images_path, labels_path)
  check(x.shape[1:] == spec.example_shape[:2], "data_file", str(images_path),
        f"must hold {spec.name} images of shape {spec.example_shape[:2]}, found {x.shape[1:]}")
  if y.size:
    check(0 <= y.min() and y.max() < spec.num_classes, "data_file", str(labels_path),
          f"must hold {spec.name} labels in [0, {spec.num_classes}), found {y.min()}..{y.max()}")
  return x, y


def _check_not_another_set(spec: DatasetSpec, labels_path, labels: np.ndarray) -> None:
  """Refuses training labels that begin as another set's canonical release does (MNIST's
  folder holding Fashion-MNIST's files, which have the same names and format)."""
  for other in SPECS:
    n = len(other.label_prefix)
    if other is not spec and n and tuple(labels[:n].tolist()) == other.label_prefix:
      raise ConfigError("data_dir", str(pathlib.Path(labels_path).parent),
                        f"holds {other.name}'s files (its training labels begin "
                        f"{', '.join(map(str, other.label_prefix[:6]))}, ...), not {spec.name}'s: "
                        f"use --dataset {other.name}, or point --data-dir at {spec.name}'s files")


def _find_file(d: pathlib.Path, stem: str) -> Optional[pathlib.Path]:
  for cand in (d / f"{stem}{s}" for s in _SUFFIXES):
    if cand.is_file():
      return cand
  return None


def load(spec: DatasetSpec, request: Request) -> Optional[Arrays]:
  """Reads the set's local IDX files.

  Args:
    spec: An IDX spec; its ``files`` are the train images, train labels, test
      images and test labels.
    request: Only ``data_dir`` is read (the entry point takes the subsets).

  Returns:
    ``(train_x, train_y, test_x, test_y)``, images ``uint8`` ``[N, H, W, 1]``
    (transposed back when ``spec.transposed``), or ``None`` when no searched
    folder holds all four files.
  """
  for d in spec.search_dirs(request.data_dir):
    found = [_find_file(d, f) for f in spec.files]
    if all(found):
      tx, ty = _checked(spec, found[0], found[1])
      _check_not_another_set(spec, found[1], ty)
      ex, ey = _checked(spec, found[2], found[3])
      if spec.transposed:
        tx, ex = tx.transpose(0, 2, 1), ex.transpose(0, 2, 1)
      return tx[..., None], ty, ex[..., None], ey
  return None


def _shown(stem: str) -> str:
  return f"{stem}[.gz]"


def expected_files(spec: DatasetSpec) -> list[str]:
  """The file names searched for, as the error message lists them."""
  return [_shown(f) for f in spec.files]


def missing_files(spec: DatasetSpec, folder: pathlib.Path) -> list[str]:
  """The names of :func:`expected_files` that ``folder`` holds in neither form."""
  return [_shown(f) for f in spec.files if _find_file(folder, f) is None]
