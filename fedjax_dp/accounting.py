"""Run-level privacy accounting: what the engine asks after every round.

An accounting object has ``on_round(cohort)`` and ``report() -> dict``. The
report always says which guarantee holds (``formal_guarantee``), for which
privacy unit and neighbouring relation, and gives ``epsilon`` only when a
formal guarantee exists (``None`` otherwise).
"""

from __future__ import annotations

import math

import dp_accounting

from fedjax_dp.privacy import PrivacyLedger
from fedjax_dp.privacy.ledger import check_supported


class LedgerAccounting:
  """One mechanism record, one ``DpEvent`` per round, composed by a :class:`PrivacyLedger`."""

  def __init__(self, mechanism, delta: float, accountant: str = "rdp"):
    self.mechanism = mechanism
    self.ledger = PrivacyLedger(delta, accountant, mechanism.relation)
    self._event = mechanism.round_event()
    check_supported(self._event, accountant, mechanism.relation)

  def on_round(self, cohort) -> None:
    del cohort  # the event of a sampled round does not depend on the draw
    self.ledger.compose(self._event)

  def report(self) -> dict:
    formal = (bool(self.mechanism.formal_guarantee)
              and not isinstance(self._event, dp_accounting.NonPrivateDpEvent))
    eps = self.ledger.epsilon() if formal else None
    if eps is not None and not math.isfinite(eps):
      eps, formal = None, False
    return {
        "epsilon": eps,
        "delta": self.ledger.delta,
        "accountant": self.ledger.accountant,
        "formal_guarantee": formal,
        "privacy_unit": self.mechanism.privacy_unit,
        "neighbouring_relation": self.mechanism.relation,
        "guarantee_note": self.mechanism.guarantee_note,
        "dp_event": repr(self._event),
    }
