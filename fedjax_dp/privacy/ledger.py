"""Host-side privacy ledger: composes each round's ``DpEvent`` with dp_accounting.

No accounting math lives here: the ledger only records events and asks
Google's ``dp_accounting`` (RDP by default, PLD on request) for epsilon.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import Optional

import numpy as np

import dp_accounting
from dp_accounting import pld, rdp

from fedjax_dp.errors import check_choice, check_open_unit

ACCOUNTANTS = ("rdp", "pld")


@contextlib.contextmanager
def quiet_accounting():
  """Silences dp_accounting's per-order convergence warnings.

  The RDP accountant logs (via absl) every fractional order whose series does
  not converge and then excludes that order, which only makes its epsilon
  larger (still a valid bound). The warnings carry no action for the user.
  """
  log = logging.getLogger("absl")
  level = log.level
  log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    log.setLevel(level)

_RELATIONS = {
    "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
}


def make_accountant(accountant: str = "rdp", relation: str = "add_remove"):
  """A fresh dp_accounting accountant for ``relation`` ("add_remove" or "replace_one")."""
  check_choice("accountant", accountant, ACCOUNTANTS)
  check_choice("neighbouring relation", relation, tuple(_RELATIONS))
  rel = _RELATIONS[relation]
  if accountant == "rdp":
    return rdp.RdpAccountant(neighboring_relation=rel)
  return pld.PLDAccountant(neighboring_relation=rel)


def epsilon_for(event: dp_accounting.DpEvent, count: int, delta: float,
                accountant: str = "rdp", relation: str = "add_remove") -> float:
  """Epsilon at ``delta`` of ``event`` self-composed ``count`` times."""
  acc = make_accountant(accountant, relation)
  with quiet_accounting():
    acc.compose(event, int(count))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def _event_rdp(event: dp_accounting.DpEvent, relation: str) -> np.ndarray:
  """The RDP curve (at ``DEFAULT_RDP_ORDERS``) of one ``event``, computed by dp_accounting once.

  RDP composes by addition, so a ledger of many rounds adds ``count`` times
  this curve instead of asking the accountant to recompute the event's curve
  every time epsilon is reported (for a Poisson-sampled Gaussian that costs
  about 0.17 s; per round, it dominated short simulations). The curve is read
  from a fresh ``RdpAccountant`` that composed the event once.
  """
  acc = make_accountant("rdp", relation)
  with quiet_accounting():
    acc.compose(event)
  return np.array(acc._rdp)  # pylint: disable=protected-access


class PrivacyLedger:
  """Composes one ``DpEvent`` per round and reports epsilon at a fixed delta.

  Rounds with the same event are run-length encoded. With the RDP accountant
  each distinct event's RDP curve is computed once (:func:`_event_rdp`) and
  epsilon comes from ``rdp_privacy_accountant.compute_epsilon`` on the summed
  curve, so reporting epsilon after every round stays cheap; with PLD the
  composed event is handed to a fresh accountant each time.

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

  def compose(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
    if self._runs and self._runs[-1][0] == event:
      self._runs[-1][1] += count
    else:
      self._runs.append([event, count])

  @property
  def rounds(self) -> int:
    return sum(c for _, c in self._runs)

  def event(self) -> dp_accounting.DpEvent:
    """The composed event of every round so far."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(e, c) for e, c in self._runs])

  def epsilon(self, delta: Optional[float] = None) -> float:
    """Epsilon of all rounds so far (``inf`` for a non-private event, 0 before any round)."""
    if not self._runs:
      return 0.0
    target = self.delta if delta is None else delta
    if self.accountant == "rdp":
      curve = sum(c * _event_rdp(e, self.relation) for e, c in self._runs)
      eps = float(rdp.rdp_privacy_accountant.compute_epsilon(
          rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, curve, target)[0])
    else:
      acc = make_accountant(self.accountant, self.relation)
      with quiet_accounting():
        acc.compose(self.event())
        eps = float(acc.get_epsilon(target))
    return eps if math.isfinite(eps) else math.inf
