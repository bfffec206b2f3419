"""One contract test over every aggregator, plus each robust aggregator's own math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp import components
from fedjax_dp.aggregators import mean, robust

D_A, D_B = (3,), (2, 2)
NAMES = components.names("aggregator")
ROBUST = [n for n in NAMES if n != "mean"]


_CACHE = {}


def make(name):
  if name not in _CACHE:
    _CACHE[name] = robust.get(name, {"byzantine": 2, "trim_beta": 0.2, "cc_tau": 3.0},
                              {"cc_iters": 10})
  return _CACHE[name]


def tree(rows):
  rows = np.asarray(rows, np.float32)
  return {"a": jnp.asarray(rows[:, :3]), "b": jnp.asarray(rows[:, 3:].reshape((-1,) + D_B))}


def flat(t):
  return np.concatenate([np.asarray(t["a"]).ravel(), np.asarray(t["b"]).ravel()])


def run(agg, rows, mask=None, weights=None, jit=True):
  u = tree(rows)
  n = len(rows)
  mask = jnp.ones(n) if mask is None else jnp.asarray(mask, jnp.float32)
  weights = jnp.ones(n) if weights is None else jnp.asarray(weights, jnp.float32)
  state = agg.init(jax.tree_util.tree_map(lambda x: x[0], u))
  if not jit:
    fn = agg.aggregate
  else:
    fn = _CACHE.setdefault(("jit", id(agg)), (agg, jax.jit(agg.aggregate)))[1]
  out, _ = fn(u, weights, mask, state, jax.random.PRNGKey(0))
  return flat(out)


def honest(n=10, seed=0):
  return 1.0 + 0.1 * np.random.default_rng(seed).normal(size=(n, 7))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("jit", [True, False])
def test_permutation_invariance(name, jit):
  rows = honest()
  perm = np.random.default_rng(1).permutation(len(rows))
  np.testing.assert_allclose(run(make(name), rows, jit=jit), run(make(name), rows[perm], jit=jit),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pad_value", [0.0, 1e6])
def test_padded_rows_are_ignored(name, pad_value):
  rows = honest()
  padded = np.concatenate([rows[:4], np.full((3, 7), pad_value), rows[4:]])
  mask = np.r_[np.ones(4), np.zeros(3), np.ones(6)]
  np.testing.assert_allclose(run(make(name), padded, mask), run(make(name), rows), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, "mixed"])
def test_nonfinite_rows_rejected_like_padding(name, bad):
  rows = honest()
  attacked = rows.copy()
  if bad == "mixed":
    attacked[-2:, ::2], attacked[-2:, 1::2] = np.inf, -np.inf
  else:
    attacked[-2:] = bad
  out = run(make(name), attacked)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, run(make(name), rows[:-2]), rtol=1e-5, atol=1e-5)
  rows_nan_one = rows.copy()
  rows_nan_one[0, 5] = np.nan  # one bad entry rejects the whole row
  np.testing.assert_allclose(run(make(name), rows_nan_one), run(make(name), rows[1:]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_all_rows_rejected_gives_zero_step(name):
  out = run(make(name), np.full((4, 7), np.nan))
  np.testing.assert_array_equal(out, np.zeros(7))
  out = run(make(name), honest(4), mask=np.zeros(4))
  np.testing.assert_array_equal(out, np.zeros(7))


def test_a_stateful_aggregator_with_no_usable_row_takes_no_step_and_keeps_its_state():
  agg = make("centered_clipping")
  u = tree(honest())
  state = agg.init(jax.tree_util.tree_map(lambda x: x[0], u))
  first, state = agg.aggregate(u, jnp.ones(10), jnp.ones(10), state, jax.random.PRNGKey(0))
  assert np.linalg.norm(flat(first)) > 0.1
  for rows, mask in ((np.full((10, 7), np.nan), np.ones(10)), (honest(), np.zeros(10))):
    out, after = agg.aggregate(tree(rows), jnp.ones(10), jnp.asarray(mask, jnp.float32), state,
                               jax.random.PRNGKey(0))
    np.testing.assert_array_equal(flat(out), np.zeros(7))
    np.testing.assert_array_equal(flat(after), flat(state))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", [1e4, 1e30])
def test_large_norm_attackers(name, scale):
  """b=2 of 10 rows at norm ~1e4, or finite rows whose squared norm overflows float32 (1e30):
  robust aggregators stay near the honest rows, the mean does not."""
  rows = honest()
  attacked = rows.copy()
  attacked[-2:] = scale * np.random.default_rng(3).normal(size=(2, 7))
  out = run(make(name), attacked)
  if name in ("sign_vote",):
    np.testing.assert_array_equal(out, np.ones(7))  # the 8 honest +1 votes win every coordinate
  elif name == "sign_sum":
    assert np.all(np.abs(out - run(make(name), rows[:-2])) <= 2)
  elif name == "mean":
    assert np.linalg.norm(out - rows[:-2].mean(0)) > 100  # not robust, as documented
  else:
    assert np.linalg.norm(out - rows[:-2].mean(0)) < 1.0, out


def test_mean_entry_is_the_base_mean():
  rows = honest()
  w = np.arange(1, 11, dtype=np.float32)
  np.testing.assert_allclose(run(make("mean"), rows, weights=w), run(mean("realized"), rows, weights=w),
                             rtol=1e-6)
  np.testing.assert_allclose(run(make("mean"), rows, weights=w), (w[:, None] * rows).sum(0) / w.sum(),
                             rtol=1e-5)


def test_coordinate_median_and_trimmed_mean_values():
  rows = np.tile(np.array([[1.], [2.], [3.], [4.], [100.]]), (1, 7))
  np.testing.assert_allclose(run(robust.coordinate_median(), rows), np.full(7, 3.0))
  np.testing.assert_allclose(run(robust.coordinate_median(), rows[:4]), np.full(7, 2.5))
  np.testing.assert_allclose(run(robust.trimmed_mean(0.2), rows), np.full(7, 3.0))
  np.testing.assert_allclose(run(robust.trimmed_mean(0.0), rows), np.full(7, 22.0))


def test_the_merge_sort_network_sorts_any_number_of_rows():
  rng = np.random.default_rng(0)
  for n in range(1, 131):
    partner, low = robust.merge_sort_layers(n)
    k = (n - 1).bit_length()
    assert partner.shape == low.shape == (k * (k + 1) // 2, n)
    for part, lo in zip(partner, low):  # disjoint comparators, the smaller value at the lower row
      np.testing.assert_array_equal(part[part], np.arange(n))
      np.testing.assert_array_equal(lo, part > np.arange(n))
    values = rng.integers(-3, 4, size=(n, 64)).astype(np.float64)  # many ties
    for part, lo in zip(partner, low):
      values = np.where(lo[:, None], np.minimum(values, values[part]),
                        np.maximum(values, values[part]))
    assert (np.diff(values, axis=0) >= 0).all(), n


@pytest.mark.parametrize("n", [1, 2, 3, 7, 30, 33])
def test_sort_rows_equals_xla_sort(n):
  rng = np.random.default_rng(n)
  values = rng.normal(size=(n, 40)).astype(np.float32)
  values[:, :8] = rng.integers(-1, 2, size=(n, 8))  # ties
  values[:, 8] = np.inf
  values[n // 2] = np.inf  # a rejected row, as _sorted_real passes it
  got = np.asarray(robust.sort_rows(jnp.asarray(values)))
  np.testing.assert_array_equal(got, np.asarray(jnp.sort(values, axis=0)))


def test_sign_vote_and_sum_values():
  rows = np.array([[1, -1, 2, 0, 1, 1, -3], [1, -1, -2, 0, 1, 1, -3], [2, 5, -1, 0, 1, 1, -3]], float)
  np.testing.assert_array_equal(run(robust.sign_vote(), rows), [1, -1, -1, 0, 1, 1, -1])
  np.testing.assert_array_equal(run(robust.sign_sum(), rows), [3, -1, -1, 0, 3, 3, -3])
  np.testing.assert_array_equal(run(robust.sign_sum(), rows, weights=[1, 1, 3]), [5, 1, -3, 0, 5, 5, -5])


@pytest.mark.parametrize("max_iter", [1, 500])
def test_geometric_median_optimality(max_iter):
  rows = np.random.default_rng(5).normal(size=(9, 7))
  w = np.random.default_rng(6).uniform(0.5, 2.0, 9)
  z = run(robust.geometric_median(gm_tol=1e-9, gm_max_iter=max_iter), rows, weights=w)
  diff = z - rows
  grad = (w[:, None] * diff / np.linalg.norm(diff, axis=1, keepdims=True)).sum(0)
  if max_iter == 500:
    assert np.linalg.norm(grad) < 1e-3 * w.sum()
  z_ref, iters = robust.weiszfeld(jnp.asarray(rows, jnp.float32), jnp.asarray(w, jnp.float32), 1e-9, max_iter)
  assert int(iters) <= max_iter
  np.testing.assert_allclose(z, np.asarray(z_ref), rtol=1e-5, atol=1e-6)


def test_geometric_median_collinear_is_median():
  rows = np.zeros((5, 7))
  rows[:, 0] = [0., 1., 2., 10., 50.]
  np.testing.assert_allclose(run(robust.geometric_median(1e-10, 1000), rows)[0], 2.0, atol=1e-3)


def test_geometric_median_leaves_a_row_that_is_not_the_median():
  # The coordinate median, where the iterations start, is the row (0, 0), and the median is not
  # there (the angle at (0, 0) is under 120 degrees): the iterations must leave it.
  from scipy.optimize import minimize
  plane = np.array([[0.0, 0.0], [5.0, 1.0], [-1.0, -5.0]])
  cost = lambda z: np.linalg.norm(plane - z, axis=1).sum()
  best = minimize(cost, plane.mean(0), method="Nelder-Mead",
                  options={"xatol": 1e-9, "fatol": 1e-12}).x
  rows = np.concatenate([plane, np.zeros((3, 5))], axis=1)  # the helpers' trees take 7 columns
  z = run(robust.get("geometric_median"), rows)  # the defaults (tol 1e-6): plain Weiszfeld's first
  np.testing.assert_allclose(z[:2], best, atol=1e-4)  # step off the row was under tol: it stayed
  assert cost(z[:2]) < cost(plane[0]) - 0.02


def test_krum_selects_an_honest_row():
  rows = honest()
  attacked = rows.copy()
  attacked[-2:] = 50.0
  out = run(robust.krum(2, krum_m=1), attacked)
  assert min(np.linalg.norm(rows[:-2] - out, axis=1)) < 1e-5
  multi = run(robust.krum(2, krum_m=3), attacked)
  assert np.linalg.norm(multi - rows[:-2].mean(0)) < 0.5


def test_centered_clipping_moves_at_most_tau_per_row_and_keeps_state():
  agg = robust.centered_clipping(cc_tau=1.0, cc_iters=1)
  u = tree(np.full((4, 7), 100.0))
  state = agg.init(jax.tree_util.tree_map(lambda x: x[0], u))
  out, state = agg.aggregate(u, jnp.ones(4), jnp.ones(4), state, jax.random.PRNGKey(0))
  assert abs(np.linalg.norm(flat(out)) - 1.0) < 1e-5  # 4 rows each moved by tau / 4 along one direction
  out2, _ = agg.aggregate(u, jnp.ones(4), jnp.ones(4), state, jax.random.PRNGKey(0))
  assert abs(np.linalg.norm(flat(out2)) - 2.0) < 1e-5  # starts from the previous aggregate


def test_bad_parameters_raise():
  from fedjax_dp.errors import ConfigError
  # Options are checked against their declarations when an aggregator is built by name.
  for fn in (lambda: robust.get("trimmed_mean", {"trim_beta": 0.5}),
             lambda: robust.get("geometric_median", {"gm_tol": 0}),
             lambda: robust.get("geometric_median", static={"gm_max_iter": 0}),
             lambda: robust.krum(-1, krum_m=1), lambda: robust.get("krum", {"byzantine": -1}),
             lambda: robust.get("centered_clipping", {"cc_tau": 0}),
             lambda: robust.get("centered_clipping", static={"cc_iters": 1.5}),
             lambda: robust.get("average")):
    with pytest.raises(ConfigError):
      fn()


def test_only_aggregators_linear_in_the_rows_declare_it():
  # The round sums a linear aggregator's rows block by block; it reads the declaration.
  assert mean().linear and robust.get("mean").linear
  for name in sorted(set(components.names("aggregator")) - {"mean"}):
    assert not robust.get(name).linear, name
