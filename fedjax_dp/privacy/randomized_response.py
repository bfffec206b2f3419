"""Binary randomized response: its DpEvent and the exact privacy profile of its composition.

Binary randomized response keeps its one-bit input with probability ``gamma``
(the keep probability, ``1/2 <= gamma <= 1``) and flips it otherwise. One
response is ``(eps0, 0)``-DP with ``eps0 = ln(gamma / (1 - gamma))``
(:func:`epsilon_of_keep_prob`, inverted by :func:`keep_prob_for_epsilon`). In
dp_accounting, ``RandomizedResponseDpEvent(noise_parameter=p, num_buckets=2)``
outputs a uniform bucket with probability ``p``, so the keep probability is
``1 - p/2``: ``p = 2 (1 - gamma)`` (:func:`randomized_response_event`).

``count`` composed responses have the exact privacy profile
``delta(epsilon) = E[(1 - exp(epsilon - L))_+]`` with the privacy loss
``L = eps0 (2J - count)``, ``J ~ Binomial(count, gamma)``
(:func:`randomized_response_delta_exact`, inverted by
:func:`randomized_response_epsilon_exact`). It is tight: randomized response
is symmetric, and its k-fold composition is the worst case for k
``eps0``-DP mechanisms (Kairouz, Oh and Viswanath, ICML 2015, Thm. 3.3); a
binary ``eps0``-DP mechanism is dominated by randomized response with the
same ``eps0`` (ibid., Thm. 2.2). The sign mechanisms of
:mod:`fedjax_dp.privacy.sign` use the exact value to check dp_accounting's
composed epsilon (never in its place).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np

from fedjax_dp.errors import check


def keep_prob_for_epsilon(epsilon: float) -> float:
  """The keep probability of binary randomized response that is ``(epsilon, 0)``-DP: gamma with
  ``ln(gamma / (1 - gamma)) = epsilon``, i.e. ``1 / (1 + exp(-epsilon))`` (Sign-Flipping's
  ``keep_prob`` for a per-coordinate, per-round epsilon; Zhu and Ling 2022, Theorem 1).

  Args:
    epsilon: the epsilon of one response, ``> 0``.

  Returns:
    gamma, in ``(0.5, 1]`` (1.0 once ``exp(-epsilon)`` rounds to 0).

  Raises:
    ConfigError: ``epsilon`` is None or not ``> 0``.
  """
  check(epsilon is not None and epsilon > 0, "epsilon", epsilon, "must be > 0")
  return 1.0 / (1.0 + math.exp(-epsilon))


def epsilon_of_keep_prob(keep_prob: float) -> float:
  """Epsilon of one binary randomized response, ``ln(gamma / (1 - gamma))``.

  Sign-Flipping's per-coordinate per-round epsilon (Zhu and Ling 2022, Theorem 1); the inverse
  of :func:`keep_prob_for_epsilon`.

  Args:
    keep_prob: gamma, in ``[0.5, 1]``.

  Returns:
    The epsilon (0 at gamma 0.5, ``inf`` at gamma 1: no privacy).

  Raises:
    ConfigError: ``keep_prob`` is None or outside ``[0.5, 1]``.
  """
  check(keep_prob is not None and 0.5 <= keep_prob <= 1, "keep_prob", keep_prob, "must be in [0.5, 1]")
  return math.inf if keep_prob == 1 else math.log(keep_prob / (1.0 - keep_prob))


def randomized_response_event(keep_prob: float) -> dp_accounting.DpEvent:
  """Binary randomized response keeping the input with probability ``keep_prob``."""
  return dp_accounting.RandomizedResponseDpEvent(noise_parameter=2.0 * (1.0 - keep_prob), num_buckets=2)


# The exact profile tabulates every response count within 60 sd of the mean; a composition
# whose window holds more than this many (about 10^13 responses at keep_prob 0.7) is not
# tabulated (10^7 coordinates x 10^4 rounds need 1.7e7).
MAX_EXACT_TABLE = 20_000_000


def _window(keep_prob: float, count: int) -> tuple:
  g, k = float(keep_prob), int(count)
  sd = math.sqrt(k * g * (1 - g))
  return (max(k // 2 + 1, int(math.floor(k * g - 60.0 * sd - 60))),
          min(k, int(math.ceil(k * g + 60.0 * sd + 60))))


def exact_tabulable(keep_prob: float, count: int) -> bool:
  """Whether the exact profile of ``count`` responses fits :data:`MAX_EXACT_TABLE` entries.

  Never beyond 2**53 responses, where float64 (the window's bounds and the table's counts)
  no longer holds every integer: there the window's float bounds collapse to one point."""
  if int(count) > 2 ** 53:
    return False
  j_lo, j_hi = _window(keep_prob, count)
  return j_hi - j_lo + 1 <= MAX_EXACT_TABLE


