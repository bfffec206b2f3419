"""Privacy of DP-RSA's sign mechanisms (Zhu and Ling, IJCAI 2022, Theorems 1 and 2).

What is protected: everything worker k sends to the (honest-but-curious)
master, i.e. the perturbed signs ``F/G(sign(x_0 - x_k))`` of every round. The
privacy unit is the worker's whole local data set, under the replace-one
relation (the data set is replaced by any other); the population and the
participation schedule are public. No amplification by sampling is claimed.
The worker's local model ``x_k`` is never released.

* Sign-Flipping (Eq. 8) is binary randomized response on each coordinate of
  ``sign(u)``: ``(eps0, 0)``-DP per coordinate per round with
  ``eps0 = ln(gamma / (1 - gamma))`` (Theorem 1), for any ``u``. One round
  releases ``d`` coordinates, a run ``T`` rounds: ``d * T`` adaptively
  composed randomized responses. In dp_accounting,
  ``RandomizedResponseDpEvent(noise_parameter=p, num_buckets=2)`` outputs a
  uniform bucket with probability ``p``, so the keep probability is
  ``1 - p/2``: ``p = 2 (1 - gamma)``.
* Sign-Gaussian (Eq. 9) ``sign(u + e)`` has a guarantee only with a bounded
  difference. With ``|u_i| <= c`` (``norm="linf"`` clip) each coordinate's
  output is ``(eps0, 0)``-DP with ``eps0 = ln(Phi(c/sigma) / Phi(-c/sigma))``
  (the flip probability is ``Phi(-|u_i|/sigma)``, Eq. 10); a binary ``eps0``-DP
  mechanism is dominated by randomized response with the same ``eps0``
  (Kairouz, Oh and Viswanath, ICML 2015, Thm. 2.2), so the composition is
  accounted as randomized response with ``gamma = Phi(c/sigma)``. With
  ``||u||_2 <= C`` (``norm="l2"``) the release is post-processing of a Gaussian
  mechanism of L2 sensitivity ``2C`` (replace-one): ``GaussianDpEvent(sigma /
  (2C))`` per round. Without a clip, the paper's Theorem 2 needs ``sigma``
  large relative to ``max_i |u_i|``, a data-dependent quantity: such runs are
  flagged ``formal_guarantee: false`` and get no epsilon.

Accounting uses dp_accounting's RDP accountant. Its PLD accountant (0.6.0)
composes a ``SelfComposedDpEvent`` of a ``RandomizedResponseDpEvent`` only
once, ignoring the count, so it is refused here; the composed epsilon is
checked against the exact privacy profile of composed randomized response
(:func:`fedjax_dp.privacy.randomized_response.randomized_response_epsilon_exact`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import dp_accounting

from fedjax_dp.errors import ConfigError, check, check_choice, check_open_unit
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.ledger import epsilon_for
from fedjax_dp.privacy.randomized_response import (epsilon_of_keep_prob, exact_tabulable,
                                                   keep_prob_for_epsilon,
                                                   randomized_response_epsilon_exact,
                                                   randomized_response_event)
from fedjax_dp.transforms.sign import NORMS

PRIVACY_UNIT = "worker (all of one worker's local data)"


def _check_rdp(accountant: str) -> None:
  check(accountant == "rdp", "accountant", accountant,
        "must be 'rdp' for the sign mechanisms: dp_accounting's PLD accountant composes a "
        "SelfComposedDpEvent of a RandomizedResponseDpEvent only once, ignoring the count")


def sign_gaussian_sigma_for_epsilon(epsilon: float, clip: float) -> float:
  """Sign-Gaussian's noise for a per-coordinate epsilon: sigma with
  ``ln(Phi(c/sigma) / Phi(-c/sigma)) = epsilon`` for the per-coordinate (``norm="linf"``) clip
  ``c``, i.e. ``c / Phi^-1(gamma)`` with gamma :func:`keep_prob_for_epsilon` (Zhu and Ling 2022,
  Eq. 10: the worst-case flip probability is ``Phi(-c/sigma)``).

  Args:
    epsilon: the per-coordinate, per-round epsilon, ``> 0``.
    clip: ``c``, the bound on each coordinate of ``u``, ``> 0``.

  Returns:
    sigma (a float).

  Raises:
    ConfigError: ``epsilon`` or ``clip`` is not ``> 0``.
  """
  from scipy.stats import norm
  check(clip is not None and clip > 0, "sign_clip", clip, "must be > 0")
  return float(clip / norm.ppf(keep_prob_for_epsilon(epsilon)))


@dataclasses.dataclass(frozen=True)
class SignFlipMechanism:
  """Sign-Flipping of DP-RSA: randomized response on each of ``dimension`` signs per round.

  Privacy: ``(ln(gamma/(1-gamma)), 0)``-DP per coordinate per round (Zhu and
  Ling 2022, Theorem 1), worker-level, replace-one. Per round the d
  coordinates compose (``SelfComposedDpEvent(RR, d)``); the run composes T
  rounds. Holds for any model difference: no clipping needed.

  Attributes:
    keep_prob: gamma, in ``[0.5, 1]`` (1: signs sent exactly, no guarantee).
    dimension: ``d``, the coordinates one message holds (the model's parameters), ``>= 1``.
    relation: the neighbouring relation, "replace_one".
    privacy_unit: what is protected, a worker's whole local data set.

  Raises:
    ConfigError: ``keep_prob`` outside ``[0.5, 1]`` or ``dimension < 1``, when made.
  """

  keep_prob: float
  dimension: int
  relation: str = "replace_one"
  privacy_unit: str = PRIVACY_UNIT

  def __post_init__(self):
    epsilon_of_keep_prob(self.keep_prob)
    check(int(self.dimension) >= 1, "dimension", self.dimension, "must be >= 1")

  @property
  def formal_guarantee(self) -> bool:
    return self.keep_prob < 1

  @property
  def coordinate_keep_prob(self) -> float:
    return self.keep_prob

  @property
  def epsilon_per_coordinate_round(self) -> Optional[float]:
    return epsilon_of_keep_prob(self.keep_prob)

  @property
  def guarantee_note(self) -> str:
    if not self.formal_guarantee:
      return "keep_prob=1: signs sent exactly, no differential privacy guarantee"
    return (f"worker-level DP (replace one worker's data set); ({self.epsilon_per_coordinate_round:.4g}, 0)-DP "
            f"per coordinate per round (Zhu and Ling 2022, Thm. 1); epsilon composes d={self.dimension} "
            "coordinates x rounds as randomized response")

  def round_event(self) -> dp_accounting.DpEvent:
    if not self.formal_guarantee:
      return dp_accounting.NonPrivateDpEvent()
    if self.keep_prob == 0.5:
      return dp_accounting.NoOpDpEvent()
    return dp_accounting.SelfComposedDpEvent(randomized_response_event(self.keep_prob), int(self.dimension))


@dataclasses.dataclass(frozen=True)
class SignGaussianMechanism:
  """Sign-Gaussian of DP-RSA, ``sign(clip(u) + N(0, sigma^2 I))``.

  Privacy (worker-level, replace-one): with ``clip`` and ``norm="linf"``,
  ``(ln(Phi(c/sigma)/Phi(-c/sigma)), 0)``-DP per coordinate per round, composed
  as the dominating randomized response; with ``norm="l2"``, a Gaussian
  mechanism of sensitivity ``2 clip`` per round (sign is post-processing).
  Without ``clip``: no formal guarantee (the paper's Theorem 2 condition on
  ``sigma`` versus ``max_i |u_i|`` is data dependent).

  Attributes:
    sigma: the noise standard deviation, ``> 0``.
    dimension: ``d``, the coordinates one message holds, ``>= 1``.
    clip: the bound on ``u`` (None: no clip, no formal guarantee), ``> 0``.
    norm: "linf" (``clip`` bounds each coordinate) or "l2" (``clip`` bounds ``||u||_2``).
    relation: the neighbouring relation, "replace_one".
    privacy_unit: what is protected, a worker's whole local data set.

  Raises:
    ConfigError: a ``sigma``, ``dimension``, ``clip`` or ``norm`` out of range, when made.
  """

  sigma: float
  dimension: int
  clip: Optional[float] = None
  norm: str = "linf"
  relation: str = "replace_one"
  privacy_unit: str = PRIVACY_UNIT

  def __post_init__(self):
    check(self.sigma is not None and self.sigma > 0, "sign_sigma", self.sigma, "must be > 0")
    check(int(self.dimension) >= 1, "dimension", self.dimension, "must be >= 1")
    check(self.clip is None or self.clip > 0, "sign_clip", self.clip, "must be > 0 or unset")
    check_choice("sign_clip_norm", self.norm, NORMS)

  @property
  def formal_guarantee(self) -> bool:
    return self.clip is not None

  @property
  def coordinate_keep_prob(self) -> Optional[float]:
    """Worst-case keep probability Phi(c/sigma) of one coordinate (linf clip only)."""
    if self.clip is None or self.norm != "linf":
      return None
    from scipy.stats import norm
    return float(norm.cdf(self.clip / self.sigma))

  @property
  def epsilon_per_coordinate_round(self) -> Optional[float]:
    g = self.coordinate_keep_prob
    if g is None:
      return None
    from scipy.stats import norm
    r = self.clip / self.sigma
    return float(norm.logcdf(r) - norm.logcdf(-r))

  @property
  def guarantee_note(self) -> str:
    if self.clip is None:
      return ("no formal guarantee: Sign-Gaussian without a clip of the model difference (the paper's "
              "Theorem 2 condition on sigma versus max_i |x_0 - x_k|_i is data dependent)")
    if self.norm == "linf":
      return (f"worker-level DP (replace one worker's data set); coordinates clipped to [-{self.clip:g}, "
              f"{self.clip:g}]: ({self.epsilon_per_coordinate_round:.4g}, 0)-DP per coordinate per round, "
              f"composed over d={self.dimension} coordinates x rounds as the dominating randomized response")
    return (f"worker-level DP (replace one worker's data set); difference clipped to L2 norm {self.clip:g}: "
            f"Gaussian mechanism with noise multiplier sigma/(2 clip)={self.sigma / (2 * self.clip):.4g} "
            "per round; sign is post-processing")

  def round_event(self) -> dp_accounting.DpEvent:
    if self.clip is None:
      return dp_accounting.NonPrivateDpEvent()
    if self.norm == "l2":
      return dp_accounting.GaussianDpEvent(self.sigma / (2.0 * self.clip))
    return dp_accounting.SelfComposedDpEvent(randomized_response_event(self.coordinate_keep_prob),
                                             int(self.dimension))


def composed_epsilon(mechanism, rounds: int, delta: float) -> dict:
  """Whole-run epsilon of ``rounds`` rounds of a sign mechanism, through dp_accounting (RDP).

  Args:
    mechanism: a :class:`SignFlipMechanism` or :class:`SignGaussianMechanism`.
    rounds: ``T``, the rounds composed, ``>= 1``.
    delta: the target delta, in ``(0, 1)``.

  Returns:
    A JSON-ready dict with ``epsilon`` (dp_accounting; None without a formal guarantee),
    ``epsilon_per_coordinate_round``, the run's settings (``rounds``, ``dimension``,
    ``delta``, ``accountant``, ``neighbouring_relation``, ``formal_guarantee``,
    ``guarantee_note``, ``dp_event``) and, for randomized-response mechanisms,
    ``epsilon_exact`` (the exact value of the composed randomized response,
    :func:`checked_against_exact`; None when too long to tabulate) and
    ``epsilon_basic_composition`` (``d T eps0``, pure DP).

  Raises:
    ConfigError: ``rounds < 1`` or ``delta`` outside ``(0, 1)``; or dp_accounting's epsilon
      is below the exact value (an accountant that mishandled the composition), which would
      be a false claim.
  """
  check(int(rounds) >= 1, "rounds", rounds, "must be >= 1")
  check_open_unit("delta", delta)
  out = {"epsilon_per_coordinate_round": mechanism.epsilon_per_coordinate_round,
         "rounds": int(rounds), "dimension": int(mechanism.dimension), "delta": delta,
         "accountant": "rdp", "neighbouring_relation": mechanism.relation,
         "formal_guarantee": bool(mechanism.formal_guarantee),
         "guarantee_note": mechanism.guarantee_note, "dp_event": repr(mechanism.round_event())}
  if not mechanism.formal_guarantee:
    out["epsilon"] = None
    return out
  eps = epsilon_for(mechanism.round_event(), int(rounds), delta, "rdp", mechanism.relation)
  out["epsilon"] = eps
  g = mechanism.coordinate_keep_prob
  if g is not None and 0.5 < g < 1:
    count = int(rounds) * int(mechanism.dimension)
    out["epsilon_exact"] = checked_against_exact(eps, g, count, delta, "rdp")
    out["epsilon_basic_composition"] = count * mechanism.epsilon_per_coordinate_round
  return out


def checked_against_exact(eps: float, keep_prob: float, count: int, delta: float,
                          accountant: str) -> Optional[float]:
  """The exact epsilon of ``count`` composed randomized responses at ``delta``, refusing a
  composed ``eps`` below it (an accountant that mishandled the composition, which would be a
  false claim); None, unchecked, when the composition is too long to tabulate
  (:func:`fedjax_dp.privacy.randomized_response.exact_tabulable`).

  Args:
    eps: the accountant's composed epsilon.
    keep_prob: ``gamma``, each response's keep probability, in ``(1/2, 1)``.
    count: the number of composed responses (coordinates times rounds).
    delta: the target delta, in ``(0, 1)``.
    accountant: the accountant's name, which the error names.

  Returns:
    The exact epsilon, or None when not tabulated.

  Raises:
    ConfigError: ``eps`` is below the exact epsilon by more than a relative ``1e-6``.
  """
  if not exact_tabulable(keep_prob, count):
    return None
  exact = randomized_response_epsilon_exact(keep_prob, count, delta)
  if eps < exact * (1 - 1e-6):
    raise ConfigError("accountant", accountant,
                      f"composed epsilon {eps} is below the exact value {exact} of {count} composed "
                      "randomized responses: the accountant mishandled the composition")
  return exact


class SignAccounting:
  """Run accounting for DP-RSA: the ledger's epsilon plus the per-coordinate epsilon.

  Wraps :class:`fedjax_dp.privacy.accounting.LedgerAccounting` (RDP only); on the last
  round (``rounds``) it also reports the exact composed value, ``epsilon_exact``, the field
  :func:`composed_epsilon` (``fedjax-dp privacy``) gives it, checked against the ledger's.
  """

  def __init__(self, mechanism, delta: float, rounds: int, accountant: str = "rdp",
               attacker_knowledge: Optional[str] = None):
    if mechanism.formal_guarantee:
      _check_rdp(accountant)
    self.mechanism = mechanism
    self.rounds = int(rounds)
    self._inner = LedgerAccounting(mechanism, delta, accountant, attacker_knowledge)
    self.ledger = self._inner.ledger

  def on_round(self, cohort) -> None:
    self._inner.on_round(cohort)

  def state(self) -> dict:
    return self._inner.state()

  def load_state(self, state: dict) -> None:
    self._inner.load_state(state)

  def report(self) -> dict:
    rep = self._inner.report()
    rep["epsilon_per_coordinate_round"] = self.mechanism.epsilon_per_coordinate_round
    g = self.mechanism.coordinate_keep_prob
    done = self.ledger.rounds
    if (rep["formal_guarantee"] and done == self.rounds and g is not None and 0.5 < g < 1):
      rep["epsilon_exact"] = checked_against_exact(
          rep["epsilon"], g, done * int(self.mechanism.dimension), self.ledger.delta,
          self.ledger.accountant)
    return rep
