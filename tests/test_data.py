"""Tests for fedjax_dp.data: partitioners, padded arrays, loaders, TFF HDF5."""

import re
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dp import data
from fedjax_dp.data import partition, sources, specs, tff_h5
from fedjax_dp.data.sources import cifar10
from fedjax_dp.errors import ConfigError


def _labels(num_classes=10, per_class=100, seed=0):
  return np.random.default_rng(seed).permutation(
      np.repeat(np.arange(num_classes), per_class))


def _assert_exact_cover(parts, n):
  flat = np.concatenate(parts)
  assert flat.shape == (n,)
  np.testing.assert_array_equal(np.sort(flat), np.arange(n))


# ---------------------------------------------------------------- partitions


def test_import_is_light():
  code = ("import sys, fedjax_dp.data; "
          "print([m for m in ('jax', 'tensorflow', 'tensorflow_datasets', "
          "'h5py', 'sklearn', 'PIL') if m in sys.modules])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == "[]"


@pytest.mark.parametrize("n,k", [(100, 7), (10, 10), (5, 1), (1001, 50)])
def test_iid_sizes_and_cover(n, k):
  parts = partition.iid(n, k, np.random.default_rng(0))
  sizes = [len(p) for p in parts]
  assert len(parts) == k and max(sizes) - min(sizes) <= 1
  _assert_exact_cover(parts, n)


def test_partitions_deterministic():
  y = _labels()
  for fn in (lambda r: partition.iid(1000, 9, r),
             lambda r: partition.dirichlet(y, 9, 0.3, r),
             lambda r: partition.shards(y, 10, 2, r)):
    a, b = fn(np.random.default_rng(3)), fn(np.random.default_rng(3))
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    c = fn(np.random.default_rng(4))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def _mean_tv_from_global(y, parts, num_classes=10):
  """Mean total-variation distance of client label dists from the global."""
  glob = np.bincount(y, minlength=num_classes) / len(y)
  tv = [0.5 * np.abs(np.bincount(y[p], minlength=num_classes) / len(p) -
                     glob).sum() for p in parts]
  return float(np.mean(tv))


def test_dirichlet_skew_and_cover():
  y = _labels(per_class=200)
  rng = np.random.default_rng(0)
  skewed = partition.dirichlet(y, 20, 0.05, rng)
  flat = partition.dirichlet(y, 20, 1000.0, rng)
  _assert_exact_cover(skewed, len(y))
  _assert_exact_cover(flat, len(y))
  # alpha -> 0: each client ~one class (TV ~0.9); alpha -> inf: ~iid.
  assert _mean_tv_from_global(y, skewed) > 0.6
  assert _mean_tv_from_global(y, flat) < 0.15


@pytest.mark.parametrize("min_examples", [1, 5])
def test_dirichlet_min_examples(min_examples):
  y = _labels(per_class=20)  # 200 examples, 40 clients, tiny alpha.
  parts = partition.dirichlet(y, 40, 0.01, np.random.default_rng(1),
                              min_examples=min_examples)
  assert min(len(p) for p in parts) >= min_examples
  _assert_exact_cover(parts, len(y))


def test_shards():
  y = _labels(per_class=100)  # class sizes are multiples of the shard size.
  parts = partition.shards(y, 10, 2, np.random.default_rng(0))
  assert [len(p) for p in parts] == [100] * 10  # 2 shards of 50 each
  assert all(len(np.unique(y[p])) <= 2 for p in parts)
  _assert_exact_cover(parts, len(y))
  # Not a multiple: the remainder is dropped, sizes stay equal, no repeats.
  parts = partition.shards(y[:997], 7, 3, np.random.default_rng(0))
  assert {len(p) for p in parts} == {3 * (997 // 21)}
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == len(flat)


def test_shards_min_labels():
  y = _labels(per_class=120)  # 60 shards of 20, one label each
  rng = np.random.default_rng(0)
  plain = partition.shards(y, 20, 3, np.random.default_rng(0))
  # Without the constraint some client of this deal holds fewer than 3 labels ...
  assert min(len(np.unique(y[p])) for p in plain) < 3
  parts = partition.shards(y, 20, 3, rng, min_labels=3)
  # ... with it every client holds 3 distinct labels, and the cover is still exact.
  assert all(len(np.unique(y[p])) >= 3 for p in parts)
  _assert_exact_cover(parts, len(y))
  with pytest.raises(ConfigError, match="min_labels"):
    partition.shards(y, 20, 1, rng, min_labels=3)  # at most 2 labels in one shard
  with pytest.raises(ConfigError, match="min_labels"):
    partition.shards(_labels(per_class=7), 10, 3, rng, min_labels=6, max_deals=3)


def test_natural():
  ids = np.array(["b", "a", "b", "c", "a", "b"])
  parts = partition.natural(ids)
  assert [p.tolist() for p in parts] == [[0, 2, 5], [1, 4], [3]]
  parts = partition.natural([7, 7, 3])
  assert [p.tolist() for p in parts] == [[0, 1], [2]]


@pytest.mark.parametrize("call,field", [
    (lambda r: partition.iid(10, 0, r), "num_clients"),
    (lambda r: partition.iid(10, 11, r), "num_clients"),
    (lambda r: partition.dirichlet(_labels(), 5, 0.0, r), "alpha"),
    (lambda r: partition.dirichlet(_labels(), 5, -1.0, r), "alpha"),
    (lambda r: partition.dirichlet(_labels(), 500, 1.0, r, min_examples=3),
     "min_examples"),
    (lambda r: partition.shards(_labels(), 10, 0, r), "shards_per_client"),
    (lambda r: partition.shards(_labels(), 600, 2, r), "shards_per_client"),
])
def test_partition_errors(call, field):
  with pytest.raises(ConfigError) as e:
    call(np.random.default_rng(0))
  assert e.value.field == field and field in str(e.value)


# ---------------------------------------------------------- FederatedData


def test_federated_data_padding_roundtrip():
  rng = np.random.default_rng(0)
  x = rng.uniform(0.1, 1.0, size=(30, 4, 4, 2)).astype(np.float32)
  y = rng.integers(0, 5, size=30).astype(np.int32)
  idx = [np.array([3, 1, 4]), np.array([0]), np.arange(5, 30)]
  fd = data.FederatedData.from_partition("t", x, y, idx, x[:6], y[:6], 5)
  assert fd.x.shape == (3, 25, 4, 4, 2) and fd.x.dtype == np.float32
  assert fd.y.shape == (3, 25) and fd.y.dtype == np.int32
  assert fd.counts.tolist() == [3, 1, 25] and fd.counts.dtype == np.int32
  assert (fd.num_clients, fd.max_examples, fd.example_shape,
          fd.total_examples) == (3, 25, (4, 4, 2), 29)
  for c, i in enumerate(idx):
    xi, yi = fd.client_examples(c)
    np.testing.assert_array_equal(xi, x[i])
    np.testing.assert_array_equal(yi, y[i])
    assert not fd.x[c, len(i):].any() and not fd.y[c, len(i):].any()
  hist = fd.label_histogram()
  assert hist.shape == (3, 5)
  for c, i in enumerate(idx):
    np.testing.assert_array_equal(hist[c], np.bincount(y[i], minlength=5))
  with pytest.raises(ConfigError, match="client"):
    fd.client_examples(3)
  with pytest.raises(ConfigError, match="client_indices"):
    data.FederatedData.from_partition("t", x, y, [np.array([0]), np.array([])],
                                      x, y, 5)


# ------------------------------------------------------------------ loaders


def test_digits():
  d = data.load_central("digits")
  assert d.train_x.shape == (1438, 8, 8, 1) and d.test_x.shape == (359, 8, 8, 1)
  assert d.train_x.dtype == np.float32 and d.train_y.dtype == np.int32
  assert d.train_x.min() == 0.0 and d.train_x.max() == 1.0
  assert d.num_classes == 10
  tr, te = np.bincount(d.train_y), np.bincount(d.test_y)
  assert tr.sum() + te.sum() == 1797
  np.testing.assert_allclose(te / (tr + te), 0.2, atol=0.01)  # stratified
  again = data.load_central("digits", seed=5)  # split does not follow seed
  np.testing.assert_array_equal(again.test_y, d.test_y)
  sub = data.load_central("digits", max_train=100, max_test=50, seed=1)
  assert sub.train_x.shape[0] == 100 and sub.test_x.shape[0] == 50
  assert np.bincount(sub.train_y).min() == 10  # class balanced


def test_load_federated_digits():
  fd = data.load_federated("digits", data.Split(20, "dirichlet", alpha=0.5), seed=0)
  assert fd.num_clients == 20 and fd.total_examples == 1438
  assert fd.counts.min() >= 1 and fd.example_shape == (8, 8, 1)
  fd2 = data.load_federated("digits", data.Split(20, "dirichlet", alpha=0.5), seed=0)
  np.testing.assert_array_equal(fd.x, fd2.x)
  fd = data.load_federated("digits", data.Split(10, "shards", shards_per_client=2))
  assert set(fd.counts.tolist()) == {2 * (1438 // 20)}
  fd = data.load_federated("digits", data.Split(7, "iid"), max_train=70)
  assert fd.counts.tolist() == [10] * 7


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_mnist_like_real(shared_data_dir, name):
  sub = specs.get(name).subdirs[0]
  if not (shared_data_dir / sub).is_dir():
    pytest.skip(f"{shared_data_dir / sub} absent")
  d = data.load_central(name, data_dir=str(shared_data_dir))
  assert d.train_x.shape == (60000, 28, 28, 1)
  assert d.test_x.shape == (10000, 28, 28, 1)
  assert d.train_x.dtype == np.float32 and d.train_y.dtype == np.int32
  assert d.train_x.min() == 0.0 and d.train_x.max() == 1.0
  assert set(np.unique(d.train_y)) == set(range(10))
  assert set(np.unique(d.test_y)) == set(range(10))


def test_mnist_env_and_flat_dir(shared_data_dir, monkeypatch, tmp_path):
  src = shared_data_dir / "mnist"
  if not src.is_dir():
    pytest.skip(f"{src} absent")
  monkeypatch.setenv("FEDJAX_DP_DATA", str(src))  # files directly in data_dir
  assert data.resolve_data_dir(None) == src
  d = data.load_central("mnist", max_train=300, max_test=100, seed=2)
  assert d.train_x.shape == (300, 28, 28, 1) and d.test_x.shape[0] == 100
  # Raw (non-gzip) IDX files are read too.
  import gzip  # pylint: disable=g-import-not-at-top
  for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
    (tmp_path / stem).write_bytes(gzip.decompress((src / f"{stem}.gz")
                                                  .read_bytes()))
  x, y = data.load_idx(tmp_path / "t10k-images-idx3-ubyte",
                       tmp_path / "t10k-labels-idx1-ubyte")
  assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
  assert y.shape == (10000,)


def test_the_other_sets_files_are_refused_by_their_labels(tmp_path, capsys):
  """MNIST's and Fashion-MNIST's files have the same names and format: a folder holding the
  other set's canonical release is refused by name, before any training."""
  from fedjax_dp.cli import main
  def idx(arr):
    return bytes([0, 0, 0x08, arr.ndim]) + np.array(arr.shape, ">i4").tobytes() + \
        arr.astype(np.uint8).tobytes()
  fashion = np.array(specs.get("fashion_mnist").label_prefix * 2)
  d = tmp_path / "mnist"
  d.mkdir()
  for split in ("train", "t10k"):
    (d / f"{split}-images-idx3-ubyte").write_bytes(idx(np.zeros((32, 28, 28))))
    (d / f"{split}-labels-idx1-ubyte").write_bytes(idx(fashion))
  with pytest.raises(ConfigError, match="holds fashion_mnist's files.*--dataset fashion_mnist"):
    data.load_central("mnist", data_dir=str(tmp_path))
  (d / "train-labels-idx1-ubyte").write_bytes(idx(fashion[::-1]))  # not a canonical release
  assert data.load_central("mnist", data_dir=str(tmp_path)).train_x.shape == (32, 28, 28, 1)
  (d / "train-labels-idx1-ubyte").write_bytes(idx(fashion))
  assert main(["run", "--dataset", "mnist", "--data-dir", str(tmp_path), "--output-dir",
               str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "invalid data_dir=" in err and not (tmp_path / "o").exists()


def test_emnist_idx_transposed(tmp_path):
  def idx(arr):
    head = bytes([0, 0, 0x08, arr.ndim]) + np.array(
        arr.shape, dtype=">i4").tobytes()
    return head + arr.astype(np.uint8).tobytes()
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, size=(12, 28, 28))
  lab = np.arange(12) * 5
  d = tmp_path / "emnist"
  d.mkdir()
  for split in ("train", "test"):
    (d / f"emnist-byclass-{split}-images-idx3-ubyte").write_bytes(idx(img))
    (d / f"emnist-byclass-{split}-labels-idx1-ubyte").write_bytes(idx(lab))
  e = data.load_central("emnist", data_dir=str(tmp_path))
  assert e.num_classes == 62 and e.train_x.shape == (12, 28, 28, 1)
  np.testing.assert_allclose(e.train_x[..., 0] * 255,
                             img.transpose(0, 2, 1))
  np.testing.assert_array_equal(e.test_y, lab)


def test_cifar10_subset_cache(shared_data_dir, tmp_path, monkeypatch):
  if not (shared_data_dir / "cifar10").is_dir():
    pytest.skip(f"{shared_data_dir / 'cifar10'} absent")
  cache = tmp_path / "cache"
  d = data.load_central("cifar10", data_dir=str(shared_data_dir),
                        cache_dir=str(cache), max_train=200, max_test=100)
  assert d.train_x.shape == (200, 32, 32, 3) and d.test_x.shape == (100, 32,
                                                                      32, 3)
  assert d.train_x.dtype == np.float32
  assert 0.0 <= d.train_x.min() and d.train_x.max() <= 1.0
  assert 0.3 < d.train_x.mean() < 0.65
  assert np.bincount(d.train_y, minlength=10).tolist() == [20] * 10
  files = sorted(p.name for p in cache.iterdir())
  assert files == ["cifar10-test-n100-seed0.npz", "cifar10-train-n200-seed0.npz"]
  # Second load must come from the cache: make the decoder unusable.
  def boom(*a, **k):
    raise AssertionError("decoded again instead of using the cache")
  with monkeypatch.context() as m:
    m.setattr(cifar10, "decode_tar", boom)
    d2 = data.load_central("cifar10", data_dir=str(shared_data_dir),
                           cache_dir=str(cache), max_train=200, max_test=100)
  np.testing.assert_array_equal(d2.train_x, d.train_x)
  np.testing.assert_array_equal(d2.test_y, d.test_y)
  with pytest.raises(ConfigError, match="cache_dir"):
    data.load_central("cifar10", data_dir=str(shared_data_dir),
                      cache_dir=str(shared_data_dir / "cifar10" / "c"),
                      max_train=10, max_test=10)


# ------------------------------------------------------------------- specs


def test_spec_table():
  assert data.DATASETS == tuple(s.name for s in data.SPECS)
  assert data.DATASETS == ("digits", "mnist", "fashion_mnist", "emnist",
                           "cifar10", "shakespeare", "federated_emnist",
                           "federated_emnist_digits", "cifar100", "stackoverflow",
                           "stackoverflow_tags")
  for s in data.SPECS:
    assert s.source in sources.LOCAL, s
    assert s.num_classes >= 2 and len(s.example_shape) == (
        1 if s.name in ("shakespeare", "stackoverflow", "stackoverflow_tags") else 3)
    # Only StackOverflow's tags are multi-label, and its default model is.
    assert s.multi_label == (s.name == "stackoverflow_tags"), s
    assert (s.tfds_name is None) == (s.source == "digits" or s.source.startswith("tff_")), s
    assert set(s.partitions) <= set(data.PARTITIONERS), s
    assert ("natural" in s.partitions) == s.source.startswith("tff_"), s
  from fedjax_dp import config  # pylint: disable=g-import-not-at-top
  assert config.DEFAULT_MODELS == {s.name: s.default_model for s in data.SPECS}
  with pytest.raises(ConfigError, match="dataset"):
    specs.get("imagenet")


def _spec_real_dir(shared_data_dir, spec):
  d = shared_data_dir / spec.subdirs[0]
  if not d.is_dir():
    pytest.skip(f"{d} absent")
  return str(shared_data_dir)


@pytest.mark.parametrize("name", ["digits", "mnist", "fashion_mnist",
                                  "cifar10"])
def test_loads_match_spec(shared_data_dir, tmp_path, name):
  spec = specs.get(name)
  ddir = None if name == "digits" else _spec_real_dir(shared_data_dir, spec)
  d = data.load_central(name, data_dir=ddir, cache_dir=str(tmp_path),
                        max_train=40, max_test=20)
  assert d.num_classes == spec.num_classes
  assert d.train_x.shape == (40,) + spec.example_shape
  assert d.test_x.shape == (20,) + spec.example_shape
  assert d.train_y.max() < spec.num_classes


def test_download_through_tfds(tmp_path, monkeypatch):
  """--download asks tfds for the spec's name and transposes EMNIST back."""
  import types  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, size=(6, 28, 28, 1)).astype(np.uint8)
  asked = []
  def load(name, split, batch_size, as_supervised):
    assert batch_size == -1 and as_supervised
    asked.append((name, split))
    return img, np.arange(6) % 3
  fake = types.SimpleNamespace(load=load, as_numpy=lambda ds: ds)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  e = data.load_central("emnist", data_dir=str(tmp_path), download=True)
  assert asked == [("emnist/byclass", "train"), ("emnist/byclass", "test")]
  assert e.num_classes == 62 and e.train_y.dtype == np.int32
  np.testing.assert_allclose(e.train_x * 255, img.transpose(0, 2, 1, 3))
  asked.clear()
  m = data.load_central("mnist", data_dir=str(tmp_path), download=True)
  assert asked == [("mnist", "train"), ("mnist", "test")]
  np.testing.assert_allclose(m.test_x * 255, img)


# ------------------------------------------------------------------- errors


def test_unknown_dataset():
  with pytest.raises(ConfigError) as e:
    data.load_central("imagenet")
  assert e.value.field == "dataset" and "imagenet" in str(e.value)
  assert "mnist" in str(e.value) and "cifar10" in str(e.value)


def test_missing_files_fail_fast(tmp_path, monkeypatch):
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)
  with pytest.raises(ConfigError) as e:
    data.load_central("mnist", data_dir=str(tmp_path))
  msg = str(e.value)
  assert e.value.field == "data_dir" and str(tmp_path) in msg
  assert "train-images-idx3-ubyte" in msg and "download" in msg
  with pytest.raises(ConfigError) as e:
    data.load_central("cifar10", data_dir=str(tmp_path))
  assert "train.tar.gz" in str(e.value) and str(tmp_path) in str(e.value)
  with pytest.raises(ConfigError) as e:  # no dir at all
    data.load_central("fashion_mnist")
  assert e.value.field == "data_dir" and "FEDJAX_DP_DATA" in str(e.value)
  assert "t10k-labels-idx1-ubyte" in str(e.value)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "emnist",
                                  "cifar10"])
def test_missing_files_message_from_spec(tmp_path, name):
  """The message names every searched folder and file of the set's spec."""
  spec = specs.get(name)
  with pytest.raises(ConfigError) as e:
    data.load_central(name, data_dir=str(tmp_path))
  msg = str(e.value)
  searched = [str(tmp_path / s) for s in spec.subdirs] + [str(tmp_path)]
  assert f"no local {name} files found; searched {', '.join(searched)} for" in msg
  assert all(f in msg for f in spec.files)
  assert "pip install 'fedjax_dp[tfds]'" in msg


def test_incomplete_files_named(tmp_path):
  """A folder holding some of a set's files: the message names the files it lacks."""
  d = tmp_path / "mnist"
  d.mkdir()
  (d / "train-images-idx3-ubyte.gz").write_bytes(b"")  # either form counts as present
  (d / "train-labels-idx1-ubyte").write_bytes(b"")
  with pytest.raises(ConfigError) as e:
    data.load_central("mnist", data_dir=str(tmp_path))
  msg = str(e.value)
  assert e.value.field == "data_dir" and "no local mnist files found" not in msg
  assert (f"incomplete local mnist files: {d} lacks t10k-images-idx3-ubyte[.gz], "
          "t10k-labels-idx1-ubyte[.gz] (searched") in msg
  assert "lacks train" not in msg and "download=True" in msg and len(msg.splitlines()) == 1
  (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")  # a second partial folder
  with pytest.raises(ConfigError, match=re.escape(f"; {tmp_path} lacks train-images-idx3-ubyte")):
    data.load_central("mnist", data_dir=str(tmp_path))
  for name, present, absent in [("cifar10", "train.tar.gz", "test.tar.gz"),
                                ("shakespeare", "shakespeare_test.h5", "shakespeare_train.h5")]:
    sub = tmp_path / specs.get(name).subdirs[0]
    sub.mkdir()
    (sub / present).write_bytes(b"")
    with pytest.raises(ConfigError,
                       match=re.escape(f"incomplete local {name} files: {sub} lacks {absent} ")):
      data.load_central(name, data_dir=str(tmp_path))


def test_missing_tfds(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(ConfigError) as e:
    data.load_central("mnist", data_dir=str(tmp_path), download=True)
  assert e.value.field == "download"
  assert "pip install 'fedjax_dp[tfds]'" in str(e.value)


@pytest.mark.parametrize("split,kwargs,field", [
    (dict(num_clients=0), {}, "num_clients"),
    (dict(num_clients=5000), {}, "num_clients"),
    (dict(num_clients=5, partition="dirichlet", alpha=0.0), {}, "alpha"),
    (dict(num_clients=5, partition="shards", shards_per_client=0), {},
     "shards_per_client"),
    (dict(num_clients=1000, partition="shards", shards_per_client=2), {},
     "shards_per_client"),
    (dict(num_clients=5, partition="natural"), {}, "partition"),
    (dict(num_clients=5, partition="bogus"), {}, "partition"),
    (dict(num_clients=5), dict(max_train=0), "max_train"),
])
def test_load_federated_errors(split, kwargs, field):
  with pytest.raises(ConfigError) as e:
    data.load_federated("digits", data.Split(**split), **kwargs)
  assert e.value.field == field
  assert f"invalid {field}=" in str(e.value)


# ------------------------------------------------------------------ TFF h5


def test_shakespeare_h5_real(shared_data_dir):
  d = shared_data_dir / "tff-h5"
  if not d.is_dir():
    pytest.skip(f"{d} absent")
  counts = {}
  for split in ("train", "test"):
    path = d / f"shakespeare_{split}.h5"
    ids = tff_h5.client_ids(path)
    assert len(ids) == 715
    import h5py  # pylint: disable=g-import-not-at-top
    with h5py.File(path, "r") as f:  # fast count; read_client checked below
      counts[split] = sum(f["examples"][c]["snippets"].shape[0] for c in ids)
  assert counts == {"train": 16068, "test": 2356}
  ids = tff_h5.client_ids(d / "shakespeare_train.h5")
  client = tff_h5.read_client(d / "shakespeare_train.h5", ids[0])
  assert set(client) == {"snippets"} and isinstance(client["snippets"][0],
                                                    bytes)
  n = sum(len(tff_h5.read_client(d / "shakespeare_test.h5", c)["snippets"])
          for c in ids[:40])
  assert n == sum(len(tff_h5.read_client(d / "shakespeare_test.h5", c,
                                         ["snippets"])["snippets"])
                  for c in ids[:40])
  with pytest.raises(ConfigError, match="client_id"):
    tff_h5.read_client(d / "shakespeare_train.h5", "NOT_A_CLIENT")
  with pytest.raises(ConfigError, match="feature"):
    tff_h5.read_client(d / "shakespeare_train.h5", ids[0], ["pixels"])


def _write_fake_emnist(path, sizes, seed):
  import h5py  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  with h5py.File(path, "w") as f:
    for k, n in enumerate(sizes):
      g = f.create_group(f"examples/f{k:04d}_{seed}")
      g["pixels"] = rng.uniform(size=(n, 28, 28)).astype(np.float32)
      label = rng.integers(0, 62, size=n).astype(np.int32)
      label[0] = k  # every client has one digit
      g["label"] = label


def test_federated_emnist_h5(tmp_path):
  import h5py  # pylint: disable=g-import-not-at-top
  train, test = tmp_path / "train.h5", tmp_path / "test.h5"
  _write_fake_emnist(train, [5, 3, 8, 1], 0)
  _write_fake_emnist(test, [2, 4, 1, 3], 1)
  fd = tff_h5.load_federated_emnist(train, test)
  assert fd.num_classes == 62 and fd.num_clients == 4
  assert fd.counts.tolist() == [5, 3, 8, 1]
  assert fd.x.shape == (4, 8, 28, 28, 1) and fd.x.dtype == np.float32
  assert fd.test_x.shape == (10, 28, 28, 1) and fd.test_y.dtype == np.int32
  with h5py.File(train, "r") as f:
    g = f["examples"]["f0002_0"]
    xi, yi = fd.client_examples(2)
    np.testing.assert_array_equal(xi[..., 0], g["pixels"][()])  # as stored
    np.testing.assert_array_equal(yi, g["label"][()])
  fd = tff_h5.load_federated_emnist(train, test, max_clients=2)
  assert fd.counts.tolist() == [5, 3] and fd.test_x.shape[0] == 10
  fd = tff_h5.load_federated_emnist(train, test, only_digits=True)
  assert fd.num_classes == 10 and fd.num_clients == 4
  for c in range(fd.num_clients):
    assert (fd.client_examples(c)[1] < 10).all()
  assert (fd.test_y < 10).all()
  with pytest.raises(ConfigError, match="path"):
    tff_h5.client_ids(tmp_path / "missing.h5")
