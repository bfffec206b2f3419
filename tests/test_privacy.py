"""The ledger against direct dp_accounting computations, and calibration."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp

from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import (CohortSampling, GaussianSumMechanism, NonPrivate, PrivacyLedger,
                               calibrate_noise_multiplier)
from fedjax_dp.privacy import mechanisms
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.ledger import RdpCurveDpEvent, epsilon_for


def _direct(event, count, delta, accountant):
  acc = accountant()
  acc.compose(event, count)
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("accountant,cls", [("rdp", rdp.RdpAccountant), ("pld", pld.PLDAccountant)])
def test_poisson_ledger_equals_direct(accountant, cls):
  mech = GaussianSumMechanism(clip=0.3, noise_multiplier=1.1, sampling="poisson", sampling_prob=0.04)
  ledger = PrivacyLedger(1e-5, accountant, mech.relation)
  for _ in range(50):
    ledger.compose(mech.round_event())
  event = dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(1.1))
  assert ledger.rounds == 50
  assert ledger.epsilon() == pytest.approx(_direct(event, 50, 1e-5, cls), rel=1e-9)


@pytest.mark.parametrize("accountant,cls", [("rdp", rdp.RdpAccountant), ("pld", pld.PLDAccountant)])
def test_joint_ledger_of_several_runs_composes_all_their_rounds(accountant, cls):
  """Seeds released together (a sweep row's mean): every round of every run in one ledger."""
  event = dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(1.1))
  other = dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(2.0))
  runs = [PrivacyLedger(1e-5, accountant) for _ in range(3)]
  for ledger in runs:
    ledger.compose(event, 20)
  runs[2].compose(other, 5)
  joint = PrivacyLedger.joint(runs)
  assert joint.rounds == 65 and runs[0].rounds == 20  # the runs' own ledgers are untouched
  direct = cls()
  direct.compose(event, 60)
  direct.compose(other, 5)
  assert joint.epsilon() == pytest.approx(direct.get_epsilon(1e-5), rel=1e-6)
  # tighter than basic composition (3 epsilon at 3 delta) even at one run's delta
  assert runs[0].epsilon() < joint.epsilon() < 3 * runs[2].epsilon()
  with pytest.raises(ConfigError, match="delta, accountant and relation"):
    PrivacyLedger.joint([runs[0], PrivacyLedger(1e-6, accountant)])
  with pytest.raises(ConfigError, match="ledgers"):
    PrivacyLedger.joint([])


def test_fixed_size_uses_replace_one_with_doubled_sensitivity():
  mech = GaussianSumMechanism(clip=1.0, noise_multiplier=2.0, sampling="fixed", num_clients=1000, cohort_size=50)
  assert mech.relation == "replace_one"
  acc = LedgerAccounting(mech, 1e-5)
  for _ in range(30):
    acc.on_round(None)
  event = dp_accounting.SampledWithoutReplacementDpEvent(1000, 50, dp_accounting.GaussianDpEvent(1.0))
  direct = _direct(event, 30, 1e-5, lambda: rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE))
  assert acc.report()["epsilon"] == pytest.approx(direct, rel=1e-9)


def _replace_one_rdp(n, m, z):
  """dp_accounting's RDP curve of m of n sampled without replacement, noise z on a sum of 2, at
  most the unsampled Gaussian's (both hold)."""
  def curve(event):
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(event)
    return np.array(acc._rdp)  # pylint: disable=protected-access
  gaussian = dp_accounting.GaussianDpEvent(z)
  return np.minimum(curve(dp_accounting.SampledWithoutReplacementDpEvent(n, m, gaussian)),
                    curve(gaussian))


