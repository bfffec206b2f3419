"""fedjax_dp.lower_bounds: Clopper-Pearson, the threshold bound, the families' trade-off curves,
their exact epsilons, and the bounds on simulated releases of known mechanisms."""

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import binom, norm

from fedjax_dp import lower_bounds as lb
from fedjax_dp.errors import ConfigError


def test_clopper_pearson_upper_bound_covers_the_rate():
  # The bound's defining property: P[Binomial(n, u) <= k] = alpha at the upper bound u.
  for k, n in ((0, 100), (3, 100), (50, 100), (99, 100)):
    u = float(lb.clopper_pearson_upper(k, n, 0.05))
    assert binom.cdf(k, n, u) == pytest.approx(0.05, rel=1e-6)
  assert lb.clopper_pearson_upper(0, 200, 0.025) == pytest.approx(1 - 0.025 ** (1 / 200))
  assert lb.clopper_pearson_upper(100, 100, 0.05) == 1.0


def test_threshold_epsilon():
  assert lb.threshold_epsilon(0.1, 0.5, 0.0) == pytest.approx(math.log(5))
  assert lb.threshold_epsilon(0.5, 0.1, 0.0) == pytest.approx(math.log(5))
  assert lb.threshold_epsilon(0.5, 0.5, 0.0) == pytest.approx(0.0)


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5])
def test_gaussian_tradeoff_is_gdp_and_signal_inverts_it(mu):
  fam = lb.Family()
  for alpha in (1e-4, 0.05, 0.3, 0.7):
    f = fam.tradeoff(mu, alpha)
    assert f == pytest.approx(norm.cdf(norm.ppf(1 - alpha) - mu), rel=1e-7, abs=1e-12)
    assert fam.signal_lower(alpha, f) == pytest.approx(mu, abs=1e-6)
  # Rates no better than guessing show no signal.
  assert fam.signal_lower(0.3, 0.7) == 0.0


@pytest.mark.parametrize("fam", [lb.Family(0.5), lb.Family(0.5, replace=True),
                                 lb.Family(0.75, replace=True)])
def test_sampled_family_signal_inverts_and_rates_no_member_explains_are_infinite(fam):
  for mu in (0.4, 1.2):
    for alpha in (0.01, 0.2):
      assert fam.signal_lower(alpha, fam.tradeoff(mu, alpha)) == pytest.approx(mu, abs=1e-6)
  # The canary is absent from a share 1 - p of the releases: whatever its signal, a test
  # misses at least about that share of world 1's. A lower miss rate is out of the family.
  assert fam.signal_lower(0.01, 0.05) == math.inf


@pytest.mark.parametrize("mu", [0.5, 1.0])
def test_gaussian_epsilon_solves_the_gdp_privacy_profile(mu):
  # mu-GDP: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su).
  delta = 1e-5
  eps = lb.Family().epsilon(mu, delta)
  gdp = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
  assert gdp == pytest.approx(delta, rel=2e-2)
  assert lb.Family(replace=True).epsilon(mu / 2, delta) == pytest.approx(eps, rel=1e-6)


@pytest.mark.parametrize("p,mu,eps", [(0.5, 0.5, 1.0), (0.75, 1.0, 2.0), (0.3, 2.0, 0.5)])
def test_mixture_delta_is_the_hockey_stick_divergence(p, mu, eps):
  def density(s, shift):
    return (1 - p) * norm.pdf(s) + p * norm.pdf(s - shift)

  def integrand(s):
    return max(0.0, density(s, mu) - math.exp(eps) * density(s, -mu))

  expected, _ = quad(integrand, -30, 30, points=[0.0], limit=400, epsabs=1e-13)
  assert lb.mixture_delta(eps, p, mu) == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_replace_family_epsilon_without_sampling_is_the_gaussian_of_sensitivity_two():
  # p -> 1: the mixture pair becomes N(mu, 1) against N(-mu, 1).
  near = lb._gaussian_epsilon(1 - 1e-9, True, 0.5, 1e-5)
  assert near == pytest.approx(lb.Family(replace=True).epsilon(0.5, 1e-5), rel=1e-3)


def _releases(fam, mu, n, rng):
  """Statistics of ``n`` releases per world from the family member with signal ``mu``."""
  shift0 = -mu if fam.replace else 0.0
  s0 = rng.normal(size=n) + shift0 * (rng.random(n) < fam.p)
  s1 = rng.normal(size=n) + mu * (rng.random(n) < fam.p)
  return s0, s1


@pytest.mark.parametrize("fam,mu", [(lb.Family(), 0.6), (lb.Family(0.5), 0.667),
                                    (lb.Family(0.75, replace=True), 0.333)])
