"""Synthetic populations whose clients' data is generated from their ids, for benchmarks.

A population of a million clients holds no per-client arrays: ``x`` and ``y``
are zero-stride views with the population's shape, and :meth:`rows` computes a
cohort's examples from the client ids when the round asks for them (host
placement). Speed does not depend on the values, which are deterministic
functions of (client id, example, feature), and labels cycle through the
classes. Not for learning experiments.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data.federated import FederatedData
from fedjax_dp.errors import check


@dataclasses.dataclass
class SyntheticClients(FederatedData):
  """:class:`FederatedData` whose rows are generated from the client ids (see the module)."""

  def rows(self, ids: np.ndarray) -> tuple:
    ids = np.asarray(ids, np.int64)
    size = int(np.prod(self.example_shape))
    m = self.max_examples
    phase = (ids[:, None, None] * 0.618 + np.arange(m)[None, :, None] * 0.414
             + np.arange(size)[None, None, :] * 0.0173)
    x = (0.5 + 0.5 * np.sin(phase)).astype(np.float32).reshape((len(ids), m) + self.example_shape)
    y = ((ids[:, None] + np.arange(m)[None, :]) % self.num_classes).astype(np.int32)
    return x, y, self.counts[ids]


def synthetic_population(num_clients: int, examples: int = 8, example_shape=(28, 28, 1),
                         num_classes: int = 10, test_examples: int = 256) -> SyntheticClients:
  """A population of ``num_clients`` clients of ``examples`` generated examples each (run it with
  host placement: the dense arrays are never built).

  Args:
    num_clients: the population, ``>= 1``.
    examples: examples per client, ``>= 1``.
    example_shape: one example's shape (float32 values in ``[0, 1]``).
    num_classes: the number of classes the labels cycle through.
    test_examples: the test set's size: example 0 of clients ``0, 1, ...`` (modulo the
      population).

  Returns:
    The :class:`SyntheticClients`.

  Raises:
    ConfigError: ``num_clients`` or ``examples`` below 1.
  """
  check(num_clients >= 1, "num_clients", num_clients, "must be >= 1")
  check(examples >= 1, "examples", examples, "must be >= 1")
  shape = (num_clients, examples) + tuple(example_shape)
  x = np.broadcast_to(np.float32(0), shape)
  y = np.broadcast_to(np.int32(0), shape[:2])
  counts = np.full(num_clients, examples, np.int32)
  data = SyntheticClients("synthetic", x, y, counts, np.zeros((test_examples,) + tuple(example_shape),
                                                             np.float32),
                          np.zeros(test_examples, np.int32), num_classes)
  data.test_x, data.test_y, _ = data.rows(np.arange(test_examples) % num_clients)
  data.test_x, data.test_y = data.test_x[:, 0], data.test_y[:, 0]
  return data
