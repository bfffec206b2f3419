"""DP-RSA: sign mechanisms, master/worker updates, privacy accounting, small end-to-end runs."""

import itertools
import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.algorithms.rsa import rsa_round, worker_step
from fedjax_dp.round import CohortBatch, compiled_step
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import randomized_response as rr
from fedjax_dp.privacy import sign as psign
from fedjax_dp.transforms.sign import paper_sign, sign_flip, sign_gaussian, to_sign


def _apply(tx, u, key=0, jit=True):
  fn = lambda u, k: tx.update(u, tx.init(u), key=k)[0]
  fn = jax.jit(fn) if jit else fn
  return fn(u, jax.random.PRNGKey(key))


@pytest.mark.parametrize("gamma", [0.55, 0.8])
@pytest.mark.parametrize("jit", [True, False])
def test_sign_flip_frequency_is_binomial(gamma, jit):
  n = 200_000
  u = {"a": jnp.linspace(-1, 1, n // 2), "b": jnp.linspace(1, -1, n // 2).reshape(100, -1)}
  out = _apply(sign_flip(gamma), u, jit=jit)
  flips = sum(int(jnp.sum(o != paper_sign(x))) for o, x in zip(jax.tree_util.tree_leaves(out),
                                                               jax.tree_util.tree_leaves(u)))
  assert stats.binomtest(flips, n, 1 - gamma).pvalue > 1e-3
  assert set(np.unique(np.asarray(out["a"]))) <= {-1.0, 1.0}
  np.testing.assert_array_equal(_apply(sign_flip(1.0), u)["a"], paper_sign(u["a"]))


@pytest.mark.parametrize("value,sigma", [(0.5, 1.0), (-0.2, 0.1), (0.0, 1.0)])
def test_sign_gaussian_flip_probability_is_normal_cdf(value, sigma):
  n = 100_000
  u = jnp.full((n,), value)
  out = _apply(sign_gaussian(sigma), u)
  flips = int(jnp.sum(out != paper_sign(u)))
  p = stats.norm.cdf(-abs(value) / sigma)
  if value == 0.0:  # sign(0) = +1, flipped when the noise is negative
    p = 0.5
  assert stats.binomtest(flips, n, p).pvalue > 1e-3


def test_sign_gaussian_clips():
  n = 100_000
  big = jnp.full((n,), 5.0)
  out = _apply(sign_gaussian(1.0, clip=0.5, norm="linf"), big)
  assert stats.binomtest(int(jnp.sum(out < 0)), n, stats.norm.cdf(-0.5)).pvalue > 1e-3
  out = _apply(sign_gaussian(1.0, clip=0.5 * math.sqrt(n), norm="l2"), big)  # ||u|| = 5 sqrt(n)
  assert stats.binomtest(int(jnp.sum(out < 0)), n, stats.norm.cdf(-0.5)).pvalue > 1e-3
  # A NaN coordinate (a diverged worker) is bounded too: it is sent as a clipped 0 would be, a
  # fair coin (the sign of NaN plus noise would be fixed, breaking the per-coordinate guarantee).
  for norm, c in (("linf", 0.5), ("l2", 0.5 * math.sqrt(n))):
    out = _apply(sign_gaussian(1.0, clip=c, norm=norm), jnp.full((n,), jnp.nan))
    assert stats.binomtest(int(jnp.sum(out < 0)), n, 0.5).pvalue > 1e-3
  # Salted: the flip and the Gaussian draw independently from the same key.
  assert not np.array_equal(_apply(sign_flip(0.6), jnp.ones(1000)), _apply(sign_gaussian(0.25), jnp.ones(1000) * 0.1))


def test_paper_sign_and_to_sign():
  np.testing.assert_array_equal(paper_sign(jnp.array([-2.0, 0.0, 3.0])), [-1, 1, 1])
  np.testing.assert_array_equal(_apply(to_sign(), jnp.array([-2.0, 0.0, 3.0])), [-1, 1, 1])


def test_worker_update_with_known_inputs():
  x0 = {"w": jnp.array([1.0, -2.0, 0.5])}
  xk = {"w": jnp.array([1.5, -2.0, 0.0])}
  g = {"w": jnp.array([0.2, 0.0, -1.0])}
  out = worker_step(xk, x0, g, lr=0.1, lam=0.5)
  np.testing.assert_allclose(out["w"], [1.5 - 0.1 * (0.2 + 0.5), -2.0 - 0.1 * 0.5, 0.0 - 0.1 * (-1.0 - 0.5)])


class _Model:
  def init(self, key):
    return {"w": jnp.zeros(3)}


X0 = jnp.array([0.0, 1.0, -1.0])
WORKERS = jnp.array([[1., 1., 1.], [-1., 2., 0.], [5., 5., 5.], [0., 0., -2.], [0.5, 0.5, -0.5]])
BATCH = CohortBatch(jnp.zeros((5, 2, 1)), jnp.zeros((5, 2), jnp.int32), jnp.ones(5, jnp.int32),
                    jnp.array([3, 4, 0, 1, 0]), jnp.array([1., 1., 1., 1., 0.]))


def _hp(**kw):
  from fedjax_dp.algorithms import options
  hp = {o.name: o.default for o in options.byzantine() if not o.static}
  hp.update(alie_z=float("nan"), server_lr=0.1, client_lr=0.1, l2=0.004, byzantine=1, **{"lambda": 0.01})
  hp.update(kw)
  from fedjax_dp.algorithms import as_hparams
  return {k: jnp.asarray(v) for k, v in as_hparams(hp).items()}


def _rsa_round(attack, grads, perturb=None, knowledge="released", num_clients=5, **hp):
  rnd = rsa_round(_Model(), num_clients, lambda p, x, y, c, k: (jnp.sum(p["w"]), grads),
                  perturb or (lambda hp: to_sign()), attack=attack, knowledge=knowledge)
  hp = _hp(**hp)
  return rnd, hp, rnd.init(jax.random.PRNGKey(0), hp)


def test_round_step_gathers_scatters_and_aggregates_signs():
  """K=5 workers, the last (id 4) Byzantine with sign_flip; cohort [3, 4, 0, 1, pad]."""
  grads = {"w": jnp.array([0.1, -0.2, 0.3])}
  rnd, hp, state = _rsa_round("sign_flip", grads)
  state = state._replace(params={"w": X0}, rows={"w": WORKERS})
  new, metrics = compiled_step(rnd, "host")(state, hp, BATCH, jax.random.PRNGKey(0))
  s = lambda v: np.where(v >= 0, 1.0, -1.0)
  x0n, W = np.asarray(X0), np.asarray(WORKERS)
  total = s(x0n - W[3]) + s(x0n - (-5.0 * W[4])) + s(x0n - W[0]) + s(x0n - W[1])
  # Eq. 11: x_0 - alpha (u x_0 + lambda sum_k sign(m_k)).
  np.testing.assert_allclose(new.params["w"], x0n - 0.1 * (0.004 * x0n + 0.01 * total), rtol=1e-6)
  g = np.asarray(grads["w"])
  expect = W.copy()
  for k in (3, 4, 0, 1):  # Byzantine worker 4 keeps its honest local update
    expect[k] = W[k] - 0.1 * (g + 0.01 * s(W[k] - x0n))
  np.testing.assert_allclose(new.rows["w"], expect, rtol=1e-6)  # row 2 untouched, padding wrote nothing
  assert float(metrics["flip_rate"]) == 0.0 and float(metrics["nonfinite_rows"]) == 0.0


@pytest.mark.parametrize("knowledge", ["released", "omniscient"])
def test_sample_duplication_copies_the_released_message(knowledge):
  """The attackers copy what a regular worker *sends* (here a perturbation that negates
  every sign), not its raw model; reading the raw model is only the omniscient variant."""
  import optax
  negate = optax.GradientTransformationExtraArgs(
      lambda p: optax.EmptyState(), lambda u, s, p=None, **kw: (jax.tree_util.tree_map(
          lambda v: -paper_sign(v), u), s))
  rnd, hp, state = _rsa_round("sample_duplication", {"w": jnp.zeros(3)}, lambda hp: negate,
                              knowledge, l2=0.0)
  state = state._replace(params={"w": X0}, rows={"w": WORKERS})
  new, _ = compiled_step(rnd, "host")(state, hp, BATCH, jax.random.PRNGKey(0))
  s = lambda v: np.where(v >= 0, 1.0, -1.0)
  x0n, W = np.asarray(X0), np.asarray(WORKERS)
  honest = -s(x0n - W[3]) - s(x0n - W[0]) - s(x0n - W[1])
  # Worker 0 is the cohort's regular worker of lowest id (its row is not the first): the one
  # copied.
  byz = -s(x0n - W[0]) if knowledge == "released" else s(x0n - W[0])
  np.testing.assert_allclose(new.params["w"], x0n - 0.1 * 0.01 * (honest + byz), rtol=1e-6)


@pytest.mark.parametrize("attack,knowledge,formal", [
    ("alie", "released", True), ("alie", "omniscient", False), ("sample_duplication", "released", True),
    ("ipm", "omniscient", False), ("gaussian", "omniscient", True)])
def test_omniscient_attacks_void_the_guarantee(digits, attack, knowledge, formal):
  from fedjax_dp.algorithms import build
  setup = build(_config("dp-rsa-f", byzantine=2, attack=attack, attacker_knowledge=knowledge,
                        epsilon=1.0), digits)
  setup.accounting.on_round(None)
  rep = setup.accounting.report()
  # Gaussian noise reads no honest row: "omniscient" changes nothing it reads.
  assert rep["attacker_knowledge"] == ("omniscient" if not formal else "released")
  assert rep["formal_guarantee"] is formal
  assert (rep["epsilon"] is None) is (not formal)
  if not formal:
    assert "omniscient" in rep["guarantee_note"]


def test_nonfinite_byzantine_messages_are_rejected():
  rnd, hp, state = _rsa_round("nonfinite", {"w": jnp.zeros(3)}, num_clients=3, l2=0.0)
  batch = CohortBatch(jnp.zeros((3, 1, 1)), jnp.zeros((3, 1), jnp.int32), jnp.ones(3, jnp.int32),
                      jnp.arange(3), jnp.ones(3))
  new, metrics = compiled_step(rnd, "host")(state, hp, batch, jax.random.PRNGKey(1))
  assert np.all(np.isfinite(new.params["w"])) and float(metrics["nonfinite_rows"]) == 1.0
  np.testing.assert_allclose(new.params["w"], -0.1 * 0.01 * 2 * np.ones(3))  # two honest +1 signs


# ----------------------------------------------------------------------------- privacy


def test_gamma_maps_onto_randomized_response_event():
  """dp_accounting's own PLD of one response (count 1, which it handles) is ln(gamma/(1-gamma))."""
  from dp_accounting import pld
  for gamma in (0.55, 0.6, 0.8):
    acc = pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(rr.randomized_response_event(gamma))
    assert acc.get_epsilon(1e-12) == pytest.approx(math.log(gamma / (1 - gamma)), rel=1e-3)


def _brute_force_delta(eps, gamma, k):
  delta = 0.0
  for out in itertools.product([0, 1], repeat=k):
    kept = sum(out)
    p = gamma ** kept * (1 - gamma) ** (k - kept)
    q = (1 - gamma) ** kept * gamma ** (k - kept)
    delta += max(p - math.exp(eps) * q, 0.0)
  return delta


@pytest.mark.parametrize("gamma,k,eps", [(0.6, 5, 0.5), (0.7, 8, 1.0), (0.55, 10, 0.0)])
def test_closed_form_matches_enumeration(gamma, k, eps):
  assert rr.randomized_response_delta_exact(eps, gamma, k) == pytest.approx(
      _brute_force_delta(eps, gamma, k), abs=1e-12)


@pytest.mark.parametrize("gamma,d,rounds", [(0.6, 1, 1), (0.55, 30, 20), (0.799, 100, 50), (0.55, 42310, 400)])
def test_ledger_epsilon_against_closed_form(gamma, d, rounds):
  delta = 1e-5
  mech = psign.SignFlipMechanism(gamma, d)
  rep = psign.composed_epsilon(mech, rounds, delta)
  count = d * rounds
  exact = rr.randomized_response_epsilon_exact(gamma, count, delta)
  assert rep["epsilon_exact"] == pytest.approx(exact)
  assert exact <= rep["epsilon"] <= max(1.25 * exact, exact + 0.05)  # RDP is an upper bound, and tight-ish
  assert rep["epsilon"] <= count * math.log(gamma / (1 - gamma)) + 1e-3 or count == 1
  assert rep["epsilon_per_coordinate_round"] == pytest.approx(math.log(gamma / (1 - gamma)))
  # The run's accounting composes the same thing round by round.
  acc = psign.SignAccounting(mech, delta, rounds)
  for _ in range(rounds):
    acc.on_round(None)
  r = acc.report()
  assert r["epsilon"] == pytest.approx(rep["epsilon"], rel=1e-9)
  assert r["epsilon_exact"] == pytest.approx(exact)
  assert r["neighbouring_relation"] == "replace_one" and r["formal_guarantee"]


def test_pld_refused_for_randomized_response():
  with pytest.raises(ConfigError, match="PLD"):
    psign.SignAccounting(psign.SignFlipMechanism(0.6, 10), 1e-5, 3, accountant="pld")


def test_sign_gaussian_mechanisms():
  assert not psign.SignGaussianMechanism(0.1, 10).formal_guarantee
  sigma = psign.sign_gaussian_sigma_for_epsilon(0.4, 0.002)
  m = psign.SignGaussianMechanism(sigma, 10, clip=0.002)
  assert m.epsilon_per_coordinate_round == pytest.approx(0.4)
  assert m.coordinate_keep_prob == pytest.approx(rr.keep_prob_for_epsilon(0.4))
  l2 = psign.SignGaussianMechanism(1.0, 10, clip=0.25, norm="l2")
  assert l2.round_event() == dp_accounting.GaussianDpEvent(2.0)
  assert l2.epsilon_per_coordinate_round is None
  acc = psign.SignAccounting(psign.SignGaussianMechanism(0.1, 10), 1e-5, 2)
  acc.on_round(None)
  rep = acc.report()
  assert rep["epsilon"] is None and not rep["formal_guarantee"] and "no formal guarantee" in rep["guarantee_note"]


def test_cli_privacy_sign_flip(capsys):
  from fedjax_dp.cli import main
  assert main(["privacy", "--mechanism", "sign-flip", "--keep-prob", "0.6", "--rounds", "20",
               "--dimension", "30", "--delta", "1e-5"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["epsilon_per_coordinate_round"] == pytest.approx(math.log(1.5))
  assert out["epsilon"] == pytest.approx(psign.composed_epsilon(psign.SignFlipMechanism(0.6, 30), 20, 1e-5)["epsilon"])
  assert out["epsilon"] >= out["epsilon_exact"]
  assert main(["privacy", "--mechanism", "sign-flip", "--keep-prob", "0.3", "--rounds", "2",
               "--dimension", "3", "--delta", "1e-5"]) == 2


# ----------------------------------------------------------------------------- end to end


def _config(algorithm, rounds=40, **options):
  from fedjax_dp.config import make_config
  fields = {k: options.pop(k) for k in ("byzantine", "attack", "attacker_knowledge", "aggregator")
            if k in options}
  return make_config(algorithm=algorithm, dataset="digits", num_clients=10, sampling="fixed",
                     cohort_size=10, model="rsa_mlp", rounds=rounds, batch_size=16, client_lr=0.05,
                     eval_every=rounds, noise_multiplier=None, target_epsilon=None, options=options,
                     **fields)


@pytest.fixture(scope="module")
def digits():
  from fedjax_dp.experiment import load_data
  return load_data(_config("rsa"))


def test_end_to_end_rsa_and_dp_rsa(digits):
  from fedjax_dp.experiment import simulate
  rsa = simulate(_config("rsa", byzantine=2, attack="sign_flip", **{"lambda": 0.05}), digits)
  assert rsa.summary["final_accuracy"] > 0.3  # 10 classes: chance is 0.1
  assert rsa.summary["epsilon"] is None and not rsa.summary["formal_guarantee"]
  f = simulate(_config("dp-rsa-f", byzantine=2, attack="gaussian", epsilon=1.38, **{"lambda": 0.05}), digits)
  assert math.isfinite(f.summary["final_accuracy"]) and f.summary["formal_guarantee"]
  assert f.history[-1]["epsilon_per_coordinate_round"] == pytest.approx(1.38)
  assert f.summary["epsilon"] >= f.summary["epsilon_exact"] > 0
  assert abs(f.history[-1]["diagnostics"]["flip_rate"] - (1 - rr.keep_prob_for_epsilon(1.38))) < 0.01


def test_end_to_end_sgd_fails_under_gaussian_attack_and_gm_does_not(digits):
  from fedjax_dp.experiment import simulate
  sgd = simulate(_config("sgd", rounds=30, byzantine=2, attack="gaussian"), digits)
  gm = simulate(_config("gm", rounds=30, byzantine=2, attack="gaussian", gm_max_iter=20), digits)
  assert gm.summary["final_accuracy"] > sgd.summary["final_accuracy"] + 0.2


def test_bad_options_rejected_before_compiling(digits):
  from fedjax_dp.algorithms import build
  for kw in ({"byzantine": 10}, {"attack": "sybil"}, {"aggregator": "mean_of_means"}):
    with pytest.raises(ConfigError):
      _config("rsa", **kw)
  for cfg in (_config("rsa", alpha=1), _config("dp-rsa-f", epsilon=1.0, keep_prob=0.7),
              _config("dp-rsa-g", epsilon=1.0, sign_sigma=0.1), _config("dp-rsa-g", epsilon=1.0),
              _config("rsa", aggregator="krum"), _config("median", aggregator="krum")):
    with pytest.raises(ConfigError):
      build(cfg, digits)


def test_the_perturbation_takes_its_default_unless_an_epsilon_is_given(digits):
  from fedjax_dp.algorithms import build
  from fedjax_dp.privacy.randomized_response import keep_prob_for_epsilon
  keep = lambda cfg: float(build(cfg, digits).hparams["keep_prob"])
  assert keep(_config("dp-rsa-f")) == pytest.approx(0.8)
  assert keep(_config("dp-rsa-f", keep_prob=0.7)) == pytest.approx(0.7)
  assert keep(_config("dp-rsa-f", epsilon=1.0)) == pytest.approx(keep_prob_for_epsilon(1.0))
  sigma = lambda cfg: float(build(cfg, digits).hparams["sign_sigma"])
  assert sigma(_config("dp-rsa-g")) == pytest.approx(0.016)
  assert sigma(_config("dp-rsa-g", epsilon=0.2, sign_clip=0.002)) == pytest.approx(0.016, rel=0.01)
  with pytest.raises(ConfigError, match="give at most one of keep_prob and epsilon"):
    build(_config("dp-rsa-f", epsilon=1.0, keep_prob=0.8), digits)


def test_summary_records_only_the_settings_the_algorithm_uses(digits):
  # DP-RSA's guarantee comes from sign perturbation: clip, target_epsilon and local steps do not
  # apply, and the summary does not record them as if they did.
  from fedjax_dp.experiment import simulate
  s = simulate(_config("dp-rsa-f", rounds=1, epsilon=1.0), digits).summary
  for name in ("clip", "target_epsilon", "noise_multiplier", "local_steps", "denominator"):
    assert name not in s["config"]["algorithm"] and name in s["config"]["not_used"]
  assert s["config"]["run"]["batch_size"] == 16 and s["config"]["algorithm"]["epsilon"] == 1.0
  assert (s["delta"], s["accountant"]) == (s["config"]["run"]["delta"], "rdp")
  # A run with no mechanism accounts nothing: no delta or accountant, in its report or its config.
  for algorithm in ("rsa", "median"):
    s = simulate(_config(algorithm, rounds=1), digits).summary
    assert (s["epsilon"], s["delta"], s["accountant"], s["formal_guarantee"]) == (None,) * 3 + (False,)
    assert {"delta", "accountant"} <= set(s["config"]["not_used"]) and "delta" not in s["config"]["run"]


def test_the_sign_mechanism_is_the_one_the_perturbation_piece_declares(digits):
  # DP-RSA's ledger comes from the worker's perturbation piece, read from the hyper-parameters
  # its transform uses; a hand-built worker that sends exact signs declares nothing.
  from fedjax_dp.algorithms import build
  from fedjax_dp.algorithms.rsa import perturbation, rsa_client
  setup = build(_config("dp-rsa-f", epsilon=1.0), digits)
  mech = setup.accounting.mechanism
  assert mech.keep_prob == pytest.approx(float(setup.hparams["keep_prob"]))
  assert mech.epsilon_per_coordinate_round == pytest.approx(1.0, rel=1e-6)
  g = build(_config("dp-rsa-g", sign_sigma=0.01, sign_clip=0.002), digits).accounting.mechanism
  assert (g.sigma, g.clip) == (pytest.approx(0.01), pytest.approx(0.002))
  assert rsa_client(lambda *a: None, perturbation("rsa")).mechanism is None
  assert rsa_client(lambda *a: None, lambda hp: to_sign()).mechanism is None


def test_sign_gaussian_without_a_clip_reads_no_delta():
  # No guarantee without sign_clip: delta and the accountant would be recorded unread.
  from fedjax_dp.algorithms import refuse_unused
  from fedjax_dp.config import make_config
  for name in ("delta", "accountant"):
    value = {"delta": 1e-6, "accountant": "pld"}[name]
    with pytest.raises(ConfigError, match=f"{name}=.*dp-rsa-g without sign_clip has no guarantee"):
      refuse_unused(make_config(algorithm="dp-rsa-g", options={"sign_sigma": 0.1}, **{name: value}),
                    given={name})
    refuse_unused(make_config(algorithm="dp-rsa-g", options={"sign_sigma": 0.1, "sign_clip": 0.01},
                              **{name: value}), given={name})


@pytest.mark.parametrize("settings", [dict(sampling="fixed", cohort_size=5),
                                      dict(sampling="poisson", sampling_prob=0.2),
                                      dict(attack="sign-flip", byzantine=2, aggregator="coordinate_median")])
def test_a_summarys_configuration_is_a_valid_config_file(settings, tmp_path):
  """What summary.json records is accepted back as a ``--config`` file as written: the
  settings that the others leave unread (attacker_knowledge without an attack, cohort_size under
  Poisson sampling, ...) are listed as not used instead of recorded, and that list sets nothing."""
  from fedjax_dp.algorithms import refuse_unused
  from fedjax_dp.config import load_config_file, make_config
  from fedjax_dp.experiment import recorded_config
  config = make_config(num_clients=20, **settings)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(recorded_config(config)))
  recorded = load_config_file(str(path))
  assert "not_used" not in recorded
  refuse_unused(make_config(**recorded), given=set(recorded))
  assert make_config(**recorded).to_dict() == {
      **config.to_dict(), **{k: make_config().to_dict()[k] for k in recorded_config(config)["not_used"]},
      "model": recorded["model"]}
  unread = {"fixed": "sampling_prob", "poisson": "cohort_size"}[config.sampling]
  assert unread in recorded_config(config)["not_used"] and unread not in recorded
  # Read only by RSA's family with an attack that reads the regular workers.
  assert "attacker_knowledge" not in recorded
