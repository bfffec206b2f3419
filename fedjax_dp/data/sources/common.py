"""What the sources and the entry points share: directories and subsets.

A source returns its data as the tuple :data:`Arrays`: ``(train_x, train_y,
test_x, test_y)``, images NHWC (``uint8``, or ``float32`` in ``[0, 1]``),
labels integers, examples in source order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import tarfile
import zlib
from typing import Callable, Optional, Sequence

import numpy as np

from fedjax_dp.errors import ConfigError

DATA_ENV = "FEDJAX_DP_DATA"
CACHE_ENV = "FEDJAX_DP_CACHE"

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Request:
  """What a load asks of a source; each source reads the fields it needs.

  Attributes:
    data_dir: Resolved data directory, or ``None`` when none is given.
    cache_dir: Cache directory as given (``None``: the default).
    max_train: Subset size of the training set, or ``None``.
    max_test: Subset size of the test set, or ``None``.
    seed: Seed of the subsets.
  """
  data_dir: Optional[pathlib.Path]
  cache_dir: Optional[str]
  max_train: Optional[int]
  max_test: Optional[int]
  seed: int

@contextlib.contextmanager
def reading(path):
  """Turns a failure to read the data file ``path`` (truncated, a bad gzip CRC, not a tar
  archive, unreadable) into a :class:`ConfigError` naming the file."""
  try:
    yield
  except ConfigError:
    raise
  except (OSError, EOFError, zlib.error, tarfile.TarError) as e:
    raise ConfigError("data_file", str(path),
                      f"is damaged or truncated ({type(e).__name__}: {e})") from None

# Stream of np.random.default_rng([seed, SUBSAMPLE_TAG]): the max_train /
# max_test subsets, independent of the partition's stream.
SUBSAMPLE_TAG = 1


def resolve_data_dir(data_dir: Optional[str]) -> Optional[pathlib.Path]:
  """Returns ``data_dir``, else ``$FEDJAX_DP_DATA``, else ``None``."""
  d = data_dir if data_dir else os.environ.get(DATA_ENV) or None
  return pathlib.Path(d).expanduser() if d else None


def missing_files(spec, folder: pathlib.Path) -> list[str]:
  """The names of ``spec.files`` that ``folder`` lacks, each looked for as written (a source
  whose files may also be compressed, IDX, has its own)."""
  return [f for f in spec.files if not (folder / f).is_file()]


def absent_files_message(spec, data_dir: Optional[pathlib.Path], expected: Sequence[str],
                         missing: Callable[[pathlib.Path], Sequence[str]]) -> str:
  """The head of the error when no folder searched for ``spec``'s files holds all of them.

  Args:
    spec: The set's :class:`~fedjax_dp.data.specs.DatasetSpec`.
    data_dir: Resolved data directory, or ``None``.
    expected: The file names searched for, as the message shows them.
    missing: ``missing(folder)``: the names of ``expected`` that ``folder`` lacks.

  Returns:
    For the searched folders that hold some of the files, which of ``expected`` each lacks;
    when none holds any, "no local <set> files found" with the folders and names searched
    (after how to give a data directory, when none is given).
  """
  searched = spec.search_dirs(data_dir)
  where = ", ".join(str(s) for s in searched) if searched else "(none)"
  partial = [(d, lacks) for d in searched for lacks in [list(missing(d))]
             if 0 < len(lacks) < len(expected)]
  if partial:
    lacking = "; ".join(f"{d} lacks {', '.join(lacks)}" for d, lacks in partial)
    return (f"incomplete local {spec.name} files: {lacking} (searched {where}; all "
            f"{len(expected)} files must be in one folder)")
  hint = ("" if data_dir is not None else
          f"no data directory given: pass data_dir (--data-dir) or set ${DATA_ENV}; ")
  return f"{hint}no local {spec.name} files found; searched {where} for {', '.join(expected)}"


def resolve_cache_dir(cache_dir: Optional[str]) -> pathlib.Path:
  """Returns ``cache_dir``, else ``$FEDJAX_DP_CACHE``, else ``~/.cache/fedjax_dp``."""
  d = cache_dir or os.environ.get(CACHE_ENV) or "~/.cache/fedjax_dp"
  return pathlib.Path(d).expanduser()


def balanced_subset(labels: np.ndarray, n: Optional[int],
                    rng: np.random.Generator) -> np.ndarray:
  """Deterministic class-balanced random subset of ``n`` indices.

  Classes take turns (in random order within each class), so class counts
  differ by at most one until a class runs out. Labels with a shape per
  example (a sequence's labels) give a uniformly random subset.

  Args:
    labels: Integer labels ``[N]`` or ``[N, *label_shape]``.
    n: Subset size; ``None`` or ``>= len(labels)`` keeps everything.
    rng: Source of randomness.

  Returns:
    Sorted ``int64`` indices (the source order is kept).
  """
  labels = np.asarray(labels)
  if n is None or n >= labels.shape[0]:
    return np.arange(labels.shape[0], dtype=np.int64)
  if labels.ndim > 1:  # one label per position: no class per example
    return np.sort(rng.choice(labels.shape[0], n, replace=False)).astype(np.int64)
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


def subset(labels: np.ndarray, n: Optional[int], seed: int) -> np.ndarray:
  """:func:`balanced_subset` on the subset stream of ``seed``.

  Args:
    labels: Integer labels ``[N]`` or ``[N, *label_shape]``.
    n: Subset size; ``None`` or ``>= len(labels)`` keeps everything.
    seed: Seed of the subsets (the stream is ``[seed, SUBSAMPLE_TAG]``).

  Returns:
    Sorted ``int64`` indices (the source order is kept).
  """
  return balanced_subset(labels, n,
                         np.random.default_rng([seed, SUBSAMPLE_TAG]))
