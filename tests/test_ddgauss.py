"""DDGauss (Kairouz, Liu and Steinke, ICML 2021): the integer encoding, the sampler, the modular
sum, the RDP bound and its accounting, the algorithm end to end."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from fedjax_dp.privacy import ddgauss as pdd
from fedjax_dp.transforms import discrete


# ------------------------------------------------------------------ encoding


def test_rotation_is_orthogonal_and_its_inverse_exact():
  h = np.asarray(jax.jit(jax.vmap(discrete.hadamard))(jnp.eye(32)))
  np.testing.assert_allclose(h @ h.T, np.eye(32), atol=1e-6)
  x = jnp.pad(jax.random.normal(jax.random.PRNGKey(0), (37,)), (0, discrete.padded_dim(37) - 37))
  assert x.shape == (64,)
  k1, k2 = jax.random.split(jax.random.PRNGKey(1))
  rotate, unrotate = jax.jit(discrete.rotate), jax.jit(discrete.unrotate)
  y = rotate(x, k1)
  assert float(jnp.linalg.norm(y)) == pytest.approx(float(jnp.linalg.norm(x)), rel=1e-6)
  np.testing.assert_allclose(unrotate(y, k1), x, atol=1e-6)
  assert not np.allclose(rotate(x, k2), y)  # the key matters
  assert float(jnp.max(jnp.abs(unrotate(y, k2) - x))) > 0.1  # a wrong key does not invert
  # A spike is spread over every coordinate (the flattening that keeps the modular sum small).
  spike = jnp.zeros(64).at[5].set(8.0)
  np.testing.assert_allclose(jnp.abs(rotate(spike, k1)), 1.0, rtol=1e-6)


def test_randomized_rounding_is_unbiased():
  x = jnp.array([0.1, 0.5, 0.9, -0.3, 2.25, -7.75, 3.0, 1e-3])
  keys = jax.random.split(jax.random.PRNGKey(2), 40000)
  r = np.asarray(jax.jit(jax.vmap(discrete.randomized_round, in_axes=(None, 0)))(x, keys))
  lo = np.floor(np.asarray(x))
  assert np.all((r == lo) | (r == lo + 1))
  frac = np.asarray(x) - lo
  se = np.sqrt(frac * (1 - frac) / len(keys)) + 1e-12
  assert np.all(np.abs(r.mean(0) - np.asarray(x)) <= 5 * se)


def test_conditional_rounding_respects_the_bound_and_retries():
  d, norm = 256, 30.0
  x = jax.random.normal(jax.random.PRNGKey(3), (d,))
  x = x / jnp.linalg.norm(x) * norm
  beta = 0.6
  bound = pdd.rounded_l2_bound(norm, beta, d)
  assert bound < norm + math.sqrt(d)  # the conditional bound is the smaller one here
  keys = jax.random.split(jax.random.PRNGKey(4), 1000)
  # Unconditioned rounding exceeds the bound with probability at most beta (Sec. 4.1).
  plain = jax.jit(jax.vmap(discrete.randomized_round, in_axes=(None, 0)))(x, keys)
  exceed = float(jnp.mean(jnp.linalg.norm(plain, axis=1) > bound))
  assert exceed <= beta
  conditional = jax.jit(jax.vmap(discrete.conditional_round, in_axes=(None, None, None, 0)))
  r, draws, ok = conditional(x, bound, 32, keys)
  assert bool(jnp.all(jnp.linalg.norm(r, axis=1) <= bound)) and bool(jnp.all(ok))
  assert bool(jnp.all(r == jnp.round(r)))
  # A bound that rounding meets only rarely: retries happen, failures fall back within the bound.
  tight = float(jnp.median(jnp.linalg.norm(plain, axis=1)))
  r, draws, ok = conditional(x, tight, 3, keys)
  assert int(jnp.max(draws)) == 3 and 0 < float(jnp.mean(ok)) < 1
  assert bool(jnp.all(jnp.linalg.norm(r, axis=1) <= tight))
  np.testing.assert_array_equal(r[~ok][0], jnp.trunc(x))  # the fallback rounds towards zero
  # Nothing fits: zeros.
  r, _, ok = conditional(x, 1.0, 4, keys[:1])
  assert not bool(ok[0]) and float(jnp.abs(r).sum()) == 0.0


# sigma is an argument of one program (it may be traced), which every sigma below shares.
_SAMPLES = jax.jit(lambda key, sigma: discrete.discrete_gaussian(key, (200000,), sigma))


@pytest.mark.parametrize("sigma", [0.5, 1.7, 6.0])
def test_discrete_gaussian_matches_the_exact_pmf(sigma):
  samples, unaccepted = _SAMPLES(jax.random.PRNGKey(int(sigma * 10)), sigma)
  assert int(unaccepted) == 0
  _check_pmf(np.asarray(samples), sigma)


def test_coordinates_a_full_buffer_leaves_out_are_retried_with_the_same_law(monkeypatch):
  # Buffers of a tenth: after the first round about half of the 2,000 coordinates are rejected
  # and at most 200 fit the buffer, so most are gathered again from the whole vector.
  monkeypatch.setattr(discrete, "RETRY_SHRINK", 0.1)
  assert discrete._buffer_sizes(2000) == (200, 32)
  sigma = 1.7
  samples, unaccepted = jax.jit(jax.vmap(lambda k: discrete.discrete_gaussian(k, (2, 1000), sigma)))(
      jax.random.split(jax.random.PRNGKey(7), 100))
  assert samples.shape == (100, 2, 1000) and int(unaccepted.sum()) == 0
  _check_pmf(np.asarray(samples).ravel(), sigma)


def test_the_retry_buffers_are_few_at_any_size():
  # Each buffer is compiled code of its own: their number stays about 9 from a thousand
  # coordinates to ten million, the last holding a 64th of them (at least 32), each 0.6 times the
  # one before.
  for n in (10, 1000, 200_000, 10_000_000):
    sizes = discrete._buffer_sizes(n)
    assert len(sizes) <= 9 and sizes[-1] == min(n, max(32, math.ceil(n / 64)))
    assert all(b == max(sizes[-1], math.ceil(a * 0.6)) for a, b in zip((n,) + sizes, sizes))


def _check_pmf(samples, sigma):
  n = samples.size
  y = samples.astype(np.int64)
  assert np.all(y == samples)
  support = np.arange(-int(40 * sigma) - 10, int(40 * sigma) + 11)
  pmf = np.exp(-support ** 2 / (2 * sigma ** 2))
  pmf /= pmf.sum()
  mean, var = float(pmf @ support), float(pmf @ support ** 2)
  assert abs(y.mean() - mean) < 5 * math.sqrt(var / n)
  assert y.var() == pytest.approx(var, rel=0.02)
  # Chi-square goodness of fit on the cells with >= 20 expected, tails lumped.
  keep = pmf * n >= 20
  lo, hi = support[keep][0], support[keep][-1]
  obs = [np.sum(y < lo)] + [np.sum(y == v) for v in support[keep]] + [np.sum(y > hi)]
  exp = [pmf[support < lo].sum()] + list(pmf[keep]) + [pmf[support > hi].sum()]
  exp = np.array(exp) * n
  obs, exp = np.array(obs)[exp > 0], exp[exp > 0]
  assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_modular_sum_is_the_true_sum_until_it_wraps():
  rng = np.random.default_rng(0)
  rows = rng.integers(-300, 300, size=(6, 50)).astype(np.int32)
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
  rows[5] = 10 ** 6  # a padded row: never counted
  true = rows[:5].sum(0)
  for bits in (14, 16):
    got = np.asarray(discrete.to_signed(discrete.modular_sum(jnp.asarray(rows), mask, bits), bits))
    np.testing.assert_array_equal(got, true)
    assert float(discrete.wrapped_fraction(jnp.asarray(rows), mask, bits)) == 0.0
  bits = 9  # [-256, 256): some coordinates of the true sum fall outside
  got = np.asarray(discrete.to_signed(discrete.modular_sum(jnp.asarray(rows), mask, bits), bits))
  outside = (true < -256) | (true >= 256)
  assert outside.any() and not outside.all()
  np.testing.assert_array_equal(got[~outside], true[~outside])
  assert np.all(got[outside] != true[outside]) and np.all((got - true) % 512 == 0)
  assert np.all((got >= -256) & (got < 256))
  assert float(discrete.wrapped_fraction(jnp.asarray(rows), mask, bits)) == pytest.approx(outside.mean())


# ------------------------------------------------------------------ privacy


def test_rounded_bound_is_the_papers():
  c, d, beta = 10.0, 100, math.exp(-0.5)
  assert pdd.rounded_l2_bound(c, 0.0, d) == c + 10
  assert pdd.rounded_l2_bound(c, beta, d) == pytest.approx(math.sqrt(100 + 25 + 1.0 * (10 + 5)))
  # With a tiny beta the conditional bound is looser than the plain one, which then holds.
  assert pdd.rounded_l2_bound(c, 1e-10, 4) == c + 2


def test_rdp_tends_to_the_gaussian_and_matches_dp_accounting():
  import dp_accounting
  from dp_accounting import rdp
  orders = np.array(pdd.ORDERS)
  l2, n, d, sigma = 3.0, 20, 4096, 50.0  # tau ~ 10 exp(-pi^2 sigma^2): nothing
  got = pdd.ddgauss_rdp(orders, l2, l2 * math.sqrt(d), sigma, n, d)
  np.testing.assert_allclose(got, orders * l2 ** 2 / (2 * n * sigma ** 2), rtol=1e-12)
  acc = rdp.RdpAccountant(orders=list(orders))
  acc.compose(dp_accounting.GaussianDpEvent(math.sqrt(n) * sigma / l2))
  np.testing.assert_allclose(got, acc._rdp, rtol=1e-9)  # pylint: disable=protected-access
  # One share: the discrete Gaussian itself, exactly the Gaussian's RDP (Canonne et al. 2020).
  np.testing.assert_allclose(pdd.ddgauss_rdp(orders, 1.0, 1.0, 0.5, 1, d), orders * 2.0, rtol=1e-12)


def _exact_rdp_of_sum(sigma, n, shift, alpha):
  """D_alpha(Z + shift || Z) of a sum of n one-dimensional discrete Gaussians, by summing pmfs."""
  y = np.arange(-60, 61)
  log_p = -y ** 2 / (2 * sigma ** 2)
  p = np.exp(log_p - special.logsumexp(log_p))
  q = p
  for _ in range(n - 1):
    q = np.convolve(q, p)
  log_q = np.log(np.maximum(q, 1e-300))
  a, b = log_q[:-shift], log_q[shift:]  # pmf of Z + shift and of Z on the same points
  ok = (q[:-shift] > 1e-250) & (q[shift:] > 1e-250)
  return special.logsumexp(alpha * a[ok] + (1 - alpha) * b[ok]) / (alpha - 1)


@pytest.mark.parametrize("sigma,n,shift", [(0.5, 3, 1), (0.6, 4, 1), (0.7, 10, 1), (1.0, 5, 3)])
def test_rdp_bound_holds_against_the_exact_divergence(sigma, n, shift):
  for alpha in (2, 5, 20):
    exact = _exact_rdp_of_sum(sigma, n, shift, alpha)
    bound = pdd.ddgauss_rdp([alpha], shift, shift, sigma, n, 1)[0]
    assert exact <= bound * (1 + 1e-9)
  # Summed discrete Gaussians are not a discrete Gaussian: at small sigma the exact divergence
  # exceeds the continuous Gaussian's alpha Delta^2 / (2 n sigma^2), which tau's term covers.
  if (sigma, n) == (0.6, 4):
    assert _exact_rdp_of_sum(sigma, n, shift, 2) > 2 * shift ** 2 / (2 * n * sigma ** 2)


def test_subsampling_bound_is_wang_et_al_as_dp_accounting_computes_it_for_gaussians():
  from dp_accounting.rdp import rdp_privacy_accountant as rpa
  orders = np.array(pdd.ORDERS)
  for q, z in ((0.1, 1.0), (0.5, 2.0), (0.02, 0.7)):
    plain = orders / (2 * z * z)
    ours = pdd.subsampled_rdp(orders, q, lambda a: np.asarray(a, float) / (2 * z * z))
    # dp_accounting: Theorem 27 (tighter, Gaussian only) up to order 256, the general Theorem 9
    # above; it does not take the minimum with the unsampled mechanism, which also holds.
    ref = np.minimum(rpa._compute_rdp_sample_wor_gaussian(q, z, orders), plain)  # pylint: disable=protected-access
    assert np.all(ours >= ref * (1 - 1e-12)) and np.all(ours <= plain + 1e-12)
    big = orders >= 512
    np.testing.assert_allclose(ours[big], ref[big], rtol=1e-9)
    if q <= 0.1:
      assert np.any(ours < plain * 0.5)  # amplification is used
  # A tiny noise multiplier (eps(2) = 1250, e^eps(2) past a float) stays finite, calibration's
  # first guesses go there (`fedjax-dp run --algorithm ddgauss --sampling fixed` raised
  # OverflowError).
  tiny = pdd.subsampled_rdp(orders, 0.05, lambda a: np.asarray(a, float) / (2 * 0.02 ** 2))
  assert np.all(np.isfinite(tiny)) and np.all(tiny <= orders / (2 * 0.02 ** 2) + 1e-9)
  assert tiny[orders == 2][0] > 1000


def test_fine_scale_approaches_dp_fedavgs_fixed_cohort_epsilon():
  from fedjax_dp.privacy.ledger import PrivacyLedger, epsilon_for
  from fedjax_dp.privacy.mechanisms import gaussian_round_event
  n_pop, m, z, rounds, delta = 1000, 50, 1.0, 100, 1e-5
  mech = pdd.mechanism_for(z, clip=1.0, quantization=pdd.Quantization(24, math.exp(-0.5), 2000.0),
                           dim=2 ** 10, cohort_size=m, num_clients=n_pop, sampling="fixed")
  ledger = PrivacyLedger(delta, "rdp", "replace_one")
  ledger.compose(mech.round_event(), rounds)
  ours = ledger.epsilon()
  gauss = epsilon_for(gaussian_round_event(z, "fixed", None, n_pop, m), rounds, delta, "rdp",
                      "replace_one")
  assert gauss <= ours <= gauss * 1.02


def test_byzantine_clients_leave_a_mixture_of_cohorts_and_noise_shares():
  # A cohort holding K of the b Byzantine clients has M - K regular clients of the N - b and
  # M - K noise shares (the Byzantine clients' are not counted): more than DP-FedAvg's mixture at
  # the same noise (whose server adds all of it) and than no Byzantine client.
  from fedjax_dp.privacy.ledger import PrivacyLedger, epsilon_for
  from fedjax_dp.privacy.mechanisms import gaussian_round_event
  n_pop, m, z, rounds, delta = 100, 10, 1.0, 20, 1e-5

  def eps(byzantine):
    mech = pdd.mechanism_for(z, clip=1.0,
                             quantization=pdd.Quantization(24, math.exp(-0.5), 2000.0),
                             dim=2 ** 10, cohort_size=m, num_clients=n_pop, sampling="fixed",
                             byzantine=byzantine)
    ledger = PrivacyLedger(delta, "rdp", "replace_one")
    ledger.compose(mech.round_event(), rounds)
    return ledger.epsilon(), mech
  plain, mixed = eps(0)[0], eps(3)[0]
  gauss = epsilon_for(gaussian_round_event(z, "fixed", None, n_pop, m, 3), rounds, delta, "rdp",
                      "replace_one")
  assert plain < mixed and gauss <= mixed <= gauss * 1.1
  # 95 of 100 Byzantine: every cohort holds 5 or more of them, the 5 regular clients keep a
  # guarantee (a cohort of Byzantine clients only releases nothing of theirs).
  many, mech = eps(95)
  assert mech.formal_guarantee and 0 < many < math.inf
  assert "M - K of the 5 regular clients" in mech.guarantee_note


def test_calibration_meets_the_target_through_the_ledger():
  from fedjax_dp.privacy.ledger import PrivacyLedger

  def make(z):
    return pdd.mechanism_for(z, clip=0.5, quantization=pdd.Quantization(16, math.exp(-0.5)),
                             dim=2 ** 12, cohort_size=10, num_clients=60, sampling="fixed")
  z = pdd.calibrate_noise_multiplier(4.0, 1e-5, 30, make)

  def eps(zz):
    ledger = PrivacyLedger(1e-5, "rdp", "replace_one")
    ledger.compose(make(zz).round_event(), 30)
    return ledger.epsilon()
  assert eps(z) <= 4.0 < eps(z * 0.999)


# ------------------------------------------------------------------ the algorithm


def _config(**kw):
  from fedjax_dp.config import RunConfig
  base = dict(algorithm="ddgauss", num_clients=60, sampling="fixed", cohort_size=10, rounds=3,
              target_epsilon=None, noise_multiplier=1.0, model="mlp")
  return RunConfig(**dict(base, **kw))


def test_pieces_declare_the_mechanism_and_a_swapped_aggregator_voids_it():
  import dataclasses
  from fedjax_dp.algorithms import build
  from fedjax_dp.algorithms.ddgauss import round_mechanism
  from fedjax_dp.algorithms.fedavg import Pieces, make_aggregator
  from fedjax_dp.data import Split, load_federated
  data = load_federated("digits", Split(60), seed=0)
  setup = build(_config(), data)
  mech = setup.accounting.mechanism
  assert isinstance(mech, pdd.DDGaussMechanism) and mech.formal_guarantee
  hp = setup.hparams
  assert mech.sigma == float(hp["sigma"]) and float(hp["bound"]) == pytest.approx(mech.bound, rel=1e-7)
  assert mech.sigma == pytest.approx(float(hp["scale"]) * 1.0 * 0.5 / math.sqrt(10), rel=1e-6)
  rep = setup.accounting.report()
  assert rep["neighbouring_relation"] == "replace_one" and rep["formal_guarantee"]
  noisy_mean = make_aggregator(Pieces(transforms=("clip",), noise=True, denominator="expected"), {})
  swapped = dataclasses.replace(setup.program, aggregator=noisy_mean)
  assert not round_mechanism(swapped, hp, mech.dim).formal_guarantee
  # Poisson sampling runs without a guarantee; calibrating under it, or PLD, is refused.
  poisson = build(_config(sampling="poisson", cohort_size=None, sampling_prob=0.2), data)
  assert not poisson.accounting.mechanism.formal_guarantee
  from fedjax_dp.errors import ConfigError
  with pytest.raises(ConfigError, match="sampling"):
    build(_config(sampling="poisson", cohort_size=None, target_epsilon=4.0, noise_multiplier=None),
          data)
  with pytest.raises(ConfigError, match="accountant"):
    build(_config(accountant="pld"), data)


def test_the_secure_sum_decodes_the_mean_of_the_clipped_updates():
  from fedjax_dp.algorithms import as_hparams
  from fedjax_dp.algorithms.ddgauss import ddgauss_metrics, ddgauss_round, model_vector
  from fedjax_dp.algorithms.fedavg import Pieces, Training, fedavg_client
  from fedjax_dp.data import Split, load_federated
  from fedjax_dp.models import get_model
  from fedjax_dp.round import CohortBatch, client_keys, messages, round_keys
  model = get_model("mlp", (8, 8, 1), 10, hidden=(16,))
  size, dim, _ = model_vector(model)
  assert dim == 2048 and 1024 < size <= 2048
  data = load_federated("digits", Split(20), seed=0)
  training = Training(local_steps=2, batch_size=4, client_optimizer="sgd", server_optimizer="sgd")
  rnd = ddgauss_round(model, 20, "fixed", training)
  m, clip = 8, 0.5
  ids = jnp.arange(m + 2) % 20
  mask = jnp.array([1.0] * m + [0.0, 0.0])
  batch = CohortBatch(jnp.asarray(data.x)[ids], jnp.asarray(data.y)[ids],
                      jnp.asarray(data.counts)[ids], ids, mask)
  key = jax.random.PRNGKey(7)
  # The reference: FedAvg's clipped updates of the same clients with the same keys, averaged.
  ref_client = fedavg_client(model, Pieces(transforms=("clip",)), training)
  flat = lambda t: jax.flatten_util.ravel_pytree(t)[0]

  @jax.jit
  def run(hp):
    state = rnd.init(jax.random.PRNGKey(0), hp)
    out, sent = messages(rnd, state, hp, batch, key)
    agg, _ = rnd.aggregator(hp).aggregate(sent, jnp.ones(m + 2), mask, state.agg_state, key)
    keys = client_keys(round_keys(key)[0], ids)
    ref = jax.vmap(ref_client(hp), in_axes=(None, 0, 0, 0, None, None, 0))(
        state.params, batch.x, batch.y, batch.counts, (), (), keys).upload
    want = jnp.sum(jax.vmap(flat)(ref)[:m], axis=0) / m
    return flat(agg) - want, sent, ddgauss_metrics(state, None, out, sent, mask, hp)

  def decoded(z, bits, scale):
    mech = pdd.mechanism_for(z, clip=clip, quantization=pdd.Quantization(16, math.exp(-0.5), scale),
                             dim=dim, cohort_size=m, num_clients=20, sampling="fixed")
    hp = as_hparams(dict(client_lr=0.1, clip=clip, noise_multiplier=z, scale=mech.scale,
                         sigma=mech.sigma, bound=mech.bound, beta=mech.beta, bits=bits,
                         rounding_tries=32, rotation_seed=3, expected_size=m, byzantine=0,
                         server_lr=1.0, l2=0.0))
    diff, sent, metrics = run(hp)
    assert sent.dtype == jnp.int32 and sent.shape == (m + 2, dim)
    return np.asarray(diff), metrics

  # No noise, fine scale: only the rounding's error, at most sqrt(d) / (s M) in norm.
  diff, metrics = decoded(0.0, 16, 4000.0)
  assert np.linalg.norm(diff) <= math.sqrt(dim) / (4000.0 * m)
  assert float(metrics["wrap_fraction"]) == 0 and float(metrics["rounding_failures"]) == 0
  # With noise z: the decoded mean's error has standard deviation z c / M per coordinate.
  diff, _ = decoded(2.0, 16, 4000.0)
  assert np.std(diff) == pytest.approx(2.0 * clip / m, rel=0.1)
  # Too few bits for the scale: the sum wraps, the metric sees it and the decoding is wrong.
  diff, metrics = decoded(0.0, 6, 4000.0)
  assert float(metrics["wrap_fraction"]) > 0.01
  assert np.linalg.norm(diff) > 20 * math.sqrt(dim) / (4000.0 * m)


def test_cli_run_on_digits(tmp_path):
  from fedjax_dp.cli import main
  out = tmp_path / "run"
  assert main(["run", "--algorithm", "ddgauss", "--num-clients", "60", "--sampling", "fixed",
               "--cohort-size", "20", "--rounds", "4", "--eval-every", "4",
               "--noise-multiplier", "0.5", "--target-epsilon", "null", "--client-lr", "0.3",
               "--set", "bits=16",
               "--output-dir", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["formal_guarantee"] is True and 0 < s["epsilon"] < math.inf
  assert s["final_accuracy"] > 0.25  # chance is 0.1
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  diag = rows[-1]["diagnostics"]
  assert 0 <= diag["wrap_fraction"] < 1e-3 and diag["rounding_failures"] == 0
  assert "wrap_fraction" not in rows[-1]  # raw, not released
