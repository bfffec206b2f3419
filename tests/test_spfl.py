"""SP-FL, spfl-sound, DP-FL, ADP-FL and NoDP-FL: client-side DP-SGD, thresholds, per-class ledgers."""

import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import pld, rdp

from fedjax_dp import objectives
from fedjax_dp.algorithms import build
from fedjax_dp.algorithms.adp_fl import quantile_update
from fedjax_dp.algorithms.spfl import HIGH, LOW, privacy_classes, spfl_classes
from fedjax_dp.client import StepStats, mean_initial_norm, poisson_indices
from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData
from fedjax_dp.engine import Experiment, run
from fedjax_dp.round import run_keys
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import simulate
from fedjax_dp.models import get_model
from fedjax_dp.privacy.example_level import (ExampleDPSGDMechanism, ExampleLevelAccounting,
                                             PrivacyClass, calibrate_example_noise,
                                             split_noise_multiplier)
from fedjax_dp.round import Round
from fedjax_dp.sampling import Cohort
from fedjax_dp.transforms import (GradientRule, clip_factors, dp_args, dp_gradient, global_norm,
                                  per_example_grads)

SHAPE = (8, 8, 1)


def _model():
  return get_model("mlp", SHAPE, 10, hidden=(16,))


def _batch(n=12, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.random((n,) + SHAPE, np.float32)),
          jnp.asarray(rng.integers(0, 10, n).astype(np.int32)))


def _setup():
  model = _model()
  params = model.init(jax.random.PRNGKey(0))
  return model, objectives.supervised(model), params


def _data(num_clients=8, per_client=24, seed=0):
  rng = np.random.default_rng(seed)
  n = num_clients * per_client
  x = rng.random((n,) + SHAPE, np.float32)
  y = rng.integers(0, 10, n).astype(np.int32)
  parts = np.array_split(rng.permutation(n), num_clients)
  return FederatedData.from_partition("synthetic", x, y, parts, x[:64], y[:64], 10)


def _config(algorithm, **kw):
  base = dict(algorithm=algorithm, model="mlp", num_clients=8, rounds=2, sampling="fixed",
              cohort_size=4, local_steps=2, batch_size=4, client_lr=0.1, weighting="examples",
              clip=1.0, noise_multiplier=1.0, target_epsilon=None, eval_every=1)
  base.update(kw)
  return make_config(**base)


@pytest.mark.parametrize("jit", [False, True])
def test_per_example_clip_bound_holds(jit):
  _, objective, params = _setup()
  x, y = _batch()
  _, g = jax.jit(lambda p: per_example_grads(objective, p, p, x, y))(params)
  norms = jax.vmap(global_norm)(g)
  clip = float(np.median(np.asarray(norms)))  # half the examples are clipped
  fn = jax.jit(clip_factors) if jit else clip_factors
  f = fn(norms, jnp.float32(clip), jnp.float32(1.0))
  clipped = jax.vmap(global_norm)(jax.tree_util.tree_map(
      lambda t: t * f.reshape((-1,) + (1,) * (t.ndim - 1)), g))
  assert np.all(np.asarray(clipped) <= clip * (1 + 1e-5))
  small = np.asarray(norms) <= clip
  np.testing.assert_allclose(np.asarray(clipped)[small], np.asarray(norms)[small], rtol=1e-6)
  # Proportional scaling (Eq. 7): every norm scaled by beta, no bound.
  fp = clip_factors(norms, jnp.float32(jnp.inf), jnp.float32(0.7))
  np.testing.assert_allclose(np.asarray(fp), 0.7, rtol=1e-6)
  # The sum the step releases (sigma = 0): its norm is at most (examples) * C.
  args = dp_args(clip, 1.0, 0.0)
  grad, info = jax.jit(lambda a: dp_gradient(objective, params, params, (x, y, jnp.ones(12)), a,
                                             jax.random.PRNGKey(1), GradientRule(1.0)))(args)
  assert float(global_norm(grad)) <= 12 * clip * (1 + 1e-5)
  assert int(info["clipped"]) == int(np.sum(~small))


