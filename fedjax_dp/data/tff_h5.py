"""Reader for TensorFlow Federated's HDF5 client-data layout.

TFF distributes federated data sets (EMNIST, CIFAR-100, Shakespeare, ...) as HDF5
files with one group per client::

  examples/<client_id>/<feature>   e.g. pixels [n, 28, 28], label [n]
                                   or  image [n, 32, 32, 3] (uint8), label [n]
                                   or  snippets [n] (byte strings)
                                   or  tokens [n] (byte strings of words)

``h5py`` is imported inside the functions, so importing this module is cheap.
Client ids are listed in the file's order, which for h5py is sorted by name.

Federated Shakespeare becomes next-character prediction at every position
(:func:`shakespeare_windows`), StackOverflow next-word prediction on sentences of 20 words
(:func:`stackoverflow_sequences`) or tag prediction from a bag of words
(:func:`stackoverflow_tag_examples`): the tasks of the TFF and FedJAX benchmarks.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import collections

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
              max_clients: Optional[int], max_per_client: Optional[int] = None):
  """Yields ``client_fn`` of each client's features, at most ``max_per_client`` of its first
  examples, for clients left non-empty, in file order."""
  with _open(path) as f:
    n = 0
    for cid in f[_ROOT].keys():
      if max_clients is not None and n >= max_clients:
        return
      x, y = client_fn(_read_group(f, path, cid, features))
      if len(y):
        n += 1
        yield x[:max_per_client], y[:max_per_client]


class H5Set(NamedTuple):
  """What a TFF HDF5 data set's clients hold and how they become examples.

  Attributes:
    name: the data set's name (:attr:`FederatedData.name`).
    features: the feature names read from each client, e.g. ``("pixels", "label")``.
    client_fn: maps one client's ``{feature: array}`` to its examples ``(x, y)`` (model inputs
      and ``int`` labels, one row per example); a client with no rows is dropped (train and
      test).
    num_classes: the number of classes.
    test_from_clients: the test file holds the training clients' own held-out examples
      (EMNIST's writers, Shakespeare's roles: statistics on it are raw, no guarantee covers
      them); False when its clients' examples are apart from every training client's
      (CIFAR-100's test split).
    multi_label: each example's labels are a set of classes (:attr:`FederatedData.multi_label`).
  """

  name: str
  features: Sequence[str]
  client_fn: Callable
  num_classes: int
  test_from_clients: bool = True
  multi_label: bool = False


def _per_client(field: str, path, h5set: H5Set, limit: Optional[int],
                max_per_client: Optional[int]) -> tuple:
  """Every non-empty client's ``(x, y)`` of one file, as two lists in file order.

  Args:
    field: the argument an error names ("train_path" or "test_path").
    path: the HDF5 file.
    h5set: what its clients hold.
    limit: keep only the first this many non-empty clients; ``None`` keeps all.
    max_per_client: keep only each client's first this many examples; ``None`` keeps all.

  Raises:
    ConfigError: the file holds no non-empty client.
  """
  xs, ys = [], []
  for x, y in _read_all(path, h5set.features, h5set.client_fn, limit, max_per_client):
    xs.append(x)
    ys.append(np.asarray(y, dtype=np.int32))
  check(len(xs) >= 1, field, str(path), "must hold at least one non-empty client")
  return xs, ys


def load_tff_h5_federated(train_path, test_path, h5set: H5Set,
                          max_clients: Optional[int] = None,
                          max_test_clients: Optional[int] = None,
                          max_per_client: Optional[int] = None) -> FederatedData:
  """Loads a TFF HDF5 data set with its natural (per-client) partition.

  Args:
    train_path: Training HDF5 file; one client per group.
    test_path: Test HDF5 file; its clients are concatenated into the centralized test set.
    h5set: what the files' clients hold and how they become examples (:class:`H5Set`).
    max_clients: Keep only the first this many (non-empty) training clients, in file order;
      ``None`` keeps all. The test set is not reduced.
    max_test_clients: Read only the first this many (non-empty) clients of the test file;
      ``None`` reads all.
    max_per_client: Keep only each client's first this many examples (train and test);
      ``None`` keeps all.

  Returns:
    The padded :class:`FederatedData`, clients in file order, its
    :attr:`~FederatedData.test_from_clients` as ``h5set`` says.

  Raises:
    ConfigError: a limit that is not None or an integer >= 1, or a file without a non-empty
      client.
  """
  for field, value in (("max_clients", max_clients), ("max_test_clients", max_test_clients),
                       ("max_per_client", max_per_client)):
    check(value is None or (isinstance(value, (int, np.integer)) and value >= 1),
          field, value, "must be None or an integer >= 1")
  xs, ys = _per_client("train_path", train_path, h5set, max_clients, max_per_client)
  tx, ty = _per_client("test_path", test_path, h5set, max_test_clients, max_per_client)
  counts = [len(y) for y in ys]
  bounds = np.cumsum([0] + counts)
  parts = [np.arange(bounds[k], bounds[k + 1]) for k in range(len(counts))]
  return FederatedData.from_partition(
      h5set.name, np.concatenate(xs).astype(np.float32), np.concatenate(ys), parts,
      np.concatenate(tx).astype(np.float32), np.concatenate(ty), h5set.num_classes,
      test_from_clients=h5set.test_from_clients, multi_label=h5set.multi_label)


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
      train_path, test_path,
      H5Set("federated_emnist", ("pixels", "label"), client_fn, 10 if only_digits else 62),
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
      train_path, test_path,
      H5Set("cifar100", ("image", label), client_fn, 100 if label == "label" else 20,
            test_from_clients=False),
      max_clients=max_clients)


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
      train_path, test_path,
      H5Set("shakespeare", ("snippets",), lambda d: shakespeare_windows(d["snippets"], length),
            SHAKESPEARE_VOCAB_SIZE),
      max_clients=max_clients)


# StackOverflow next-word prediction as TFF's baseline and FedJAX set it up
# (tff.simulation.baselines.stackoverflow, fedjax.datasets.stackoverflow): the 10,000 most
# frequent words, pad 0, the words 1..10,000 in order of frequency, one out-of-vocabulary
# token, beginning and end of sentence; sentences of at most 20 words; at most 1,000
# sentences per client.
SO_VOCAB_SIZE = 10_000
SO_SEQUENCE_LENGTH = 20
SO_MAX_PER_CLIENT = 1000


def so_special_tokens(vocab_size: int = SO_VOCAB_SIZE) -> tuple[int, int, int, int]:
  """``(PAD, OOV, BOS, EOS)`` ids for a vocabulary of ``vocab_size`` words: ``0``,
  ``vocab_size + 1``, ``+ 2``, ``+ 3``; ``vocab_size + 4`` tokens in all."""
  return 0, vocab_size + 1, vocab_size + 2, vocab_size + 3


def _split(text: bytes, sep: Optional[str] = None) -> list[str]:
  """``text`` decoded (UTF-8, a bad byte replaced) and split on ``sep`` (``None``: on
  whitespace), empty parts dropped."""
  return [w for w in text.decode("utf-8", "replace").split(sep) if w]


def user_counts(path, features: dict[str, Optional[str]],
                max_clients: Optional[int] = None) -> dict[str, collections.Counter]:
  """For each word of each of ``features``, how many clients (users) of a StackOverflow HDF5
  file use it, as TFF's word counts (``tokens``) and tag counts (``tags``) count them; the file
  is read once.

  Args:
    path: A TFF StackOverflow file (``examples/<client_id>/tokens``, sentences of
      space-separated words; ``tags``, ``|``-separated tags).
    features: ``{feature: separator}``, the separator of its words (``None``: whitespace).
    max_clients: Count only the first this many clients (file order); ``None`` counts all.

  Returns:
    ``{feature: Counter}``, a ``Counter`` of its words (``str``): the number of clients with at
    least one example holding it.
  """
  counts = {feature: collections.Counter() for feature in features}
  with _open(path) as f:
    for k, cid in enumerate(f[_ROOT].keys()):
      if max_clients is not None and k >= max_clients:
        break
      client = _read_group(f, path, cid, tuple(features))
      for feature, sep in features.items():
        counts[feature].update({w for text in client[feature] for w in _split(text, sep)})
  return counts


def word_counts(path, max_clients: Optional[int] = None) -> collections.Counter:
  """For each word, how many clients (users) of a StackOverflow HDF5 file use it in their
  ``tokens`` (:func:`user_counts`)."""
  return user_counts(path, {"tokens": None}, max_clients)["tokens"]


def stackoverflow_vocabulary(counts: collections.Counter,
                             size: int = SO_VOCAB_SIZE) -> dict[str, int]:
  """The ``size`` words of largest count, numbered ``1..`` by decreasing count (ties by word).

  Args:
    counts: Word counts (:func:`word_counts`).
    size: Vocabulary size, ``>= 1``; fewer words when ``counts`` has fewer.

  Returns:
    ``{word: id}``.
  """
  check(isinstance(size, (int, np.integer)) and size >= 1, "size", size,
        "must be an integer >= 1")
  ranked = sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:size]
  return {w: i + 1 for i, (w, _) in enumerate(ranked)}


def stackoverflow_sequences(sentences: Sequence[bytes], vocab: dict[str, int],
                            vocab_size: int = SO_VOCAB_SIZE,
                            length: int = SO_SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
  """One client's sentences as next-word examples ``(x, y)``, each ``[n, length]``, one per
  sentence (TFF's preprocessing).

  A sentence's first ``length`` words become ids (:func:`stackoverflow_vocabulary`'s, a word
  outside it OOV), preceded by BOS and, when the sentence had fewer than ``length`` words,
  followed by EOS; padded with PAD to ``length + 1`` tokens, the inputs are the first
  ``length`` and the targets the last ``length`` (``y[i, t]`` is the token after
  ``x[i, t]``); a PAD target is :data:`IGNORE`. With ``length=3``, ``b"a b"`` gives
  ``x = [BOS, a, b]``, ``y = [a, b, EOS]`` and ``b"a b c d"`` gives ``x = [BOS, a, b]``,
  ``y = [a, b, c]``.

  Args:
    sentences: The client's ``tokens`` (byte strings of space-separated words).
    vocab: ``{word: id}`` with ids in ``1..vocab_size``.
    vocab_size: The vocabulary's nominal size, which sets the special ids
      (:func:`so_special_tokens`).
    length: Sequence length, ``>= 1``.

  Returns:
    ``int32`` inputs and targets.
  """
  check(isinstance(length, (int, np.integer)) and length >= 1, "length", length,
        "must be an integer >= 1")
  pad, oov, bos, eos = so_special_tokens(vocab_size)
  rows = np.full((len(sentences), length + 1), pad, np.int32)
  for i, sentence in enumerate(sentences):
    words = sentence.decode("utf-8", "replace").split()
    ids = [bos] + [vocab.get(w, oov) for w in words[:length]]
    if len(words) < length:
      ids.append(eos)
    rows[i, :len(ids)] = ids
  y = rows[:, 1:].copy()
  y[y == pad] = IGNORE
  return rows[:, :-1], y


def load_federated_stackoverflow(train_path, test_path, held_out_path,
                                 max_clients: Optional[int] = None,
                                 max_test_clients: Optional[int] = None,
                                 vocab_size: int = SO_VOCAB_SIZE,
                                 length: int = SO_SEQUENCE_LENGTH,
                                 max_per_client: Optional[int] = SO_MAX_PER_CLIENT
                                 ) -> FederatedData:
  """Loads TFF's federated StackOverflow for next-word prediction (one client per user).

  TFF splits the posts by user and date: training holds posts before 2018 of 342,477 users,
  test the later posts of the users not held out, held-out every post of the users whose id is
  0 modulo 10. The vocabulary (:func:`stackoverflow_vocabulary`) is the ``vocab_size`` words
  used by the most users **of the held-out file** (:func:`word_counts`): its users are neither
  training nor test users, so the vocabulary depends on no training client's data. (TFF's and
  FedJAX's baselines take it from TFF's word counts of the training split's users,
  data-dependent; the two vocabularies differ.)
  Each sentence is one example (:func:`stackoverflow_sequences`); inputs are token ids stored as
  ``float32`` ``[n, length]``, labels ``int32`` ``[n, length]`` over ``vocab_size + 4`` tokens.

  Args:
    train_path: ``stackoverflow_train.h5``.
    test_path: ``stackoverflow_test.h5``; its clients' sentences form the test set, the
      training users' own later posts (``test_from_clients``).
    held_out_path: ``stackoverflow_held_out.h5``, read for the vocabulary only.
    max_clients: Keep only the first this many training clients (file order).
    max_test_clients: Read only the first this many test clients; ``None`` reads all.
    vocab_size: Words in the vocabulary.
    length: Sequence length.
    max_per_client: Keep each client's first this many sentences (TFF's baseline: 1,000);
      ``None`` keeps all.

  Returns:
    The padded :class:`FederatedData` named ``"stackoverflow"``.
  """
  vocab = stackoverflow_vocabulary(word_counts(held_out_path), vocab_size)
  return load_tff_h5_federated(
      train_path, test_path,
      H5Set("stackoverflow", ("tokens",),
            lambda d: stackoverflow_sequences(d["tokens"], vocab, vocab_size, length),
            vocab_size + 4),
      max_clients=max_clients, max_test_clients=max_test_clients,
      max_per_client=max_per_client)


# StackOverflow tag prediction as TFF's baseline sets it up
# (tff.simulation.baselines.stackoverflow.create_tag_prediction_task and its
# tag_prediction_preprocessing): the word vocabulary of next-word prediction, the 500 tags used
# by the most users; a post's words (title and sentence) as a bag of words, its tags as a
# multi-hot vector. StackOverflow allows at most 5 tags per question; the first 100 words of a
# post are kept (title first).
SO_TAG_VOCAB_SIZE = 500
SO_MAX_TAGS = 5
SO_BAG_LENGTH = 100


def stackoverflow_tag_examples(tokens: Sequence[bytes], titles: Sequence[bytes],
                               tags: Sequence[bytes], words: dict[str, int],
                               tag_ids: dict[str, int], vocab_size: int = SO_VOCAB_SIZE,
                               length: int = SO_BAG_LENGTH,
                               max_tags: int = SO_MAX_TAGS) -> tuple[np.ndarray, np.ndarray]:
  """One client's examples as tag-prediction examples ``(x, y)``: word ids ``[n, length]`` and
  tag ids ``[n, max_tags]``, one per example (TFF's preprocessing, in a compact form).

  ``x[i]``: the ids (:func:`stackoverflow_vocabulary`'s ``words``, a word outside it
  ``vocab_size + 1``, out of the vocabulary) of the words of ``titles[i]`` then ``tokens[i]``,
  split on whitespace, the first ``length`` of them, padded with 0. A bag-of-words model
  (:class:`fedjax_dp.models.bag_of_words.BagOfWordsLR`) forms from them TFF's features: the
  frequency of each vocabulary word among the words, out-of-vocabulary ones counted. TFF joins
  the sentence and then the title, which gives the same bag; putting the title first keeps it
  when a long sentence is cut at ``length`` words (TFF cuts nothing).

  ``y[i]``: the ids (``tag_ids``, ``0..``) of the tags of ``tags[i]`` (split on ``|``) that are
  in ``tag_ids``, each once, in order, padded with :data:`IGNORE`: the classes of TFF's
  multi-hot label vector (:func:`fedjax_dp.models.multi_hot` expands it), which drops the tags
  outside the vocabulary too. An example without one has no true class, as in TFF.

  Args:
    tokens: The client's ``tokens`` (byte strings of space-separated words).
    titles: Its ``title`` (one per example).
    tags: Its ``tags`` (``|``-separated).
    words: ``{word: id}`` with ids in ``1..vocab_size``.
    tag_ids: ``{tag: id}`` with ids in ``0..``.
    vocab_size: The word vocabulary's nominal size, which sets the out-of-vocabulary id.
    length: Words kept per example, ``>= 1``.
    max_tags: Tags per example, ``>= 1``.

  Returns:
    ``int32`` word ids and tag ids.

  Raises:
    ConfigError: for a bad ``length`` or ``max_tags``, features of different lengths, or an
      example with more than ``max_tags`` tags in the vocabulary.
  """
  for field, value in (("length", length), ("max_tags", max_tags)):
    check(isinstance(value, (int, np.integer)) and value >= 1, field, value,
          "must be an integer >= 1")
  n = len(tokens)
  check(len(titles) == n and len(tags) == n, "title", len(titles),
        f"must hold one title and one tags string per example ({n} tokens, {len(tags)} tags)")
  oov = vocab_size + 1
  x = np.zeros((n, length), np.int32)
  y = np.full((n, max_tags), IGNORE, np.int32)
  for i in range(n):
    ids = [words.get(w, oov) for w in (_split(titles[i]) + _split(tokens[i]))[:length]]
    x[i, :len(ids)] = ids
    known = list(dict.fromkeys(tag_ids[t] for t in _split(tags[i], "|") if t in tag_ids))
    check(len(known) <= max_tags, "tags", tags[i].decode("utf-8", "replace"),
          f"must hold at most max_tags={max_tags} tags of the vocabulary (StackOverflow allows "
          "5 per question)")
    y[i, :len(known)] = known
  return x, y


def load_federated_stackoverflow_tags(train_path, test_path, held_out_path,
                                      max_clients: Optional[int] = None,
                                      max_test_clients: Optional[int] = None,
                                      tag_vocab_size: int = SO_TAG_VOCAB_SIZE,
                                      length: int = SO_BAG_LENGTH,
                                      max_per_client: Optional[int] = SO_MAX_PER_CLIENT
                                      ) -> FederatedData:
  """Loads TFF's federated StackOverflow for tag prediction (one client per user).

  The files and users are next-word prediction's (:func:`load_federated_stackoverflow`); each
  example (a sentence with its post's title and tags) becomes
  :func:`stackoverflow_tag_examples`: inputs are word ids stored as ``float32``
  ``[n, length]``, labels ``int32`` ``[n, 5]``, the ids of its tags among ``tag_vocab_size``
  classes (:attr:`FederatedData.multi_label`).

  Vocabularies: the words are next-word prediction's, the :data:`SO_VOCAB_SIZE` (TFF's 10,000)
  words used by the most users of the held-out file; the tags, likewise, the ``tag_vocab_size``
  tags used by the most users of the held-out file (:func:`user_counts` of ``tags`` split on
  ``|``), numbered ``0..`` by decreasing count (ties by tag). TFF's baseline takes both from its
  counts over the training split's users (``load_word_counts``, ``load_tag_counts``), which
  depend on training clients' data; the vocabularies differ.

  Args:
    train_path: ``stackoverflow_train.h5``.
    test_path: ``stackoverflow_test.h5``; its clients' examples form the test set, the training
      users' own later posts (``test_from_clients``).
    held_out_path: ``stackoverflow_held_out.h5``, read for the vocabularies only.
    max_clients: Keep only the first this many training clients (file order).
    max_test_clients: Read only the first this many test clients; ``None`` reads all.
    tag_vocab_size: Tags in the tag vocabulary, the classes (TFF's default: 500).
    length: Words kept per example.
    max_per_client: Keep each client's first this many examples (as next-word prediction:
      1,000); ``None`` keeps all.

  Returns:
    The padded :class:`FederatedData` named ``"stackoverflow_tags"``.
  """
  counts = user_counts(held_out_path, {"tokens": None, "tags": "|"})
  words = stackoverflow_vocabulary(counts["tokens"], SO_VOCAB_SIZE)
  tag_ids = {t: i - 1 for t, i in
             stackoverflow_vocabulary(counts["tags"], tag_vocab_size).items()}

  def client_fn(d):
    return stackoverflow_tag_examples(d["tokens"], d["title"], d["tags"], words, tag_ids,
                                      SO_VOCAB_SIZE, length)

  return load_tff_h5_federated(
      train_path, test_path,
      H5Set("stackoverflow_tags", ("tokens", "title", "tags"), client_fn, tag_vocab_size,
            multi_label=True),
      max_clients=max_clients, max_test_clients=max_test_clients,
      max_per_client=max_per_client)
