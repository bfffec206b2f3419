"""Lower bounds on epsilon from the error rates of a test between two neighbouring inputs.

An auditor sees releases of a mechanism on two neighbouring inputs (worlds 0
and 1) and guesses the world. Every test's false positive rate ``FPR`` and
false negative rate ``FNR`` satisfy, for an (epsilon, delta)-DP mechanism,
``FPR e^eps + delta >= 1 - FNR`` (and the same with the rates swapped); an
f-DP mechanism has ``FNR >= f(FPR)`` for its trade-off function ``f`` (Dong,
Roth and Su, "Gaussian Differential Privacy", JRSS-B 2022). Rates measured on
``n`` releases get Clopper-Pearson upper bounds (:func:`clopper_pearson_upper`),
so every bound here holds with the stated confidence.

Two kinds of bound:

* :func:`threshold_epsilon`: the (epsilon, delta) bound from one test's error
  rates. It assumes nothing about the mechanism, but sees only the events the
  trials can resolve: with ``n`` releases no rate below about ``3/n`` is
  bounded, and epsilon at delta = 1e-5 is set by rarer events.
* :class:`Family`: the mechanism's release along the canary's direction is
  assumed to belong to a one-parameter family whose trade-off curves are
  nested (more signal, lower curve): a Gaussian whose mean the canary moves by
  ``mu`` noise standard deviations, present with probability ``p`` (Poisson
  or fixed-size sampling) and, for replace-one, moved by ``-mu`` in world 0;
  or randomized response over ``count`` coordinates (:class:`SignFamily`).
  From one test's bounded error rates :meth:`Family.signal_lower` solves
  ``f_mu(FPR_u) = FNR_u`` for the smallest signal ``mu`` consistent with them,
  and :meth:`Family.epsilon` gives that family member's exact epsilon. This is
  the approach of Nasr et al. ("Tight Auditing of Differentially Private
  Machine Learning", USENIX Security 2023), which fits mu-GDP; here the family
  is the mechanism's own (sampling included), known to the auditor. The bound
  holds when the assumption does: a release outside the family (a broken
  clip, a wrong sampling rate) usually shows as a signal no member explains,
  reported as an infinite bound.

One run instead of many (:func:`one_run_p_value`, :func:`one_run_epsilon`): ``m`` canaries,
each included independently with probability 1/2, in one run of the mechanism, and an auditor
who guesses which of them were included (Steinke, Nasr and Jagielski, "Privacy Auditing with One
(1) Training Run", NeurIPS 2023). Its bound assumes nothing about the mechanism either.

Epsilon of a family member comes from dp_accounting's privacy loss
distributions with optimistic rounding (an estimate from below), except for
replace-one under sampling (a mixture against a mixture), which dp_accounting
does not build: its exact hockey-stick divergence is :func:`mixture_delta`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy.optimize import brentq
from scipy.special import ndtr
from scipy.stats import beta, binom, norm

from fedjax_dp.errors import check

# The largest signal (noise standard deviations) a family is searched over: past it every
# family's trade-off curve is its limit to within float64.
MAX_SIGNAL = 40.0
# Halvings of a bisection: its bracket, at most 2 (MAX_SIGNAL + mu) wide, shrinks below 1e-14.
BISECTIONS = 56
# dp_accounting's discretization of the privacy loss: with optimistic rounding a coarser one still
# estimates epsilon from below, by at most about this much less.
PLD_INTERVAL = 1e-3


def clopper_pearson_upper(errors, n: int, alpha: float) -> np.ndarray:
  """One-sided upper confidence bound, level ``1 - alpha``, on a rate of ``errors`` in ``n``.

  Args:
    errors: error counts (array-like of integers in ``[0, n]``).
    n: the number of trials each count is out of.
    alpha: the probability that the bound is below the true rate.

  Returns:
    ``u`` with ``P[Binomial(n, u) <= errors] = alpha`` (1 where ``errors = n``).
  """
  k = np.asarray(errors, np.float64)
  safe = np.minimum(k, n - 1)
  return np.where(k >= n, 1.0, beta.ppf(1.0 - alpha, safe + 1.0, n - safe))


def error_rates(thresholds, s0: np.ndarray, s1: np.ndarray, alpha: float) -> tuple:
  """The errors of the tests "world 1 iff s > t", one per threshold ``t``.

  Args:
    thresholds: the thresholds ``t`` (array-like).
    s0, s1: the statistic of each release of worlds 0 and 1, each sorted ascending.
    alpha: each rate bound's one-sided error probability.

  Returns:
    ``(fp, fn, fpr_u, fnr_u)``: the false positives among ``s0``, the false negatives among
    ``s1`` and their rates' Clopper-Pearson upper bounds (:func:`clopper_pearson_upper`).
  """
  fp = len(s0) - np.searchsorted(s0, thresholds, side="right")
  fn = np.searchsorted(s1, thresholds, side="right")
  return (fp, fn, clopper_pearson_upper(fp, len(s0), alpha),
          clopper_pearson_upper(fn, len(s1), alpha))


def threshold_epsilon(fpr_u, fnr_u, delta: float) -> np.ndarray:
  """The (epsilon, delta) lower bound of tests with error rates at most ``fpr_u``, ``fnr_u``.

  ``max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u))``, elementwise;
  ``-inf`` where no test beats guessing.

  Args:
    fpr_u: upper bounds on the tests' false positive rates (array-like).
    fnr_u: upper bounds on their false negative rates (array-like, broadcast with ``fpr_u``).
    delta: the delta at which epsilon is bounded.

  Returns:
    The lower bounds on epsilon, elementwise (float64).
  """
  fpr_u, fnr_u = np.asarray(fpr_u, np.float64), np.asarray(fnr_u, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    a = np.log(np.maximum(1.0 - delta - fnr_u, 0.0) / fpr_u)
    b = np.log(np.maximum(1.0 - delta - fpr_u, 0.0) / fnr_u)
  return np.maximum(a, b)


def mixture_delta(epsilon: float, p: float, mu: float) -> float:
  """Exact delta(epsilon) of ``P1 = (1-p) N(0,1) + p N(mu,1)`` against
  ``P0 = (1-p) N(0,1) + p N(-mu,1)``.

  The pair is symmetric under ``s -> -s`` and its likelihood ratio ``L`` is increasing in ``s``,
  so the hockey-stick divergence is ``P1(s > s*) - e^eps P0(s > s*)`` with ``L(s*) = e^eps``.

  Args:
    epsilon: the epsilon at which delta is computed.
    p: the probability that the canary is present, in (0, 1).
    mu: the canary's shift, in noise standard deviations.

  Returns:
    delta(epsilon), at least 0.
  """
  def log_ratio(s):
    a = np.logaddexp(math.log1p(-p) + norm.logpdf(s), math.log(p) + norm.logpdf(s - mu))
    b = np.logaddexp(math.log1p(-p) + norm.logpdf(s), math.log(p) + norm.logpdf(s + mu))
    return a - b

  if epsilon >= log_ratio(MAX_SIGNAL):  # the set where P1 > e^eps P0 lies past MAX_SIGNAL sd
    return 0.0
  s = brentq(lambda x: log_ratio(x) - epsilon, -MAX_SIGNAL, MAX_SIGNAL, xtol=1e-12)
  tail1 = (1 - p) * norm.sf(s) + p * norm.sf(s - mu)
  tail0 = (1 - p) * norm.sf(s) + p * norm.sf(s + mu)
  return max(0.0, float(tail1 - math.exp(epsilon) * tail0))


@dataclasses.dataclass(frozen=True)
class Family:
  """A Gaussian release moved by the canary: world 1 ``(1-p) N(0,1) + p N(mu,1)``; world 0
  ``N(0,1)`` (add/remove) or ``(1-p) N(0,1) + p N(-mu,1)`` (``replace``).

  Attributes:
    p: the probability that the canary is in the release (the sampling rate; 1 for none).
    replace: replace-one (the canary against its anti-canary) rather than add/remove.
  """

  p: float = 1.0
  replace: bool = False

  def describe(self) -> str:
    """The assumption, in words."""
    moved = "moves it by +mu (world 1) or -mu (world 0)" if self.replace else \
        "moves it by mu in world 1 only"
    present = "" if self.p == 1 else f", present with probability {self.p:g}"
    return (f"the release along the canary's direction is Gaussian; the canary {moved} noise "
            f"standard deviations{present}")

  def errors(self, mu: float, t):
    """``(FPR, FNR)`` of the test "world 1 iff s > t" (``t`` in noise standard deviations)."""
    t = np.asarray(t, np.float64)
    shift0 = -mu if self.replace else 0.0
    fpr = (1 - self.p) * ndtr(-t) + self.p * ndtr(shift0 - t)
    fnr = (1 - self.p) * ndtr(t) + self.p * ndtr(t - mu)
    return fpr, fnr

  def tradeoff(self, mu, fpr):
    """``f_mu(fpr)``: the least FNR of a test with false positive rate ``fpr`` (the threshold
    test is the likelihood-ratio test: the ratio is increasing in ``s``), elementwise.

    The threshold with ``FPR(t) = fpr`` is found by bisection (FPR decreases in ``t``).
    """
    mu, fpr = np.broadcast_arrays(np.asarray(mu, np.float64), np.asarray(fpr, np.float64))
    lo, hi = -MAX_SIGNAL - mu, MAX_SIGNAL + mu
    for _ in range(BISECTIONS):
      mid = (lo + hi) / 2
      above = self.errors(mu, mid)[0] > fpr  # the threshold lies above mid
      lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    fnr = self.errors(mu, (lo + hi) / 2)[1]
    return np.where(fpr <= 0, 1.0, np.where(fpr >= 1, 0.0, fnr))

  def signal_lower(self, fpr_u, fnr_u):
    """The smallest ``mu >= 0`` whose trade-off curve allows a test with rates ``fpr_u``,
    ``fnr_u`` (``f_mu(fpr_u) <= fnr_u``), elementwise: 0 for rates no better than guessing,
    ``inf`` where no member of the family allows them. Bisection: ``f_mu`` decreases in ``mu``.
    """
    fpr_u, fnr_u = np.broadcast_arrays(np.asarray(fpr_u, np.float64),
                                       np.asarray(fnr_u, np.float64))
    lo, hi = np.zeros(fpr_u.shape), np.full(fpr_u.shape, MAX_SIGNAL)
    for _ in range(BISECTIONS):
      mid = (lo + hi) / 2
      allowed = self.tradeoff(mid, fpr_u) <= fnr_u  # mid is consistent: the least lies below
      lo, hi = np.where(allowed, lo, mid), np.where(allowed, mid, hi)
    out = np.where(fnr_u >= 1.0 - fpr_u, 0.0, hi)
    out = np.where(self.tradeoff(MAX_SIGNAL, fpr_u) > fnr_u, math.inf, out)
    return out if out.ndim else float(out)

  def epsilon(self, mu: float, delta: float) -> float:
    """Epsilon at ``delta`` of the family member with signal ``mu`` (0 for 0, inf for inf)."""
    if mu <= 0:
      return 0.0
    if not math.isfinite(mu):
      return math.inf
    return _gaussian_epsilon(self.p, self.replace, round(mu, 9), delta)


@functools.lru_cache(maxsize=256)
def _gaussian_epsilon(p: float, replace: bool, mu: float, delta: float) -> float:
  if replace and p < 1:
    if mixture_delta(0.0, p, mu) <= delta:
      return 0.0
    hi = 1.0
    while mixture_delta(hi, p, mu) > delta:
      hi *= 2
    return float(brentq(lambda e: mixture_delta(e, p, mu) - delta, 0.0, hi, xtol=1e-9))
  # Replace-one without sampling is the Gaussian mechanism with sensitivity 2 (means -mu, +mu).
  loss = pld.from_gaussian_mechanism(
      1.0 / mu, sensitivity=2.0 if replace else 1.0, sampling_prob=p, pessimistic_estimate=False,
      use_connect_dots=False, value_discretization_interval=PLD_INTERVAL)
  return float(loss.get_epsilon_for_delta(delta))


@dataclasses.dataclass(frozen=True)
class SignFamily:
  """Randomized response on ``count`` signs: each kept with probability ``keep`` (unknown),
  flipped otherwise, independently.

  The statistic is the number of flips among all coordinates of all evaluated releases; the
  upper confidence bound on the flip rate gives the least keep probability, and
  :meth:`epsilon` that member's epsilon.
  """

  count: int

  def describe(self) -> str:
    """The assumption, in words."""
    return (f"each of the {self.count} released signs is the true sign kept with one unknown "
            "probability, independently")

  def epsilon(self, keep: float, delta: float) -> float:
    """Epsilon at ``delta`` of ``count`` composed responses with keep probability ``keep``."""
    if keep <= 0.5:
      return 0.0
    if keep >= 1.0:
      return math.inf
    one = pld.from_randomized_response(2.0 * (1.0 - keep), 2, pessimistic_estimate=False,
                                       value_discretization_interval=PLD_INTERVAL)
    return float(one.self_compose(self.count).get_epsilon_for_delta(delta))


def family_bound(s0: np.ndarray, s1: np.ndarray, family: Family, delta: float,
                 confidence: float) -> dict:
  """The family's bound from statistics ``s0``, ``s1`` (one per release, world 1 higher).

  The first half of each world chooses the threshold (among 64 levels of the false positive
  rate) whose rates, bounded as on the second half, give the largest signal; the second half
  bounds that one test's rates (each one-sided at ``(1 - confidence) / 2``).

  Args:
    s0, s1: the test statistic of each release of worlds 0 and 1.
    family: the assumed :class:`Family`.
    delta: the delta of the epsilon reported.
    confidence: the joint confidence of the two rate bounds.

  Returns:
    ``{epsilon_lower_bound, signal_lower_bound, assumption, test}``.
  """
  h = len(s0) // 2
  alpha = (1.0 - confidence) / 2
  sel0, sel1, ev0, ev1 = np.sort(s0[:h]), np.sort(s1[:h]), np.sort(s0[h:]), np.sort(s1[h:])

  levels = np.geomspace(max(3.0 / h, 1e-6), 0.5, 64)
  candidates = np.unique(np.quantile(sel0, 1.0 - levels))
  _, _, fpr_u, fnr_u = error_rates(candidates, sel0, sel1, alpha)
  t = float(candidates[int(np.argmax(family.signal_lower(fpr_u, fnr_u)))])
  fp, fn, fpr_u, fnr_u = (float(x[0]) for x in error_rates(np.array([t]), ev0, ev1, alpha))
  mu = float(family.signal_lower(fpr_u, fnr_u))
  return {"epsilon_lower_bound": family.epsilon(mu, delta), "signal_lower_bound": mu,
          "assumption": family.describe(),
          "test": {"threshold": t, "false_positives": int(fp), "false_negatives": int(fn),
                   "evaluated_per_world": [len(ev0), len(ev1)],
                   "fpr_upper": fpr_u, "fnr_upper": fnr_u}}


def sign_bound(r0: np.ndarray, r1: np.ndarray, family: SignFamily, delta: float,
               confidence: float) -> dict:
  """The sign family's bound from releases ``r0``, ``r1`` (``[trials, count]``).

  Each world's true signs are read from the first half (the sign of each coordinate's mean);
  the flips of the second half, over both worlds and all coordinates, get a Clopper-Pearson
  upper bound at level ``confidence``.

  Args:
    r0, r1: the releases of worlds 0 and 1, ``[trials, count]`` each.
    family: the assumed :class:`SignFamily`.
    delta: the delta of the epsilon reported.
    confidence: the confidence of the flip rate's bound.

  Returns:
    ``{epsilon_lower_bound, keep_prob_lower_bound, assumption, test}``.
  """
  check(r0.shape[1] == family.count, "releases", r0.shape, f"must have {family.count} columns")
  h = len(r0) // 2
  flips, n = 0, 0
  for r in (r0, r1):
    truth = np.sign(r[:h].mean(0))
    flips += int(np.sum(np.sign(r[h:]) != truth))
    n += r[h:].size
  keep = 1.0 - float(clopper_pearson_upper(flips, n, 1.0 - confidence))
  return {"epsilon_lower_bound": family.epsilon(keep, delta), "keep_prob_lower_bound": keep,
          "assumption": family.describe(),
          "test": {"flips": flips, "evaluated_signs": n}}


def _check_guesses(m: int, r: int, v: int, delta: float) -> None:
  for name, value in (("canaries", m), ("guesses", r), ("correct", v)):
    check(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0,
          name, value, "must be an integer >= 0")
  check(r <= m, "guesses", r, f"must be at most the canaries ({m})")
  check(v <= r, "correct", v, f"must be at most the guesses ({r})")
  check(isinstance(delta, (int, float)) and 0 <= delta <= 1, "delta", delta, "must be in [0, 1]")


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
  """The probability of ``v`` or more correct guesses of ``r`` under (epsilon, delta)-DP.

  ``m`` canaries are each included in the mechanism's input independently with probability
  1/2; after one run the auditor guesses "included" or "excluded" for ``r`` of them (abstaining
  on the others). If the mechanism is (epsilon, delta)-DP under adding or removing one canary,
  the number ``W`` of correct guesses satisfies (Steinke, Nasr and Jagielski, "Privacy Auditing
  with One (1) Training Run", NeurIPS 2023, their main theorem for (epsilon, delta)-DP,
  computed as in their Appendix D)::

    P[W >= v] <= beta + alpha * delta * 2m,
    q = e^eps / (1 + e^eps),          beta = P[Binomial(r, q) >= v],
    alpha = max_{i in 1..v} (1/i) sum_{j=1..i} P[Binomial(r, q) = v - j].

  With delta = 0 this is the binomial test: the guesses are no better than ``r`` independent
  randomized responses with accuracy ``q``.

  Args:
    m: the canaries (each included with probability 1/2).
    r: the guesses made (at most ``m``).
    v: the correct guesses (at most ``r``).
    epsilon: the epsilon of the null hypothesis (>= 0).
    delta: the delta of the null hypothesis, in [0, 1].

  Returns:
    The p-value, at most 1.

  Raises:
    ConfigError: a count that is not an integer >= 0, ``r > m``, ``v > r``, epsilon below 0
      or not a number, or delta outside [0, 1].
  """
  _check_guesses(m, r, v, delta)
  check(isinstance(epsilon, (int, float)) and epsilon >= 0, "epsilon", epsilon,
        "must be a number >= 0")
  q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
  tail = float(binom.sf(v - 1, r, q))  # beta = P[Binomial(r, q) >= v]
  if delta == 0 or v == 0:
    return min(1.0, tail)
  below = np.cumsum(binom.pmf(v - np.arange(1, v + 1), r, q))  # P[v - i <= B < v], i = 1..v
  alpha = float(np.max(below / np.arange(1, v + 1)))
  return min(1.0, tail + alpha * delta * 2 * m)


# Halvings of one_run_epsilon's bisection.
ONE_RUN_BISECTIONS = 60


def one_run_epsilon(m: int, r: int, v: int, delta: float, confidence: float) -> float:
  """The largest epsilon that ``v`` correct guesses of ``r`` (``m`` canaries) reject at level
  ``1 - confidence``: a lower bound on the mechanism's epsilon at ``delta``, at ``confidence``.

  The largest epsilon with :func:`one_run_p_value` ``<= 1 - confidence``, by bisection (the
  p-value increases with epsilon); 0 when even epsilon = 0 is not rejected.

  Args:
    m: the canaries (each included with probability 1/2).
    r: the guesses made (at most ``m``).
    v: the correct guesses (at most ``r``).
    delta: the delta at which epsilon is bounded, in [0, 1].
    confidence: the probability that the bound holds, in (0, 1).

  Returns:
    The lower bound on epsilon (0 when none).

  Raises:
    ConfigError: on the bad counts or delta of :func:`one_run_p_value`, or a confidence outside
      (0, 1).
  """
  _check_guesses(m, r, v, delta)
  check(isinstance(confidence, (int, float)) and 0 < confidence < 1, "confidence", confidence,
        "must be in (0, 1)")
  level = 1.0 - confidence
  if one_run_p_value(m, r, v, 0.0, delta) > level:
    return 0.0
  lo, hi = 0.0, 1.0
  while one_run_p_value(m, r, v, hi, delta) <= level:
    lo, hi = hi, 2 * hi  # ends: as epsilon grows, q -> 1 and the p-value -> 1
  for _ in range(ONE_RUN_BISECTIONS):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) <= level else (lo, mid)
  return lo