def test_noise_std_is_sigma_times_bound_in_force():
  _, objective, params = _setup()
  x, y = _batch(16)
  n_params = sum(p.size for p in jax.tree_util.tree_leaves(params))
  tol = 4.0 / math.sqrt(2 * n_params)  # 4 standard errors of a sample std

  def noise(args, mask, data_dependent=False):
    rule = GradientRule(1.0, data_dependent_noise=data_dependent)
    fn = jax.jit(lambda a, k: dp_gradient(objective, params, params, (x, y, mask), a, k, rule))
    noisy, info = fn(args, jax.random.PRNGKey(3))
    clean, _ = fn(args._replace(noise_multiplier=jnp.zeros_like(args.noise_multiplier)),
                  jax.random.PRNGKey(3))
    diff = jnp.concatenate([jnp.ravel(a - b) for a, b in zip(
        jax.tree_util.tree_leaves(noisy), jax.tree_util.tree_leaves(clean))])
    return float(jnp.std(diff)), info

  # Constant bound: std = sigma * C.
  std, info = noise(dp_args(0.3, 1.0, 1.7), jnp.ones(16))
  assert std == pytest.approx(1.7 * 0.3, rel=tol)
  assert float(info["noise_std"]) == pytest.approx(1.7 * 0.3, rel=1e-6)
  # Published proportional clipping: std = sigma * beta * mean ||g_i|| of the batch.
  _, g = jax.jit(lambda p: per_example_grads(objective, p, p, x, y))(params)
  mean_norm = float(jnp.mean(jax.vmap(global_norm)(g)))
  std, info = noise(dp_args(jnp.inf, 0.5, 2.0), jnp.ones(16), data_dependent=True)
  assert std == pytest.approx(2.0 * 0.5 * mean_norm, rel=tol)
  # Without the build-time choice an infinite bound never gets data-dependent noise.
  _, info = noise(dp_args(jnp.inf, 0.5, 2.0), jnp.ones(16))
  assert math.isinf(float(info["noise_std"]))


def test_the_statistics_noise_has_a_key_of_its_own():
  # The gradient's noise is drawn from its key and nothing else is derived from that key: the
  # statistic's noise comes from a key split beside it (its draws changed nothing of the
  # gradient's), and a statistic without one is refused.
  _, objective, params = _setup()
  x, y = _batch(6)
  args = dp_args(0.5, 1.0, 1.0, stat_noise=3.0)
  rule = GradientRule(6.0, "norm")
  fn = jax.jit(lambda k, ks: dp_gradient(objective, params, params, (x, y, jnp.ones(6)), args, k,
                                         rule, stat_key=ks))
  k = jax.random.PRNGKey(1)
  (g1, i1), (g2, i2) = fn(k, jax.random.PRNGKey(2)), fn(k, jax.random.PRNGKey(3))
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(i1["stat"]) != float(i2["stat"])
  with pytest.raises(ConfigError, match="stat_key"):
    dp_gradient(objective, params, params, (x, y, jnp.ones(6)), args, k, rule)


def test_nonfinite_example_gradient_is_zeroed_before_clipping():
  _, objective, params = _setup()
  x, y = _batch(6)
  x = x.at[2].set(jnp.inf)
  args = dp_args(0.5, 1.0, 0.0)
  grad, info = jax.jit(lambda a: dp_gradient(objective, params, params, (x, y, jnp.ones(6)), a,
                                             jax.random.PRNGKey(1), GradientRule(1.0)))(args)
  assert int(info["nonfinite"]) == 1
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grad))
  assert float(global_norm(grad)) <= 5 * 0.5 * (1 + 1e-5)


def test_poisson_indices_sample_only_real_rows():
  key = jax.random.PRNGKey(0)
  count, rate, cap, m = 50, 0.2, 40, 64
  draw = jax.jit(jax.vmap(lambda k: poisson_indices(jnp.int32(count), jnp.float32(rate), cap, m, k)))
  idxs, masks, overs = draw(jax.random.split(key, 200))
  sizes = []
  for idx, mask, over in zip(np.asarray(idxs), np.asarray(masks), np.asarray(overs)):
    sel = idx[mask > 0]
    assert np.all(sel < count) and len(set(sel.tolist())) == len(sel)
    assert float(over) == 0.0
    sizes.append(len(sel))
  # Binomial(50, 0.2): mean 10, std of the mean over 200 draws ~0.2.
  assert np.mean(sizes) == pytest.approx(10.0, abs=1.0)


def test_poisson_overflow_keeps_a_uniform_random_subset():
  # Rate 0.9 over 50 rows into a capacity of 10: nearly every step overflows,
  # and each row must be kept with the same frequency (10/50), whatever its index.
  count, rate, cap, m, trials = 50, 0.9, 10, 64, 4000
  draw = jax.jit(jax.vmap(lambda k: poisson_indices(jnp.int32(count), jnp.float32(rate), cap, m, k)))
  idxs, masks, overs = draw(jax.random.split(jax.random.PRNGKey(1), trials))
  assert float(jnp.mean(overs)) > 0.99
  kept = np.zeros(m)
  for idx, mask in zip(np.asarray(idxs), np.asarray(masks)):
    kept[idx[mask > 0]] += 1
  freq = kept[:count] / trials
  assert np.all(kept[count:] == 0)
  # Binomial(4000, ~0.2) per row: 5 standard errors is 0.032.
  np.testing.assert_allclose(freq, cap / count, atol=0.032)


