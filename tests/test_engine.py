"""The round engine: vmap equals a Python loop, padding is inert, seeds reproduce, sampling."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dp.algorithms import build
from fedjax_dp.round import CohortBatch, client_keys, compiled_step
from fedjax_dp.config import make_config
from fedjax_dp.data import Split, load_federated
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import simulate
from fedjax_dp.privacy import GaussianSumMechanism
from fedjax_dp.sampling import (SAMPLINGS, FixedSizeSampler, PoissonSampler, check_design,
                                make_sampler)


@pytest.fixture(scope="module")
def digits():
  return load_federated("digits", Split(60), seed=0)


def _config(**kw):
  base = dict(num_clients=60, sampling_prob=0.2, rounds=3, local_steps=3, batch_size=4, model="mlp",
              clip=0.5, noise_multiplier=1.0, target_epsilon=None, eval_every=1)
  base.update(kw)
  return make_config(**base)


def _batch(data, ids, mask):
  ids = jnp.asarray(ids, jnp.int32)
  return CohortBatch(jnp.asarray(data.x)[ids], jnp.asarray(data.y)[ids], jnp.asarray(data.counts)[ids],
                     ids, jnp.asarray(mask, jnp.float32))


def _round(setup):
  """``(round, hparams as arrays, state)`` of a built setup."""
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  return setup.program, hp, setup.program.init(jax.random.PRNGKey(0), hp)


@pytest.mark.parametrize("algorithm", ["fedavg", "dp_fedavg"])
def test_vmapped_round_equals_python_loop(digits, algorithm):
  rnd, hp, state = _round(build(_config(algorithm=algorithm, noise_multiplier=0.0), digits))
  ids, mask = [4, 9, 17, 30], [1, 1, 1, 1]
  key = jax.random.PRNGKey(7)
  new_state, metrics = compiled_step(rnd, "host")(state, hp, _batch(digits, ids, mask), key)
  # The same client update, one client at a time.
  k_clients, _ = jax.random.split(key)
  keys = client_keys(k_clients, jnp.asarray(ids))
  update = jax.jit(rnd.client(hp))
  deltas, norms = [], []
  for i, cid in enumerate(ids):
    out = update(state.params, jnp.asarray(digits.x[cid]), jnp.asarray(digits.y[cid]),
                 jnp.asarray(digits.counts[cid]), (), (), keys[i])
    deltas.append(out.upload)
    norms.append(float(out.norm))
  weights = np.ones(4) if algorithm == "dp_fedavg" else digits.counts[ids].astype(np.float64)
  mean = jax.tree_util.tree_map(lambda *ds: sum(w * d for w, d in zip(weights, ds)) / weights.sum(), *deltas)
  if algorithm == "dp_fedavg":  # expected-size denominator q N = 12
    mean = jax.tree_util.tree_map(lambda m: m * weights.sum() / (0.2 * 60), mean)
  expected = jax.tree_util.tree_map(jnp.add, state.params, mean)  # server SGD with lr 1
  for a, b in zip(jax.tree_util.tree_leaves(new_state.params), jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["update_norm"], norms, rtol=1e-5)


def test_padded_clients_are_inert(digits):
  rnd, hp, state = _round(build(_config(), digits))  # with noise: the noise key must not depend on padding
  step = compiled_step(rnd, "host")
  key = jax.random.PRNGKey(3)
  a, _ = step(state, hp, _batch(digits, [5, 11], [1, 1]), key)
  # Same cohort padded to capacity 5 with slots that point at real clients' data.
  b, m = step(state, hp, _batch(digits, [5, 11, 0, 3, 7], [1, 1, 0, 0, 0]), key)
  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
  assert np.asarray(m["mask"]).tolist() == [1, 1, 0, 0, 0]


def test_same_seed_same_result(digits):
  r1 = simulate(_config(rounds=2), digits)
  r2 = simulate(_config(rounds=2), digits)
  r3 = simulate(_config(rounds=2, seed=1), digits)
  strip = lambda h: [{k: ({kk: vv for kk, vv in v.items() if kk != "seconds"} if k == "diagnostics" else v)
                      for k, v in r.items()} for r in h]
  assert strip(r1.history) == strip(r2.history)
  leaves = lambda r: jax.tree_util.tree_leaves(r.state.params)
  for x, y in zip(leaves(r1), leaves(r2)):
    np.testing.assert_array_equal(x, y)
  assert not all(np.array_equal(x, y) for x, y in zip(leaves(r1), leaves(r3)))


def test_host_placement_matches_device(digits):
  a = simulate(_config(rounds=2, placement="device"), digits)
  b = simulate(_config(rounds=2, placement="host"), digits)
  for x, y in zip(jax.tree_util.tree_leaves(a.state.params), jax.tree_util.tree_leaves(b.state.params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_history_records_and_epsilon_increase(digits, tmp_path):
  r = simulate(_config(rounds=3), digits, output_dir=str(tmp_path))
  assert [h["round"] for h in r.history] == [1, 2, 3]
  eps = [h["epsilon"] for h in r.history]
  assert eps[0] < eps[1] < eps[2] == pytest.approx(r.summary["epsilon"])
  for h in r.history:
    d = h["diagnostics"]
    assert 0 <= d["fraction_clipped"] <= 1 and d["update_norm"]["q10"] <= d["update_norm"]["q90"]
  assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3
  assert (tmp_path / "summary.json").exists()
  # An earlier run's files are kept unless overwrite, as by `fedjax-dp run`.
  before = (tmp_path / "summary.json").read_bytes()
  with pytest.raises(ConfigError, match="already holds metrics.jsonl"):
    simulate(_config(rounds=1), digits, output_dir=str(tmp_path))
  assert (tmp_path / "summary.json").read_bytes() == before
  assert simulate(_config(rounds=1), digits, output_dir=str(tmp_path), overwrite=True).summary[
      "rounds"] == 1


def test_poisson_sampling_frequencies():
  n, p, rounds = 200, 0.1, 400
  s = PoissonSampler(n, p, seed=0)
  counts = np.zeros(n)
  sizes = []
  for _ in range(rounds):
    c = s.sample()
    assert c.ids.shape == (s.capacity,) and c.mask.shape == (s.capacity,)
    assert len(set(c.real_ids.tolist())) == c.size
    counts[c.real_ids] += 1
    sizes.append(c.size)
  # Each client's inclusion count is Binomial(rounds, p): two-sided test on the total,
  # and no single client far outside its binomial range (Bonferroni over clients).
  total = counts.sum()
  assert stats.binomtest(int(total), n * rounds, p).pvalue > 1e-3
  lo, hi = stats.binom.ppf([1e-4 / n, 1 - 1e-4 / n], rounds, p)
  assert counts.min() >= lo and counts.max() <= hi
  assert abs(np.mean(sizes) - n * p) < 6 * np.sqrt(n * p * (1 - p) / rounds)


def test_poisson_never_truncates():
  s = PoissonSampler(100, 0.5, seed=0, capacity=10)
  for _ in range(5):
    c = s.sample()
    assert c.size == int(c.mask.sum()) and c.size <= s.capacity
  assert s.capacity_grew >= 1 and s.capacity >= 30


def test_fixed_size_sampler():
  s = FixedSizeSampler(50, 7, seed=1)
  c = s.sample()
  assert c.size == 7 and len(set(c.ids.tolist())) == 7
  with pytest.raises(ConfigError, match="cohort_size"):
    FixedSizeSampler(5, 6, seed=0)


@pytest.mark.parametrize("kind, kw, field", [
    ("poisson", dict(prob=0.0), "sampling_prob"), ("poisson", dict(prob=1.5), "sampling_prob"),
    ("fixed", dict(cohort_size=0), "cohort_size"), ("fixed", dict(cohort_size=11), "cohort_size"),
    ("uniform", dict(prob=0.1), "sampling")])
def test_one_statement_of_the_sampling_ranges_refuses_for_each_layer(kind, kw, field):
  # The run's settings, the samplers and the mechanism record refuse the same ranges, stated once.
  prob, cohort = kw.get("prob", 0.1), kw.get("cohort_size", 2)
  refusals = [lambda: check_design(kind, 10, **kw),
              lambda: make_config(sampling=kind, num_clients=10, sampling_prob=prob,
                                  cohort_size=cohort),
              lambda: GaussianSumMechanism(1.0, 1.0, kind, prob, 10, cohort)]
  if kind in SAMPLINGS:
    refusals.append(lambda: make_sampler(kind, 10, 0, prob, cohort))
  for refuse in refusals:
    with pytest.raises(ConfigError, match=f"invalid {field}="):
      refuse()


@pytest.mark.heavy
def test_quickstart_reaches_sensible_accuracy():
  """The default configuration (the CLI's quickstart) learns under its privacy budget."""
  r = simulate(make_config())
  assert r.summary["formal_guarantee"] is True
  assert r.summary["epsilon"] <= 8.0 + 1e-9
  assert r.summary["final_accuracy"] >= 0.75  # measured 0.872; chance is 0.1


def test_a_diverged_client_does_not_void_the_dp_fedavg_bound(digits):
  # One client's data holds Inf: its local update is non-finite. Before the fix
  # clip_l2 turned it into NaN and the released model was NaN.
  x = np.array(digits.x, copy=True)
  x[5] = np.inf
  data = dataclasses.replace(digits, x=x)
  rnd, hp, state = _round(build(_config(algorithm="dp_fedavg"), data))
  new_state, metrics = compiled_step(rnd, "host")(state, hp, _batch(data, [5, 9, 17], [1, 1, 1]),
                                                  jax.random.PRNGKey(1))
  assert int(metrics["nonfinite_updates"]) == 1
  for leaf in jax.tree_util.tree_leaves(new_state.params):
    assert bool(jnp.all(jnp.isfinite(leaf)))


def test_an_accountant_that_cannot_compose_the_event_is_refused_before_compiling(digits):
  # dp_accounting's PLD accountant has no sampled-without-replacement event.
  with pytest.raises(ConfigError, match="accountant.*rdp"):
    build(_config(algorithm="dp_fedavg", sampling="fixed", cohort_size=10, accountant="pld"), digits)


def test_realized_denominator_with_poisson_sampling_is_refused_in_private_runs(digits, capsys):
  # |P_t| is an unnoised statistic of the secret draw; the released average reveals it.
  with pytest.raises(ConfigError, match="denominator.*expected"):
    build(_config(algorithm="dp_fedavg", denominator="realized"), digits)
  # Fixed-size sampling: the cohort size is public, so the realized denominator is fine,
  # and non-private FedAvg has no guarantee to lose.
  build(_config(algorithm="dp_fedavg", denominator="realized", sampling="fixed", cohort_size=10), digits)
  build(_config(algorithm="fedavg", denominator="realized"), digits)
  from fedjax_dp.cli import main
  assert main(["run", "--num-clients", "40", "--denominator", "realized", "--rounds", "1",
               "--output-dir", "/nonexistent/never-written"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "denominator" in err[0]


@pytest.mark.parametrize("algorithm", ["dp_fedavg", "blur+lus"])
def test_changing_hyper_parameters_does_not_recompile(digits, algorithm, count_compiles):
  cfg = _config(algorithm=algorithm, rounds=2)
  simulate(cfg, digits)  # compiles the round and the evaluation once
  events, stop = count_compiles()
  try:
    changed = cfg.replace(clip=0.2, noise_multiplier=2.5, client_lr=0.03, server_lr=0.7, seed=4,
                          options={"lambda": 0.1, "sparsity": 0.3} if algorithm == "blur+lus" else {})
    r = simulate(changed, digits)
  finally:
    stop()
  assert events == []
  assert r.summary["noise_multiplier"] == pytest.approx(2.5)
  # A change of structure (the number of local steps is a shape) does compile: 9 steps, which no
  # other test runs (compiled rounds are cached per process, so a pytest worker that ran another
  # test's round of this shape first would compile nothing here).
  events, stop = count_compiles()
  try:
    simulate(cfg.replace(local_steps=9), digits)
  finally:
    stop()
  assert len(events) >= 1


def test_rounds_after_the_first_compile_nothing(digits, count_compiles):
  events, stop = count_compiles()
  seen = []
  try:
    # A batch size no other test uses: nothing of this round is compiled yet.
    simulate(_config(rounds=4, eval_every=1, seed=11, batch_size=7), digits,
             on_round=lambda rec: seen.append(len(events)))
  finally:
    stop()
  assert seen[0] >= 1 and seen[1:] == [seen[0]] * 3, seen


def test_a_round_whose_pieces_do_not_add_noise_claims_no_guarantee(digits):
  from fedjax_dp.aggregators import robust
  from fedjax_dp.privacy.mechanisms import user_level_mechanism
  setup = build(_config(algorithm="dp_fedavg", noise_multiplier=1.0), digits)
  mech = user_level_mechanism(setup.program, setup.hparams, "poisson", 0.2)
  assert mech.formal_guarantee and mech.noise_multiplier == pytest.approx(1.0)
  # Hand-built: the same round with its noisy mean replaced by the coordinate median.
  median = dataclasses.replace(setup.program, aggregator=lambda hp: robust.get("coordinate_median"))
  mech = user_level_mechanism(median, setup.hparams, "poisson", 0.2)
  assert not mech.formal_guarantee and "without noise" in mech.guarantee_note
  # Hand-built with a server rule: it reads the clients' raw per-client values (aux).
  ruled = dataclasses.replace(setup.program, hooks=setup.program.hooks._replace(
      server_rule=lambda server, hp, aux, mask, ids: server))
  mech = user_level_mechanism(ruled, setup.hparams, "poisson", 0.2)
  assert not mech.formal_guarantee and "server rule" in mech.guarantee_note
  # From the configuration: --aggregator coordinate_median with a target epsilon.
  s = build(_config(algorithm="dp_fedavg", noise_multiplier=None, target_epsilon=4.0,
                    aggregator="coordinate_median"), digits)
  s.accounting.on_round(None)
  rep = s.accounting.report()
  assert rep["formal_guarantee"] is False and rep["epsilon"] is None
  assert rep["delta"] is None and rep["accountant"] is None and rep["neighbouring_relation"] is None
  assert "coordinate_median" in rep["guarantee_note"]


def test_a_hand_built_round_whose_attack_reads_the_regular_rows_claims_no_guarantee(digits):
  # The regular clients' clipped updates are not released: attackers copying them (sample
  # duplication) multiply a client's weight in the noised sum, as in DP-FedAvg.
  from fedjax_dp.experiment import custom_setup
  config = _config(algorithm="dp_fedavg", noise_multiplier=1.0)
  setup = build(config, digits)
  for attack, byzantine, knowledge, formal in (("sample_duplication", 5, "omniscient", False),
                                               ("gaussian", 5, "released", True),
                                               ("sample_duplication", 0, None, True)):
    rnd = dataclasses.replace(setup.program, attack=attack)
    custom = custom_setup(rnd, {**setup.hparams, "byzantine": byzantine}, config, digits)
    custom.accounting.on_round(None)
    rep = custom.accounting.report()
    assert rep.get("attacker_knowledge") == knowledge and rep["formal_guarantee"] is formal


@pytest.mark.parametrize("algorithm", ["dp_fedavg", "ddgauss"])
def test_fixed_cohorts_with_byzantine_clients_are_accounted_over_the_regular_ones(digits,
                                                                                  algorithm):
  # 2 of the 60 clients Byzantine: they know when they are sampled, so the ledger samples the
  # cohort's M - K regular clients from the 58 regular ones (a mixture over the K Byzantine
  # clients sampled), and a target epsilon is met that way.
  def report(byzantine, **kw):
    setup = build(_config(algorithm=algorithm, sampling="fixed", cohort_size=12,
                          byzantine=byzantine, attack="gaussian" if byzantine else "none", **kw),
                  digits)
    setup.accounting.on_round(None)
    return setup.accounting.report()
  rep, plain = report(2), report(0)
  assert rep["formal_guarantee"] and rep["epsilon"] > plain["epsilon"]
  assert "M - K of the 58 regular clients" in rep["guarantee_note"] if algorithm == "ddgauss" else (
      "58 regular clients, M - K" in rep["dp_event"])
  assert "Hypergeometric(N=60, byzantine=2, M=12)" in rep["dp_event"] or algorithm == "ddgauss"
  target = report(2, noise_multiplier=None, target_epsilon=3.0, rounds=1)
  assert 3.0 - 1e-3 < target["epsilon"] <= 3.0


def test_dp_fedavg_with_byzantine_clients_and_a_robust_aggregator_from_the_cli(tmp_path, capsys):
  import json
  from fedjax_dp.cli import main
  out = tmp_path / "byz"
  assert main(["run", "--num-clients", "40", "--rounds", "2", "--local-steps", "2", "--model", "mlp",
               "--byzantine", "4", "--attack", "sign_flip", "--aggregator", "trimmed_mean",
               "--set", "trim_beta=0.2", "--output-dir", str(out), "--no-progress"]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert summary["config"]["algorithm"]["attack"]["byzantine"] == 4
  assert summary["config"]["algorithm"]["aggregator"]["name"] == "trimmed_mean"
  assert summary["formal_guarantee"] is False and summary["epsilon"] is None
  assert summary["attacker_knowledge"] == "released"
  assert "no formal DP guarantee" in capsys.readouterr().out
  # The noised mean with attackers keeps its guarantee (the attackers read nothing honest).
  out2 = tmp_path / "byz_mean"
  assert main(["run", "--num-clients", "40", "--rounds", "2", "--local-steps", "2", "--model", "mlp",
               "--byzantine", "4", "--attack", "gaussian", "--output-dir", str(out2),
               "--no-progress"]) == 0
  s2 = json.loads((out2 / "summary.json").read_text())
  assert s2["formal_guarantee"] is True and s2["epsilon"] > 0


@pytest.mark.parametrize("algorithm", ["dp_fedavg", "dp-rsa-f"])
def test_the_round_vmaps_over_an_experiment_axis(digits, algorithm):
  # Hyper-parameters are data: experiments with different numbers and seeds run as one vmap.
  from fedjax_dp.round import step
  if algorithm == "dp_fedavg":
    setup = build(_config(algorithm=algorithm, noise_multiplier=1.0), digits)
    changes = [{"clip": 0.3, "noise_multiplier": 0.5, "client_lr": 0.1},
               {"clip": 0.8, "noise_multiplier": 2.0, "client_lr": 0.02}]
  else:
    setup = build(_config(algorithm=algorithm, noise_multiplier=None, target_epsilon=None, byzantine=3,
                          attack="sign_flip", options={"keep_prob": 0.7}), digits)
    changes = [{"keep_prob": 0.6, "lambda": 0.05}, {"keep_prob": 0.9, "lambda": 0.01}]
  rnd = setup.program
  hps = [{k: jnp.asarray(c.get(k, v), jnp.asarray(v).dtype) for k, v in setup.hparams.items()}
         for c in changes]
  keys = [jax.random.PRNGKey(1), jax.random.PRNGKey(2)]
  batch = _batch(digits, [4, 9, 17, 58], [1, 1, 1, 1])
  states = [rnd.init(jax.random.PRNGKey(i), hp) for i, hp in enumerate(hps)]
  single = [compiled_step(rnd, "host")(s, hp, batch, k)[0] for s, hp, k in zip(states, hps, keys)]
  stack = lambda trees: jax.tree_util.tree_map(lambda *v: jnp.stack(v), *trees)
  together, _ = jax.jit(jax.vmap(lambda s, hp, k: step(rnd, s, hp, batch, k)))(
      stack(states), stack(hps), jnp.stack(keys))
  for i, one in enumerate(single):
    for a, b in zip(jax.tree_util.tree_leaves(one.params), jax.tree_util.tree_leaves(together.params)):
      np.testing.assert_allclose(a, b[i], rtol=1e-5, atol=1e-6)
  assert not np.allclose(jax.tree_util.tree_leaves(single[0].params)[0],
                         jax.tree_util.tree_leaves(single[1].params)[0])


def test_norm_quantiles_of_diverged_clients_are_infinite_not_nan(recwarn):
  """A round whose clients diverged: the quantiles say inf where the order statistics are inf,
  with no NumPy warning; finite norms keep NumPy's interpolation."""
  from fedjax_dp.engine import quantiles
  finite = [0.5, 1.0, 2.0, 4.0]
  assert quantiles(finite) == {k: float(v) for k, v in
                               zip(("q10", "q50", "q90"), np.quantile(finite, [0.1, 0.5, 0.9]))}
  q = quantiles([1.0, 2.0, np.inf, np.inf, np.inf])
  assert q["q10"] == pytest.approx(1.4) and q["q50"] == np.inf and q["q90"] == np.inf
  assert quantiles([np.inf] * 3) == {"q10": np.inf, "q50": np.inf, "q90": np.inf}
  assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
  assert all(np.isnan(v) for v in quantiles([]).values())
