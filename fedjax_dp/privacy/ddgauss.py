"""Privacy of the distributed discrete Gaussian (DDGauss; Kairouz, Liu and Steinke, ICML 2021).

One round: each of the ``M`` clients of a fixed-size cohort clips its update
to L2 norm ``c``, rotates it (randomized Hadamard, public key), scales it by
``s`` (the paper's ``1/gamma``), rounds it conditionally to an integer
vector of L2 norm at most ``B`` (:func:`rounded_l2_bound`) and adds
N_Z(0, sigma^2) to every coordinate; the server sees only the sum modulo
``2^bits`` (secure aggregation), from which it decodes the sum.

Privacy unit and relation: one client's whole data set, replace-one (the
population ``N`` and the cohort size ``M`` are public), the cohort a uniform
subset of ``M`` of the ``N`` clients each round. Replacing a client changes
its rounded vector and nothing else (every client's noise and the others'
vectors are independent of its data), so the integer sum moves by ``Delta``
with ``||Delta||_2 <= 2B`` and, being an integer vector,
``||Delta||_1 <= ||Delta||_2 min(sqrt(d), ||Delta||_2)``; the sum carries
``n`` independent discrete Gaussian shares (``n = M``; with Byzantine clients, which may send
anything, ``n = M - K`` for the ``K`` of them in the cohort). Per round the RDP of the sum is
:func:`ddgauss_rdp` (the paper's Theorem 1 / Proposition 14); the
subsampling of the cohort amplifies it by :func:`subsampled_rdp` (Wang,
Balle and Kasiviswanathan, AISTATS 2019, Theorem 9: sampling without
replacement, replace-one, any mechanism), with Byzantine clients as a mixture over ``K``
(:func:`fedjax_dp.privacy.mechanisms.byzantine_mixture`); rounds compose by adding RDP
curves, converted to (epsilon, delta) by dp_accounting
(:class:`fedjax_dp.privacy.ledger.RdpCurveDpEvent`). The modular wrap-around,
the decoding and everything computed from the sum are post-processing.

What is not covered: the raw diagnostics (pre-clip norms, rounding retries,
the wrap-around fraction of the true sum); and the sampler's floating point
(:func:`fedjax_dp.transforms.discrete.discrete_gaussian` runs Canonne, Kamath
and Steinke's exact algorithm on float32 uniforms, not exact arithmetic: the
accounting treats its output as exactly discrete Gaussian, as DP libraries do
with floating-point Gaussian samplers). Poisson sampling is simulated but has
no guarantee here: under add/remove the number of noise shares changes with
the neighbour, outside the paper's bound.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from fedjax_dp.errors import ConfigError, check
from fedjax_dp.privacy.ledger import PrivacyLedger, RdpCurveDpEvent
from fedjax_dp.privacy.mechanisms import byzantine_mixture

ORDERS = tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
PRIVACY_UNIT = "client (all of one client's examples)"
# The integer orders up to the largest of ORDERS (subsampled_rdp's bound needs eps(j) at each).
_INT_ORDERS = np.arange(1, int(max(ORDERS)) + 1)


def rounded_l2_bound(norm: float, beta: float, dim: int) -> float:
  """The L2 bound ``B`` of a conditionally rounded vector (Kairouz et al. 2021, Sec. 4.1).

  For ``x`` of norm at most ``norm`` in ``R^dim``, any randomized rounding has
  norm at most ``norm + sqrt(d)``; with ``beta > 0`` it is at most
  ``sqrt(norm^2 + d/4 + sqrt(2 log(1/beta)) (norm + sqrt(d)/2))`` with
  probability at least ``1 - beta``, and conditional rounding retries until it is.
  ``B`` is the smaller of the two (``beta = 0``: the first, no retries needed).

  Args:
    norm: the L2 norm bound of ``x`` before rounding (integer units, ``>= 0``).
    beta: the conditional rounding's failure probability, in ``[0, 1)``.
    dim: ``d``, the vector's dimension.

  Returns:
    ``B``.

  Raises:
    ConfigError: ``beta`` is outside ``[0, 1)``.
  """
  check(0 <= beta < 1, "beta", beta, "must be in [0, 1)")
  plain = norm + math.sqrt(dim)
  if beta == 0:
    return plain
  conditional = math.sqrt(norm ** 2 + dim / 4 + math.sqrt(2 * math.log(1 / beta))
                          * (norm + math.sqrt(dim) / 2))
  return min(plain, conditional)


def ddgauss_rdp(orders, l2: float, l1: float, sigma: float, n: int, dim: int) -> np.ndarray:
  """RDP of the sum of ``n`` discrete Gaussians, ``D_alpha(Z + Delta || Z)``, at ``orders``.

  Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for
  Federated Learning with Secure Aggregation", ICML 2021, Theorem 1 (the RDP
  form of Proposition 14, Eq. 17): with ``Z`` the sum of ``n`` independent
  N_Z(0, sigma^2)^d vectors, ``sigma >= 1/2``, and any ``Delta`` in ``Z^d``
  with ``||Delta||_2 <= l2``, ``||Delta||_1 <= l1``, for every ``alpha >= 1``

    eps(alpha) = min( alpha l2^2 / (2 n sigma^2) + tau d,
                      alpha/2 (l2^2 / (n sigma^2) + 2 l1 tau / (sqrt(n) sigma) + tau^2 d),
                      alpha/2 (l2 / (sqrt(n) sigma) + tau sqrt(d))^2 ),
    tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)).

  ``tau`` measures how far the sum of discrete Gaussians is from one discrete
  Gaussian of variance ``n sigma^2``; as it vanishes (large ``sigma``, or
  ``n = 1``) the bound is the Gaussian mechanism's ``alpha l2^2 / (2 n sigma^2)``.

  Args:
    orders: the RDP orders ``alpha >= 1`` (array-like of floats).
    l2: the L2 sensitivity bound of ``Delta`` (integer units).
    l1: the L1 sensitivity bound of ``Delta`` (integer units).
    sigma: each share's discrete Gaussian standard deviation (integer units), ``>= 1/2``.
    n: the number of independent shares in the sum, ``>= 1``.
    dim: ``d``, the vector's dimension.

  Returns:
    float64 array of ``eps(alpha)``, shaped like ``orders``.

  Raises:
    ConfigError: ``sigma < 1/2`` or ``n < 1``.
  """
  check(sigma >= 0.5, "sigma", sigma, "must be >= 1/2 (Theorem 1's range)")
  check(int(n) >= 1, "noise shares", n, "must be >= 1")
  a = np.asarray(orders, np.float64)
  k = np.arange(1, int(n))
  tau = 10.0 * float(np.sum(np.exp(-2 * math.pi ** 2 * sigma ** 2 * k / (k + 1))))
  s = math.sqrt(n) * sigma
  return np.minimum.reduce([
      a * l2 ** 2 / (2 * s ** 2) + tau * dim,
      a / 2 * (l2 ** 2 / s ** 2 + 2 * l1 * tau / s + tau ** 2 * dim),
      a / 2 * (l2 / s + tau * math.sqrt(dim)) ** 2])


def subsampled_rdp(orders, q: float, rdp: Callable) -> np.ndarray:
  """RDP of a mechanism run on a uniformly random subset of a ``q`` fraction of the data (without
  replacement, replace-one relation), given its RDP ``rdp(integer orders) -> array``.

  Wang, Balle and Kasiviswanathan, "Subsampled Renyi Differential Privacy and
  Analytical Moments Accountant", AISTATS 2019, Theorem 9, for a mechanism
  with no finite ``eps(inf)``: at integer ``alpha >= 2``

    eps'(alpha) <= 1/(alpha-1) log(1 + q^2 C(alpha,2) min(4 (e^eps(2) - 1), 2 e^eps(2))
                                   + sum_{j=3}^alpha 2 q^j C(alpha,j) e^{(j-1) eps(j)}).

  At a fractional order the cumulant ``(alpha - 1) eps'(alpha)``, convex in
  ``alpha``, is interpolated linearly between the neighbouring integers (their
  Corollary 10; it is 0 at ``alpha = 1``). The result is the smaller of this
  and the unsubsampled ``rdp`` (both hold).

  Args:
    orders: the RDP orders, each in ``[1, max(ORDERS)]`` (array-like of floats).
    q: the sampled fraction, ``M / N`` in ``(0, 1]``; at ``q >= 1`` ``rdp(orders)`` is returned.
    rdp: the unsubsampled mechanism's RDP, a function from an array of orders to an array of
      epsilons of the same shape.

  Returns:
    float64 array of the subsampled ``eps'(alpha)``, shaped like ``orders``.
  """
  a = np.asarray(orders, np.float64)
  if q >= 1:
    return rdp(a)
  base = rdp(_INT_ORDERS)                      # eps(j) at j = 1, 2, ..., max order
  e2 = base[1]
  lo = np.floor(a).astype(int)
  hi = np.ceil(a).astype(int)
  cgf = {1: 0.0}                               # (alpha - 1) eps'(alpha) at the integers needed
  for alpha in sorted((set(lo) | set(hi)) - {1}):
    j = np.arange(3, alpha + 1)
    log_comb = special.gammaln(alpha + 1) - special.gammaln(j + 1) - special.gammaln(alpha - j + 1)
    terms = [0.0, 2 * math.log(q) + math.log(math.comb(alpha, 2))
             # log(e^e2 - 1) as e2 + log(1 - e^-e2): no overflow at a large eps(2).
             + min(math.log(4) + e2 + math.log(-math.expm1(-e2)) if e2 > 0 else -math.inf,
                   math.log(2) + e2)]
    terms += list(math.log(2) + j * math.log(q) + log_comb + (j - 1) * base[j - 1])
    cgf[alpha] = float(special.logsumexp(terms))
  t = a - lo
  interpolated = ((1 - t) * np.array([cgf[i] for i in lo]) + t * np.array([cgf[i] for i in hi])) / (a - 1)
  return np.minimum(interpolated, rdp(a))


def scale_for_bits(bits: int, clip: float, noise_multiplier: float, clients: int, dim: int,
                   k_stddevs: float, rho: float = 1.0) -> float:
  """The scale ``s`` that fits ``k_stddevs`` standard deviations of the aggregate in ``2^bits``.

  Kairouz et al. 2021, Sec. 4.4 / 5 (their ``1/gamma``): the sum's coordinates in
  the integer domain have standard deviation about
  ``sqrt(rho/d (c s M)^2 + M/4 + M sigma^2)`` (signal bound after a flattening
  rotation, rounding, noise), with ``M sigma^2 = (s z c)^2``; solving
  ``2 k_stddevs * std = 2^bits`` for ``s`` gives
  ``s = sqrt((4^bits / (4 k^2) - M/4) / (c^2 (rho M^2 / d + z^2)))``.

  Args:
    bits: secure aggregation's modulus is ``2^bits``.
    clip: ``c``, the L2 clip of each update (model units, ``> 0``).
    noise_multiplier: ``z``, the noise standard deviation of the sum over ``c``.
    clients: ``M``, the cohort size.
    dim: ``d``, the padded dimension.
    k_stddevs: ``k``, the standard deviations of the aggregate that ``2^bits`` must hold.
    rho: the flattening constant of the rotation (1: a perfectly flat rotated vector).

  Returns:
    ``s``.

  Raises:
    ConfigError: ``4^bits / (4 k^2) <= M/4``, i.e. the rounding alone overflows ``2^bits``.
  """
  room = 4.0 ** bits / (4 * k_stddevs ** 2) - clients / 4
  if room <= 0:
    raise ConfigError("bits", bits, f"too few for {clients} clients at k_stddevs={k_stddevs:g}: "
                      "the rounding alone overflows; raise bits or lower k_stddevs")
  return math.sqrt(room / (clip ** 2 * (rho * clients ** 2 / dim + noise_multiplier ** 2)))


@dataclasses.dataclass(frozen=True)
class DDGaussMechanism:
  """One DDGauss round, as the clients and the server run it, and its privacy record.

  Attributes:
    clip: ``c``, the L2 clip of each update.
    noise_multiplier: ``z``: the ``M`` noise shares sum to standard deviation
      ``z c`` in model units (the same meaning as DP-FedAvg's).
    scale: ``s``, the paper's ``1/gamma``.
    sigma: the local discrete Gaussian's standard deviation in integer units,
      ``s z c / sqrt(M)`` (the float32 value the round uses).
    beta: the conditional rounding's parameter.
    dim: ``d``, the padded (power-of-two) dimension.
    cohort_size: ``M``, clients per round (the noise is sized for ``M`` shares).
    num_clients: ``N``, the population.
    sampling: "fixed" (the guarantee) or "poisson" (simulated, no guarantee).
    byzantine: the Byzantine clients among the ``N``: a cohort holding ``K`` of them has
      ``M - K`` regular clients, sampled from the ``N - byzantine`` regular ones, and as many
      noise shares (:func:`fedjax_dp.privacy.mechanisms.byzantine_mixture`).
  """

  clip: float
  noise_multiplier: float
  scale: float
  sigma: float
  beta: float
  dim: int
  cohort_size: float
  num_clients: int
  sampling: str = "fixed"
  byzantine: int = 0
  relation: str = "replace_one"
  privacy_unit: str = PRIVACY_UNIT

  @property
  def bound(self) -> float:
    """``B``: the L2 bound of every client's rounded vector (:func:`rounded_l2_bound`)."""
    return rounded_l2_bound(self.scale * self.clip, self.beta, self.dim)

  @property
  def formal_guarantee(self) -> bool:
    return self.sampling == "fixed" and self.sigma > 0

  @property
  def guarantee_note(self) -> str:
    if self.sampling != "fixed":
      return ("no formal guarantee: DDGauss's bound (Kairouz et al. 2021, Thm. 1) is for a fixed number "
              "of noise shares; with Poisson sampling the shares change with the neighbour. Use "
              "--sampling fixed --cohort-size M")
    if self.sigma == 0:
      return "noise_multiplier=0: rounding only, no differential privacy guarantee"
    m = int(self.cohort_size)
    shares, sampled = m, "the cohort"
    if self.byzantine:
      shares, sampled = "M - K", (
          f"M - K of the {self.num_clients - self.byzantine} regular clients, K of the "
          f"{self.byzantine} Byzantine ones sampled (they know when they are; a mixture over K)")
    return (f"user-level DP; replace one client (population N={self.num_clients} and cohort "
            f"M={m} public); the integer sum has L2 sensitivity 2B={2 * self.bound:.6g} "
            f"(scale s={self.scale:.6g}) and {shares} discrete Gaussian shares of std "
            f"{self.sigma:.6g}: Kairouz et al. 2021 Thm. 1, amplified by sampling without replacement "
            f"(Wang et al. 2019, Thm. 9) of {sampled}, composed over rounds (RDP)")

  def rdp(self) -> np.ndarray:
    """The round's RDP curve at :data:`ORDERS` (:func:`ddgauss_rdp` of the cohort's shares,
    :func:`subsampled_rdp`; with Byzantine clients, :func:`byzantine_mixture` of it)."""
    l2 = 2 * self.bound
    l1 = l2 * min(math.sqrt(self.dim), l2)
    m, regular = int(self.cohort_size), self.num_clients - self.byzantine

    def cohort(shares):  # a cohort of `shares` regular clients (each adding a share)
      return subsampled_rdp(ORDERS, shares / regular,
                            lambda a: ddgauss_rdp(a, l2, l1, self.sigma, shares, self.dim))
    return byzantine_mixture(self.num_clients, m, self.byzantine, cohort) if self.byzantine else (
        cohort(m))

  def round_event(self):
    if not self.formal_guarantee:
      return dp_accounting.NonPrivateDpEvent()
    return RdpCurveDpEvent(repr(self), tuple(float(v) for v in self.rdp()))


@dataclasses.dataclass(frozen=True)
class Quantization:
  """How a DDGauss client puts its update on the integers (Kairouz et al. 2021, Sec. 4).

  Attributes:
    bits: secure aggregation sums modulo ``2^bits``.
    beta: the conditional rounding's parameter.
    scale: ``s``, the paper's ``1/gamma``; None: from ``bits`` (:func:`scale_for_bits`).
    k_stddevs: the standard deviations of the aggregate that ``2^bits`` holds when the scale
      comes from ``bits``.
  """

  bits: int
  beta: float
  scale: Optional[float] = None
  k_stddevs: float = 4.0


def mechanism_for(noise_multiplier: float, *, clip: float, quantization: Quantization, dim: int,
                  cohort_size: float, num_clients: int, sampling: str,
                  byzantine: int = 0) -> DDGaussMechanism:
  """The round's :class:`DDGaussMechanism` for noise multiplier ``z``, its numbers as float32
  (what the compiled round reads).

  The scale is ``quantization.scale``, or from its ``bits`` (:func:`scale_for_bits`), and
  ``sigma = s z c / sqrt(M)``.

  Args:
    noise_multiplier: ``z``.
    clip: ``c``.
    quantization: the bits, rounding and scale.
    dim, cohort_size, num_clients, sampling, byzantine: as :class:`DDGaussMechanism`'s.

  Returns:
    The mechanism.

  Raises:
    ConfigError: the integers would pass float32's exact range (``2^23``), or the local noise
      is outside Theorem 1's range (``sigma >= 1/2``).
  """
  f32 = lambda v: float(np.float32(v))
  q = quantization
  s = f32(q.scale if q.scale is not None else scale_for_bits(q.bits, clip, noise_multiplier,
                                                             cohort_size, dim, q.k_stddevs))
  mech = DDGaussMechanism(f32(clip), f32(noise_multiplier), s,
                          f32(s * f32(noise_multiplier) * f32(clip) / math.sqrt(f32(cohort_size))),
                          f32(q.beta), int(dim), f32(cohort_size), int(num_clients),
                          sampling, int(byzantine))
  field = "scale" if q.scale is not None else "bits"
  check(mech.bound + 64 * mech.sigma < 2 ** 23, field, q.scale if q.scale is not None else q.bits,
        f"gives integers up to {mech.bound + 64 * mech.sigma:.3g} per client, beyond float32's "
        "exact integers (2^23): lower it")
  if noise_multiplier > 0 and mech.sigma < 0.5:
    raise ConfigError("noise_multiplier", noise_multiplier,
                      f"gives a local discrete Gaussian of std {mech.sigma:.3g} < 1/2 (integer units), "
                      f"outside the range of Kairouz et al.'s Theorem 1; raise it or the {field}")
  return mech


def calibrate_noise_multiplier(target_epsilon: float, delta: float, rounds: int,
                               make: Callable[[float], DDGaussMechanism]) -> float:
  """Smallest ``z`` (to a relative 1e-4, never below it) whose ``make(z)``, composed over
  ``rounds`` by :class:`fedjax_dp.privacy.ledger.PrivacyLedger`, meets (epsilon, delta).

  A ``z`` at which ``make`` raises :class:`ConfigError` (local noise below Theorem 1's
  ``sigma >= 1/2``) counts as having no bound; the search brackets ``z`` in ``[1e-3, 1]``,
  doubling the upper end until it meets the target, and bisects geometrically.

  Args:
    target_epsilon: the epsilon to meet, ``> 0``.
    delta: the delta of the (epsilon, delta) guarantee, in ``(0, 1)``.
    rounds: the number of rounds composed.
    make: the round's :class:`DDGaussMechanism` for a noise multiplier (e.g.
      :func:`mechanism_for` with the run's other settings bound).

  Returns:
    ``z``.

  Raises:
    ConfigError: no ``z`` up to ``1e6`` meets the target.
  """
  def epsilon(z):
    try:
      mech = make(z)
    except ConfigError:  # sigma < 1/2 at this z: no bound, look higher
      return math.inf
    ledger = PrivacyLedger(delta, "rdp", mech.relation)
    ledger.compose(mech.round_event(), int(rounds))
    return ledger.epsilon()

  lo, hi = 1e-3, 1.0
  while epsilon(hi) > target_epsilon:
    lo, hi = hi, hi * 2
    if hi > 1e6:
      raise ConfigError("target_epsilon", target_epsilon,
                        f"no noise multiplier up to 1e6 meets it with delta={delta}, {rounds} rounds")
  while hi / lo > 1 + 1e-4:
    mid = math.sqrt(lo * hi)
    lo, hi = (lo, mid) if epsilon(mid) <= target_epsilon else (mid, hi)
  return hi
