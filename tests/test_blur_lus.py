"""BLUR and LUS (Cheng et al., CVPR 2022): regulariser, per-layer top-s mask, order, ledger, e2e."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp import objectives
from fedjax_dp import components
from fedjax_dp.algorithms import build
from fedjax_dp.round import mask_rows
from fedjax_dp.config import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.transforms import clip_l2, global_norm, sparsify_by_utility
from fedjax_dp.transforms.sparsify import kept_count, top_s_mask

VARIANTS = ("dp_fedavg", "dp_fedavg+blur", "dp_fedavg+lus", "blur+lus")


@pytest.fixture(scope="module")
def digits():
  from fedjax_dp.data import Split, load_federated
  return load_federated("digits", Split(40, "iid"), seed=0)


def _cfg(**kw):
  base = dict(dataset="digits", num_clients=40, model="rsa_mlp", rounds=2, sampling_prob=0.2,
              local_steps=3, batch_size=8, client_lr=0.1, clip=0.3, noise_multiplier=1.1,
              target_epsilon=None, eval_every=1)
  base.update(kw)
  return make_config(base)


def _tree(key, scale=1.0):
  k1, k2 = jax.random.split(key)
  return {"b": scale * jax.random.normal(k1, (6,)), "w": scale * jax.random.normal(k2, (5, 4))}


# ---------------------------------------------------------------- BLUR (Eq. 5, Lemma 2)

@pytest.mark.parametrize("jit", [False, True])
def test_blur_gradient_zero_inside_and_linear_outside(jit):
  lam, radius = 0.4, 1.0
  f = objectives.blur(lambda p, b, a: 0.0 * objectives.sq_distance(p, a), lam, radius)
  grad = jax.grad(f)
  grad = jax.jit(grad) if jit else grad
  anchor = _tree(jax.random.PRNGKey(0))
  direction = _tree(jax.random.PRNGKey(1))
  dnorm = float(global_norm(direction))
  for r, outside in ((0.5, False), (0.999, False), (1.0, False), (1.5, True), (3.0, True)):
    w = jax.tree_util.tree_map(lambda a, d: a + (r / dnorm) * d, anchor, direction)
    g = grad(w, None, anchor)
    for k in anchor:
      expected = lam * (w[k] - anchor[k]) if outside else np.zeros_like(w[k])
      np.testing.assert_allclose(g[k], expected, rtol=1e-4, atol=1e-6)


def test_blur_adds_to_base_objective_and_lemma2_discount():
  # One SGD step outside the ball discounts the accumulated update by (1 - lam * eta).
  lam, eta, radius = 0.4, 0.1, 0.5
  base = lambda p, b, a: jnp.sum(p["w"] * b)
  f = objectives.blur(base, lam, radius)
  anchor = {"w": jnp.zeros(3)}
  w = {"w": jnp.array([1.0, 0.0, 0.0])}
  batch = jnp.array([0.1, 0.2, 0.3])
  g = jax.grad(f)(w, batch, anchor)
  new = w["w"] - eta * g["w"]
  np.testing.assert_allclose(new, (1 - lam * eta) * w["w"] - eta * batch, rtol=1e-6)
  np.testing.assert_allclose(f(w, batch, anchor), base(w, batch, anchor) + 0.5 * lam * (1 - 0.25))


@pytest.mark.parametrize("bad", [dict(lam=-0.1, radius=1.0), dict(lam=0.4, radius=0.0)])
def test_blur_rejects_bad_arguments(bad):
  with pytest.raises(ConfigError):
    objectives.blur(lambda p, b, a: 0.0, bad["lam"], bad["radius"])


# ---------------------------------------------------------------- LUS (Eq. 9-12)

def test_kept_count():
  assert kept_count(10, 0.7) == 3
  assert kept_count(10, 0.0) == 10
  assert kept_count(10, 0.9) == 1
  assert kept_count(3, 0.9) == 1  # at least one element per layer
  assert kept_count(1000, 0.5) == 500
  assert kept_count(35, 0.7) == 10 and kept_count(5, 0.5) == 2  # a Python number's half rounds down


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("c", [0.1, 0.5, 0.7, 0.9])
def test_sparsify_keeps_exact_count_per_layer_by_utility(jit, c):
  delta, g = _tree(jax.random.PRNGKey(2)), _tree(jax.random.PRNGKey(3))
  tx = sparsify_by_utility(c)
  f = lambda d, g: tx.update(d, tx.init(d), None, grad=g)[0]
  out = (jax.jit(f) if jit else f)(delta, g)
  for k in delta:
    d, gk, o = np.asarray(delta[k]).ravel(), np.asarray(g[k]).ravel(), np.asarray(out[k]).ravel()
    s = kept_count(d.size, c)
    kept = np.flatnonzero(o != 0)
    assert len(kept) == s
    np.testing.assert_array_equal(o[kept], d[kept])  # kept elements unchanged
    # The kept set is the top-s by |g * delta| (recomputed with NumPy).
    expected = np.sort(np.argsort(-np.abs(gk * d), kind="stable")[:s])
    np.testing.assert_array_equal(kept, expected)


def test_top_s_mask_ties_are_deterministic_lowest_index_first():
  scores = jnp.array([[1.0, 2.0, 2.0], [2.0, 0.5, 2.0]])
  m = np.asarray(top_s_mask(scores, 2))
  np.testing.assert_array_equal(m, [[0, 1, 1], [0, 0, 0]])
  m3 = np.asarray(jax.jit(top_s_mask, static_argnums=1)(scores, 3))
  np.testing.assert_array_equal(m3, [[0, 1, 1], [1, 0, 0]])
  # Negative values, -0.0 and +0.0 compare as floats do.
  neg = jnp.array([-1.0, -0.0, 0.0, -3.0, 2.0])
  np.testing.assert_array_equal(np.asarray(top_s_mask(neg, 3)), [0, 1, 1, 0, 1])
  # All equal (e.g. a zero gradient): the first s in row-major order.
  np.testing.assert_array_equal(np.asarray(top_s_mask(jnp.zeros(5), 2)), [1, 1, 0, 0, 0])
  # NaN ranks lowest.
  np.testing.assert_array_equal(np.asarray(top_s_mask(jnp.array([jnp.nan, 1.0, 0.0]), 1)), [0, 1, 0])


def test_sparsify_needs_grad_and_valid_sparsity():
  tx = sparsify_by_utility(0.5)
  d = _tree(jax.random.PRNGKey(0))
  with pytest.raises(TypeError):
    tx.update(d, tx.init(d), None)
  for bad in (-0.1, 1.0, None):
    with pytest.raises(ConfigError):
      sparsify_by_utility(bad)


def test_order_sparsify_then_clip_bounds_the_released_norm():
  # Alg. 2: sparsify, then clip to S; noise comes after, on the server's sum.
  delta = _tree(jax.random.PRNGKey(4), scale=1.0)
  g = _tree(jax.random.PRNGKey(5))
  sp = sparsify_by_utility(0.7)
  sparse = sp.update(delta, sp.init(delta), None, grad=g)[0]
  n_full, n_sparse = float(global_norm(delta)), float(global_norm(sparse))
  clip = 0.5 * (n_full + n_sparse)
  cl = clip_l2(clip)
  chain = optax.chain(sp, cl)
  out = chain.update(delta, chain.init(delta), None, grad=g, key=jax.random.PRNGKey(0))[0]
  assert n_sparse < clip < n_full  # the case where the order matters
  # sparsify -> clip: the sparse update passes unscaled (its norm is already < S).
  for k in delta:
    np.testing.assert_allclose(out[k], sparse[k], rtol=1e-6)
  # clip -> sparsify would have shrunk it by S / ||delta||.
  wrong = sp.update(cl.update(delta, cl.init(delta))[0], sp.init(delta), None, grad=g)[0]
  np.testing.assert_allclose(float(global_norm(wrong)), n_sparse * clip / n_full, rtol=1e-5)
  assert float(global_norm(wrong)) < float(global_norm(out)) * (1 - 1e-3)
  assert float(global_norm(out)) <= clip * (1 + 1e-6)


def test_builder_chain_order_padding_and_noise_on_the_sum(digits):
  cfg = _cfg(algorithm="blur+lus", clip=0.05)
  setup = build(cfg, digits)
  rnd = setup.program
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  p0 = rnd.model.init(jax.random.PRNGKey(0))
  ids = jnp.array([0, 1, 2, 7])
  mask = jnp.array([1.0, 1.0, 1.0, 0.0])
  x, y, c = (jnp.asarray(digits.x)[ids], jnp.asarray(digits.y)[ids], jnp.asarray(digits.counts)[ids])
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  empty = jnp.zeros((4, 0))
  clients = jax.jit(jax.vmap(rnd.client(hp), in_axes=(None, 0, 0, 0, 0, 0, 0)))
  res = clients(p0, x, y, c, empty, empty, keys)
  out, pre_norm = res.upload, res.norm
  # Padded clients (mask 0) come out as exact zeros and do not change the real rows.
  ids2 = jnp.array([0, 1, 2, 30])
  out2 = clients(p0, jnp.asarray(digits.x)[ids2], jnp.asarray(digits.y)[ids2],
                 jnp.asarray(digits.counts)[ids2], empty, empty, keys).upload
  for la, lb in zip(jax.tree_util.tree_leaves(mask_rows(out, mask)),
                    jax.tree_util.tree_leaves(mask_rows(out2, mask))):
    np.testing.assert_array_equal(la[:3], lb[:3])
    assert np.all(np.asarray(la[3]) == 0) and np.all(np.asarray(lb[3]) == 0)
  leaves = jax.tree_util.tree_leaves(out)
  norms = np.sqrt(sum(np.sum(np.square(np.asarray(l).reshape(4, -1)), 1) for l in leaves))
  assert np.all(norms <= cfg.clip * (1 + 1e-5))  # clipped after sparsification
  assert np.all(np.asarray(pre_norm) > cfg.clip)  # the clip was active
  for l in leaves:  # sparse: about 30% of each leaf kept (the clip keeps zeros zero)
    frac = np.mean(np.asarray(l)[0] != 0)
    assert frac <= 0.3 + 1e-6
  # The noise is the server's, on the sum: z * S, none added per client.
  mechanism = setup.accounting.mechanism
  assert mechanism.noise_stddev == pytest.approx(cfg.noise_multiplier * cfg.clip)
  zero = jax.tree_util.tree_map(jnp.zeros_like, out)
  agg, _ = rnd.aggregator(hp).aggregate(zero, jnp.ones(4), mask, None, jax.random.PRNGKey(3))
  flat = np.concatenate([np.asarray(a).ravel() for a in jax.tree_util.tree_leaves(agg)])
  expected_std = mechanism.noise_stddev / setup.sampler.expected_size
  assert abs(flat.std() / expected_std - 1) < 0.05  # ~ 2,700 coordinates: 5% is > 3 sigma


# ---------------------------------------------------------------- privacy: same ledger as DP-FedAvg

@pytest.mark.parametrize("kw", [dict(noise_multiplier=0.9, target_epsilon=None),
                                dict(noise_multiplier=None, target_epsilon=3.0)])
def test_blur_lus_ledger_equals_dp_fedavg(digits, kw):
  rounds = 40
  setups = {a: build(_cfg(algorithm=a, rounds=rounds, **kw), digits) for a in VARIANTS}
  ref = setups["dp_fedavg"]
  for a, s in setups.items():
    assert s.accounting.mechanism == ref.accounting.mechanism, a
    for _ in range(rounds):
      s.accounting.on_round(None)
  eps = {a: s.accounting.report()["epsilon"] for a, s in setups.items()}
  assert eps["dp_fedavg"] is not None and math.isfinite(eps["dp_fedavg"]) and eps["dp_fedavg"] > 0
  for a in VARIANTS:
    assert eps[a] == eps["dp_fedavg"], (a, eps)
    assert setups[a].accounting.report()["formal_guarantee"]
  if kw["target_epsilon"] is not None:
    assert eps["blur+lus"] <= kw["target_epsilon"] + 1e-6


def test_options_validated_before_compilation(digits):
  for opts in ({"lambda": -1}, {"sparsity": 1.0}, {"lus_batches": -1}, {"lus_batches": 1.5},
               {"lamda": 0.4}, {"sparsity": "high"}):
    with pytest.raises(ConfigError):
      build(_cfg(algorithm="blur+lus", options=opts), digits)


# ---------------------------------------------------------------- end to end

def test_the_family_declares_the_noised_mean_its_mechanism():
  for name in ("fedavg",) + VARIANTS:
    assert components.get("algorithm", name)["central_noise"] == (name != "fedavg")


@pytest.fixture(scope="module")
def e2e(digits):
  """Every variant for 2 rounds, same seed (one compile each)."""
  from fedjax_dp.experiment import simulate
  kw = dict(clip=0.05, client_lr=0.3, local_steps=5)
  return {a: simulate(_cfg(algorithm=a, options={"lus_batches": 0} if a == "blur+lus" else {}, **kw),
                      digits) for a in ("fedavg",) + VARIANTS}


@pytest.mark.parametrize("algorithm", ("fedavg",) + VARIANTS)
def test_end_to_end_each_variant(e2e, algorithm):
  res = e2e[algorithm]
  assert len(res.history) == 2
  acc = res.summary["final_accuracy"]
  assert 0.0 <= acc <= 1.0 and math.isfinite(res.summary["final_test_loss"])
  if algorithm == "fedavg":
    assert res.summary["epsilon"] is None and not res.summary["formal_guarantee"]
  else:
    assert res.summary["epsilon"] > 0 and res.summary["formal_guarantee"]
    assert all(h["diagnostics"]["update_norm"]["q50"] > 0 for h in res.history)
  eps = {a: e2e[a].summary["epsilon"] for a in VARIANTS}
  assert len(set(eps.values())) == 1  # same noise, sampling, rounds: same epsilon


def test_blur_shrinks_update_norms(e2e):
  # Same seed, same cohort, same minibatches in round 1: BLUR pulls local models
  # back towards the ball, so the pre-clip norms are smaller.
  plain = e2e["dp_fedavg"].history[0]["diagnostics"]["update_norm"]
  blurred = e2e["dp_fedavg+blur"].history[0]["diagnostics"]["update_norm"]
  assert blurred["q50"] < plain["q50"] and blurred["mean"] < plain["mean"]


@pytest.mark.slow
def test_reproduction_tiny(tmp_path):
  import json
  from fedjax_dp.reproduce import run_reproduction
  assert run_reproduction("cheng2022", scale="tiny", output_dir=str(tmp_path)) == 0
  res = json.loads((tmp_path / "results.json").read_text())
  methods = {r["method"] for r in res["rows"]}
  assert methods == {"fedavg", "ae-dpfl", "ddgauss", "dp_fedavg-fixed"} | set(VARIANTS)
  fixed = {r["method"]: (r["sampling"], r["cohort_size"]) for r in res["rows"]
           if r["method"] in ("ddgauss", "dp_fedavg-fixed")}
  assert fixed["dp_fedavg-fixed"] == fixed["ddgauss"] and fixed["ddgauss"][0] == "fixed"
  for r in res["rows"]:
    assert {"method", "epsilon", "accuracy_mean", "accuracy_std", "seeds"} <= set(r)
  eps = {r["method"]: r["epsilon"] for r in res["rows"]
         if r["target_epsilon"] == 2.0 and r["method"] in VARIANTS}
  assert len(set(eps.values())) == 1
  for name in ("results.md", "cheng2022_update_norms.png", "cheng2022_accuracy.png"):
    assert (tmp_path / name).is_file()
