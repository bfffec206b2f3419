"""Clip and noise transforms, and the mean aggregator."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp import aggregators
from fedjax_dp.client import make_optimizer
from fedjax_dp.errors import ConfigError, TracedCheckError, check
from fedjax_dp.transforms import add_gaussian_noise, clip_l2, global_norm, sparsify_by_utility
from fedjax_dp.transforms.sign import clip_linf, sign_flip, sign_gaussian


def _tree(key, scale=1.0):
  k1, k2 = jax.random.split(key)
  return {"w": scale * jax.random.normal(k1, (7, 5)), "b": scale * jax.random.normal(k2, (5,))}


def _apply(tx, tree, key=None, jit=False):
  def f(t, k):
    out, _ = tx.update(t, tx.init(t), key=k)
    return out
  f = jax.jit(f) if jit else f
  return f(tree, jax.random.PRNGKey(0) if key is None else key)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("bad", [jnp.inf, -jnp.inf, jnp.nan, 1e30])
def test_clip_zeroes_nonfinite_updates(jit, bad):
  # An Inf entry used to become NaN after scaling (inf * 0); a 1e30 entry overflows the norm.
  tree = _tree(jax.random.PRNGKey(1))
  tree["w"] = tree["w"].at[2, 3].set(bad)
  out = _apply(clip_l2(0.7), tree, jit=jit)
  for leaf in jax.tree_util.tree_leaves(out):
    np.testing.assert_array_equal(np.asarray(leaf), 0.0)


def test_clip_refuses_an_infinite_bound():
  with pytest.raises(ConfigError, match="clip"):
    clip_l2(float("inf"))


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0])
def test_clip_bound_holds(jit, scale):
  bound = 0.7
  tree = _tree(jax.random.PRNGKey(1), scale)
  out = _apply(clip_l2(bound), tree, jit=jit)
  norm_in, norm_out = float(global_norm(tree)), float(global_norm(out))
  assert norm_out <= bound * (1 + 1e-6)
  if norm_in <= bound:  # small updates pass unchanged
    np.testing.assert_allclose(out["w"], tree["w"], rtol=1e-6)
  else:  # large updates keep their direction and land on the sphere
    np.testing.assert_allclose(norm_out, bound, rtol=1e-5)
    np.testing.assert_allclose(out["w"] / norm_out, tree["w"] / norm_in, rtol=1e-4, atol=1e-7)


def test_clip_rejects_bad_bound():
  for bad in (0.0, -1.0):
    with pytest.raises(ConfigError, match="clip"):
      clip_l2(bad)


@pytest.mark.parametrize("jit", [False, True])
def test_noise_stddev_matches(jit):
  # Noise on a zero tree of n coordinates: the sample std of n iid N(0, s^2) has
  # relative standard error about 1/sqrt(2n); 6 standard errors is the tolerance.
  s = 0.3
  zeros = {"w": jnp.zeros((200, 100)), "b": jnp.zeros((1000,))}
  out = _apply(add_gaussian_noise(s), zeros, jit=jit)
  flat = np.concatenate([np.ravel(out["w"]), np.ravel(out["b"])])
  n = flat.size
  assert abs(flat.mean()) < 6 * s / np.sqrt(n)
  assert abs(flat.std() / s - 1) < 6 / np.sqrt(2 * n)


def test_one_draw_cut_into_leaves_keeps_shapes_dtypes_and_independence():
  """gaussian_like draws all coordinates at once and cuts them into the leaves: two leaves of
  the same shape get different, uncorrelated noise, each of the right scale, in its own dtype."""
  from fedjax_dp.transforms import gaussian_like
  tree = {"a": jnp.zeros((40, 50)), "b": jnp.zeros((40, 50)), "c": jnp.zeros((7,), jnp.bfloat16)}
  noise = gaussian_like(tree, 2.0, jax.random.PRNGKey(3))
  assert {k: (v.shape, v.dtype) for k, v in noise.items()} == {
      k: (v.shape, v.dtype) for k, v in tree.items()}
  a, b = np.ravel(noise["a"]), np.ravel(noise["b"])
  assert abs(np.corrcoef(a, b)[0, 1]) < 6 / np.sqrt(a.size)
  for x in (a, b):
    assert abs(x.std() / 2.0 - 1) < 6 / np.sqrt(2 * x.size)
  assert gaussian_like({}, 1.0, jax.random.PRNGKey(0)) == {}


def test_noise_depends_on_key_and_chain_salts_are_independent():
  zeros = {"w": jnp.zeros((500,))}
  a = _apply(add_gaussian_noise(1.0), zeros, jax.random.PRNGKey(0))["w"]
  b = _apply(add_gaussian_noise(1.0), zeros, jax.random.PRNGKey(1))["w"]
  assert not np.allclose(a, b)
  # Two noise transforms in one chain receive the same key; distinct salts make the draws independent.
  two = _apply(optax.chain(add_gaussian_noise(1.0), add_gaussian_noise(1.0, salt=1)), zeros)["w"]
  second = two - a
  assert abs(np.corrcoef(a, second)[0, 1]) < 6 / np.sqrt(500)


def test_mean_aggregator_denominators_and_padding():
  updates = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]])}
  weights = jnp.ones(3)
  mask = jnp.array([1.0, 1.0, 0.0])  # the third row is padding
  key = jax.random.PRNGKey(0)
  agg, _ = aggregators.mean("realized").aggregate(updates, weights, mask, None, key)
  np.testing.assert_allclose(agg["w"], [2.0, 3.0])
  agg, _ = aggregators.mean("expected", expected_size=4.0).aggregate(updates, weights, mask, None, key)
  np.testing.assert_allclose(agg["w"], [1.0, 1.5])
  with pytest.raises(ConfigError, match="expected_size"):
    aggregators.mean("expected")


def test_mean_aggregator_noise_on_sum():
  n, s = 20000, 2.0
  updates = {"w": jnp.zeros((3, n))}
  agg, _ = aggregators.mean("expected", expected_size=4.0, noise_stddev=s).aggregate(
      updates, jnp.ones(3), jnp.ones(3), None, jax.random.PRNGKey(3))
  # Noise N(0, s^2) on the sum, then divided by 4.
  assert abs(float(jnp.std(agg["w"])) / (s / 4) - 1) < 6 / np.sqrt(2 * n)


def test_check_refuses_a_traced_condition_as_a_programming_error():
  # Inside a compiled function a value has no value to check: check says so instead of
  # passing silently, and it is not a ConfigError (the user's input is not at fault).
  with pytest.raises(TracedCheckError, match="'clip' on a traced value") as e:
    jax.jit(lambda v: check(v > 0, "clip", v, "must be > 0"))(1.0)
  assert isinstance(e.value, TypeError) and not isinstance(e.value, ConfigError)
  check(jnp.float32(1.0) > 0, "clip", 1.0, "must be > 0")  # a concrete JAX value is checked
  with pytest.raises(ConfigError, match="clip"):
    check(jnp.float32(-1.0) > 0, "clip", -1.0, "must be > 0")


# Each public piece refuses a bad concrete number, and builds from a traced one (a hyper-parameter
# of the compiled round, checked where the settings are read) without pretending to check it.
PIECES = {
    "clip": (lambda v: clip_l2(v), 0.0),
    "noise stddev": (lambda v: add_gaussian_noise(v), -1.0),
    "keep_prob": (lambda v: sign_flip(v), 0.4),
    "sign_clip": (lambda v: clip_linf(v), 0.0),
    "sign_sigma": (lambda v: sign_gaussian(v), 0.0),
    "sparsity": (lambda v: sparsify_by_utility(v), 1.0),
    "noise_stddev": (lambda v: aggregators.mean(noise_stddev=v), -1.0),
    "expected_size": (lambda v: aggregators.mean("expected", expected_size=v), 0.0),
    "learning_rate": (lambda v: make_optimizer("sgd", v), 0.0),
}


@pytest.mark.parametrize("field", sorted(PIECES))
def test_pieces_refuse_bad_concrete_values_and_build_from_traced_ones(field):
  make, bad = PIECES[field]
  with pytest.raises(ConfigError, match=f"invalid {field}="):
    make(bad)
  # A concrete JAX value is read on the host, even inside a function being compiled.
  bad_array, good_array = jnp.float32(bad), jnp.float32(0.7)
  with pytest.raises(ConfigError, match=f"invalid {field}="):
    jax.eval_shape(lambda: make(bad_array) and 0)
  jax.eval_shape(lambda: make(good_array) and 0)

  def build(v):
    make(v)
    return v

  assert float(jax.jit(build)(0.7)) == pytest.approx(0.7)