def _hp(setup):
  """The Setup's hparams as the engine passes them to the round (arrays)."""
  return {k: jnp.asarray(v) for k, v in setup.hparams.items()}


def _class_ids(setup, classes):
  """Client ids whose privacy classes (``hp["client_class"]``) are ``classes``, in order."""
  cls = np.asarray(setup.hparams["client_class"])
  pools = {c: list(np.flatnonzero(cls == c)) for c in set(classes)}
  ids = jnp.asarray([pools[c].pop(0) for c in classes], jnp.int32)
  np.testing.assert_array_equal(cls[np.asarray(ids)], classes)
  return ids


def test_spfl_thresholds_follow_the_formulas():
  data = _data()
  cfg = _config("spfl", options={"beta_high": 0.8, "beta_low": 0.6, "high_fraction": 0.5})
  setup = build(cfg, data)
  rnd, hp = setup.program, _hp(setup)
  state = rnd.init(run_keys(cfg.seed)[0], hp)
  # Initial threshold: the mean initial per-example gradient norm of all clients (Sec. 2.1).
  objective = objectives.supervised(rnd.model)
  norms = []
  pe_norms = jax.jit(lambda p, x, y: jax.vmap(global_norm)(per_example_grads(objective, p, p, x, y)[1]))
  for c in range(data.num_clients):
    k = min(32, int(data.counts[c]))
    norms.extend(np.asarray(pe_norms(state.params, data.x[c, :k], data.y[c, :k])).tolist())
  assert float(state.server[0]) == pytest.approx(np.mean(norms), rel=1e-5)
  # Eq. 5: C_{t+1,h} = beta_h * mean per-example norm of the round's high clients.
  classes = [HIGH, LOW, HIGH, HIGH]
  ids = _class_ids(setup, classes)
  mask = jnp.array([1.0, 1.0, 1.0, 0.0])
  stats = StepStats(loss=jnp.zeros(4), norm_sum=jnp.array([10.0, 100.0, 6.0, 50.0]),
                    examples=jnp.array([4.0, 4.0, 4.0, 4.0]), clipped=jnp.zeros(4),
                    noise_std=jnp.zeros(4), stat_sum=jnp.zeros(4), overflow=jnp.zeros(4),
                    nonfinite=jnp.zeros(4))
  new = rnd.hooks.server_rule(state.server, hp, stats, mask, ids)
  assert float(new[0]) == pytest.approx(0.8 * 16.0 / 8.0, rel=1e-6)
  # Client arguments: high clip C_h with scale 1, low clip inf with scale beta_l.
  args = rnd.hooks.client_hparams(new, hp, ids)
  assert float(args.clip[0]) == pytest.approx(1.6) and math.isinf(float(args.clip[1]))
  assert float(args.scale[1]) == pytest.approx(0.6) and float(args.scale[0]) == 1.0

  # spfl-sound: C_h = beta_h * clamp(B (1/2 + noisy shifted sum / (n_high Q L)), min_clip, B).
  sound_setup = build(_config("spfl-sound", options={"beta_high": 0.8, "stat_bound": 4.0,
                                                     "low_cap": 0.5}), data)
  sound, sound_hp = sound_setup.program, _hp(sound_setup)
  st = sound.init(jax.random.PRNGKey(0), sound_hp)
  assert float(st.server[0]) == pytest.approx(1.0)  # data-independent start: config.clip
  ids = _class_ids(sound_setup, classes)
  stats = stats._replace(stat_sum=jnp.array([-1.0, 50.0, -2.0, 9.0]))
  new = sound.hooks.server_rule(st.server, sound_hp, stats, mask, ids)
  expected = 0.8 * 4.0 * (0.5 + (-3.0) / (2 * 2 * 4))
  assert float(new[0]) == pytest.approx(expected, rel=1e-6)
  args = sound.hooks.client_hparams(new, sound_hp, ids)
  assert float(args.clip[1]) == pytest.approx(0.5)  # the low class's cap
  # High: the gradient gets z_Delta > z (the statistic takes the rest); low: z.
  z = float(sound_setup.hparams["sigma"])
  assert float(args.noise_multiplier[1]) == pytest.approx(z)
  assert float(args.noise_multiplier[0]) == pytest.approx(split_noise_multiplier(z, 5 * z), rel=1e-5)

  # adp-fl: C <- C exp(-eta (b~ - gamma)).
  adp_setup = build(_config("adp-fl", options={"clip_lr": 0.3, "target_quantile": 0.6}), data)
  adp, adp_hp = adp_setup.program, _hp(adp_setup)
  st = adp.init(jax.random.PRNGKey(0), adp_hp)
  new = adp.hooks.server_rule(st.server, adp_hp, stats, mask, jnp.arange(4))
  b = 0.5 + (-1.0 + 50.0 - 2.0) / (3 * 2 * 4)
  assert float(new[0]) == pytest.approx(1.0 * math.exp(-0.3 * (b - 0.6)), rel=1e-5)


