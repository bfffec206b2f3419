"""Host-side privacy ledger: composes each round's ``DpEvent`` with dp_accounting.

No accounting math lives here: the ledger only records events and asks
Google's ``dp_accounting`` (RDP by default, PLD on request) for epsilon.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Optional, Sequence

import attr
import numpy as np

import dp_accounting
from dp_accounting import pld, rdp

from fedjax_dp.errors import ConfigError, check, check_choice, check_open_unit

ACCOUNTANTS = ("rdp", "pld")
# dp_accounting's default grid of privacy-loss values for the PLD accountant.
PLD_INTERVAL = 1e-4
# The grid of calibration's first search (:func:`fedjax_dp.privacy.mechanisms.calibrate`).
COARSE_PLD_INTERVAL = 1e-3


# What dp_accounting raises when a setting is beyond its arithmetic: a noise multiplier whose
# square underflows (RDP), a PLD whose discretization needs more memory than the machine has.
ACCOUNTING_FAILURES = (MemoryError, OverflowError, ZeroDivisionError)


@contextlib.contextmanager
def accounting(accountant: str):
  """Runs dp_accounting's ``accountant``: its warnings silenced, its arithmetic failures refused.

  The RDP accountant logs (via absl) every fractional order whose series does
  not converge and then excludes that order, which only makes its epsilon
  larger (still a valid bound); the warnings carry no action for the user.
  A setting dp_accounting cannot compute (:data:`ACCOUNTING_FAILURES`)
  becomes a :class:`ConfigError` naming the accountant, never a traceback.
  """
  log = logging.getLogger("absl")
  level = log.level
  log.setLevel(logging.ERROR)
  try:
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
      yield
  except ACCOUNTING_FAILURES as e:
    raise ConfigError("accountant", accountant, "dp_accounting cannot account this setting "
                      f"({type(e).__name__}: {str(e)[:100]}); fewer rounds, a larger noise "
                      "multiplier or delta, or the other accountant may") from None
  finally:
    log.setLevel(level)


_RELATIONS = {
    "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
}


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RdpCurveDpEvent(dp_accounting.DpEvent):
  """A mechanism whose RDP curve its own record computes (dp_accounting has no event for it).

  ``rdp`` holds its RDP at ``rdp_privacy_accountant.DEFAULT_RDP_ORDERS``; the
  RDP accountant of :func:`make_accountant` composes it by adding the curve, as
  dp_accounting's does for its own events, and converts with dp_accounting's
  ``compute_epsilon``. Only the RDP accountant takes it. ``mechanism`` names the record and every
  parameter the curve depends on (the event's repr; e.g. DDGauss,
  :mod:`fedjax_dp.privacy.ddgauss`, or a fixed-size cohort with Byzantine clients,
  :func:`fedjax_dp.privacy.mechanisms.byzantine_mixture`).
  """

  mechanism: str
  rdp: tuple = attr.ib(repr=False)


class RdpAccountant(rdp.RdpAccountant):
  """dp_accounting's RDP accountant, which also composes :class:`RdpCurveDpEvent` (adding its
  curve, at the default orders), so calibration and epsilon treat those events as its own."""

  def _maybe_compose(self, event, count, do_compose):
    if not isinstance(event, RdpCurveDpEvent):
      return super()._maybe_compose(event, count, do_compose)
    if len(event.rdp) != len(self._orders):
      return self.CompositionErrorDetails(event, "a curve at other orders than the accountant's")
    if do_compose:
      self._rdp += count * np.asarray(event.rdp)
    return None


def make_accountant(accountant: str = "rdp", relation: str = "add_remove",
                    pld_interval: float = PLD_INTERVAL):
  """A fresh dp_accounting accountant for ``relation`` ("add_remove" or "replace_one") (RDP:
  :class:`RdpAccountant`, which also takes :class:`RdpCurveDpEvent`).

  ``pld_interval`` is the PLD accountant's ``value_discretization_interval``:
  every epsilon the ledger reports uses dp_accounting's default,
  :data:`PLD_INTERVAL`; only calibration's first search asks for a coarser one.

  Args:
    accountant: "rdp" or "pld".
    relation: "add_remove" or "replace_one".
    pld_interval: PLD only: the privacy-loss discretisation interval, ``> 0``.

  Returns:
    An empty dp_accounting ``PrivacyAccountant``.

  Raises:
    ConfigError: an unknown accountant or relation.
  """
  check_choice("accountant", accountant, ACCOUNTANTS)
  check_choice("neighbouring relation", relation, tuple(_RELATIONS))
  rel = _RELATIONS[relation]
  if accountant == "rdp":
    return RdpAccountant(neighboring_relation=rel)
  return pld.PLDAccountant(neighboring_relation=rel, value_discretization_interval=pld_interval)


def _supports(event: dp_accounting.DpEvent, accountant: str, relation: str) -> bool:
  return make_accountant(accountant, relation).supports(event)


def check_supported(event: dp_accounting.DpEvent, accountant: str, relation: str,
                    field: str = "accountant", alternative: str = "") -> None:
  """Raises :class:`ConfigError` unless dp_accounting's ``accountant`` can compose ``event``.

  Asked of every run's round event while building, so an unsupported pair
  (PLD with fixed-size sampling, RDP with Poisson sampling under replace-one)
  is refused before anything compiles.

  Args:
    event: the mechanism's ``DpEvent`` (one round or one step).
    accountant: "rdp" or "pld".
    relation: "add_remove" or "replace_one".
    field: the configuration field the error names.
    alternative: another way out the error suggests (e.g. a setting whose event the chosen
      accountant does compose); "" for none.

  Raises:
    ConfigError: ``accountant`` cannot compose ``event`` under ``relation``; the message names
      the other accountant when it can.
  """
  if not _supports(event, accountant, relation):
    other = [a for a in ACCOUNTANTS if a != accountant and _supports(event, a, relation)]
    hint = f"use '{other[0]}'" if other else "no accountant of dp_accounting supports it"
    hint += f", {alternative}" if alternative else ""
    raise ConfigError(field, accountant,
                      f"dp_accounting's {accountant.upper()} accountant cannot compose this "
                      f"mechanism's event under the {relation} relation ({type(event).__name__}); {hint}")


def check_accountable(event: dp_accounting.DpEvent, accountant: str, relation: str) -> None:
  """Builds ``event``'s RDP curve or PLD (kept for the ledger, :func:`event_rdp`,
  :func:`_event_pld`), so a setting dp_accounting cannot compute is refused before a run
  trains, not when its first epsilon is reported.

  Args:
    event: the mechanism's ``DpEvent``.
    accountant: "rdp" or "pld".
    relation: "add_remove" or "replace_one".

  Raises:
    ConfigError: dp_accounting fails on the event (:data:`ACCOUNTING_FAILURES`).
  """
  with accounting(accountant):
    (event_rdp if accountant == "rdp" else _event_pld)(event, relation)


def epsilon_for(event: dp_accounting.DpEvent, count: int, delta: float,
                accountant: str = "rdp", relation: str = "add_remove") -> float:
  """Epsilon at ``delta`` of ``event`` self-composed ``count`` times.

  Args:
    event: one round's (or step's) ``DpEvent``.
    count: the number of compositions, ``>= 1``.
    delta: the target delta, in ``(0, 1)``.
    accountant: "rdp" or "pld".
    relation: "add_remove" or "replace_one".

  Returns:
    Epsilon (``inf`` for a non-private event).

  Raises:
    ConfigError: an unknown accountant or relation, or dp_accounting fails on the setting.
  """
  acc = make_accountant(accountant, relation)
  with accounting(accountant):
    acc.compose(event, int(count))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def event_rdp(event: dp_accounting.DpEvent, relation: str) -> np.ndarray:
  """The RDP curve (at ``DEFAULT_RDP_ORDERS``) of one ``event``, computed by dp_accounting once.

  RDP composes by addition, so a ledger of many rounds adds ``count`` times
  this curve instead of asking the accountant to recompute the event's curve
  every time epsilon is reported. The curve is read from a fresh
  :class:`RdpAccountant` that composed the event once.
  """
  acc = make_accountant("rdp", relation)
  with accounting("rdp"):
    acc.compose(event)
  return np.array(acc._rdp)  # pylint: disable=protected-access


@functools.lru_cache(maxsize=256)
def _event_pld(event: dp_accounting.DpEvent, relation: str):
  """The privacy loss distribution of one ``event``, built by dp_accounting once.

  Building a sampled Gaussian's PLD costs more than self-composing it ``k``
  times and reading epsilon, so the ledger composes the cached PLD (exactly
  what ``PLDAccountant.compose(event, k)`` computes) instead of rebuilding it
  whenever epsilon is reported.
  """
  acc = make_accountant("pld", relation)
  with accounting("pld"):
    acc.compose(event)
  if acc._contains_non_dp_event:  # pylint: disable=protected-access
    return None
  return acc._pld  # pylint: disable=protected-access


class PrivacyLedger:
  """Composes one ``DpEvent`` per round and reports epsilon at a fixed delta.

  Rounds with the same event are run-length encoded. With the RDP accountant
  each distinct event's RDP curve is computed once (:func:`event_rdp`) and
  epsilon comes from ``rdp_privacy_accountant.compute_epsilon`` on the summed
  curve; with PLD each distinct event's distribution is built once
  (:func:`_event_pld`) and self-composed, so reporting epsilon after every
  round stays cheap.

  Args:
    delta: the target delta in (0, 1).
    accountant: "rdp" (default) or "pld".
    relation: the neighbouring relation the events are stated for.
  """

  def __init__(self, delta: float, accountant: str = "rdp", relation: str = "add_remove"):
    check_open_unit("delta", delta)
    make_accountant(accountant, relation)  # validates both names
    self.delta = float(delta)
    self.accountant = accountant
    self.relation = relation
    self._runs: list[list] = []  # [event, count]
    self._last = None  # (key, epsilon) of the last epsilon reported

  def compose(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
    _extend(self._runs, event, count)

  def key(self) -> tuple:
    """The arguments of :func:`_composed_epsilon` that :meth:`epsilon` asks now."""
    return self._key(self._runs, self.delta)

  def upcoming(self, event: dp_accounting.DpEvent, rounds: int) -> list:
    """The arguments of :func:`_composed_epsilon` that :meth:`epsilon` will ask after each of
    the next ``rounds`` compositions of ``event`` (:mod:`fedjax_dp.privacy.ahead`)."""
    runs = [list(r) for r in self._runs]
    keys = []
    for _ in range(rounds):
      _extend(runs, event, 1)
      keys.append(self._key(runs, self.delta))
    return keys

  @property
  def rounds(self) -> int:
    return sum(c for _, c in self._runs)

  def state(self) -> list:
    """The composed events as ``[[repr(event), count], ...]`` (JSON; a checkpoint's part)."""
    return [[repr(e), c] for e, c in self._runs]

  def load_state(self, runs: list, events) -> None:
    """Restores :meth:`state`'s ``runs``, each event found by its repr among ``events`` (the
    events this run composes): a checkpoint of other events is refused, never reinterpreted."""
    by_repr = {repr(e): e for e in events}
    for text, _ in runs:
      check(text in by_repr, "resume", text, "the checkpoint's privacy ledger composed an event "
            f"this run does not ({sorted(by_repr)}): it was written by another configuration, or "
            "by a version of fedjax_dp that accounted this mechanism otherwise (start again "
            "with --overwrite)")
    self._runs = [[by_repr[text], int(count)] for text, count in runs]

  @classmethod
  def joint(cls, ledgers: Sequence["PrivacyLedger"]) -> "PrivacyLedger":
    """The ledger of several runs released together (e.g. the seeds of a sweep's row): every
    round of every run composed in one ledger, at their common delta, accountant and relation.

    Valid for runs on the same data set with independent randomness: the tuple of their
    outputs is the adaptive composition of all their rounds (RDP curves add; PLDs compose).
    """
    check(len(ledgers) >= 1, "ledgers", len(ledgers), "need at least one ledger to join")
    first = ledgers[0]
    for other in ledgers[1:]:
      got = (other.delta, other.accountant, other.relation)
      check(got == (first.delta, first.accountant, first.relation), "ledgers", got,
            f"must all have delta, accountant and relation "
            f"{(first.delta, first.accountant, first.relation)} to be joined")
    joint = cls(first.delta, first.accountant, first.relation)
    for ledger in ledgers:
      for event, count in ledger._runs:  # pylint: disable=protected-access
        joint.compose(event, count)
    return joint

  def event(self) -> dp_accounting.DpEvent:
    """The composed event of every round so far."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(e, c) for e, c in self._runs])

  def epsilon(self, delta: Optional[float] = None) -> float:
    """Epsilon of all rounds so far (``inf`` for a non-private event, 0 before any round)."""
    if not self._runs:
      return 0.0
    target = self.delta if delta is None else delta
    with accounting(self.accountant):
      eps = self._epsilon(target)
    return eps if math.isfinite(eps) else math.inf

  def _key(self, runs: list, target: float) -> tuple:
    return tuple((e, c) for e, c in runs), self.relation, self.accountant, target

  def _epsilon(self, target: float) -> float:
    key = self._key(self._runs, target)
    if self._last is None or self._last[0] != key:
      self._last = key, _ahead_or_composed(key)
    return self._last[1]


def _extend(runs: list, event: dp_accounting.DpEvent, count: int) -> None:
  """Appends ``count`` compositions of ``event`` to ``runs`` (run-length encoded)."""
  if runs and runs[-1][0] == event:
    runs[-1][1] += count
  else:
    runs.append([event, count])


def _ahead_or_composed(key: tuple) -> float:
  """``_composed_epsilon(*key)``, a worker's value when one computed it ahead."""
  ahead = AHEAD.get(key)
  if ahead is not None:
    try:
      return ahead.result()
    except Exception:  # pylint: disable=broad-except
      pass  # a worker that failed or was stopped: the same function computes it here
  return _composed_epsilon(*key)


# Epsilons being computed ahead by worker processes (:class:`fedjax_dp.privacy.ahead.Ahead`):
# the arguments of :func:`_composed_epsilon` -> a future of its value.
AHEAD: dict = {}


@functools.lru_cache(maxsize=1024)  # the seeds of a sweep's setting ask it in the same round
def _composed_epsilon(runs: tuple, relation: str, accountant: str, target: float) -> float:
  """Epsilon at ``target`` of ``runs`` (``(event, count)`` pairs) composed in order."""
  if accountant == "rdp":
    curve = sum(c * event_rdp(e, relation) for e, c in runs)
    return float(rdp.rdp_privacy_accountant.compute_epsilon(
        rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, curve, target)[0])
  plds = [_event_pld(e, relation) for e, _ in runs]
  if any(p is None for p in plds):
    return math.inf
  total = None
  for p, (_, c) in zip(plds, runs):
    p = p.self_compose(c) if c > 1 else p
    total = p if total is None else total.compose(p)
  return float(total.get_epsilon_for_delta(target))
