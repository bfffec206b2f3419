"""Partitioners: split a centralized data set's examples among clients.

Each function returns a list with one ``int64`` index array per client. The
random ones are deterministic given the ``numpy.random.Generator`` they get;
indices within a client are in random order (``natural`` keeps the data's
order). Feed the result to :meth:`FederatedData.from_partition`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedjax_dp.errors import ConfigError, check, check_positive

PARTITIONERS = ("iid", "dirichlet", "shards", "natural")


def _check_num_clients(num_clients: int, num_examples: int) -> None:
  check(isinstance(num_clients, (int, np.integer)) and
        1 <= num_clients <= num_examples, "num_clients", num_clients,
        f"must be an integer in [1, {num_examples}] (number of training "
        "examples)")


def iid(num_examples: int, num_clients: int,
        rng: np.random.Generator) -> list[np.ndarray]:
  """Uniformly random partition into near-equal parts.

  Args:
    num_examples: Number of examples to split.
    num_clients: Number of clients, in ``[1, num_examples]``.
    rng: Source of randomness.

  Returns:
    ``num_clients`` disjoint index arrays covering ``range(num_examples)``
    whose sizes differ by at most one.
  """
  _check_num_clients(num_clients, num_examples)
  perm = rng.permutation(num_examples)
  return [p.astype(np.int64) for p in np.array_split(perm, num_clients)]


def dirichlet(labels: Sequence[int], num_clients: int, alpha: float,
              rng: np.random.Generator,
              min_examples: int = 1) -> list[np.ndarray]:
  """Label-skewed partition with Dirichlet class proportions.

  For each class ``c`` the proportions of its examples given to the clients
  are drawn as ``q_c ~ Dir(alpha * 1_K)`` (Hsu, Qi & Brown 2019, "Measuring
  the effects of non-identical data distribution for federated visual
  classification"; Yurochkin et al. 2019). Small ``alpha`` gives each client
  few classes; large ``alpha`` approaches an iid split.

  Minimum size: a single draw is made and then *rebalanced* (no rejection
  loop, which may never end for tiny ``alpha`` and many clients): while a
  client holds fewer than ``min_examples`` examples, one random example moves
  to it from the currently largest client. This moves at most
  ``num_clients * min_examples`` examples.

  Args:
    labels: Integer label of each example.
    num_clients: Number of clients, ``>= 1``.
    alpha: Dirichlet concentration, ``> 0``.
    rng: Source of randomness.
    min_examples: Minimum examples per client, ``>= 1`` and
      ``num_clients * min_examples <= len(labels)``.

  Returns:
    ``num_clients`` disjoint index arrays covering every example exactly once.
  """
  labels = np.asarray(labels).reshape(-1)
  n = labels.shape[0]
  _check_num_clients(num_clients, n)
  check_positive("alpha", alpha)
  check(isinstance(min_examples, (int, np.integer)) and min_examples >= 1 and
        num_clients * min_examples <= n, "min_examples", min_examples,
        f"must be >= 1 with num_clients * min_examples <= {n}")
  parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    q = rng.dirichlet(np.full(num_clients, float(alpha)))
    cuts = (np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
    for k, chunk in enumerate(np.split(idx, cuts)):
      parts[k].append(chunk)
  clients = [list(np.concatenate(p)) for p in parts]
  sizes = np.array([len(p) for p in clients])
  for k in range(num_clients):
    while sizes[k] < min_examples:
      donor = int(np.argmax(sizes))
      j = int(rng.integers(sizes[donor]))
      clients[donor][j], clients[donor][-1] = clients[donor][-1], clients[donor][j]
      clients[k].append(clients[donor].pop())
      sizes[donor] -= 1
      sizes[k] += 1
  return [rng.permutation(np.asarray(p, dtype=np.int64)) for p in clients]


def shards(labels: Sequence[int], num_clients: int, shards_per_client: int,
           rng: np.random.Generator, min_labels: int = 1,
           max_deals: int = 1000) -> list[np.ndarray]:
  """Pathological non-iid "shards" partition (McMahan et al. 2017, FedAvg).

  Examples are sorted by label, cut into ``num_clients * shards_per_client``
  equal shards, and each client is dealt ``shards_per_client`` random shards.
  When the number of examples is not a multiple of the number of shards, the
  remainder (fewer than one example per shard) is dropped at random before
  sorting. A shard that straddles a class boundary holds two labels, so a
  client holds at most ``shards_per_client`` labels only when class sizes are
  multiples of the shard size (at most ``2 * shards_per_client`` otherwise).

  Args:
    labels: Integer label of each example.
    num_clients: Number of clients, ``>= 1``.
    shards_per_client: Shards per client, ``>= 1`` with
      ``num_clients * shards_per_client <= len(labels)``.
    rng: Source of randomness.
    min_labels: Every client must hold at least this many distinct labels
      (e.g. SP-FL's "at least 3 labels per client"; errors name it by its
      setting, ``min_labels_per_client``). The random deal of shards
      is redrawn until it holds (rejection sampling, so every admissible deal
      stays equally likely); a ConfigError after ``max_deals`` failed deals.
    max_deals: Cap on the number of deals tried.

  Returns:
    ``num_clients`` disjoint index arrays, each of size
    ``shards_per_client * (len(labels) // (num_clients * shards_per_client))``.
  """
  labels = np.asarray(labels).reshape(-1)
  n = labels.shape[0]
  _check_num_clients(num_clients, n)
  check(isinstance(shards_per_client, (int, np.integer)) and
        shards_per_client >= 1 and num_clients * shards_per_client <= n,
        "shards_per_client", shards_per_client,
        f"must be >= 1 with num_clients * shards_per_client <= {n} "
        f"(num_clients={num_clients})")
  num_shards = num_clients * shards_per_client
  shard_size = n // num_shards
  keep = rng.permutation(n)[:num_shards * shard_size]
  keep = keep[np.argsort(labels[keep], kind="stable")]
  check(isinstance(min_labels, (int, np.integer)) and 1 <= min_labels <= 2 * shards_per_client,
        "min_labels_per_client", min_labels,
        f"must be in [1, 2 * shards_per_client = {2 * shards_per_client}]")
  shard_rows = keep.reshape(num_shards, shard_size)
  shard_labels = labels[shard_rows]  # [num_shards, shard_size]
  for _ in range(max_deals):
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    held = shard_labels[deal].reshape(num_clients, -1)
    distinct = np.array([np.unique(h).size for h in held])
    if distinct.min() >= min_labels:
      break
  else:
    raise ConfigError("min_labels_per_client", min_labels,
                      f"no deal of {shards_per_client} shards per client gave every client that many "
                      f"labels in {max_deals} tries; lower it or raise shards_per_client")
  return [rng.permutation(shard_rows[d].reshape(-1)).astype(np.int64)
          for d in deal]


def natural(client_ids: Sequence) -> list[np.ndarray]:
  """Groups examples by a client-id column (e.g. the writer of a digit).

  Args:
    client_ids: One hashable, sortable id per example (ints or strings).

  Returns:
    One index array per distinct id, clients in order of first appearance,
    indices within a client in their original order.
  """
  ids = np.asarray(client_ids).reshape(-1)
  check(ids.shape[0] >= 1, "client_ids", "[]", "must be non-empty")
  _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
  rank = np.empty_like(first)
  rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
  group = rank[inverse.reshape(-1)]
  order = np.argsort(group, kind="stable")
  bounds = np.cumsum(np.bincount(group))[:-1]
  return [g.astype(np.int64) for g in np.split(order, bounds)]