def test_spfl_initial_threshold_is_read_at_the_runs_initial_model(monkeypatch):
  # The builder computes it on the host (the round holds no data) at the model the engine
  # starts from: the first round's clip_high must be the mean per-example norm there.
  data = _data()
  cfg = _config("spfl", rounds=1, seed=3)
  seen = {}
  init = Round.init

  def spy(self, key, hparams):
    state = init(self, key, hparams)
    seen["params"] = state.params
    return state

  monkeypatch.setattr(Round, "init", spy)
  res = simulate(cfg, data)
  objective = objectives.supervised(build(cfg, data).program.model)
  got = mean_initial_norm(objective, seen["params"], data.x[:, :32], data.y[:, :32],
                          data.counts, 32)
  # A raw statistic of the clients' data, so a diagnostic, not a released metric.
  assert "clip_high" not in res.history[0]
  assert res.history[0]["diagnostics"]["clip_high"] == pytest.approx(float(got), rel=1e-5)


def test_adp_quantile_tracks_a_known_quantile():
  rng = np.random.default_rng(0)
  gamma, clip, E = 0.3, 5.0, 200
  for _ in range(400):
    norms = rng.lognormal(0.0, 0.5, E)
    noisy = np.sum((norms <= clip) - 0.5) + rng.normal(0, 5.0)
    clip = float(quantile_update(clip, noisy, E, gamma, 0.2))
  true_q = float(np.exp(0.5 * (-0.5244)))  # lognormal(0, 0.5) quantile at 0.3
  assert clip == pytest.approx(true_q, rel=0.1)
  assert np.mean(rng.lognormal(0.0, 0.5, 100000) <= clip) == pytest.approx(gamma, abs=0.05)


def test_adp_quantile_update_is_clamped():
  # A statistic far below its range (every norm above C, plus noise) grows C
  # geometrically without bound; the clamp keeps it finite.
  c = jnp.float32(1.0)
  for _ in range(200):
    c = quantile_update(c, -1e4, 10.0, 0.9, 5.0, 1e-3, 50.0)
  assert float(c) == pytest.approx(50.0)
  assert float(quantile_update(jnp.float32(1.0), 1e4, 10.0, 0.1, 5.0, 1e-3, 50.0)) == pytest.approx(1e-3)
  # Unclamped, the same sequence overflows to inf (the defect the clamp prevents).
  c = jnp.float32(1.0)
  for _ in range(200):
    c = quantile_update(c, -1e4, 10.0, 0.9, 5.0)
  assert math.isinf(float(c))


def test_split_noise_multiplier_keeps_the_total():
  z = 1.3
  zd = split_noise_multiplier(z, 2.0)
  assert (zd ** -2 + 4.0 ** -2) ** -0.5 == pytest.approx(z, rel=1e-12)
  with pytest.raises(ConfigError):
    split_noise_multiplier(z, 0.6)


def test_the_ledger_accounts_the_float32_multipliers_the_steps_run_with():
  # Each float32 multiplier is rounded on its own: where the combined multiplier they give is
  # below float32(z), the step event accounts it, never more noise than runs.
  found = 0
  for z in np.linspace(0.5, 3.0, 400):
    z32 = float(np.float32(z))
    zd, stat = (float(np.float32(v)) for v in (split_noise_multiplier(z32, 5 * z32), 5 * z32))
    combined = (zd ** -2 + (2 * stat) ** -2) ** -0.5
    mech = ExampleDPSGDMechanism(z32, 16, 1, grad_noise_multiplier=zd, stat_noise=stat)
    assert mech.accounted_multiplier == min(z32, combined)
    assert mech.step_event(600).event.noise_multiplier == pytest.approx(min(z32, combined) / 2,
                                                                         rel=1e-15)
    found += combined < z32
  assert found  # float32 rounding does make it smaller for some z


