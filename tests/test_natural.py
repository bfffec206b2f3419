"""Natural partitions: federated Shakespeare, EMNIST, CIFAR-100 and StackOverflow (next-word and
tag prediction) in TFF's HDF5 layout, the LSTMs, and `fedjax-dp run --partition natural`."""

import json

import jax
import numpy as np
import optax
import pytest

from fedjax_dp import data
from fedjax_dp.cli import main
from fedjax_dp.data import tff_h5
from fedjax_dp.errors import ConfigError
from fedjax_dp.models import IGNORE, cross_entropy, get_model, multi_hot, num_params

BOS, EOS, PAD, OOV = tff_h5.BOS, tff_h5.EOS, tff_h5.PAD, tff_h5.OOV


def _ids(text: bytes):
  return [tff_h5.SHAKESPEARE_CHARS.index(bytes([c])) + 1 for c in text]


def _text(ids) -> str:
  return "".join(chr(tff_h5.SHAKESPEARE_CHARS[int(i) - 1]) for i in ids)


def _write_h5(path, clients):
  """A file in TFF's layout: examples/<client_id>/<feature> for each client's dict of arrays."""
  import h5py  # pylint: disable=g-import-not-at-top
  with h5py.File(path, "w") as f:
    for cid, features in clients.items():
      for name, value in features.items():
        f.create_dataset(f"examples/{cid}/{name}", data=value)


PLAYS = {  # client -> snippets; ids sort in this order, as h5py lists them
    "AS_YOU_LIKE_IT_ROSALIND": [b"All the world's a stage,", b"And all the men and women"],
    "HAMLET_HAMLET": [b"To be, or not to be: that is the question"],
    "MACBETH_WITCH": [b"Double, double toil and trouble;", b"Fire burn", b"and cauldron bubble."],
    "TEMPEST_ARIEL": [b"Full fathom five thy father lies"],
}


@pytest.fixture(scope="module")
def plays_dir(tmp_path_factory):
  """A data directory with tiny Shakespeare files in TFF's layout, under tff-h5/."""
  root = tmp_path_factory.mktemp("data")
  (root / "tff-h5").mkdir()
  _write_h5(root / "tff-h5" / "shakespeare_train.h5",
            {c: {"snippets": np.array(s, dtype=object)} for c, s in PLAYS.items()})
  _write_h5(root / "tff-h5" / "shakespeare_test.h5",
            {c: {"snippets": np.array([s[0][:12]], dtype=object)} for c, s in PLAYS.items()})
  return root


# ------------------------------------------------------------------- vocabulary and windows


def test_vocabulary_is_tffs():
  assert len(tff_h5.SHAKESPEARE_CHARS) == len(set(tff_h5.SHAKESPEARE_CHARS)) == 86
  assert tff_h5.SHAKESPEARE_CHARS[:6] == b"dhlptx" and tff_h5.SHAKESPEARE_CHARS[-1:] == b"\r"
  assert (PAD, OOV, BOS, EOS, tff_h5.SHAKESPEARE_VOCAB_SIZE) == (0, 87, 88, 89, 90)
  assert tff_h5.IGNORE == IGNORE  # the reader's copy of the losses' constant


def test_windows_cover_every_next_character_once():
  a, b, c, d, e = _ids(b"ABCDE")
  x, y = tff_h5.shakespeare_windows([b"ABCD", b"E"], 3)
  np.testing.assert_array_equal(x, [[BOS, a, b], [c, d, EOS], [BOS, e, PAD]])
  np.testing.assert_array_equal(y, [[a, b, c], [d, EOS, BOS], [e, EOS, IGNORE]])
  x, y = tff_h5.shakespeare_windows([b"caf\xc3\xa9"], 80)  # non-ASCII bytes are OOV
  assert x.shape == y.shape == (1, 80)
  np.testing.assert_array_equal(y[0, :6], _ids(b"caf") + [OOV, OOV, EOS])
  assert (x[0, 6:] == PAD).all() and (y[0, 6:] == IGNORE).all()
  x, y = tff_h5.shakespeare_windows([b"x" * 159], 80)  # 161 tokens: exactly 2 windows
  assert x.shape == (2, 80) and (y != IGNORE).all()
  assert tff_h5.shakespeare_windows([], 80)[0].shape == (0, 80)
  with pytest.raises(ConfigError, match="length"):
    tff_h5.shakespeare_windows([b"ab"], 0)


