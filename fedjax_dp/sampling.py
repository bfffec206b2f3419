"""Host-side cohort sampling (NumPy).

Cohorts have a fixed padded ``capacity`` so the round compiles once; ``mask``
marks the real clients. Padded slots repeat client 0 and are masked out.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.errors import check, check_choice

SAMPLINGS = ("poisson", "fixed")


def check_design(kind: str, num_clients: int | None = None, prob: float | None = None,
                 cohort_size: int | None = None) -> None:
  """Refuses a cohort sampling design outside its range: the one statement of these ranges.

  A run's settings are checked where they are read, by
  :class:`fedjax_dp.config.RunConfig` (the boundary); the public classes that take these numbers
  from a caller directly (the samplers here and
  :class:`fedjax_dp.privacy.mechanisms.GaussianSumMechanism`) check theirs with it too.

  Args:
    kind: "poisson" or "fixed" (:data:`SAMPLINGS`).
    num_clients: the population size (needed by "fixed").
    prob: "poisson": each client's probability per round, in (0, 1].
    cohort_size: "fixed": clients per round, in [1, num_clients].

  Raises:
    ConfigError: naming the first setting outside its range.
  """
  check_choice("sampling", kind, SAMPLINGS)
  if kind == "poisson":
    check(prob is not None and 0 < prob <= 1, "sampling_prob", prob, "must be in (0, 1]")
  else:
    check(num_clients is not None and num_clients >= 1, "num_clients", num_clients, "must be >= 1")
    check(cohort_size is not None and 1 <= cohort_size <= num_clients, "cohort_size", cohort_size,
          f"must be in [1, num_clients={num_clients}] with sampling='fixed'")


@dataclasses.dataclass(frozen=True)
class Cohort:
  ids: np.ndarray    # [capacity] int32
  mask: np.ndarray   # [capacity] float32, 1 for real clients

  @property
  def size(self) -> int:
    return int(self.mask.sum())

  @property
  def real_ids(self) -> np.ndarray:
    return self.ids[self.mask > 0]


def _pad(ids: np.ndarray, capacity: int) -> Cohort:
  padded = np.zeros(capacity, np.int32)
  padded[:len(ids)] = ids
  mask = np.zeros(capacity, np.float32)
  mask[:len(ids)] = 1.0
  return Cohort(padded, mask)


def _rows(joins: np.ndarray, capacity: int) -> tuple:
  """``[n, num_clients]`` membership to ``(ids, mask)`` (``[n, capacity]``), ids ascending then
  padded with 0 as :func:`_pad` pads one cohort."""
  n, num = joins.shape
  order = np.argsort(~joins, axis=1, kind="stable")[:, :capacity].astype(np.int32)
  mask = np.take_along_axis(joins, order, axis=1)
  return np.where(mask, order, 0).astype(np.int32), mask.astype(np.float32)


def poisson_capacity(num_clients: int, prob: float, tail: float = 1e-9) -> int:
  """Smallest c with P[Binomial(N, p) > c] < ``tail`` (Chernoff-free exact tail via the log-pmf).

  Args:
    num_clients: ``N``, the population, ``>= 1``.
    prob: ``p``, each client's probability per round, in ``(0, 1]``.
    tail: the largest allowed probability that a round's draw exceeds the capacity.

  Returns:
    ``c``, clipped to ``[1, N]``.
  """
  from scipy import stats  # scipy comes with scikit-learn
  c = int(stats.binom.isf(tail, num_clients, prob)) + 1
  return max(1, min(num_clients, c))


class _Sampler:
  """What every sampler carries between rounds: its NumPy Generator and its capacity."""

  def state(self) -> dict:
    """Everything :meth:`load_state` needs to continue the draws exactly (a checkpoint's part)."""
    return {"bit_generator": self._rng.bit_generator.state, "capacity": self.capacity,
            "capacity_grew": self.capacity_grew}

  def reseed(self, entropy: int) -> None:
    """Draws from here on from a generator seeded by ``entropy`` (a private release's secret)."""
    self._rng = np.random.default_rng(entropy)

  def load_state(self, state: dict) -> None:
    self._rng.bit_generator.state = state["bit_generator"]
    self.capacity = int(state["capacity"])
    self.capacity_grew = int(state["capacity_grew"])


class PoissonSampler(_Sampler):
  """Each client joins each round independently with probability ``prob``.

  The cohort is padded to ``capacity`` (by default large enough that overflow
  has probability below 1e-9 per round). A draw is never truncated: truncation
  would change the sampling distribution and void the privacy analysis. If a
  draw does exceed the capacity, the capacity grows to fit it (the round
  recompiles once) and ``capacity_grew`` records it.

  Raises:
    ConfigError: ``num_clients``, ``prob`` or ``capacity`` out of range (:func:`check_design`).
  """

  kind = "poisson"

  def __init__(self, num_clients: int, prob: float, seed: int, capacity: int | None = None):
    check(num_clients >= 1, "num_clients", num_clients, "must be >= 1")
    check_design(self.kind, num_clients, prob=prob)
    self.num_clients = int(num_clients)
    self.prob = float(prob)
    self.capacity = int(capacity) if capacity else poisson_capacity(num_clients, prob)
    check(1 <= self.capacity <= num_clients, "capacity", self.capacity,
          f"must be in [1, num_clients={num_clients}]")
    self.capacity_grew = 0
    self._rng = np.random.default_rng(seed)

  @property
  def expected_size(self) -> float:
    return self.prob * self.num_clients

  def sample(self) -> Cohort:
    ids = np.flatnonzero(self._rng.random(self.num_clients) < self.prob).astype(np.int32)
    if len(ids) > self.capacity:
      self.capacity = int(math.ceil(len(ids) * 1.1))
      self.capacity = min(self.capacity, self.num_clients)
      self.capacity_grew += 1
    return _pad(ids, self.capacity)

  def sample_many(self, n: int) -> tuple:
    """``n`` cohorts at once: ``(ids, mask)``, each ``[n, capacity]``.

    The draws are those of ``n`` calls of :meth:`sample` (the generator's uniforms are
    consumed in the same order), except that the capacity does not grow: a draw past it
    raises.

    Raises:
      ConfigError: a draw holds more clients than ``capacity``.
    """
    joins = self._rng.random((n, self.num_clients)) < self.prob
    sizes = joins.sum(1)
    check(int(sizes.max(initial=0)) <= self.capacity, "capacity", self.capacity,
          f"is below a draw of {int(sizes.max(initial=0))} clients")
    return _rows(joins, self.capacity)


class FixedSizeSampler(_Sampler):
  """A uniformly random subset of exactly ``cohort_size`` clients, without replacement.

  Raises:
    ConfigError: ``num_clients`` or ``cohort_size`` out of range (:func:`check_design`).
  """

  kind = "fixed"

  def __init__(self, num_clients: int, cohort_size: int, seed: int):
    check_design(self.kind, num_clients, cohort_size=cohort_size)
    self.num_clients = int(num_clients)
    self.capacity = int(cohort_size)
    self.capacity_grew = 0
    self._rng = np.random.default_rng(seed)

  @property
  def expected_size(self) -> float:
    return float(self.capacity)

  def sample(self) -> Cohort:
    ids = np.sort(self._rng.choice(self.num_clients, self.capacity, replace=False)).astype(np.int32)
    return _pad(ids, self.capacity)

  def sample_many(self, n: int) -> tuple:
    """``n`` uniformly random cohorts at once: ``(ids, mask)``, each ``[n, cohort_size]``.

    Each row has the distribution of :meth:`sample` (a uniform subset, sorted), drawn as the
    ``cohort_size`` smallest of ``num_clients`` uniforms; the generator's stream differs from
    ``n`` calls of :meth:`sample`.
    """
    order = np.argsort(self._rng.random((n, self.num_clients)), axis=1)
    joins = np.zeros((n, self.num_clients), bool)
    np.put_along_axis(joins, order[:, :self.capacity], True, axis=1)
    return _rows(joins, self.capacity)


def make_sampler(kind: str, num_clients: int, seed: int, prob: float | None = None,
                 cohort_size: int | None = None, capacity: int | None = None):
  """The cohort sampler of a sampling design.

  Args:
    kind: "poisson" or "fixed" (:data:`SAMPLINGS`).
    num_clients: ``N``, the population, ``>= 1``.
    seed: the NumPy generator's seed.
    prob: "poisson": each client's probability per round, in ``(0, 1]``.
    cohort_size: "fixed": clients per round, in ``[1, N]``.
    capacity: "poisson": the padded cohort slots, in ``[1, N]``; None: :func:`poisson_capacity`.

  Returns:
    A :class:`PoissonSampler` or :class:`FixedSizeSampler`.

  Raises:
    ConfigError: an unknown ``kind`` or a setting out of range (:func:`check_design`).
  """
  check_choice("sampling", kind, SAMPLINGS)
  if kind == "poisson":
    return PoissonSampler(num_clients, prob, seed, capacity)
  return FixedSizeSampler(num_clients, cohort_size, seed)
