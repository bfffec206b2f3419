"""Run-level privacy accounting: what the engine asks after every round.

An accounting object has ``on_round(cohort)`` and ``report() -> dict``. The
report always says which guarantee holds (``formal_guarantee``), for which
privacy unit and neighbouring relation, and gives ``epsilon`` only when a
formal guarantee exists (``None`` otherwise).
"""

from __future__ import annotations

import math
from typing import Optional

import dp_accounting

from fedjax_dp.attacks import OMNISCIENT_REASON
from fedjax_dp.privacy.ledger import PrivacyLedger, check_accountable, check_supported


class LedgerAccounting:
  """One mechanism record, one ``DpEvent`` per round, composed by a :class:`PrivacyLedger`.

  ``attacker_knowledge`` (runs with Byzantine clients) is recorded in the
  report; "omniscient" voids the guarantee (the attackers' messages depend
  on honest raw state, see :data:`fedjax_dp.attacks.OMNISCIENT_REASON`).
  """

  def __init__(self, mechanism, delta: float, accountant: str = "rdp",
               attacker_knowledge: Optional[str] = None):
    self.mechanism = mechanism
    self.attacker_knowledge = attacker_knowledge
    self.ledger = PrivacyLedger(delta, accountant, mechanism.relation)
    self._event = mechanism.round_event()
    check_supported(self._event, accountant, mechanism.relation)
    check_accountable(self._event, accountant, mechanism.relation)

  def on_round(self, cohort) -> None:
    del cohort  # the event of a sampled round does not depend on the draw
    self.ledger.compose(self._event)

  def state(self) -> dict:
    """The composed events (JSON; a checkpoint's part, :meth:`load_state` restores it)."""
    return {"ledger": self.ledger.state()}

  def load_state(self, state: dict) -> None:
    self.ledger.load_state(state["ledger"], [self._event])

  def _accountable(self) -> bool:
    """Whether the mechanism claims a formal guarantee for an event the accountant composes."""
    return (bool(self.mechanism.formal_guarantee)
            and not isinstance(self._event, dp_accounting.NonPrivateDpEvent))

  def upcoming(self, rounds: int) -> list:
    """What the reports after the next ``rounds`` rounds will ask the PLD accountant
    (:mod:`fedjax_dp.privacy.ahead`); none when they give no epsilon or the accountant is RDP,
    whose epsilon takes milliseconds."""
    if (self.ledger.accountant != "pld" or not self._accountable()
        or self.attacker_knowledge == "omniscient"):
      return []
    return self.ledger.upcoming(self._event, rounds)

  def report(self) -> dict:
    formal = self._accountable()
    note = self.mechanism.guarantee_note
    if formal and self.attacker_knowledge == "omniscient":
      formal, note = False, OMNISCIENT_REASON
    eps = self.ledger.epsilon() if formal else None
    if eps is not None and not math.isfinite(eps):
      eps, formal = None, False
    extra = {} if self.attacker_knowledge is None else {"attacker_knowledge": self.attacker_knowledge}
    # A release with no mechanism is not accounted: no delta, accountant or neighbouring
    # relation applies to it.
    unaccounted = isinstance(self._event, dp_accounting.NonPrivateDpEvent)
    return {
        "epsilon": eps,
        "delta": None if unaccounted else self.ledger.delta,
        "accountant": None if unaccounted else self.ledger.accountant,
        "formal_guarantee": formal,
        "privacy_unit": self.mechanism.privacy_unit,
        "neighbouring_relation": None if unaccounted else self.mechanism.relation,
        "guarantee_note": note,
        "dp_event": repr(self._event),
        **extra,
    }