def test_generated_shakespeare_file_loads_per_client(plays_dir):
  train = plays_dir / "tff-h5" / "shakespeare_train.h5"
  test = plays_dir / "tff-h5" / "shakespeare_test.h5"
  fd = tff_h5.load_federated_shakespeare(train, test, length=16)
  assert fd.name == "shakespeare" and fd.num_classes == 90 and fd.num_clients == 4
  assert fd.example_shape == (16,) and fd.y.shape[2:] == (16,)
  for k, snippets in enumerate(PLAYS.values()):  # file order = sorted client ids
    want_x, want_y = tff_h5.shakespeare_windows(snippets, 16)
    x, y = fd.client_examples(k)
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)
    targets = y.reshape(-1)[y.reshape(-1) != IGNORE]
    assert _text(targets[targets < OOV]) == "".join(s.decode() for s in snippets)
  assert fd.test_x.shape == (4, 16)  # 12 characters + BOS + EOS - 1 = 13 inputs per client
  assert fd.test_from_clients  # the same writers' held-out lines: their own data
  two = tff_h5.load_federated_shakespeare(train, test, max_clients=2, length=16)
  assert two.num_clients == 2 and two.test_x.shape == (4, 16)


def test_real_shakespeare_natural(shared_data_dir):
  if not (shared_data_dir / "tff-h5").is_dir():
    pytest.skip(f"{shared_data_dir / 'tff-h5'} absent (set FEDJAX_DP_DATA to a folder with "
                "tff-h5/shakespeare_{train,test}.h5)")
  fd = data.load_federated("shakespeare", data.Split(715, "natural"), data_dir=str(shared_data_dir))
  assert fd.num_clients == 715 and fd.example_shape == (80,)
  assert fd.total_examples == 30_249 and fd.test_y.shape == (4_657, 80)
  assert fd.y.min() >= IGNORE and fd.y.max() < 90 and fd.x.max() < 90
  ids = tff_h5.client_ids(shared_data_dir / "tff-h5" / "shakespeare_train.h5")
  snippets = tff_h5.read_client(shared_data_dir / "tff-h5" / "shakespeare_train.h5",
                                ids[0])["snippets"]
  x, y = fd.client_examples(0)
  assert x[0, 0] == BOS and _text(x[0, 1:1 + 17]) == snippets[0][:17].decode()
  assert (y[-1] != IGNORE).sum() == (sum(len(s) + 2 for s in snippets) - 1) - 80 * (len(y) - 1)
  with pytest.raises(ConfigError, match="num_clients=716"):
    data.load_federated("shakespeare", data.Split(716, "natural"), data_dir=str(shared_data_dir))


# ------------------------------------------------------------------- federated EMNIST


def test_federated_emnist_natural_from_generated_files(tmp_path):
  rng = np.random.default_rng(0)
  sizes = {"f0000_14": 3, "f0001_41": 5, "f0002_07": 2}
  for split in ("train", "test"):
    for name, digits in (("fed_emnist", False), ("fed_emnist_digitsonly", True)):
      _write_h5(tmp_path / f"{name}_{split}.h5", {
          w: {"pixels": rng.uniform(size=(n, 28, 28)).astype(np.float32),
              "label": rng.integers(0, 10 if digits else 62, size=n).astype(np.int32)}
          for w, n in sizes.items()})
  fd = data.load_federated("federated_emnist", data.Split(3, "natural"), data_dir=str(tmp_path))
  assert fd.num_classes == 62 and fd.counts.tolist() == [3, 5, 2]
  assert fd.x.shape == (3, 5, 28, 28, 1) and fd.test_x.shape == (10, 28, 28, 1)
  digits = data.load_federated("federated_emnist_digits", data.Split(2, "natural"),
                               data_dir=str(tmp_path), max_test=4)
  assert digits.num_classes == 10 and digits.counts.tolist() == [3, 5]
  assert digits.test_y.shape == (4,)
  pooled = data.load_federated("federated_emnist", data.Split(5, "iid"), data_dir=str(tmp_path))
  assert pooled.total_examples == 10 and pooled.num_clients == 5
  # The natural partition's test set is its writers' own held-out data; pooled, it is apart
  # from every (made-up) client's data set.
  assert fd.test_from_clients and digits.test_from_clients and not pooled.test_from_clients
  with pytest.raises(ConfigError, match="num_clients=4: must be <= 3"):
    data.load_federated("federated_emnist", data.Split(4, "natural"), data_dir=str(tmp_path))
  with pytest.raises(ConfigError, match="max_train"):
    data.load_federated("federated_emnist", data.Split(3, "natural"), data_dir=str(tmp_path),
                        max_train=5)
  with pytest.raises(ConfigError) as e:
    data.load_federated("shakespeare", data.Split(3, "natural"), data_dir=str(tmp_path))
  assert e.value.field == "data_dir" and "shakespeare_train.h5" in str(e.value)
  assert str(tmp_path / "tff-h5") in str(e.value)
  with pytest.raises(ConfigError, match="partition='dirichlet'"):
    data.load_federated("shakespeare", data.Split(3, "dirichlet"), data_dir=str(tmp_path))


