"""CIFAR-10 as tarballs of JPEGs, decoded once and cached as ``.npz``.

``train.tar.gz`` and ``test.tar.gz`` (:attr:`DatasetSpec.files`) hold members
``<split>/<class>/<NNNN>.jpg``. Decoding all 60,000 images takes about a
minute, so each decoded split (or class-balanced subset of it) is cached under
the cache directory, never inside the data directory (read-only in CI), and
rebuilt when the tarball's size changes.
"""

from __future__ import annotations

import io
import os
import pathlib
import tarfile
from typing import Optional

import numpy as np

from fedjax_dp.data.sources import common
from fedjax_dp.data.specs import DatasetSpec
from fedjax_dp.errors import ConfigError, check

# Class folder names; their order gives the label ids 0..9 (CIFAR-10's own).
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
           "horse", "ship", "truck")
_SPLITS = ("train", "test")


def _find_dir(spec: DatasetSpec,
              data_dir: Optional[pathlib.Path]) -> Optional[pathlib.Path]:
  for d in spec.search_dirs(data_dir):
    if all((d / f).is_file() for f in spec.files):
      return d
  return None


def decode_tar(path: pathlib.Path, max_n: Optional[int], seed: int,
               example_shape: tuple[int, ...] = (32, 32, 3)):
  """Decodes (a balanced subset of) one CIFAR-10 JPEG tarball.

  Args:
    path: ``train.tar.gz`` or ``test.tar.gz``.
    max_n: Keep a class-balanced subset of at most this many images (drawn
      before decoding); ``None`` keeps all.
    seed: Seed of the subset.
    example_shape: Shape of one decoded image.

  Returns:
    ``(x, y)``: ``uint8`` ``[N, *example_shape]`` sorted by class, then member
    name, and ``int32`` labels.
  """
  with common.reading(path), tarfile.open(path, "r:gz") as tar:
    members = []
    for m in tar.getmembers():
      parts = m.name.split("/")
      if m.isfile() and m.name.endswith(".jpg") and len(parts) >= 2:
        check(parts[-2] in CLASSES, "data_file", str(path),
              f"member {m.name}'s class folder must be one of {list(CLASSES)}")
        members.append(m)
    members.sort(key=lambda m: (CLASSES.index(m.name.split("/")[-2]), m.name))
    labels = np.array([CLASSES.index(m.name.split("/")[-2]) for m in members],
                      dtype=np.int32)
    pick = common.subset(labels, max_n, seed)
    chosen = [members[i] for i in pick]
    # Read in archive order so the gzip stream is only ever seeked forward.
    pos = {m.offset_data: k for k, m in enumerate(chosen)}
    x = np.zeros((len(chosen),) + tuple(example_shape), dtype=np.uint8)
    for m in sorted(chosen, key=lambda m: m.offset_data):
      x[pos[m.offset_data]] = _decode(path, m.name, tar.extractfile(m).read(), example_shape)
  return x, labels[pick]


def _decode(path: pathlib.Path, name: str, blob: bytes, example_shape) -> np.ndarray:
  """Member ``name`` of tarball ``path`` as an RGB array, checked to be a JPEG of the right size."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  h, w = example_shape[:2]
  want = f"member {name} must be a {w}x{h} JPEG image"
  try:
    with Image.open(io.BytesIO(blob)) as img:
      check(img.format == "JPEG" and img.size == (w, h), "data_file", str(path),
            f"{want}, found a {img.size[0]}x{img.size[1]} {img.format}")
      return np.asarray(img.convert("RGB"))
  except OSError as e:  # not an image, or a truncated one
    raise ConfigError("data_file", str(path), f"{want} ({e})") from None


def _cached_split(spec: DatasetSpec, src: pathlib.Path, split: str,
                  max_n: Optional[int], seed: int, cache_dir: pathlib.Path):
  """Loads a decoded split from the cache, decoding and caching on a miss."""
  tag = "all" if max_n is None else f"n{max_n}-seed{seed}"
  cache = cache_dir / f"{spec.name}-{split}-{tag}.npz"
  size = src.stat().st_size
  if cache.is_file():
    try:
      with np.load(cache) as z:
        if int(z["source_size"]) == size:
          return z["x"], z["y"]
    except (OSError, ValueError, KeyError):
      pass  # Corrupt or stale cache: rebuild it below.
  x, y = decode_tar(src, max_n, seed, spec.example_shape)
  try:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
      np.savez(f, x=x, y=y, source_size=np.int64(size))
    os.replace(tmp, cache)
  except OSError:
    pass  # A read-only cache only costs speed.
  return x, y


def load(spec: DatasetSpec,
         request: common.Request) -> Optional[common.Arrays]:
  """Reads (subsets of) the local tarballs through the decoded-array cache.

  Args:
    spec: The ``cifar10`` spec; its ``files`` are the train and test tarballs.
    request: The data and cache directories, and the subsets (taken before
      decoding, so a small subset decodes fast).

  Returns:
    ``(train_x, train_y, test_x, test_y)``, images ``uint8``
    ``[N, 32, 32, 3]`` sorted by class, or ``None`` when no searched folder
    holds both tarballs.

  Raises:
    ConfigError: If the cache directory is (inside) the folder of the files.
  """
  d = _find_dir(spec, request.data_dir)
  if d is None:
    return None
  cache = common.resolve_cache_dir(request.cache_dir)
  d_res = d.resolve()
  check(not (cache.resolve() == d_res or d_res in cache.resolve().parents),
        "cache_dir", str(cache),
        f"must not be inside the data directory {d} (read-only in CI)")
  out = ()
  for split, f, max_n in zip(_SPLITS, spec.files,
                             (request.max_train, request.max_test)):
    out += _cached_split(spec, d / f, split, max_n, request.seed, cache)
  return out


def expected_files(spec: DatasetSpec) -> list[str]:
  """The file names searched for, as the error message lists them."""
  return list(spec.files)


missing_files = common.missing_files  # the names of expected_files that a folder lacks
