"""Mechanism records: what one round releases, and the ``DpEvent`` that describes it.

A mechanism record ties the runtime transforms (clip bound, noise standard
deviation) to the dp_accounting event of one round and to its neighbouring
relation, so the mechanism that runs and the mechanism that is accounted for
agree by construction.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import dp_accounting
import numpy as np
from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special, stats

from fedjax_dp.errors import ConfigError, check, check_choice, check_open_unit, check_positive
from fedjax_dp.privacy.ledger import (ACCOUNTANTS, COARSE_PLD_INTERVAL, PLD_INTERVAL,
                                      RdpCurveDpEvent, event_rdp, accounting, check_supported,
                                      make_accountant)
from fedjax_dp.sampling import check_design

RELATIONS = {"poisson": "add_remove", "fixed": "replace_one"}
# A noise multiplier above MAX_NOISE_MULTIPLIER is refused, given or calibrated: it drowns every
# update, and the accountants overflow on its square.
MAX_NOISE_MULTIPLIER = 1e6
# The user-level relations in words. Every run releases its population size N (summary.json's
# "data", the mean's public denominator q N), so add/remove is stated in its zero-out form: the
# client's slot stays and contributes nothing (Kairouz et al., ICML 2021). A zeroed client adds 0
# to a sum, as an absent one does, so the Poisson-subsampled add/remove accounting covers it.
RELATION_WORDS = {
    "add_remove": "add/remove one client's data with the population size N public (zero-out: "
                  "the client's slot stays and contributes nothing)",
    "replace_one": "replace one client (population size public)",
}


@dataclasses.dataclass(frozen=True)
class NonPrivate:
  """No privacy: the round releases the exact aggregate. Epsilon is infinite."""

  relation: str = "add_remove"
  privacy_unit: str = "none"
  formal_guarantee: bool = False
  guarantee_note: str = "non-private: no differential privacy guarantee"

  def round_event(self) -> dp_accounting.DpEvent:
    return dp_accounting.NonPrivateDpEvent()


@dataclasses.dataclass(frozen=True)
class GaussianSumMechanism:
  """User-level sampled Gaussian mechanism of DP-FedAvg (McMahan et al. 2018).

  Each sampled client's update is clipped to L2 norm ``clip``; Gaussian noise of
  standard deviation ``noise_multiplier * clip`` is added to the sum of the
  clipped updates, once per round.

  Privacy: user-level DP. With Poisson sampling (probability ``sampling_prob``
  per client per round) the relation is add/remove one client's whole data set,
  with the population size public (the zero-out form, :data:`RELATION_WORDS`):
  the sum's L2 sensitivity is ``clip`` and one round is
  ``PoissonSampledDpEvent(p, GaussianDpEvent(z))``. With fixed-size sampling
  without replacement (``cohort_size`` of ``num_clients``) the population size
  is public and the relation is replace-one client: replacing a client moves
  the sum by up to ``2 * clip``, so the event is
  ``SampledWithoutReplacementDpEvent(N, M, GaussianDpEvent(z / 2))``. With ``byzantine``
  clients among the ``N`` (the last ids), who know whenever they are sampled, the ``K`` of them
  in a cohort leave ``M - K`` places to a uniform sample of the ``N - byzantine`` regular
  clients: the round is accounted as that mixture over K (:func:`byzantine_mixture`), the
  guarantee a regular client has against the Byzantine clients' knowledge. Poisson sampling
  draws each client apart, so nothing changes.
  The guarantee covers the released noisy sums; everything computed from them
  (the model, metrics on it) is post-processing. It does not cover statistics
  reported from the raw updates (pre-clip norms in the run's metrics are for
  diagnosis and are not private).
  """

  clip: float
  noise_multiplier: float
  sampling: str = "poisson"
  sampling_prob: Optional[float] = None
  num_clients: Optional[int] = None
  cohort_size: Optional[int] = None
  byzantine: int = 0
  privacy_unit: str = "client (all of one client's examples)"
  formal_guarantee: bool = True

  def __post_init__(self):
    check_positive("clip", self.clip)
    check(self.noise_multiplier is not None and self.noise_multiplier >= 0,
          "noise_multiplier", self.noise_multiplier, "must be >= 0")
    check_design(self.sampling, self.num_clients, self.sampling_prob, self.cohort_size)
    check(0 <= self.byzantine < (self.num_clients or math.inf), "byzantine", self.byzantine,
          f"must be in [0, num_clients={self.num_clients})")

  @property
  def relation(self) -> str:
    return RELATIONS[self.sampling]

  @property
  def noise_stddev(self) -> float:
    """Standard deviation of the noise added to the sum of clipped updates."""
    return self.noise_multiplier * self.clip

  @property
  def guarantee_note(self) -> str:
    if self.noise_multiplier == 0:
      return "noise_multiplier=0: clipping only, no differential privacy guarantee"
    honest = ""
    if self.byzantine and self.sampling == "fixed":
      honest = (f"; sampling accounted over the {self.num_clients - self.byzantine} regular "
                f"clients, cohorts of M - K with K of the {self.byzantine} Byzantine clients "
                "sampled (they know when they are)")
    return (f"user-level DP; neighbouring relation: {RELATION_WORDS[self.relation]}; L2 "
            f"sensitivity of the sum bounded by clip{honest}")

  def round_event(self) -> dp_accounting.DpEvent:
    if self.noise_multiplier == 0:
      return dp_accounting.NonPrivateDpEvent()
    return gaussian_round_event(self.noise_multiplier, self.sampling, self.sampling_prob,
                                self.num_clients, self.cohort_size, self.byzantine)


def user_level_mechanism(rnd, hparams: dict, sampling: str, sampling_prob=None,
                         num_clients=None, cohort_size=None):
  """The mechanism a round actually runs, derived from what its pieces declare.

  A guarantee needs both halves: a client piece that declares an L2 bound on
  every update it releases (:attr:`fedjax_dp.round.Piece.bound`) and an
  aggregator piece that adds Gaussian noise scaled to that same bound to the
  sum (:attr:`fedjax_dp.round.Piece.noise`), with uniform weights and a
  public denominator. Then the round is :class:`GaussianSumMechanism` with the
  bound and the noise multiplier read from ``hparams`` (the float32 values the
  compiled round uses, so the ledger accounts exactly the noise that runs);
  otherwise it is :class:`NonPrivate` with the reason, whatever the
  configuration says about noise or target epsilon (a median of clipped
  updates, noise on unbounded updates, a hand-built aggregator that declares
  nothing, a server rule reading the clients' per-client values, and so on).

  Args:
    rnd: the :class:`fedjax_dp.round.Round` that runs (its client and aggregator pieces, hooks
      and weighting are read).
    hparams: the round's hyperparameters by name (float32 values); the client's ``bound`` name,
      ``"noise_multiplier"`` and optionally ``"byzantine"`` are read.
    sampling: "poisson" or "fixed".
    sampling_prob: Poisson only: each client's probability per round.
    num_clients: ``N``, the population (fixed-size sampling).
    cohort_size: ``M``, clients per round (fixed-size sampling).

  Returns:
    A :class:`GaussianSumMechanism`, or :class:`NonPrivate` with the reason in its
    ``guarantee_note``.

  Raises:
    ConfigError: the sampling description is invalid (as :class:`GaussianSumMechanism`).
  """
  bound = getattr(rnd.client, "bound", None)
  noise = getattr(rnd.aggregator, "noise", None)
  name = getattr(rnd.aggregator, "name", "") or "aggregate"
  what = f"the {name} of the cohort's {'clipped ' if bound else ''}updates"
  if noise is None:
    return NonPrivate(guarantee_note=f"{what} is released without noise: no differential privacy "
                                     "guarantee")
  if bound is None or noise != bound:
    return NonPrivate(guarantee_note="noise is added but it is not scaled to an L2 bound the clients' "
                                     "released updates satisfy: unbounded sensitivity, no guarantee")
  if rnd.hooks.server_rule is not None:
    return NonPrivate(guarantee_note="a server rule computes the server's state from the "
                                     "clients' per-client values (aux), which no noise covers: no "
                                     "guarantee")
  if rnd.weighting != "uniform":
    return NonPrivate(guarantee_note="clients are weighted by their example counts: the sum's "
                                     "sensitivity is not the clip bound, no guarantee")
  if not getattr(rnd.aggregator, "public_denominator", False) and sampling == "poisson":
    return NonPrivate(guarantee_note="the realized cohort size divides the noisy sum: an unnoised "
                                     "statistic of the Poisson draw is released, no guarantee")
  return GaussianSumMechanism(float(hparams[bound]), float(hparams["noise_multiplier"]), sampling,
                              sampling_prob, num_clients, cohort_size,
                              int(hparams.get("byzantine", 0)))


def byzantine_mixture(num_clients: int, cohort_size: int, byzantine: int,
                      cohort_rdp: Callable[[int], np.ndarray]) -> np.ndarray:
  """The RDP curve of one fixed-size cohort round when ``b`` of the ``N`` clients are Byzantine.

  The Byzantine clients (the last ids) know when they are sampled, so they know ``K``, how many
  of the cohort's ``M`` places they hold: ``K`` is hypergeometric (``M`` drawn from ``N``, ``b``
  of them Byzantine), drawn apart from every client's data, and given ``K = k`` the cohort's
  regular clients are a uniform sample of ``M - k`` of the ``N - b`` regular ones, whose round
  has the RDP curve ``cohort_rdp(M - k)`` (no regular client, ``k = M``: zero). What the
  Byzantine clients see is the pair (K, the round's output); as K's law is the same on
  neighbouring data sets, the pair's Renyi divergence of order ``a`` is exactly

    1/(a - 1) log sum_k P(K = k) exp((a - 1) D_a(output | K = k)),

  and each ``D_a`` is at most ``cohort_rdp(M - k)``, which bounds the round's RDP. Rounds compose
  by adding curves (the attackers' updates may depend on earlier rounds' outputs, adaptive
  composition; an attack that reads this round's regular updates voids the guarantee,
  :data:`fedjax_dp.attacks.OMNISCIENT_REASON`). ``cohort_rdp`` returns the curve at
  dp_accounting's ``DEFAULT_RDP_ORDERS``; it is called once per ``k`` of K's support.

  Args:
    num_clients: ``N``, the population, Byzantine clients included.
    cohort_size: ``M``, clients per round.
    byzantine: ``b``, the Byzantine clients among the ``N``, in ``[0, N)``.
    cohort_rdp: the RDP curve (at ``DEFAULT_RDP_ORDERS``) of a round whose cohort holds the
      given number ``m >= 1`` of regular clients, sampled uniformly from the ``N - b``.

  Returns:
    float64 array, the round's RDP at ``DEFAULT_RDP_ORDERS``.
  """
  orders = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, np.float64)
  ks = np.arange(max(0, cohort_size - (num_clients - byzantine)), min(cohort_size, byzantine) + 1)
  # In logs: a tail probability below float64's smallest still weighs its term.
  log_p = stats.hypergeom(num_clients, byzantine, cohort_size).logpmf(ks)
  curves = np.array([cohort_rdp(cohort_size - k) if k < cohort_size else np.zeros_like(orders)
                     for k in ks])
  return special.logsumexp(log_p[:, None] + (orders - 1) * curves, axis=0) / (orders - 1)


def gaussian_round_event(z: float, sampling: str, sampling_prob=None, num_clients=None,
                         cohort_size=None, byzantine: int = 0) -> dp_accounting.DpEvent:
  """One round's event for a sum of clipped updates with noise multiplier ``z`` (fixed-size
  cohorts with Byzantine clients: over the regular clients, :func:`byzantine_mixture`).

  Poisson: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (add/remove, sensitivity ``S``);
  fixed: ``SampledWithoutReplacementDpEvent(N, M, GaussianDpEvent(z / 2))`` (replace-one,
  sensitivity ``2S``).

  Args:
    z: the noise multiplier, the noise's standard deviation over the clip bound ``S``.
    sampling: "poisson" or "fixed".
    sampling_prob: Poisson only: each client's probability per round.
    num_clients: fixed only: ``N``, the population.
    cohort_size: fixed only: ``M``, clients per round.
    byzantine: fixed only: the Byzantine clients among the ``N`` (0: none).

  Returns:
    The round's ``DpEvent`` (an :class:`~fedjax_dp.privacy.ledger.RdpCurveDpEvent` with
    Byzantine clients).
  """
  if sampling == "poisson":
    return dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(z))
  # Replace-one sensitivity of a sum of updates clipped to S is 2S.
  noise = dp_accounting.GaussianDpEvent(z / 2.0)
  if not byzantine:
    return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, cohort_size, noise)
  regular = num_clients - byzantine

  # A sampled round is a mixture of outputs whose divergence is 0 (the client not sampled) or the
  # Gaussian's, so its RDP is at most the Gaussian's; dp_accounting's bound near m = n is above.
  def cohort_rdp(m):
    return np.minimum(
        event_rdp(dp_accounting.SampledWithoutReplacementDpEvent(regular, m, noise),
                  "replace_one"), event_rdp(noise, "replace_one"))
  return RdpCurveDpEvent(
      f"SampledWithoutReplacementDpEvent({regular} regular clients, M - K, {noise}) with "
      f"K ~ Hypergeometric(N={num_clients}, byzantine={byzantine}, M={cohort_size}) known to "
      "the Byzantine clients (mechanisms.byzantine_mixture)",
      tuple(float(v) for v in byzantine_mixture(num_clients, cohort_size, byzantine, cohort_rdp)))


@dataclasses.dataclass(frozen=True)
class _Search:
  """The search of :func:`calibrate` for one event, count, relation and target.

  :meth:`meets` tells whether a noise multiplier meets the target with the accountant's PLD
  discretisation ``interval``; :meth:`search` and :meth:`exact_from` find the smallest one.
  """

  make_event: Callable[[float], dp_accounting.DpEvent]
  count: int
  relation: str
  target_epsilon: float
  delta: float
  accountant: str
  floor: float  # the smallest multiplier probed
  tol: float = 1e-4

  def composed(self, z):
    return dp_accounting.SelfComposedDpEvent(self.make_event(z), self.count)

  def fresh(self, interval):
    return lambda: make_accountant(self.accountant, self.relation, interval)

  def meets(self, z, interval) -> bool:
    acc = self.fresh(interval)()
    acc.compose(self.composed(z))
    return acc.get_epsilon(self.delta) <= self.target_epsilon

  def bracketed(self, bracket, interval) -> float:
    return float(dp_accounting.calibrate_dp_mechanism(
        self.fresh(interval), self.composed, self.target_epsilon, self.delta, bracket,
        tol=self.tol))

  def search(self, guess, interval) -> float:
    """The search on the PLD grid ``interval``, bracketed by halving (or doubling) ``guess``."""
    calib = dp_accounting.mechanism_calibration
    if not self.meets(guess, interval):
      return self.bracketed(calib.LowerEndpointAndGuess(guess, 2 * guess), interval)
    hi, lo = guess, guess / 2
    while lo > self.floor and self.meets(lo, interval):
      hi, lo = lo, lo / 2
    lo = max(lo, self.floor)
    if self.meets(lo, interval):
      return float(lo)
    return self.bracketed(calib.ExplicitBracketInterval(lo, hi), interval)

  def exact_from(self, z) -> float:
    """The coarse grid's answer ``z`` made the ledger grid's: bracketed by steps from ``z`` that
    double, then bisected (brentq would evaluate the bracket's ends again, a second each)."""
    step, floor = self.tol, self.floor
    meets = lambda v: self.meets(v, PLD_INTERVAL)
    if meets(z):
      hi, lo = z, z - step
      while lo > floor and meets(lo):
        hi, step = lo, 2 * step
        lo = hi - step
      if lo <= floor:
        if meets(floor):
          return floor
        lo, step = floor, hi - floor
    else:
      lo, hi = z, z + step
      while not meets(hi):
        lo, step = hi, 2 * step
        hi = lo + step
    while step > self.tol:  # lo fails, hi meets, step apart
      step /= 2
      if meets(lo + step):
        hi = lo + step
      else:
        lo = lo + step
    return float(hi)


def calibrate(make_event: Callable[[float], dp_accounting.DpEvent], count: int, relation: str,
              target_epsilon: float, delta: float, accountant: str = "rdp",
              coarse_first: bool = True) -> float:
  """Smallest noise multiplier ``z`` whose event, self-composed ``count`` times, meets (epsilon, delta).

  Uses ``dp_accounting.calibrate_dp_mechanism`` (a bracketed search over the accountant's own
  epsilon); the result is within about ``1e-4`` of the minimum and never below it (the returned
  value meets the target, by the same accountant the ledger uses). The bracket is found by
  halving from 1 (or doubling), never probing below ``1e-3`` with RDP or ``0.1`` with PLD, whose
  discretised distribution at a tiny multiplier would need tens of GiB; if even that floor meets
  the target, the floor is returned (it meets the target; smaller values are not searched).

  With PLD the search runs first on a grid of privacy losses 10 times coarser than the ledger's
  (:data:`~fedjax_dp.privacy.ledger.COARSE_PLD_INTERVAL`), whose evaluations are cheaper;
  its answer is then checked on the ledger's grid, and moved there by steps that double and a
  bisection when the two grids disagree by more than ``1e-4``: two exact evaluations instead of
  a dozen in the common case. Whatever the coarse search finds, the result meets the target on
  the ledger's grid, and ``1e-4`` less does not.

  Args:
    make_event: ``z -> DpEvent`` of one round (or one step).
    count: how many times the event is composed.
    relation: "add_remove" or "replace_one".
    target_epsilon, delta: the target guarantee.
    accountant: "rdp" or "pld"; it must support the event (checked first).
    coarse_first: with PLD, search the coarse grid first (False: the ledger's grid alone,
      ``benchmarks/calibration_speed.py``'s baseline).

  Returns:
    The noise multiplier, at most :data:`MAX_NOISE_MULTIPLIER`.

  Raises:
    ConfigError: a bad argument, an accountant without the event, or a target that no noise
      multiplier up to :data:`MAX_NOISE_MULTIPLIER` meets.
  """
  check_positive("target_epsilon", target_epsilon)
  check(math.isfinite(target_epsilon), "target_epsilon", target_epsilon, "must be a finite number")
  check_open_unit("delta", delta)
  check(int(count) >= 1, "rounds", count, "must be >= 1")
  check_choice("accountant", accountant, ACCOUNTANTS)
  check_supported(make_event(1.0), accountant, relation)
  s = _Search(make_event, int(count), relation, target_epsilon, delta, accountant,
              floor=1e-3 if accountant == "rdp" else 0.1)
  try:
    with accounting(accountant):
      if accountant == "pld" and coarse_first:
        z = s.exact_from(s.search(1.0, COARSE_PLD_INTERVAL))
      else:
        z = s.search(1.0, PLD_INTERVAL)
  except ConfigError:
    raise
  except (ValueError, RuntimeError, NoBracketIntervalFoundError) as e:  # the target cannot be met
    raise ConfigError("target_epsilon", target_epsilon,
                      f"no noise multiplier meets it with delta={delta}, {count} compositions ({e})")
  check(z <= MAX_NOISE_MULTIPLIER, "target_epsilon", target_epsilon,
        f"needs noise multiplier {z:.3g} over {count} compositions at delta={delta}, above "
        f"{MAX_NOISE_MULTIPLIER:g} (it drowns every update): a larger target or fewer rounds")
  # The compiled round holds the multiplier in float32 (rounded to nearest), and the ledger
  # accounts that value: it must meet the target too. At extreme targets the accountant's
  # epsilon jumps between nearby multipliers, and a float32 below the search's answer can miss
  # the target by far; then the float32 above it is returned if it meets it, else the target is
  # refused. One rounded up adds noise, as the search's answer does (checked no further).
  nearest = float(np.float32(z))
  above = float(np.nextafter(np.float32(z), np.float32(np.inf)))
  with accounting(accountant):
    if nearest < z and not s.meets(nearest, PLD_INTERVAL):
      check(s.meets(above, PLD_INTERVAL), "target_epsilon", target_epsilon,
            f"cannot be certified by the {accountant} accountant at delta={delta} over {count} "
            f"compositions: it meets it at noise multiplier {z:.10g} but not at {nearest:.10g} "
            f"or {above:.10g}, the float32 values next to it that the round computes with")
      return above
  return z


@dataclasses.dataclass(frozen=True)
class CohortSampling:
  """How each round's cohort is drawn, as :class:`GaussianSumMechanism` accounts for it.

  The fields are :class:`GaussianSumMechanism`'s of the same names (``poisson``: each client
  with probability ``sampling_prob``; ``fixed``: ``cohort_size`` of ``num_clients``, of whom
  ``byzantine`` are Byzantine); ``GaussianSumMechanism(clip, z, **dataclasses.asdict(s))`` is
  the mechanism with this sampling.
  """

  sampling: str = "poisson"
  sampling_prob: Optional[float] = None
  num_clients: Optional[int] = None
  cohort_size: Optional[int] = None
  byzantine: int = 0


@functools.lru_cache(maxsize=4096)  # runs of one setting (seeds, methods) share the search
def calibrate_noise_multiplier(target_epsilon: float, delta: float, rounds: int,
                               cohorts: CohortSampling, accountant: str = "rdp") -> float:
  """Smallest noise multiplier of :class:`GaussianSumMechanism` meeting (epsilon, delta) after
  ``rounds``.

  Args:
    target_epsilon: the target epsilon, ``> 0``.
    delta: the target delta, in ``(0, 1)``.
    rounds: the rounds composed.
    cohorts: how each round's cohort is drawn (:class:`CohortSampling`; checked first, as the
      mechanism checks it).
    accountant: "rdp" or "pld".

  Returns:
    The noise multiplier (:func:`calibrate`).

  Raises:
    ConfigError: a bad sampling description, or as :func:`calibrate`.
  """
  fields = dataclasses.asdict(cohorts)
  GaussianSumMechanism(1.0, 1.0, **fields)  # validates the sampling description
  return calibrate(lambda z: gaussian_round_event(z, **fields), rounds,
                   RELATIONS[cohorts.sampling], target_epsilon, delta, accountant)