def _direct(event, count, delta, accountant="rdp"):
  rel = dp_accounting.NeighboringRelation.REPLACE_ONE
  acc = (rdp.RdpAccountant(neighboring_relation=rel) if accountant == "rdp"
         else pld.PLDAccountant(neighboring_relation=rel))
  acc.compose(event, count)
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("sampling,capacity", [
    ("poisson", None),
    # About 50 s of dp_accounting's truncated-Poisson PLD: `make test-slow` (the truncated
    # event's accounting stays in the suite: test_truncated_poisson_steps_are_accounted).
    pytest.param("poisson", 30, marks=pytest.mark.slow),
    ("fixed", None)])
def test_per_class_ledgers_equal_direct_dp_accounting(sampling, capacity):
  counts = np.array([100, 100, 50, 100, 80, 100])
  accountant = "pld" if sampling == "poisson" else "rdp"
  mech_a = ExampleDPSGDMechanism(1.1, 10, 3, sampling, capacity=capacity)
  mech_b = ExampleDPSGDMechanism(0.9, 10, 3, sampling, capacity=capacity)
  acc = ExampleLevelAccounting([PrivacyClass("a", (0, 1, 2), mech_a),
                                PrivacyClass("b", (3, 4), mech_b),
                                PrivacyClass("c", (5,), None, "published rule: no bound")],
                               counts, 1e-5, accountant)
  cohorts = [[0, 2, 3, 5], [0, 4], [0, 2, 4, 5], [1]]
  for ids in cohorts:
    ids = np.array(ids, np.int32)
    acc.on_round(Cohort(ids, np.ones(len(ids), np.float32)))

  def event(z, n):
    if sampling == "fixed":
      return dp_accounting.SampledWithoutReplacementDpEvent(n, 10, dp_accounting.GaussianDpEvent(z / 2))
    if capacity is None:
      return dp_accounting.PoissonSampledDpEvent(10 / n, dp_accounting.GaussianDpEvent(z))
    return dp_accounting.TruncatedSubsampledGaussianDpEvent(n, 10 / n, capacity, z)

  eps = {0: _direct(event(1.1, 100), 3 * 3, 1e-5, accountant),
         1: _direct(event(1.1, 100), 3, 1e-5, accountant),
         2: _direct(event(1.1, 50), 2 * 3, 1e-5, accountant),
         3: _direct(event(0.9, 100), 3, 1e-5, accountant),
         4: _direct(event(0.9, 80), 2 * 3, 1e-5, accountant)}
  for cid, e in eps.items():
    assert acc.client_epsilon(cid) == pytest.approx(e, rel=1e-9)
  rep = acc.report()
  assert rep["classes"]["a"]["epsilon_max"] == pytest.approx(max(eps[0], eps[1], eps[2]), rel=1e-9)
  assert rep["classes"]["a"]["epsilon_median"] == pytest.approx(
      float(np.median([eps[0], eps[1], eps[2]])), rel=1e-9)
  assert rep["epsilon_b_max"] == pytest.approx(max(eps[3], eps[4]), rel=1e-9)
  # A class without a mechanism never gets an epsilon, and neither does the run.
  assert rep["classes"]["c"]["formal_guarantee"] is False
  assert rep["epsilon_c_max"] is None and rep["epsilon"] is None and rep["formal_guarantee"] is False
  assert "one example of one client" in rep["privacy_unit"]
  assert rep["neighbouring_relation"].startswith("replace_one")


def test_an_empty_class_has_no_epsilon_and_does_not_break_the_run_report():
  # high_fraction=0 leaves the high class empty: nothing to account, no min() over no clients.
  mech = ExampleDPSGDMechanism(1.1, 10, 3, "fixed")
  acc = ExampleLevelAccounting([PrivacyClass("high", (), mech), PrivacyClass("low", (0, 1), mech)],
                               np.array([100, 100]), 1e-5, "rdp")
  acc.on_round(Cohort(np.array([0], np.int32), np.ones(1, np.float32)))
  rep = acc.report()
  assert rep["classes"]["high"]["clients"] == 0 and rep["classes"]["high"]["epsilon_max"] is None
  assert rep["formal_guarantee"] is True
  assert rep["epsilon"] == pytest.approx(acc.client_epsilon(0), rel=1e-12) and rep["epsilon"] > 0