def test_fixed_cohorts_with_byzantine_clients_are_a_mixture_over_the_byzantine_clients_sampled():
  # The Byzantine clients know how many of them, K, a cohort holds; given K = k its regular
  # clients are M - k of the N - b regular ones. N = 4, M = 2, b = 1: K is 0 or 1 with
  # probability C(3, 2) / C(4, 2) = 1/2 each, so the round's RDP at order a is
  # log(e^((a-1) r(3, 2)) / 2 + e^((a-1) r(3, 1)) / 2) / (a - 1).
  orders = np.array(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
  event = GaussianSumMechanism(1.0, 2.0, "fixed", None, 4, 2, 1).round_event()
  assert isinstance(event, RdpCurveDpEvent)
  assert "Hypergeometric(N=4, byzantine=1, M=2)" in repr(event)
  two, one = _replace_one_rdp(3, 2, 1.0), _replace_one_rdp(3, 1, 1.0)
  expected = (np.logaddexp((orders - 1) * two, (orders - 1) * one) - np.log(2)) / (orders - 1)
  np.testing.assert_allclose(event.rdp, expected, rtol=1e-12)

  def epsilon(byzantine, sampling="fixed", cohort=10, z=3.0):
    mech = GaussianSumMechanism(1.0, z, sampling, 0.1, 100, cohort, byzantine)
    led = PrivacyLedger(1e-5, relation=mech.relation)
    led.compose(mech.round_event(), 50)
    return led.epsilon(), mech
  plain, _ = epsilon(0)
  eps, mech = epsilon(50)
  # Between the worst case every round (no Byzantine client sampled: 10 of the 50 regular
  # clients) and the cohort alone (10 of 100).
  worst = epsilon_for(dp_accounting.SampledWithoutReplacementDpEvent(
      50, 10, dp_accounting.GaussianDpEvent(1.5)), 50, 1e-5, relation="replace_one")
  assert plain < eps < worst and (round(plain, 2), round(eps, 2), round(worst, 2)) == (
      5.6, 5.93, 11.84)
  assert "over the 50 regular clients, cohorts of M - K" in mech.guarantee_note
  # Cohorts of nearly every regular client (10 of 12, 5 Byzantine): each K's curve is at most the
  # unsampled Gaussian's, so the mixture is at most every round at K = 0 (7 of 7).
  led = PrivacyLedger(1e-5, relation="replace_one")
  led.compose(GaussianSumMechanism(1.0, 2.0, "fixed", None, 12, 10, 5).round_event(), 50)
  assert led.epsilon() <= epsilon_for(dp_accounting.SampledWithoutReplacementDpEvent(
      7, 7, dp_accounting.GaussianDpEvent(1.0)), 50, 1e-5, relation="replace_one") + 1e-9
  # 95 of 100 Byzantine with cohorts of 10: at least 5 Byzantine clients in every cohort, and a
  # guarantee for the 5 regular ones (a cohort of only Byzantine clients releases nothing of
  # them), below the worst case of all 5 in every cohort.
  many, _ = epsilon(95)
  assert plain < many < epsilon_for(dp_accounting.SampledWithoutReplacementDpEvent(
      5, 5, dp_accounting.GaussianDpEvent(1.5)), 50, 1e-5, relation="replace_one")
  assert epsilon(50, "poisson")[0] == epsilon(0, "poisson")[0]  # each client drawn apart
  # Calibrated to the same accounting: the target is met against the Byzantine clients too
  # (cohorts of 2 of 20 clients, 5 Byzantine: a mixture of three curves).
  z = calibrate_noise_multiplier(4.0, 1e-5, 20, CohortSampling("fixed", None, 20, 2, byzantine=5))
  for byzantine, low, high in ((5, 4.0 - 1e-3, 4.0), (0, 0, 4.0 - 1e-2)):  # more than b = 0 needs
    led = PrivacyLedger(1e-5, relation="replace_one")
    led.compose(GaussianSumMechanism(1.0, z, "fixed", None, 20, 2, byzantine).round_event(), 20)
    assert low < led.epsilon() <= high
  with pytest.raises(ConfigError, match="byzantine"):
    GaussianSumMechanism(1.0, 1.0, "fixed", None, 100, 10, 100)


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
  def eps(z, t):
    led = PrivacyLedger(1e-5)
    led.compose(GaussianSumMechanism(1.0, z, sampling_prob=0.1).round_event(), t)
    return led.epsilon()
  assert eps(1.0, 10) < eps(1.0, 100)
  assert eps(2.0, 100) < eps(1.0, 100)


@pytest.mark.parametrize("sampling,kw", [("poisson", dict(sampling_prob=0.05)),
                                          ("fixed", dict(num_clients=2000, cohort_size=100))])
def test_calibration_round_trips(sampling, kw):
  z = calibrate_noise_multiplier(3.0, 1e-5, 200, CohortSampling(sampling, **kw))
  mech = GaussianSumMechanism(1.0, z, sampling=sampling, **kw)
  led = PrivacyLedger(1e-5, relation=mech.relation)
  led.compose(mech.round_event(), 200)
  eps = led.epsilon()
  assert eps <= 3.0 + 1e-9
  assert eps > 2.95  # the smallest such noise: a little less noise would exceed the target
  led2 = PrivacyLedger(1e-5, relation=mech.relation)
  led2.compose(GaussianSumMechanism(1.0, 0.97 * z, sampling=sampling, **kw).round_event(), 200)
  assert led2.epsilon() > 3.0


@pytest.mark.parametrize("coarse", [None, 1e-2])
def test_pld_calibration_is_exact_on_the_ledgers_grid_whatever_the_coarse_search_finds(
    monkeypatch, coarse):
  # The first search runs on a coarser grid of privacy losses. On the default grid its answer is
  # the exact one here; on 1e-2 (10x coarser) it lands 5e-3 above it, and the steps down and
  # the bisection on the ledger's grid find it.
  if coarse is not None:
    monkeypatch.setattr(mechanisms, "COARSE_PLD_INTERVAL", coarse)
  event = lambda z: mechanisms.gaussian_round_event(z, "poisson", 0.1)
  z = mechanisms.calibrate(event, 300, "add_remove", 4.0, 1e-5, "pld")
  assert epsilon_for(event(z), 300, 1e-5, "pld") <= 4.0
  assert epsilon_for(event(z - 1e-4), 300, 1e-5, "pld") > 4.0


def test_nonprivate_reports_no_epsilon():
  acc = LedgerAccounting(NonPrivate(), 1e-5)
  acc.on_round(None)
  rep = acc.report()
  assert rep["epsilon"] is None and rep["formal_guarantee"] is False
  zero_noise = LedgerAccounting(GaussianSumMechanism(1.0, 0.0, sampling_prob=0.1), 1e-5)
  zero_noise.on_round(None)
  assert zero_noise.report()["formal_guarantee"] is False
  assert zero_noise.report()["epsilon"] is None


@pytest.mark.parametrize("kwargs,field", [
    (dict(clip=0.0, noise_multiplier=1.0, sampling_prob=0.1), "clip"),
    (dict(clip=1.0, noise_multiplier=-1.0, sampling_prob=0.1), "noise_multiplier"),
    (dict(clip=1.0, noise_multiplier=1.0, sampling_prob=1.5), "sampling_prob"),
    (dict(clip=1.0, noise_multiplier=1.0, sampling="fixed", num_clients=10, cohort_size=11), "cohort_size"),
])
def test_mechanism_validation(kwargs, field):
  with pytest.raises(ConfigError, match=field):
    GaussianSumMechanism(**kwargs)


def test_ledger_validation():
  with pytest.raises(ConfigError, match="delta"):
    PrivacyLedger(1.5)
  with pytest.raises(ConfigError, match="accountant"):
    PrivacyLedger(1e-5, "moments")
  assert PrivacyLedger(1e-5).epsilon() == 0.0
  assert math.isinf(_direct(dp_accounting.NonPrivateDpEvent(), 1, 1e-5, rdp.RdpAccountant))


def test_guarantee_notes_say_the_population_size_is_public():
  # Every summary releases N, so add/remove must be the zero-out form (the slot stays).
  poisson = GaussianSumMechanism(clip=0.3, noise_multiplier=1.1, sampling="poisson",
                                 sampling_prob=0.04)
  fixed = GaussianSumMechanism(clip=1.0, noise_multiplier=2.0, sampling="fixed",
                               num_clients=1000, cohort_size=50)
  assert "population size N public (zero-out" in poisson.guarantee_note
  assert "replace one client (population size public)" in fixed.guarantee_note


def test_a_calibrated_multiplier_meets_its_target_in_the_float32_the_round_uses():
  # At epsilon 1e-9 the RDP accountant's epsilon jumps between neighbouring multipliers: the
  # search's 14142.14197 meets it, the float32 nearest to it (14142.1416) gives 0.0035.
  sampling = CohortSampling("poisson", 0.1)
  z = mechanisms.calibrate_noise_multiplier(1e-9, 1e-5, 2, sampling)
  ledger = PrivacyLedger(1e-5, "rdp", "add_remove")
  ledger.compose(mechanisms.gaussian_round_event(float(np.float32(z)), sampling="poisson",
                                                 sampling_prob=0.1), 2)
  assert ledger.epsilon() <= 1e-9
  # An ordinary target keeps the search's answer.
  z8 = mechanisms.calibrate_noise_multiplier(8.0, 1e-5, 50, sampling)
  assert abs(z8 - 0.8574428856737534) < 1e-3 and z8 != float(np.float32(z8))
