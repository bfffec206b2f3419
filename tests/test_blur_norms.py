"""Eq. 5's norm bounds (fedjax_dp.reproduce.blur_norms) against a direct simulation of Lemma 2's
recursion and against the library's BLUR local training; the cheng2022-norms report."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import objectives
from fedjax_dp.client import local_sgd, make_optimizer
from fedjax_dp.reproduce import blur_norms as bn


def simulate(grads, lam, eta, radius):
  """Lemma 2's recursion ``u_q = (1 - lam eta 1[||u_{q-1}|| > S]) u_{q-1} - eta g_q`` from
  ``u_0 = 0``: every iterate ``u_0 .. u_Q`` as rows."""
  u = np.zeros(grads.shape[1])
  path = [u]
  for g in grads:
    u = (1.0 - lam * eta * (np.linalg.norm(u) > radius)) * u - eta * g
    path.append(u)
  return np.array(path)


def constant(grad_norm, steps, dim=7, seed=0):
  d = np.random.default_rng(seed).normal(size=dim)
  return np.tile(grad_norm * d / np.linalg.norm(d), (steps, 1))


# (G, lambda, eta, Q, S); none has S / (eta G) an integer (the sphere itself is no boundary case).
CONSTANT_CASES = [
    (0.76, 0.4, 0.05, 15, 0.3),   # the project's small setting, G >= lambda S
    (1.1, 0.8, 0.1, 30, 0.3),     # CIFAR-10's eta and Q
    (0.23, 0.4, 0.1, 30, 0.3),
    (0.047, 0.4, 0.03, 30, 0.03),  # EMNIST's eta, Q and S
    (0.5, 0.0, 0.05, 15, 0.3),    # lambda = 0: plain local SGD
    (0.1, 0.4, 0.05, 5, 0.3),     # Q steps all inside the ball
    (0.9, 3.2, 0.05, 9, 0.3),     # G < lambda S, but still outside at step Q
]


@pytest.mark.parametrize("G,lam,eta,steps,radius", CONSTANT_CASES)
def test_constant_gradient_norm_is_the_simulated_norm(G, lam, eta, steps, radius):
  u = simulate(constant(G, steps), lam, eta, radius)[-1]
  assert bn.constant_gradient_norm(G, lam, eta, steps, radius) == pytest.approx(
      np.linalg.norm(u), rel=1e-12)


def test_constant_gradient_norm_refuses_a_reentering_update():
  G, lam, eta, steps, radius = 0.76, 3.2, 0.05, 15, 0.3
  path = np.linalg.norm(simulate(constant(G, steps), lam, eta, radius), axis=1)
  assert path[1:-1].min() <= radius < path.max()  # it did come back inside the ball
  assert path[-1] <= radius + eta * G
  with pytest.raises(ValueError, match="re-enters"):
    bn.constant_gradient_norm(G, lam, eta, steps, radius)


def test_steady_norm_is_the_fixed_point():
  G, lam, eta = 0.76, 0.4, 0.05
  u = simulate(constant(G, 3000), lam, eta, 0.3)[-1]
  assert np.linalg.norm(u) == pytest.approx(bn.steady_norm(G, lam), rel=1e-9)
  assert bn.steady_norm(G, 0.0) == math.inf


@pytest.mark.parametrize("lam,eta,steps", [(0.4, 0.05, 15), (0.8, 0.1, 30), (0.4, 0.03, 30)])
def test_shrink_factor_is_the_smallest_constant_gradient_ratio(lam, eta, steps):
  G = 0.7
  plain = steps * eta * G
  tiny_ball = np.linalg.norm(simulate(constant(G, steps), lam, eta, 1e-12)[-1])
  assert tiny_ball / plain == pytest.approx(bn.shrink_factor(lam, eta, steps), rel=1e-12)
  assert bn.effective_steps(lam, eta, steps) * eta * G == pytest.approx(tiny_ball, rel=1e-12)
  assert bn.reduction_bound(G, lam, eta, steps) == pytest.approx(plain - tiny_ball, rel=1e-12)
  for radius in np.linspace(0.01, 2 * plain, 37):  # any S: never below the factor
    r = np.linalg.norm(simulate(constant(G, steps), lam, eta, radius)[-1])
    assert r / plain >= bn.shrink_factor(lam, eta, steps) - 1e-12
  # the threshold gradient: above it the update ends outside the ball, for any S
  radius = 0.3
  g_max = bn.max_gradient_inside(lam, eta, steps, radius)
  assert np.linalg.norm(simulate(constant(1.001 * g_max, steps), lam, eta, radius)[-1]) > radius
  assert bn.max_gradient_inside(0.0, eta, steps, radius) == pytest.approx(radius / (eta * steps))


def random_gradients(rng, steps, G, drift):
  """Norms uniform in [0, G], directions a random walk around a drift (drift 0: independent)."""
  mean = rng.normal(size=5)
  d = drift * mean / np.linalg.norm(mean) + rng.normal(size=(steps, 5))
  return rng.uniform(0, G, size=(steps, 1)) * d / np.linalg.norm(d, axis=1, keepdims=True)


@pytest.mark.parametrize("lam,eta,steps", [(0.4, 0.05, 15), (0.8, 0.1, 30), (3.2, 0.05, 15)])
def test_identity_reduction_bound_and_floor_hold_for_any_gradients(lam, eta, steps):
  rng, G, b = np.random.default_rng(1), 1.3, lam * eta
  for trial in range(300):
    grads = random_gradients(rng, steps, G, drift=[0.0, 1.0, 5.0][trial % 3])
    radius = rng.uniform(0.005, 0.6)
    path = simulate(grads, lam, eta, radius)
    u, v = path[-1], -eta * grads.sum(0)
    outside = np.linalg.norm(path[:-1], axis=1) > radius
    np.testing.assert_allclose(u, v - b * (outside[:, None] * path[:-1]).sum(0), atol=1e-12)  # (I)
    assert np.linalg.norm(v - u) <= bn.reduction_bound(G, lam, eta, steps) + 1e-12
    largest = np.linalg.norm(path[1:-1], axis=1).max(initial=0.0)
    slack = (1 / bn.shrink_floor(lam, eta, steps) - 1) * largest
    assert np.linalg.norm(v) - np.linalg.norm(u) <= slack + 1e-12
    assert np.linalg.norm(u) <= bn.worst_case_norm(G, lam, eta, steps, radius) + 1e-12


@pytest.mark.parametrize("lam", [0.5, 4.0])
def test_worst_case_norm_is_attained_and_has_its_limit(lam):
  # Dyadic numbers: full steps of eta G = 0.125 land exactly on S = 0.25.
  G, eta, steps, radius = 1.0, 0.125, 10, 0.25
  best = 0.0
  for hold in range(steps - 1):  # push to S, wait there (no discount on the sphere), push
    pushes = [1.0, 1.0] + [0.0] * hold + [1.0] * (steps - 2 - hold)
    grads = np.array(pushes)[:, None] * np.array([[-G]])
    best = max(best, np.linalg.norm(simulate(grads, lam, eta, radius)[-1]))
  assert bn.worst_case_norm(G, lam, eta, steps, radius) == pytest.approx(best, rel=1e-12)
  assert bn.worst_case_norm(G, lam, eta, 4000, radius) == pytest.approx(
      max(radius + eta * G, G / lam), rel=1e-9)


@pytest.mark.parametrize("lam,eta,steps", [(0.4, 0.05, 15), (6.4, 0.05, 15), (0.0, 0.05, 15)])
def test_noise_floor_bounds_the_mean_square_norm_of_zero_mean_noise(lam, eta, steps):
  rng, sigma, dim, n = np.random.default_rng(2), 2.5, 10, 4000
  floor = bn.noise_floor(sigma, lam, eta, steps)
  for radius, exact in ((1e-9, True), (0.3, False)):
    sq = np.mean([np.sum(simulate(rng.normal(0, sigma / math.sqrt(dim), (steps, dim)), lam, eta,
                                  radius)[-1] ** 2) for _ in range(n)])
    if exact or lam == 0:  # every step discounted (or none): the bound is the mean square
      assert sq == pytest.approx(floor ** 2, rel=0.05)
    else:
      assert sq >= 0.95 * floor ** 2
  assert bn.noise_floor(sigma, 0.0, eta, steps) == pytest.approx(eta * sigma * math.sqrt(steps))


def test_bad_discount_is_refused():
  from fedjax_dp.errors import ConfigError
  with pytest.raises(ConfigError):
    bn.shrink_factor(25.0, 0.05, 15)  # lambda eta = 1.25


# ------------------------------------------------------------- the library's BLUR local training

def linear(c):
  """A loss whose gradient is the pytree ``c`` everywhere: f(w) = <c, w>."""
  def f(params, batch, anchor):
    del batch, anchor
    return sum(jnp.vdot(a, p) for a, p in zip(jax.tree_util.tree_leaves(c),
                                               jax.tree_util.tree_leaves(params)))
  return f


@pytest.mark.parametrize("G,lam,eta,steps,radius", CONSTANT_CASES + [(0.7, 0.4, 0.05, 15, 1e-6)])
def test_library_blur_local_training_follows_lemma2(G, lam, eta, steps, radius):
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  c = {"b": jax.random.normal(k1, (6,)), "w": jax.random.normal(k2, (5, 4))}
  flat = np.concatenate([np.asarray(x).ravel() for x in jax.tree_util.tree_leaves(c)])
  c = jax.tree_util.tree_map(lambda x: x * (G / np.linalg.norm(flat)), c)
  w_t = jax.tree_util.tree_map(lambda x: jax.random.normal(k3, x.shape), c)  # the anchor
  train = local_sgd(objectives.blur(linear(c), lam, radius), make_optimizer("sgd", eta), steps,
                    batch_size=2)
  x, y = jnp.zeros((4, 1)), jnp.zeros((4,), jnp.int32)
  w_q, _ = jax.jit(train)(w_t, x, y, jnp.int32(4), jax.random.PRNGKey(1))
  u = np.concatenate([np.asarray(a - b).ravel() for a, b in zip(jax.tree_util.tree_leaves(w_q),
                                                               jax.tree_util.tree_leaves(w_t))])
  grads = np.tile(flat * (G / np.linalg.norm(flat)), (steps, 1))
  np.testing.assert_allclose(u, simulate(grads, lam, eta, radius)[-1], rtol=2e-5, atol=1e-6)
  expected = (bn.shrink_factor(lam, eta, steps) * steps * eta * G if radius < 1e-3 else
              bn.constant_gradient_norm(G, lam, eta, steps, radius))
  assert np.linalg.norm(u) == pytest.approx(expected, rel=2e-5)


# ------------------------------------------------------------- the report

def test_registered_with_tiny_and_small_scales():
  from fedjax_dp.reproduce import REPRODUCTIONS, scales
  assert REPRODUCTIONS["cheng2022-norms"] == "fedjax_dp.reproduce.blur_norms:run"
  assert {"tiny", "small"} <= set(scales("cheng2022-norms"))
  assert bn.SCALES["small"]["lambdas"][:6] == (0.0,) + bn.PAPER_LAMBDAS


def synthetic_results():
  norms = {0.0: [0.5, 0.6, 0.7, 0.2], 0.4: [0.45, 0.5, 0.25, 0.6]}
  return {
      "settings": {"config": {"client_lr": 0.05, "local_steps": 15, "clip": 0.3},
                   "lambdas": [0.0, 0.4], "seeds": 1, "target_epsilon": 6.0, "grad_batches": 2,
                   "pooled_rounds": [3, 4], "wall_seconds": 1.0, "description": "synthetic"},
      "runs": [{"lambda": lam, "seed": 0, "accuracy": acc, "epsilon": 6.0, "noise_multiplier": 1.0,
                "norms": norms[lam], "grad_minibatch": [1.0, 2.0, 3.0, 4.0],
                "grad_full": [0.5, 1.5], "seconds": 1.0}
               for lam, acc in ((0.0, 0.80), (0.4, 0.81))]}


def test_summarize_and_render_from_results_json(tmp_path):
  results = synthetic_results()
  (tmp_path / "results.json").write_text(json.dumps(results))
  rows = {r["lambda"]: r for r in bn.summarize(results)}
  assert rows[0.0]["norm_q50"] == pytest.approx(0.55)
  assert rows[0.4]["median_ratio"] == pytest.approx(0.475 / 0.55)
  assert rows[0.4]["fraction_over_S"] == pytest.approx(0.75)
  g_eff = 0.55 / (0.05 * 15)
  assert rows[0.4]["predicted_norm"] == pytest.approx(bn.constant_gradient_norm(
      g_eff, 0.4, 0.05, 15, 0.3))
  assert rows[0.4]["grad_minibatch_q50"] == pytest.approx(2.5)
  assert rows[0.4]["steady_gradient"] == pytest.approx(0.12)
  assert bn.render(str(tmp_path), log=lambda *a: None) == 0
  text = (tmp_path / "results.md").read_text()
  assert "not private" in text and "**Can Eq. 5 as published explain" in text
  assert "| 0.4 | 81.00 | 4 | 0.310 / 0.475 / 0.570 | 0.75 | 0.864 |" in text
  assert "| EMNIST (Table 1) | 0.4 | 0.012 | 0.844 | 0.742 | 0.012 |" in text
  assert (tmp_path / bn.FIGURE).stat().st_size > 0


@pytest.mark.slow
def test_tiny_reproduction_writes_and_renders(tmp_path):
  from fedjax_dp.plots import read_norms
  assert bn.run("tiny", str(tmp_path), log=lambda *a: None) == 0
  results = json.loads((tmp_path / "results.json").read_text())
  spec = bn.SCALES["tiny"]
  raw = results["release"]["diagnostics"]["runs.norms, runs.grad_minibatch, runs.grad_full"]
  assert raw == bn.RAW and "provenance" in results
  assert [r["lambda"] for r in results["runs"]] == list(spec["lambdas"])
  first = results["settings"]["pooled_rounds"][0]
  for r in results["runs"]:
    z = read_norms(tmp_path / "runs" / f"lambda{r['lambda']:g}_seed0")
    pooled = np.concatenate([n for k, n in zip(z["round"], z["norms"]) if k >= first])
    np.testing.assert_allclose(r["norms"], pooled, atol=1e-6)
    assert len(r["grad_full"]) == spec["config"]["num_clients"]
    assert len(r["grad_minibatch"]) == spec["config"]["num_clients"] * spec["grad_batches"]
    assert min(r["grad_minibatch"]) > 0
  text = (tmp_path / "results.md").read_text()
  (tmp_path / "results.md").unlink()
  (tmp_path / bn.FIGURE).unlink()
  assert bn.render(str(tmp_path), log=lambda *a: None) == 0
  assert (tmp_path / "results.md").read_text() == text
  assert (tmp_path / bn.FIGURE).is_file()