def test_example_counts_are_public_so_poisson_is_accounted_under_replace_one():
  # The count sets the rate L/n and the weights, so the relation that keeps it
  # fixed is replace-one. Its epsilon is well above the add/remove value the
  # ledger reported before (about 4.0 with RDP for this client, target 4).
  mech = ExampleDPSGDMechanism(1.142, 32, 160, "poisson")
  assert mech.relation == "replace_one"
  acc = ExampleLevelAccounting([PrivacyClass("all", (0,), mech)], np.array([600]), 1e-5, "pld")
  acc.on_round(Cohort(np.array([0], np.int32), np.ones(1, np.float32)))
  eps = acc.client_epsilon(0)
  add_remove = rdp.RdpAccountant()
  add_remove.compose(dp_accounting.PoissonSampledDpEvent(32 / 600, dp_accounting.GaussianDpEvent(1.142)),
                     160)
  assert eps == pytest.approx(5.57, abs=0.01)
  assert eps > add_remove.get_epsilon(1e-5) + 1.0
  # RDP has no Poisson-sampled Gaussian under replace-one: refused before building.
  with pytest.raises(ConfigError, match="accountant.*pld"):
    ExampleLevelAccounting([PrivacyClass("all", (0,), mech)], np.array([600]), 1e-5, "rdp")


def test_truncated_poisson_steps_are_accounted():
  trunc = ExampleDPSGDMechanism(1.0, 10, 1, "poisson", capacity=12).step_event(100)
  assert isinstance(trunc, dp_accounting.TruncatedSubsampledGaussianDpEvent)
  assert (trunc.dataset_size, trunc.truncated_batch_size) == (100, 12)
  full = ExampleDPSGDMechanism(1.0, 10, 1, "poisson").step_event(100)
  # A tight capacity costs privacy: more examples' presence changes which others are kept.
  assert _direct(trunc, 50, 1e-5, "pld") > _direct(full, 50, 1e-5, "pld") + 0.05
  # A capacity that holds every example drops nothing: plain Poisson.
  assert isinstance(ExampleDPSGDMechanism(1.0, 10, 1, "poisson", capacity=100).step_event(100),
                    dp_accounting.PoissonSampledDpEvent)


@pytest.mark.parametrize("sampling,accountant", [("fixed", "rdp"), ("poisson", "pld")])
def test_calibration_meets_the_target_for_every_client(sampling, accountant):
  z = calibrate_example_noise(2.0, 1e-5, 40, 100, 10, sampling, accountant)
  e = _direct(ExampleDPSGDMechanism(z, 10, 1, sampling).step_event(100), 40, 1e-5, accountant)
  assert 1.8 < e <= 2.0 + 1e-9


def test_calibration_runs_once_for_the_same_arguments(monkeypatch):
  calls = []
  monkeypatch.setattr("fedjax_dp.privacy.example_level.calibrate",
                      lambda *a, **k: calls.append(a) or 1.5)
  calibrate_example_noise.cache_clear()
  try:
    args = (3.0, 1e-5, 12, 100, 10, "fixed", "rdp")
    assert calibrate_example_noise(*args) == calibrate_example_noise(*args) == 1.5
    assert len(calls) == 1
    calibrate_example_noise(3.0, 1e-5, 13, 100, 10, "fixed", "rdp")
    assert len(calls) == 2
  finally:
    calibrate_example_noise.cache_clear()  # no remembered stub for the other tests


def _run(cfg, data):
  setup = build(cfg, data)
  return run(setup.program, Experiment(setup.hparams, data, setup.sampler, cfg.seed,
                                      setup.accounting), cfg.rounds)


ALGS = ["spfl", "spfl-sound", "dp-fl", "adp-fl", "nodp-fl"]


@pytest.fixture(scope="module")
def runs():
  """One tiny run of each algorithm (spfl with Poisson per-step sampling, the others fixed)."""
  data = _data()
  out = {}
  for alg in ALGS:
    poisson = alg in ("spfl", "adp-fl")
    opts = {"example_sampling": "poisson"} if poisson else {}
    out[alg] = _run(_config(alg, options=opts, accountant="pld" if poisson else "rdp"), data)
  return out


@pytest.mark.parametrize("alg", ALGS)
def test_end_to_end_each_algorithm(runs, alg):
  res = runs[alg]
  s = res.summary
  assert math.isfinite(s["final_test_loss"]) and len(res.history) == 2
  assert "one example of one client" in s["privacy_unit"]
  if alg in ("spfl-sound", "dp-fl", "adp-fl"):
    assert s["formal_guarantee"] is True and 0 < s["epsilon"] < math.inf
    for c in s["classes"].values():
      assert c["formal_guarantee"] and c["epsilon_max"] >= c["epsilon_median"] >= 0
  else:
    assert s["formal_guarantee"] is False and s["epsilon"] is None
  if alg == "adp-fl":
    assert res.history[-1]["clip_all"] != pytest.approx(1.0)  # the bound moved