def _rr_loss_table(keep_prob: float, count: int):
  """``(P[J=j], L_j)`` for the responses j with positive loss within 60 sd of the mean.

  Outside that window the binomial mass is below 1e-700 (negligible in float64).
  """
  from scipy.stats import binom
  check(exact_tabulable(keep_prob, count), "count", count, f"must leave at most "
        f"{MAX_EXACT_TABLE:,} response counts within 60 sd of the mean to tabulate")
  g, k = float(keep_prob), int(count)
  eps0 = math.log(g / (1.0 - g))
  j_lo, j_hi = _window(g, k)
  j = np.arange(j_lo, j_hi + 1, dtype=np.float64)
  return binom.logpmf(j, k, g), eps0 * (2.0 * j - k)


def _rr_delta(epsilon: float, table) -> float:
  logp, loss = table
  sel = loss > epsilon
  return float(np.sum(np.exp(logp[sel]) - np.exp(logp[sel] + epsilon - loss[sel])))


def randomized_response_delta_exact(epsilon: float, keep_prob: float, count: int) -> float:
  """Exact delta(epsilon) of ``count`` composed binary randomized responses.

  The privacy loss of one response is ``+-eps0`` (``eps0 = ln(gamma/(1-gamma))``);
  under the first input ``J ~ Binomial(count, gamma)`` responses are kept and the
  loss is ``L = eps0 (2J - count)``. The hockey-stick divergence is
  ``delta(epsilon) = E[(1 - exp(epsilon - L))_+]`` (tight: randomized response
  is symmetric, and its k-fold composition is the worst case for k ``eps0``-DP
  mechanisms; Kairouz, Oh and Viswanath 2015, Thm. 3.3).

  Args:
    epsilon: the epsilon at which delta is read, ``>= 0``.
    keep_prob: ``gamma``, each response's keep probability, in ``(1/2, 1)``.
    count: the number of composed responses, ``>= 1``.

  Returns:
    ``delta(epsilon)``.

  Raises:
    ConfigError: ``keep_prob`` is outside ``(1/2, 1)``, or the composition is too long to
      tabulate (:func:`exact_tabulable`).
  """
  check(0.5 < keep_prob < 1, "keep_prob", keep_prob, "must be in (0.5, 1)")
  return _rr_delta(epsilon, _rr_loss_table(keep_prob, count))


def randomized_response_epsilon_exact(keep_prob: float, count: int, delta: float) -> float:
  """Smallest epsilon with ``delta(epsilon) <= delta`` for ``count`` composed randomized responses.

  A check on dp_accounting's composed value (never used in its place). Found by Brent's
  method on :func:`randomized_response_delta_exact`'s profile between 0 and ``count eps0``
  (relative tolerance 1e-10).

  Args:
    keep_prob: ``gamma``, each response's keep probability, in ``(1/2, 1)``.
    count: the number of composed responses, ``>= 1``.
    delta: the target delta, in ``(0, 1)``.

  Returns:
    Epsilon (0 when ``delta(0) <= delta``).

  Raises:
    ConfigError: ``keep_prob`` is outside ``(1/2, 1)``, or the composition is too long to
      tabulate (:func:`exact_tabulable`).
  """
  from scipy.optimize import brentq
  check(0.5 < keep_prob < 1, "keep_prob", keep_prob, "must be in (0.5, 1)")
  table = _rr_loss_table(keep_prob, count)
  if _rr_delta(0.0, table) <= delta:
    return 0.0
  hi = int(count) * epsilon_of_keep_prob(keep_prob)
  return float(brentq(lambda e: _rr_delta(e, table) - delta, 0.0, hi, xtol=1e-10 * max(1.0, hi)))