# ------------------------------------------------------------------- federated CIFAR-100


CIFAR_TRAIN_SIZES = {"0": 4, "1": 2, "10": 3}  # TFF's ids are "0".."499"; h5py sorts them as strings


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
  """A data directory with tiny CIFAR-100 files in TFF's layout, under tff-h5/: per client
  image uint8 [n, 32, 32, 3], label and coarse_label int64 [n]."""
  root = tmp_path_factory.mktemp("cifar")
  (root / "tff-h5").mkdir()
  rng = np.random.default_rng(0)
  for split, sizes in (("train", CIFAR_TRAIN_SIZES), ("test", {"0": 2, "1": 3})):
    clients = {}
    for cid, n in sizes.items():
      label = rng.integers(0, 100, size=n).astype(np.int64)
      clients[cid] = {"image": rng.integers(0, 256, size=(n, 32, 32, 3)).astype(np.uint8),
                      "label": label, "coarse_label": label // 5}
    _write_h5(root / "tff-h5" / f"fed_cifar100_{split}.h5", clients)
  return root


def test_federated_cifar100_natural_from_generated_files(cifar_dir):
  train = cifar_dir / "tff-h5" / "fed_cifar100_train.h5"
  fd = data.load_federated("cifar100", data.Split(3, "natural"), data_dir=str(cifar_dir))
  # TFF's test clients partition CIFAR-100's test split: no training client's data.
  assert fd.name == "cifar100" and fd.num_classes == 100 and not fd.test_from_clients
  assert fd.counts.tolist() == [4, 2, 3]  # file order: "0", "1", "10"
  assert fd.x.shape == (3, 4, 32, 32, 3) and fd.x.dtype == np.float32
  assert fd.test_x.shape == (5, 32, 32, 3) and fd.test_y.dtype == np.int32
  stored = tff_h5.read_client(train, "10")
  x, y = fd.client_examples(2)
  np.testing.assert_array_equal(x, stored["image"] / np.float32(255))
  np.testing.assert_array_equal(y, stored["label"])
  coarse = tff_h5.load_federated_cifar100(train, cifar_dir / "tff-h5" / "fed_cifar100_test.h5",
                                          max_clients=2, label="coarse_label")
  assert coarse.num_classes == 20 and coarse.num_clients == 2
  np.testing.assert_array_equal(coarse.client_examples(1)[1], tff_h5.read_client(
      train, "1")["coarse_label"])
  pooled = data.load_federated("cifar100", data.Split(3, "dirichlet", alpha=0.5),
                               data_dir=str(cifar_dir))
  assert pooled.total_examples == 9 and not pooled.test_from_clients
  with pytest.raises(ConfigError, match="label='fine': must be one of"):
    tff_h5.load_federated_cifar100(train, train, label="fine")
  with pytest.raises(ConfigError, match="num_clients=4: must be <= 3"):
    data.load_federated("cifar100", data.Split(4, "natural"), data_dir=str(cifar_dir))


def test_cifar100_defaults_to_tffs_resnet18_gn_with_every_client():
  from fedjax_dp.config import make_config  # pylint: disable=g-import-not-at-top
  config = make_config(dataset="cifar100", partition="natural")
  assert config.model_name == "resnet18_gn" and config.num_clients == 500
  model = get_model("resnet18_gn", (32, 32, 3), 100)  # shapes only: no training here
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert num_params(params) == 11_220_132  # 11,173,962 with 10 classes, + 90 x 513
  logits = jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((2, 32, 32, 3), np.float32))
  assert logits.shape == (2, 100)