def test_published_spfl_reports_no_guarantee_with_reasons(runs):
  s = runs["spfl"].summary
  for name in ("high", "low"):
    c = s["classes"][name]
    assert c["formal_guarantee"] is False and c["epsilon_max"] is None and c["epsilon_median"] is None
    assert len(c["reason"]) > 20
  assert "unbounded" in s["classes"]["low"]["reason"]
  assert s["epsilon"] is None and s["epsilon_high_max"] is None and s["epsilon_low_max"] is None
  assert "no formal DP guarantee" in s["guarantee_note"]


def test_privacy_classes_split_and_bad_options():
  cls = privacy_classes(10, 0.3, 0)
  assert np.sum(cls == HIGH) == 3 and np.sum(cls == LOW) == 7
  data = _data()
  with pytest.raises(ConfigError, match="option"):
    build(_config("spfl", options={"betta": 1.0}), data)
  with pytest.raises(ConfigError, match="high_fraction"):
    build(_config("spfl", options={"high_fraction": 1.5}), data)
  with pytest.raises(ConfigError, match="batch_size"):
    build(_config("dp-fl", batch_size=1000), data)
  with pytest.raises(ConfigError, match="stat_noise"):
    build(_config("adp-fl", options={"stat_noise_ratio": 0.2}), data)


def test_spfl_classes_are_the_ids_of_the_draw():
  ids = spfl_classes(10, 0.3, 4)
  cls = privacy_classes(10, 0.3, 4)
  np.testing.assert_array_equal(ids["high"], np.flatnonzero(cls == HIGH))
  np.testing.assert_array_equal(ids["low"], np.flatnonzero(cls == LOW))
  assert sorted([*ids["high"], *ids["low"]]) == list(range(10)) and len(ids["high"]) == 3
  with pytest.raises(ConfigError, match="high_fraction"):
    spfl_classes(10, 1.5, 0)
  with pytest.raises(ConfigError, match="num_clients"):
    spfl_classes(0, 0.5, 0)


def test_byzantine_clients_and_robust_aggregators_keep_the_example_level_guarantee():
  # Each upload is private already (example-level, local to its client): an attack that reads
  # the uploads and any aggregator of them are post-processing.
  data = _data()
  base = _run(_config("dp-fl"), data)
  res = _run(_config("dp-fl", byzantine=2, attack="sample_duplication",
                     aggregator="coordinate_median"), data)
  s = res.summary
  assert s["formal_guarantee"] is True and s["epsilon"] == pytest.approx(base.summary["epsilon"])
  assert s["attacker_knowledge"] == "released"
  assert math.isfinite(s["final_test_loss"])
  assert any(h["diagnostics"]["byzantine_in_cohort"] > 0 for h in res.history)
  with pytest.raises(ConfigError, match="option trim_beta"):
    build(_config("spfl-sound", aggregator="trimmed_mean", options={"trim_beta": 0.7}), data)


@pytest.mark.parametrize("algorithm,option", [
    ("dp-fl", "beta_high"), ("dp-fl", "target_quantile"), ("nodp-fl", "high_fraction"),
    ("adp-fl", "beta_low"), ("spfl", "clip_lr"), ("spfl-sound", "init_norm_examples"),
    ("spfl", "stat_noise_ratio")])
def test_an_option_of_another_algorithm_of_the_family_is_refused(algorithm, option):
  # Each algorithm reads its own options: another's would run ignored, recorded as applied.
  from fedjax_dp.algorithms import option_table
  data = _data()
  with pytest.raises(ConfigError, match=f"option='{option}': must be one of .* for algorithm "
                                       f"'{algorithm}'"):
    build(_config(algorithm, options={option: 0.3}), data)
  assert option not in {o.name for o in option_table(algorithm)}  # nor listed by `algorithms`


def test_nodp_fl_reads_no_clip():
  from fedjax_dp.algorithms import refuse_unused
  with pytest.raises(ConfigError, match="clip=7.0: is not used by algorithm 'nodp-fl'"):
    refuse_unused(make_config(algorithm="nodp-fl", clip=7.0), given={"clip"})


@pytest.mark.parametrize("algorithm,attack,why", [
    ("dp-fl", "sample_duplication", "algorithm 'dp-fl' fixes what its attacks read"),
    ("dp_fedavg", "ipm", "algorithm 'dp_fedavg' fixes what its attacks read"),
    ("gm", "alie", "algorithm 'gm' fixes what its attacks read"),
    ("dp-rsa-f", "gaussian", "attack 'gaussian' reads no regular client"),
    ("dp-rsa-f", "ipm", None)])