def test_family_bound_is_below_the_true_epsilon_and_catches_halved_noise(fam, mu):
  rng = np.random.default_rng(0)
  truth = fam.epsilon(mu, 1e-5)
  for seed in range(3):
    rep = lb.family_bound(*_releases(fam, mu, 200_000, np.random.default_rng(seed)), fam, 1e-5,
                          0.95)
    assert 0.75 * truth < rep["epsilon_lower_bound"] <= truth, rep
  halved = lb.family_bound(*_releases(fam, 2 * mu, 200_000, rng), fam, 1e-5, 0.95)
  assert halved["epsilon_lower_bound"] > truth


def test_sign_bound_estimates_the_keep_probability():
  rng = np.random.default_rng(1)
  fam, keep, n = lb.SignFamily(6), 0.6, 100_000
  truth = fam.epsilon(keep, 1e-5)
  assert truth == pytest.approx(6 * math.log(keep / (1 - keep)), rel=1e-2)
  flips = lambda: np.where(rng.random((n, 6)) < keep, 1.0, -1.0)
  rep = lb.sign_bound(-flips(), flips(), fam, 1e-5, 0.95)
  assert 0.95 * truth < rep["epsilon_lower_bound"] <= truth
  assert rep["keep_prob_lower_bound"] < keep
  lying = np.where(rng.random((n, 6)) < 0.8, 1.0, -1.0)
  assert lb.sign_bound(-lying, lying, fam, 1e-5, 0.95)["epsilon_lower_bound"] > truth


def test_one_run_p_value_without_delta_is_the_binomial_test():
  for eps in (0.0, 0.5, 2.0):
    q = math.exp(eps) / (1 + math.exp(eps))
    for r, v in ((20, 15), (100, 70), (200, 200)):
      assert lb.one_run_p_value(1000, r, v, eps, 0.0) == pytest.approx(binom.sf(v - 1, r, q))


def test_one_run_p_value_worked_example():
  # m = 10, r = v = 2, eps = 0, delta = 0.01: q = 1/2, beta = P[B >= 2] = 1/4; alpha =
  # max(P[B = 1] / 1, (P[B = 1] + P[B = 0]) / 2) = max(1/2, 3/8) = 1/2; p = 1/4 + 1/2 * 0.01 * 20.
  assert lb.one_run_p_value(10, 2, 2, 0.0, 0.01) == pytest.approx(0.35)
  # Every guess right and delta = 0: the bound solves q^r = 1 - confidence.
  q = 0.05 ** (1 / 100)
  assert lb.one_run_epsilon(1000, 100, 100, 0.0, 0.95) == pytest.approx(math.log(q / (1 - q)),
                                                                        rel=1e-9)


def test_one_run_bound_grows_with_the_correct_guesses_and_is_zero_at_chance():
  p = [lb.one_run_p_value(1000, 200, v, 1.0, 1e-5) for v in range(100, 201, 10)]
  assert all(a >= b for a, b in zip(p, p[1:]))
  eps = [lb.one_run_epsilon(1000, 200, v, 1e-5, 0.95) for v in range(100, 201, 10)]
  assert all(a <= b for a, b in zip(eps, eps[1:])) and eps[-1] > 3
  assert eps[0] == 0.0  # half the guesses right: no better than chance
  # The bound is the largest epsilon rejected: its p-value sits at the level.
  e = lb.one_run_epsilon(1000, 200, 180, 1e-5, 0.95)
  assert lb.one_run_p_value(1000, 200, 180, e, 1e-5) <= 0.05 < lb.one_run_p_value(
      1000, 200, 180, e + 1e-6, 1e-5)
  # delta only weakens it.
  assert lb.one_run_epsilon(1000, 200, 180, 1e-3, 0.95) < e


@pytest.mark.parametrize("args, field", [((10, 20, 5, 1.0, 0.0), "guesses"),
                                         ((10, 5, 6, 1.0, 0.0), "correct"),
                                         ((10, 5, -1, 1.0, 0.0), "correct"),
                                         ((10, 5, 2.5, 1.0, 0.0), "correct"),
                                         ((10, 5, 2, -1.0, 0.0), "epsilon"),
                                         ((10, 5, 2, 1.0, 2.0), "delta")])
def test_one_run_p_value_refuses_bad_input(args, field):
  with pytest.raises(ConfigError, match=f"invalid {field}="):
    lb.one_run_p_value(*args)
  with pytest.raises(ConfigError, match="invalid confidence="):
    lb.one_run_epsilon(10, 5, 2, 0.0, 1.0)