def test_real_cifar100_natural(shared_data_dir):
  d = shared_data_dir / "tff-h5"
  if not (d / "fed_cifar100_train.h5").is_file():
    pytest.skip(f"{d / 'fed_cifar100_train.h5'} absent (set FEDJAX_DP_DATA to a folder with "
                "tff-h5/fed_cifar100_{train,test}.h5, as tff.simulation.datasets.cifar100 "
                "downloads them)")
  fd = data.load_federated("cifar100", data.Split(500, "natural"), data_dir=str(shared_data_dir))
  assert fd.num_clients == 500 and fd.counts.tolist() == [100] * 500
  assert fd.total_examples == 50_000 and fd.test_x.shape == (10_000, 32, 32, 3)
  assert fd.y.max() == 99 and 0 <= fd.x.min() and fd.x.max() <= 1


def test_cli_runs_natural_cifar100(cifar_dir, tmp_path):
  out = tmp_path / "run"
  assert main(["run", "--dataset", "cifar100", "--algorithm", "fedavg", "--data-dir", str(cifar_dir),
               "--partition", "natural", "--num-clients", "3", "--model", "mlp",
               "--rounds", "1", "--sampling", "fixed", "--cohort-size", "2", "--local-steps", "1",
               "--batch-size", "2",
               "--no-progress", "--output-dir", str(out)]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["data"]["num_clients"] == 3 and summary["data"]["example_shape"] == [32, 32, 3]
  assert 0 <= summary["final_accuracy"] <= 1
  assert summary["data"]["test_examples"] == 5  # the test split: public, not a diagnostic


# ------------------------------------------------------------------- StackOverflow


def _so_client(sentences):
  """One user's features in TFF's layout: tokens, title, tags ('|'-separated), creation_date,
  score, type, one row per sentence."""
  n = len(sentences)
  return {"tokens": np.array(sentences, dtype=object),
          "title": np.array([b"how do i loop"] * n, dtype=object),
          "tags": np.array([b"python|loops"] * n, dtype=object),
          "creation_date": np.array([b"2017-01-01 00:00:00.000000 UTC"] * n, dtype=object),
          "score": np.zeros(n, np.int64),
          "type": np.array([b"question"] * n, dtype=object)}


@pytest.fixture(scope="module")
def so_dir(tmp_path_factory):
  """Tiny StackOverflow files in TFF's layout under tff-h5/: train, test and held-out."""
  root = tmp_path_factory.mktemp("so")
  (root / "tff-h5").mkdir()
  _write_h5(root / "tff-h5" / "stackoverflow_train.h5", {
      "00000001": _so_client([b"how do i sort a list", b"use sorted ( ) ."]),
      "00000002": _so_client([b"a list is a list"]),
      "00000003": _so_client([b"sort it", b"it works", b"thanks !"])})
  _write_h5(root / "tff-h5" / "stackoverflow_test.h5", {
      "00000001": _so_client([b"sorted a list"]), "00000002": _so_client([b"a b c"])})
  # The vocabulary's source, users apart from both: "a" and "sort" used by 2, "it", "list" by 1.
  _write_h5(root / "tff-h5" / "stackoverflow_held_out.h5", {
      "00000010": _so_client([b"a list", b"sort a list"]),
      "00000020": _so_client([b"sort it a"])})
  return root


def test_stackoverflow_vocabulary_and_sequences():
  from collections import Counter  # pylint: disable=g-import-not-at-top
  vocab = tff_h5.stackoverflow_vocabulary(Counter({"b": 2, "a": 2, "c": 5, "d": 1}), 3)
  assert vocab == {"c": 1, "a": 2, "b": 3}  # by count, ties by word
  pad, oov, bos, eos = tff_h5.so_special_tokens(3)
  assert (pad, oov, bos, eos) == (0, 4, 5, 6) and tff_h5.so_special_tokens() == (
      0, 10_001, 10_002, 10_003)
  x, y = tff_h5.stackoverflow_sequences([b"a b", b"c d a b", b"z"], vocab, 3, 3)
  np.testing.assert_array_equal(x, [[bos, 2, 3], [bos, 1, oov], [bos, oov, eos]])
  # Under 3 words: EOS ends the targets, PAD targets are IGNORE; 3 or more: truncated, no EOS.
  np.testing.assert_array_equal(y, [[2, 3, eos], [1, oov, 2], [oov, eos, IGNORE]])
  assert tff_h5.stackoverflow_sequences([], vocab, 3, 3)[0].shape == (0, 3)


def test_stackoverflow_natural_from_generated_files(so_dir):
  d = so_dir / "tff-h5"
  assert tff_h5.word_counts(d / "stackoverflow_held_out.h5") == {"a": 2, "sort": 2, "it": 1,
                                                                 "list": 1}
  fd = data.load_federated("stackoverflow", data.Split(3, "natural"), data_dir=str(so_dir))
  assert fd.name == "stackoverflow" and fd.num_classes == 10_004 and fd.test_from_clients
  assert fd.counts.tolist() == [2, 1, 3] and fd.example_shape == (20,)
  assert fd.test_y.shape == (2, 20)
  pad, oov, bos, eos = tff_h5.so_special_tokens()
  vocab = {"a": 1, "sort": 2, "it": 3, "list": 4}  # the held-out file's words, by users
  x, y = fd.client_examples(2)
  np.testing.assert_array_equal(x[0, :4], [bos, vocab["sort"], vocab["it"], eos])
  np.testing.assert_array_equal(y[0, :3], [vocab["sort"], vocab["it"], eos])
  assert (y[0, 3:] == IGNORE).all() and (x[0, 4:] == pad).all()
  x, _ = fd.client_examples(1)  # "a list is a list": "is" is out of the vocabulary
  np.testing.assert_array_equal(x[0, :6], [bos, vocab["a"], vocab["list"], oov, vocab["a"],
                                           vocab["list"]])
  capped = tff_h5.load_federated_stackoverflow(
      d / "stackoverflow_train.h5", d / "stackoverflow_test.h5", d / "stackoverflow_held_out.h5",
      max_test_clients=1, max_per_client=1, vocab_size=4, length=5)
  assert capped.counts.tolist() == [1, 1, 1] and capped.test_y.shape == (1, 5)
  assert capped.num_classes == 8
  pooled = data.load_federated("stackoverflow", data.Split(2, "iid"), data_dir=str(so_dir))
  assert pooled.total_examples == 6
  (d / "stackoverflow_held_out.h5").rename(d / "held_out.h5")
  try:
    with pytest.raises(ConfigError, match="stackoverflow_held_out.h5"):
      data.load_federated("stackoverflow", data.Split(3, "natural"), data_dir=str(so_dir))
  finally:
    (d / "held_out.h5").rename(d / "stackoverflow_held_out.h5")


def test_stackoverflow_defaults_to_tffs_word_lstm():
  from fedjax_dp.config import make_config  # pylint: disable=g-import-not-at-top
  config = make_config(dataset="stackoverflow", partition="natural")
  # 342,477 users do not fit in memory: the natural partition keeps the first num_clients.
  assert config.model_name == "word_lstm" and config.num_clients == 700
  model = get_model("word_lstm", (20,), 10_004)  # its parameters: tests/test_models.py
  params = jax.eval_shape(model.init, jax.random.key(0))
  logits = jax.eval_shape(model.apply, params, jax.ShapeDtypeStruct((2, 20), np.float32))
  assert logits.shape == (2, 20, 10_004)


@pytest.mark.parametrize("name, shape, classes, max_id, multi_label", [
    ("stackoverflow", (20,), 10_004, 10_003, False),
    ("stackoverflow_tags", (100,), 500, 10_001, True)])
def test_real_stackoverflow_natural(shared_data_dir, name, shape, classes, max_id, multi_label):
  d = shared_data_dir / "tff-h5"
  if not all((d / f"stackoverflow_{s}.h5").is_file() for s in ("train", "test", "held_out")):
    pytest.skip(f"{d}/stackoverflow_{{train,test,held_out}}.h5 absent (set FEDJAX_DP_DATA to a "
                "folder with them, as tff.simulation.datasets.stackoverflow downloads them)")
  fd = data.load_federated(name, data.Split(100, "natural"), data_dir=str(shared_data_dir))
  assert fd.num_clients == 100 and fd.counts.max() <= 1000 and fd.example_shape == shape
  assert fd.y.max() < classes and fd.x.max() <= max_id and fd.multi_label == multi_label


def test_cli_runs_natural_stackoverflow(so_dir, tmp_path):
  out = tmp_path / "run"
  assert main(["run", "--dataset", "stackoverflow", "--algorithm", "fedavg", "--data-dir", str(so_dir),
               "--partition", "natural", "--num-clients", "3", "--model", "char_lstm_small",
               "--rounds", "1", "--sampling", "fixed", "--cohort-size", "2", "--local-steps", "1",
               "--batch-size", "2", "--no-progress", "--output-dir", str(out)]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["data"]["num_clients"] == 3 and summary["data"]["example_shape"] == [20]
  assert 0 <= summary["final_accuracy"] <= 1


# ------------------------------------------------------------------- StackOverflow tags


def _so_posts(posts):
  """One user's examples in TFF's layout from ``(tokens, title, tags)`` triples."""
  client = _so_client([p[0] for p in posts])
  client["title"] = np.array([p[1] for p in posts], dtype=object)
  client["tags"] = np.array([p[2] for p in posts], dtype=object)
  return client


@pytest.fixture(scope="module")
def so_tags_dir(tmp_path_factory):
  """Tiny StackOverflow files in TFF's layout under tff-h5/, with titles and tags."""
  root = tmp_path_factory.mktemp("so_tags")
  (root / "tff-h5").mkdir()
  _write_h5(root / "tff-h5" / "stackoverflow_train.h5", {
      "00000001": _so_posts([(b"use a list", b"sort a list", b"python|list"),
                             (b"it works", b"sort a list", b"python|list")]),
      "00000002": _so_posts([(b"a loop", b"java loop", b"java|loops|rare")]),
      "00000003": _so_posts([(b"sort it", b"", b"c"), (b"thanks", b"", b""),
                             (b"list it", b"", b"python")])})
  _write_h5(root / "tff-h5" / "stackoverflow_test.h5", {
      "00000001": _so_posts([(b"a list", b"sort", b"python")]),
      "00000002": _so_posts([(b"loop", b"java", b"java|c")])})
  # The vocabularies' source: words "a", "list" used by 2 users, "sort" by 1; tags "python" by
  # 2, "java", "loops", "c" by 1 (ties by name: c, java, loops).
  _write_h5(root / "tff-h5" / "stackoverflow_held_out.h5", {
      "00000010": _so_posts([(b"a list", b"t", b"python|java"), (b"sort", b"t", b"loops")]),
      "00000020": _so_posts([(b"a list", b"t", b"python|c")])})
  return root


def test_stackoverflow_tag_examples():
  words, tags = {"a": 1, "list": 2, "sort": 3}, {"python": 0, "java": 1}
  oov = 4 + 1  # vocab_size 4
  x, y = tff_h5.stackoverflow_tag_examples(
      [b"a list  of lists", b"", b"sort"], [b"sort a list", b"", b"a"],
      [b"python|c|python", b"", b"java|python"], words, tags, vocab_size=4, length=6,
      max_tags=3)
  # The title's words, then the sentence's, cut at 6: "sort a list" + "a list of" (not "lists").
  np.testing.assert_array_equal(x, [[3, 1, 2, 1, 2, oov], [0] * 6, [1, 3, 0, 0, 0, 0]])
  # Tags split on '|', those outside the vocabulary dropped, a repeated one kept once.
  np.testing.assert_array_equal(y, [[0, IGNORE, IGNORE], [IGNORE] * 3, [1, 0, IGNORE]])
  with pytest.raises(ConfigError, match=r"tags='java\|python': must hold at most max_tags=1"):
    tff_h5.stackoverflow_tag_examples([b"a"], [b""], [b"java|python"], words, tags, max_tags=1)
  with pytest.raises(ConfigError, match="length=0: must be an integer >= 1"):
    tff_h5.stackoverflow_tag_examples([b"a"], [b""], [b""], words, tags, length=0)


def test_stackoverflow_tags_natural_from_generated_files(so_tags_dir):
  d = so_tags_dir / "tff-h5"
  counts = tff_h5.user_counts(d / "stackoverflow_held_out.h5", {"tokens": None, "tags": "|"})
  assert counts["tokens"] == {"a": 2, "list": 2, "sort": 1}
  assert counts["tags"] == {"python": 2, "java": 1, "loops": 1, "c": 1}
  fd = data.load_federated("stackoverflow_tags", data.Split(3, "natural"),
                           data_dir=str(so_tags_dir))
  assert fd.name == "stackoverflow_tags" and fd.num_classes == 500 and fd.multi_label
  assert fd.test_from_clients and fd.counts.tolist() == [2, 1, 3]
  assert fd.example_shape == (100,) and fd.y.shape == (3, 3, 5) and fd.test_y.shape == (2, 5)
  a, lst, sort, oov = 1, 2, 3, 10_001  # words by users, ties by word; 10,000 nominal
  python, c, java, loops = 0, 1, 2, 3  # tags likewise
  x, y = fd.client_examples(0)  # "sort a list" then "use a list": "use" out of the vocabulary
  np.testing.assert_array_equal(x[0, :7], [sort, a, lst, oov, a, lst, 0])
  assert not x[:, 7:].any()
  np.testing.assert_array_equal(y, [[python, IGNORE, IGNORE, IGNORE, IGNORE]] * 2)  # no "list"
  x, y = fd.client_examples(1)  # "rare" is no tag of the vocabulary
  np.testing.assert_array_equal(x[0, :4], [oov, oov, a, oov])
  np.testing.assert_array_equal(y[0], [java, loops, IGNORE, IGNORE, IGNORE])
  _, y = fd.client_examples(2)  # a post without a tag keeps an all-zero multi-hot label
  np.testing.assert_array_equal(y[:, 0], [c, IGNORE, python])
  np.testing.assert_array_equal(multi_hot(fd.test_y, 500)[:, :4], [[1, 0, 0, 0], [0, 1, 1, 0]])
  # The tag vocabulary has the 500 most used tags, or as many as a smaller size keeps.
  small = tff_h5.load_federated_stackoverflow_tags(
      d / "stackoverflow_train.h5", d / "stackoverflow_test.h5", d / "stackoverflow_held_out.h5",
      tag_vocab_size=2, length=3, max_per_client=1)
  assert small.num_classes == 2 and small.multi_label and small.counts.tolist() == [1, 1, 1]
  np.testing.assert_array_equal(small.y[:, 0, :2], [[python, IGNORE], [IGNORE, IGNORE],
                                                    [c, IGNORE]])
  assert small.example_shape == (3,)
  pooled = data.load_federated("stackoverflow_tags", data.Split(2, "iid"),
                               data_dir=str(so_tags_dir))
  assert pooled.total_examples == 6 and pooled.multi_label
  with pytest.raises(ConfigError, match="partition='dirichlet'"):
    data.load_federated("stackoverflow_tags", data.Split(2, "dirichlet"),
                        data_dir=str(so_tags_dir))


def test_stackoverflow_tags_defaults_to_tffs_logistic_regression():
  from fedjax_dp.config import make_config  # pylint: disable=g-import-not-at-top
  config = make_config(dataset="stackoverflow_tags", partition="natural")
  assert config.model_name == "bow_lr" and config.num_clients == 700
  model = get_model("bow_lr", (100,), 500)
  assert model.multi_label and num_params(jax.eval_shape(model.init, jax.random.key(0))) == (
      10_000 * 500 + 500)


def test_cli_runs_dp_fedavg_on_stackoverflow_tags(so_tags_dir, tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", "--dataset", "stackoverflow_tags", "--partition", "natural",
               "--data-dir", str(so_tags_dir), "--num-clients", "3", "--algorithm", "dp_fedavg",
               "--sampling", "fixed", "--cohort-size", "2", "--rounds", "2", "--local-steps", "2",
               "--batch-size", "2", "--clip", "1", "--noise-multiplier", "0.5", "--no-progress",
               "--output-dir", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "final test recall@5=" in printed and "accuracy" not in printed
  summary = json.loads((out / "summary.json").read_text())
  assert summary["model"]["name"] == "bow_lr" and summary["model"]["parameters"] == 5_000_500
  # The headline place holds TFF's recall at 5, and says so.
  assert summary["accuracy_metric"] == "recall_at_5"
  assert summary["final_accuracy"] == summary["final_recall_at_5"]
  assert 0 <= summary["final_recall_at_5"] <= 1 and 0 <= summary["final_precision"] <= 1
  assert np.isfinite(summary["final_test_loss"]) and summary["epsilon"] > 0
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in rows] == [1, 2]
  evaluated = [r for r in rows if "test_accuracy" in r]
  assert evaluated and all(r["test_recall_at_5"] == r["test_accuracy"] for r in evaluated)
  assert all(0 <= r["test_recall_at_5"] <= 1 and 0 <= r["test_precision"] <= 1
             for r in evaluated)
  # Computed on the users' own later posts: raw, not covered, as the accuracy would be.
  covered = summary["release"]["covered_by_guarantee"]
  assert covered["summary"] == ["params_sha256"] and covered["metrics_rows"] == ["aggregate_norm"]
  assert "test_recall_at_5" in covered["note"] and "final_precision" in covered["note"]
  header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
  assert {"test_accuracy", "test_recall_at_5", "test_precision"} <= set(header)


def test_multi_label_data_needs_a_multi_label_model(so_tags_dir, capsys, tmp_path):
  assert main(["run", "--dataset", "stackoverflow_tags", "--partition", "natural",
               "--data-dir", str(so_tags_dir), "--num-clients", "3", "--model", "mlp",
               "--output-dir", str(tmp_path / "o")]) == 2
  assert capsys.readouterr().err.strip() == (
      "fedjax-dp: error: invalid model='mlp': must be a multi-label model (a sigmoid per class) "
      "for dataset stackoverflow_tags, whose examples each have a set of classes: one of "
      "['bow_lr']")
  from fedjax_dp import simulate  # pylint: disable=g-import-not-at-top
  fd = data.load_federated("stackoverflow", data.Split(3, "natural"), data_dir=str(so_tags_dir))
  with pytest.raises(ConfigError, match="model='bow_lr': is a multi-label model"):
    simulate(data=fd, dataset="stackoverflow", model="bow_lr", rounds=1)


# ------------------------------------------------------------------- the LSTM


def test_char_lstm_learns_a_tiny_corpus():
  x, y = tff_h5.shakespeare_windows([b"to be or not to be " * 4] * 4, 20)
  model = get_model("char_lstm", (20,), 90, hidden=(32,))
  params = model.init(jax.random.key(0))
  assert model.apply(params, x).shape == (len(x), 20, 90)
  opt = optax.adam(0.05)

  @jax.jit
  def step(params, state):
    loss, g = jax.value_and_grad(lambda p: cross_entropy(model.apply(p, x), y))(params)
    updates, state = opt.update(g, state)
    return optax.apply_updates(params, updates), state, loss

  state = opt.init(params)
  losses = []
  for _ in range(40):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[0] > np.log(90) - 0.5  # starts near uniform over 90 tokens
  assert losses[-1] < 0.5 * losses[0] and losses[-1] < min(losses[:10])


# ------------------------------------------------------------------- the command line


@pytest.mark.parametrize("dataset", ["mnist", "digits", "cifar10"])
def test_cli_refuses_natural_without_clients(dataset, capsys, tmp_path):
  assert main(["run", "--dataset", dataset, "--partition", "natural",
               "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"fedjax-dp: error: invalid partition='natural': must be one of ['iid', "
                 f"'dirichlet', 'shards'] for dataset={dataset} (natural partitions: "
                 "shakespeare, federated_emnist, federated_emnist_digits, cifar100, "
                 "stackoverflow, stackoverflow_tags)")
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dataset", ["shakespeare", "federated_emnist", "federated_emnist_digits"])
def test_config_takes_natural_for_tff_sets(dataset):
  from fedjax_dp.config import make_config  # pylint: disable=g-import-not-at-top
  config = make_config(dataset=dataset, partition="natural", num_clients=715)
  assert config.partition == "natural"
  assert config.model_name == ("char_lstm" if dataset == "shakespeare" else "cnn2")


def test_cli_runs_dp_fedavg_on_natural_shakespeare(plays_dir, tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", "--dataset", "shakespeare", "--partition", "natural",
               "--data-dir", str(plays_dir), "--num-clients", "4", "--model", "char_lstm_small",
               "--algorithm", "dp_fedavg", "--sampling", "fixed", "--cohort-size", "2",
               "--rounds", "2", "--local-steps", "2", "--batch-size", "2", "--clip", "1",
               "--noise-multiplier", "0.5", "--no-progress",
               "--output-dir", str(out)]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["data"]["num_clients"] == 4 and summary["data"]["example_shape"] == [80]
  assert 0 <= summary["final_accuracy"] <= 1 and summary["epsilon"] > 0
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in rows] == [1, 2] and np.isfinite(rows[-1]["test_loss"])
  # Evaluated on the writers' own held-out lines: raw, not covered.
  covered = summary["release"]["covered_by_guarantee"]
  assert covered["summary"] == ["params_sha256"] and covered["metrics_rows"] == ["aggregate_norm"]
  assert "held-out" in covered["note"]
  # So is the number of those examples: a diagnostic, not the public data block's.
  assert "test_examples" not in summary["data"]
  assert summary["diagnostics"]["data"]["test_examples"] == 4
  capsys.readouterr()
  # A private release would have to leave its accuracy out: refused, with the reason.
  assert main(["run", "--dataset", "shakespeare", "--partition", "natural",
               "--data-dir", str(plays_dir), "--num-clients", "4", "--model", "char_lstm_small",
               "--rounds", "1", "--no-progress", "--release", "private",
               "--output-dir", str(tmp_path / "private")]) == 2
  err = capsys.readouterr().err
  assert "release" in err and "held-out" in err and "Traceback" not in err