def test_attacker_knowledge_is_refused_where_nothing_reads_it(algorithm, attack, why):
  # Only RSA's family lets an attack that reads the regular workers read their raw state; given
  # anywhere else, --attacker-knowledge would be ignored, so it is refused.
  from fedjax_dp.algorithms import refuse_unused
  from fedjax_dp.config import make_config
  config = make_config(algorithm=algorithm, byzantine=2, attack=attack,
                       attacker_knowledge="omniscient")
  if why is None:
    refuse_unused(config, given={"attacker_knowledge"})
  else:
    with pytest.raises(ConfigError, match=f"attacker_knowledge='omniscient': is not used: {why}"):
      refuse_unused(config, given={"attacker_knowledge"})


def test_runs_differing_only_in_numbers_share_one_compilation(count_compiles):
  # Same shapes and pieces (local_steps=3 is used by no other test, so the first run compiles).
  data = _data()
  cfg_a = _config("dp-fl", local_steps=3, clip=1.0, noise_multiplier=1.0, client_lr=0.1)
  cfg_b = _config("dp-fl", local_steps=3, clip=0.5, noise_multiplier=3.0, client_lr=0.05)
  assert build(cfg_a, data).program is build(cfg_b, data).program
  events, stop = count_compiles()
  try:
    res_a = simulate(cfg_a, data)
    first = len(events)
    res_b = simulate(cfg_b, data)
    second = len(events) - first
  finally:
    stop()
  assert first >= 1  # the round (and anything else new) compiled once
  assert second == 0
  # The numbers took effect: the bound in force and the noise std sigma * C.
  assert res_a.history[0]["clip_all"] == pytest.approx(1.0)
  assert res_b.history[0]["clip_all"] == pytest.approx(0.5)
  assert res_a.history[0]["diagnostics"]["noise_std"] == pytest.approx(1.0)
  assert res_b.history[0]["diagnostics"]["noise_std"] == pytest.approx(1.5)
  assert res_a.summary["final_test_loss"] != res_b.summary["final_test_loss"]


def test_mean_initial_norm_masks_padding():
  _, objective, params = _setup()
  x, y = _batch(6)
  xs, ys = jnp.stack([x, x]), jnp.stack([y, y])
  _, g = per_example_grads(objective, params, params, x, y)
  norms = np.asarray(jax.vmap(global_norm)(g))
  got = mean_initial_norm(objective, params, xs, ys, jnp.array([6, 2]), 6)
  assert float(got) == pytest.approx(np.concatenate([norms, norms[:2]]).mean(), rel=1e-5)


def test_each_class_record_is_the_one_the_dp_sgd_client_declares():
  # The per-class records come from the round's DP-SGD client piece, read from the hparams the
  # compiled steps use; published SP-FL's client (noise from the batch's own norms) declares none.
  data = _data()
  sound = build(_config("spfl-sound"), data)
  hp = sound.hparams
  high, low = (c.mechanism for c in sound.accounting.classes)
  assert high.grad_noise_multiplier == pytest.approx(float(hp["z_grad"]))
  assert high.stat_noise == pytest.approx(float(hp["stat_noise"]))
  assert low.grad_noise_multiplier == pytest.approx(float(hp["sigma"])) and low.stat_noise == 0.0
  assert high.noise_multiplier == low.noise_multiplier == pytest.approx(float(hp["sigma"]))
  assert sound.program.client.mechanism is not None
  published = build(_config("spfl"), data)
  assert published.program.client.mechanism is None
  assert all(c.mechanism is None for c in published.accounting.classes)
  assert build(_config("nodp-fl"), data).program.client.mechanism is None


def test_published_spfl_releases_nothing_as_covered_and_sound_spfl_its_thresholds(tmp_path):
  # Published SP-FL has no guarantee for any client: its release block covers nothing. The
  # sound variant's thresholds come from noisy statistics, so they are released and covered.
  data = _data()
  for alg, covered_clip in (("spfl", False), ("spfl-sound", True)):
    res = simulate(_config(alg, rounds=1), data, output_dir=str(tmp_path / alg))
    covered = res.summary["release"]["covered_by_guarantee"]
    assert ("clip_*" in covered["metrics_rows"]) is covered_clip
    assert ("clip_high" in res.history[0]) is covered_clip
    if not covered_clip:
      assert covered["summary"] == [] and covered["metrics_rows"] == []
