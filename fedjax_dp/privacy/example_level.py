"""Example-level privacy accounting of client-side DP-SGD, one ledger per client.

The privacy unit is **one example of one client** (example-level DP, local to
each client), not a whole client: the guarantee says that the models a client
uploads (and everything computed from them) change little when one of *its*
examples is **replaced** by any other example. It says nothing about hiding a
client's participation or its whole data set.

Why replace-one: each client's example count ``|D_n|`` sets its per-step
sampling rate ``L / |D_n|``, its aggregation weight (SP-FL weights clients by
their counts) and the fixed-size sampler's population. Under replace-one the
count is the same in both neighbouring data sets, so using it is not a
leak; under add/remove one example it would be (a neighbour with one more
example has another rate and weight), and the add/remove epsilon would
understate the cost.

Each client has its own :class:`fedjax_dp.privacy.PrivacyLedger`: for every
round it took part in, its ``Q`` local steps are composed, each step

* fixed-size batches: ``SampledWithoutReplacementDpEvent(|D_n|, L,
  GaussianDpEvent(z / 2))`` (replacing an example moves the clipped sum by up
  to ``2C``), accounted with RDP;
* Poisson batches (rate ``L / |D_n|``, packed into a fixed capacity ``K``;
  when more than ``K`` examples are drawn a uniformly random ``K`` of them
  are kept): ``TruncatedSubsampledGaussianDpEvent(|D_n|, L / |D_n|, K, z)``
  (``PoissonSampledDpEvent(L / |D_n|, GaussianDpEvent(z))`` when ``K >=
  |D_n|``, where nothing can be dropped), accounted with PLD: dp_accounting's
  RDP accountant has no Poisson-sampled Gaussian under replace-one.

Clients are grouped into privacy classes (SP-FL's high and low privacy need);
each class reports the max and the median epsilon over its clients, or, for
a class whose mechanism has no formal guarantee, ``formal_guarantee: false``
with the reason and no epsilon at all.

Public by design (not covered): each client's example count ``|D_n|``
(invariant under the relation) and which clients take part in which round
(the client-level cohort draw does not depend on any example).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np

from fedjax_dp.errors import check, check_choice, check_open_unit
from fedjax_dp.privacy.ledger import ACCOUNTANTS, PrivacyLedger, check_supported
from fedjax_dp.privacy.mechanisms import calibrate
from fedjax_dp.sampling import SAMPLINGS

PRIVACY_UNIT = "one example of one client (example-level DP, local to each client)"
RELATION = "replace_one"
# What a report's neighbouring_relation says.
REPORTED_RELATION = RELATION + " (one example of one client; its example count is public)"
FIXED_BATCHES = "or fixed-size batches (--set example_sampling=fixed) with rdp"


def split_noise_multiplier(z: float, stat_noise: float) -> float:
  """Gradient noise multiplier ``z_Delta`` when a norm statistic shares the budget.

  Andrew et al., "Differentially Private Learning with Adaptive Clipping",
  NeurIPS 2021, Sec. 3: releasing the gradient sum with multiplier
  ``z_Delta`` and a statistic of sensitivity 1/2 with noise ``stat_noise``
  (multiplier ``2 stat_noise``) on the same sample is one Gaussian mechanism
  with multiplier ``z`` when ``z_Delta = (z^-2 - (2 stat_noise)^-2)^(-1/2)``.

  Raises:
    ConfigError: unless ``2 * stat_noise > z > 0``.
  """
  check(z > 0, "noise_multiplier", z, "must be > 0 to split it")
  check(2.0 * stat_noise > z, "stat_noise", stat_noise,
        f"must be > noise_multiplier / 2 = {z / 2:g} (Andrew et al. 2021, Sec. 3)")
  return float((z ** -2 - (2.0 * stat_noise) ** -2) ** -0.5)


@dataclasses.dataclass(frozen=True)
class ExampleDPSGDMechanism:
  """What one client's local DP-SGD releases, for the ledger.

  Attributes:
    noise_multiplier: the accounted multiplier ``z`` of one step (with a norm
      statistic, the combined multiplier; the gradient's own is
      ``grad_noise_multiplier``).
    batch_size: ``L``: expected (Poisson) or exact (fixed) examples per step.
    local_steps: ``Q`` steps per round the client takes part in.
    sampling: per-step example sampling, "fixed" or "poisson".
    grad_noise_multiplier: the gradient sum's multiplier (``z`` when no
      statistic is released, ``z_Delta`` of :func:`split_noise_multiplier`
      otherwise).
    stat_noise: noise standard deviation of the per-step statistic (0: none).
    capacity: Poisson only: the most examples a step keeps (``K``; a larger
      draw keeps a uniformly random ``K`` of them). None: never truncated.

  Privacy: example-level under replace-one, see the module docstring. Each
  step's per-example gradients are clipped to a bound that does not depend on
  the step's data (a constant, or computed only from earlier noisy
  releases), so replacing one example moves the step's sum by at most ``2C``,
  with Gaussian noise ``z_Delta * C`` on it.
  """

  noise_multiplier: float
  batch_size: int
  local_steps: int
  sampling: str = "fixed"
  grad_noise_multiplier: Optional[float] = None
  stat_noise: float = 0.0
  capacity: Optional[int] = None
  privacy_unit: str = PRIVACY_UNIT
  formal_guarantee: bool = True

  def __post_init__(self):
    check(self.noise_multiplier is not None and self.noise_multiplier >= 0
          and math.isfinite(self.noise_multiplier), "noise_multiplier", self.noise_multiplier,
          "must be a finite number >= 0")
    check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
    check(self.local_steps >= 1, "local_steps", self.local_steps, "must be >= 1")
    check_choice("example_sampling", self.sampling, SAMPLINGS)
    check(self.capacity is None or self.capacity >= 1, "capacity", self.capacity, "must be >= 1")

  @property
  def relation(self) -> str:
    return RELATION

  @property
  def accounted_multiplier(self) -> float:
    """``noise_multiplier``, or with a norm statistic the combined multiplier of the two (float32)
    multipliers the steps run with where that is smaller (float32 rounding, about 1e-7 relative):
    the ledger never accounts more noise than runs."""
    z = float(self.noise_multiplier)
    if self.stat_noise and self.grad_noise_multiplier:
      z = min(z, float((self.grad_noise_multiplier ** -2 + (2.0 * self.stat_noise) ** -2) ** -0.5))
    return z

  @property
  def guarantee_note(self) -> str:
    if self.noise_multiplier == 0:
      return "noise_multiplier=0: clipping only, no differential privacy guarantee"
    return (f"example-level DP, privacy unit: {PRIVACY_UNIT}; neighbouring relation: replace one "
            "example of one client's data (its example count is public); per-step sampled "
            f"Gaussian mechanism ({self.sampling} batches) composed over the client's own local steps")

  def step_event(self, num_examples: int) -> dp_accounting.DpEvent:
    """One local step of a client holding ``num_examples`` examples."""
    n = int(num_examples)
    L = int(self.batch_size)
    check(n >= L or self.sampling == "poisson", "batch_size", L,
          f"must be <= the client's examples ({n}) with fixed-size sampling")
    if self.noise_multiplier == 0:
      return dp_accounting.NonPrivateDpEvent()
    z = self.accounted_multiplier
    if self.sampling == "fixed":
      # Replacing one example moves the clipped sum by up to 2C.
      return dp_accounting.SampledWithoutReplacementDpEvent(n, L, dp_accounting.GaussianDpEvent(z / 2.0))
    q = min(1.0, L / n)
    if self.capacity is None or self.capacity >= n:
      return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    return dp_accounting.TruncatedSubsampledGaussianDpEvent(n, q, int(self.capacity), z)

  def round_event(self, num_examples: int) -> dp_accounting.DpEvent:
    """The ``Q`` steps of one round for a client with ``num_examples`` examples."""
    return dp_accounting.SelfComposedDpEvent(self.step_event(num_examples), self.local_steps)


@functools.lru_cache(maxsize=64)  # the seeds of a sweep's setting calibrate the same noise
def calibrate_example_noise(target_epsilon: float, delta: float, steps: int, num_examples: int,
                            batch_size: int, sampling: str = "fixed", accountant: str = "rdp",
                            capacity: Optional[int] = None) -> float:
  """Smallest ``z`` with epsilon <= target after ``steps`` local steps of one client.

  Uses :func:`fedjax_dp.privacy.mechanisms.calibrate` (dp_accounting's
  calibration) with the per-step event of a client holding ``num_examples``
  examples. Pass the largest number of steps any client can take (every
  round) and the smallest client to bound every client's epsilon. A process computes each
  calibration once: the result of the same arguments is remembered.

  Args:
    target_epsilon: the epsilon to meet, ``> 0``.
    delta: the target delta, in ``(0, 1)``.
    steps: the local steps composed, ``>= 1``.
    num_examples: ``|D_n|``, the client's examples.
    batch_size: ``L``, examples per step (fixed: at most ``num_examples``).
    sampling: per-step example sampling, "fixed" or "poisson".
    accountant: "rdp" or "pld" (Poisson batches need "pld").
    capacity: Poisson only: the most examples a step keeps (``K``); None: never truncated.

  Returns:
    The noise multiplier ``z`` (:func:`fedjax_dp.privacy.mechanisms.calibrate`).

  Raises:
    ConfigError: a bad argument, an accountant that cannot compose the step's event, or a
      target no noise multiplier meets.
  """
  def make_event(z):
    return ExampleDPSGDMechanism(z, batch_size, 1, sampling, capacity=capacity).step_event(num_examples)
  check_supported(make_event(1.0), accountant, RELATION, alternative=FIXED_BATCHES)
  return calibrate(make_event, int(steps), RELATION, target_epsilon, delta, accountant)


@dataclasses.dataclass(frozen=True)
class PrivacyClass:
  """A group of clients that share one mechanism.

  Attributes:
    name: e.g. "high", "low" or "all".
    client_ids: the clients of the class.
    mechanism: an :class:`ExampleDPSGDMechanism` when the class has a formal
      guarantee, else None.
    reason: why there is no formal guarantee (required when ``mechanism`` is
      None), or a note on the guarantee.
  """

  name: str
  client_ids: tuple
  mechanism: Optional[ExampleDPSGDMechanism] = None
  reason: str = ""

  def __post_init__(self):
    check(self.mechanism is not None or bool(self.reason), "reason", self.reason,
          "a class without a formal guarantee must say why")

  @property
  def formal_guarantee(self) -> bool:
    return self.mechanism is not None and self.mechanism.noise_multiplier > 0


class ExampleLevelAccounting:
  """Per-client ledgers grouped by privacy class (engine accounting interface).

  Args:
    classes: the :class:`PrivacyClass` es; every client in at most one.
    counts: ``[num_clients]`` examples per client.
    delta: the target delta of every client's guarantee.
    accountant: "rdp" or "pld".
    mechanism: the run's nominal per-step record (reported as the summary's
      noise multiplier); the per-class mechanisms do the accounting.
    attacker_knowledge: recorded in the report for runs with Byzantine clients
      (their attacks read only the uploads, which are private already).
  """

  def __init__(self, classes: Sequence[PrivacyClass], counts, delta: float,
               accountant: str = "rdp", mechanism: Optional[ExampleDPSGDMechanism] = None,
               attacker_knowledge: Optional[str] = None):
    check_open_unit("delta", delta)
    check_choice("accountant", accountant, ACCOUNTANTS)
    self.mechanism = mechanism  # the run's nominal per-step record (its noise multiplier)
    self.attacker_knowledge = attacker_knowledge
    self.classes = list(classes)
    self.counts = np.asarray(counts, np.int64)
    self.delta = float(delta)
    self.accountant = accountant
    n = len(self.counts)
    self.participation = np.zeros(n, np.int64)
    self.class_of = np.full(n, -1, np.int64)
    for i, c in enumerate(self.classes):
      ids = np.asarray(c.client_ids, np.int64)
      check(np.all(self.class_of[ids] < 0), "classes", c.name, "clients must be in one class only")
      self.class_of[ids] = i
    self.ledgers = {}
    for i, c in enumerate(self.classes):
      if c.formal_guarantee and len(c.client_ids):  # an empty class has no one to account
        smallest = int(self.counts[np.asarray(c.client_ids, np.int64)].min())
        check_supported(c.mechanism.step_event(smallest), accountant, RELATION,
                        alternative=FIXED_BATCHES)
        for cid in c.client_ids:
          self.ledgers[int(cid)] = PrivacyLedger(self.delta, accountant, c.mechanism.relation)
    self._memo: dict = {}

  def on_round(self, cohort) -> None:
    """Composes ``Q`` steps into the ledger of every client of the cohort."""
    for cid in np.asarray(cohort.real_ids, np.int64):
      cid = int(cid)
      self.participation[cid] += 1
      k = self.class_of[cid]
      if k >= 0 and cid in self.ledgers:
        mech = self.classes[k].mechanism
        self.ledgers[cid].compose(mech.step_event(self.counts[cid]), mech.local_steps)

  def state(self) -> dict:
    """Each client's participation and composed events (JSON; a checkpoint's part)."""
    return {"participation": self.participation.tolist(),
            "ledgers": {str(cid): ledger.state() for cid, ledger in self.ledgers.items()
                        if ledger.rounds}}

  def load_state(self, state: dict) -> None:
    """Restores :meth:`state`; each client's events must be the ones its class composes."""
    participation = np.asarray(state["participation"], np.int64)
    check(participation.shape == self.participation.shape, "resume", len(participation),
          f"the checkpoint's accounting has another number of clients than this run's "
          f"{len(self.participation)}")
    self.participation = participation
    for cid, runs in state["ledgers"].items():
      cid = int(cid)
      check(cid in self.ledgers, "resume", cid, "the checkpoint has a ledger for a client this "
            "run accounts without one: it was written by another configuration")
      mech = self.classes[self.class_of[cid]].mechanism
      self.ledgers[cid].load_state(runs, [mech.step_event(self.counts[cid])])

  def pending(self) -> list:
    """What the next report will ask the PLD accountant that no earlier one did (each
    ledger's :meth:`fedjax_dp.privacy.ledger.PrivacyLedger.key` not memoized yet), for
    workers to compute meanwhile (:mod:`fedjax_dp.privacy.ahead`); none with RDP, whose
    epsilons take milliseconds."""
    if self.accountant != "pld":
      return []
    return [key for key in (ledger.key() for ledger in self.ledgers.values() if ledger.rounds)
            if key not in self._memo]

  def client_epsilon(self, cid: int) -> Optional[float]:
    """Epsilon of client ``cid`` (None when its class has no formal guarantee)."""
    ledger = self.ledgers.get(int(cid))
    if ledger is None:
      return None
    if ledger.rounds == 0:
      return 0.0
    key = ledger.key()  # clients with the same composed events share their epsilon
    if key not in self._memo:
      self._memo[key] = ledger.epsilon()
    return self._memo[key]

  def report(self) -> dict:
    per_class = {}
    flat = {}
    all_formal = bool(self.classes)
    eps_all = []
    for c in self.classes:
      ids = np.asarray(c.client_ids, np.int64)
      rec = {"formal_guarantee": c.formal_guarantee, "clients": int(len(ids)),
             "clients_participated": int(np.sum(self.participation[ids] > 0)),
             "max_rounds_participated": int(self.participation[ids].max()) if len(ids) else 0}
      if c.formal_guarantee and not len(ids):
        rec.update(epsilon_max=None, epsilon_median=None,
                   note="no clients in this class: nothing to account")
      elif c.formal_guarantee:
        eps = np.array([self.client_epsilon(i) for i in ids], np.float64)
        rec.update(epsilon_max=float(eps.max()), epsilon_median=float(np.median(eps)),
                   noise_multiplier=c.mechanism.noise_multiplier,
                   grad_noise_multiplier=c.mechanism.grad_noise_multiplier,
                   step_event=repr(c.mechanism.step_event(int(self.counts[ids].min()))),
                   note=c.reason or c.mechanism.guarantee_note)
        if not math.isfinite(rec["epsilon_max"]):
          rec.update(formal_guarantee=False, epsilon_max=None, epsilon_median=None,
                     reason="epsilon is infinite")
        else:
          eps_all.append(rec["epsilon_max"])
      else:
        rec.update(epsilon_max=None, epsilon_median=None, reason=c.reason)
      all_formal = all_formal and rec["formal_guarantee"]
      per_class[c.name] = rec
      flat[f"epsilon_{c.name}_max"] = rec["epsilon_max"]
      flat[f"epsilon_{c.name}_median"] = rec["epsilon_median"]
    missing = [f"{c.name}: {per_class[c.name]['reason']}" for c in self.classes
               if not per_class[c.name]["formal_guarantee"]]
    note = (f"example-level DP, privacy unit: {PRIVACY_UNIT}; epsilon is the max over all clients of all classes"
            if all_formal else "no formal DP guarantee for " + "; ".join(missing))
    # A run with no mechanism at all (no class's, no nominal record) is not accounted: no delta
    # or accountant applies to it.
    unaccounted = self.mechanism is None and all(c.mechanism is None for c in self.classes)
    return {
        "epsilon": max(eps_all) if all_formal and eps_all else None,
        "delta": None if unaccounted else self.delta,
        "accountant": None if unaccounted else self.accountant,
        "formal_guarantee": all_formal,
        "privacy_unit": PRIVACY_UNIT,
        "neighbouring_relation": REPORTED_RELATION,
        "guarantee_note": note,
        "classes": per_class,
        **flat,
        **({} if self.attacker_knowledge is None else {"attacker_knowledge": self.attacker_knowledge}),
    }


__all__ = ["PRIVACY_UNIT", "ExampleDPSGDMechanism", "ExampleLevelAccounting", "PrivacyClass",
           "calibrate_example_noise", "split_noise_multiplier"]
