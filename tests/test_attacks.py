"""Each attack's output: regular rows untouched, Byzantine rows as the attack defines."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from fedjax_dp import attacks, components
from fedjax_dp.errors import ConfigError

ATTACKS = components.names("attack")
N = 8
BYZ = np.array([0, 0, 0, 0, 0, 0, 1, 1], np.float32)  # the last two ids
MASK = np.array([1, 1, 1, 1, 1, 0, 1, 1], np.float32)  # row 5 is padding


def rows(seed=0):
  r = np.random.default_rng(seed)
  return {"w": jnp.asarray(r.normal(size=(N, 50)), jnp.float32),
          "b": jnp.asarray(r.normal(size=(N, 4, 3)), jnp.float32)}


def flat(t):
  return np.concatenate([np.asarray(t["w"]).reshape(N, -1), np.asarray(t["b"]).reshape(N, -1)], 1)


def apply(attack, mask=MASK, jit=True, seed=0, ids=None):
  u = rows(seed)
  fn = jax.jit(attack) if jit else attack
  out = fn(u, jnp.asarray(BYZ), jax.random.PRNGKey(7),
           mask=None if mask is None else jnp.asarray(mask),
           ids=ids)
  return flat(u), flat(out)


def regular_stats(x, mask=MASK):
  w = (1 - BYZ) * (mask if mask is not None else 1)
  mu = (w[:, None] * x).sum(0) / w.sum()
  sd = np.sqrt((w[:, None] * (x - mu) ** 2).sum(0) / w.sum())
  return mu, sd


def test_byzantine_mask_is_the_last_ids():
  ids = jnp.array([0, 3, 7, 9, 8, 0])
  np.testing.assert_array_equal(attacks.byzantine_mask(ids, 10, 3), [0, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(attacks.byzantine_mask(ids, 10, 0), np.zeros(6))


def test_every_attack_declares_whether_it_reads_honest_rows():
  reads = {name: attacks.get(name).reads_honest for name in ATTACKS}
  assert reads == {"none": False, "gaussian": False, "sign_flip": False, "sample_duplication": True,
                   "alie": True, "ipm": True, "nonfinite": False}


@pytest.mark.parametrize("name", ATTACKS)
@pytest.mark.parametrize("jit", [True, False])
def test_regular_rows_untouched(name, jit):
  x, out = apply(attacks.get(name), jit=jit)
  np.testing.assert_array_equal(out[BYZ == 0], x[BYZ == 0])
  if name != "none":
    assert not np.array_equal(out[BYZ == 1], x[BYZ == 1])


def test_gaussian_scale():
  x, out = apply(attacks.get("gaussian", {"attack_sigma": 1e4}))
  v = out[BYZ == 1].ravel()
  # 124 samples: the sample sd is within 25% of sigma with overwhelming probability.
  assert abs(v.std() / 1e4 - 1) < 0.25 and abs(v.mean()) < 4 * 1e4 / np.sqrt(v.size)
  assert not np.allclose(out[6], out[7])  # independent rows
  # attack_shared: every attacker sends one draw (the DP-RSA authors' code), traced or not
  for shared in (1, jnp.float32(1)):
    _, same = apply(attacks.get("gaussian", {"attack_sigma": 1e4, "attack_shared": shared}))
    np.testing.assert_array_equal(same[6], same[7])
    np.testing.assert_array_equal(same[BYZ == 0], x[BYZ == 0])
    assert abs(same[6].std() / 1e4 - 1) < 0.35
  # by default a row's draw is its own: under each leaf's key, the draw of the row's client id
  # (without ids, its position)
  def own(ids):
    kb, kw = jax.random.split(jax.random.PRNGKey(7), 2)  # the leaves in tree order: "b", "w"
    draw = lambda k, i, shape: 1e4 * jax.random.normal(
        jax.random.fold_in(jax.random.fold_in(k, 0), i), shape)
    return flat({"b": jnp.stack([draw(kb, i, (4, 3)) for i in ids]),
                 "w": jnp.stack([draw(kw, i, (50,)) for i in ids])})
  np.testing.assert_allclose(out[BYZ == 1], own(range(N))[BYZ == 1], rtol=1e-6)
  ids = [3, 1, 4, 15, 9, 2, 6, 5]
  _, by_id = apply(attacks.get("gaussian", {"attack_sigma": 1e4}), ids=ids)
  np.testing.assert_allclose(by_id[BYZ == 1], own(ids)[BYZ == 1], rtol=1e-6)


@pytest.mark.parametrize("name", ATTACKS)
def test_attackers_messages_follow_their_ids_not_their_rows(name):
  """The cohort's rows reversed (their ids with them) and padded with two more: every
  message is the same, so a cohort's order, padding and split over devices change none."""
  ids = np.array([3, 1, 4, 15, 9, 2, 6, 5], np.int32)
  u, byz, mask = rows(), jnp.asarray(BYZ), jnp.asarray(MASK)
  key = jax.random.PRNGKey(7)
  attack = jax.jit(attacks.get(name))
  out = attack(u, byz, key, mask=mask, ids=jnp.asarray(ids))
  rev = lambda a: jnp.concatenate([a[::-1], jnp.zeros((2,) + a.shape[1:], a.dtype)])
  moved = attack(jax.tree_util.tree_map(rev, u), rev(byz), key, mask=rev(mask),
                 ids=rev(jnp.asarray(ids)))
  np.testing.assert_allclose(flat(jax.tree_util.tree_map(lambda a: a[:N][::-1], moved)),
                             flat(out), rtol=1e-6, atol=1e-5, equal_nan=True)  # sums reordered


def test_sign_flip_is_minus_five_times_true_row():
  x, out = apply(attacks.get("sign-flip"))
  np.testing.assert_allclose(out[BYZ == 1], -5 * x[BYZ == 1], rtol=1e-6)
  x, out = apply(attacks.get("sign_flip", {"attack_scale": -2.0}))
  np.testing.assert_allclose(out[BYZ == 1], -2 * x[BYZ == 1], rtol=1e-6)


def test_sample_duplication_copies_one_regular_real_row():
  x, out = apply(attacks.get("sample-duplication"))
  np.testing.assert_array_equal(out[6], x[0])
  np.testing.assert_array_equal(out[7], x[0])
  mask = MASK.copy()
  mask[0] = 0  # row 0 padded: the first real regular row is 1
  x, out = apply(attacks.get("sample_duplication"), mask=mask)
  np.testing.assert_array_equal(out[6], x[1])
  # with ids, the real regular worker of lowest id, wherever its row is (row 5 is padding)
  x, out = apply(attacks.get("sample_duplication"), ids=[3, 1, 4, 15, 9, 0, 6, 5])
  np.testing.assert_array_equal(out[6], x[1])
  u = rows()  # ids as a list or NumPy's int64, outside jit
  out = attacks.get("sample_duplication")(u, jnp.asarray(BYZ), None, mask=jnp.asarray(MASK),
                                          ids=np.array([3, 1, 4, 15, 9, 0, 6, 5]))
  np.testing.assert_array_equal(flat(out)[6], x[1])
  _, listed = apply(attacks.get("gaussian"), jit=False, ids=[3, 1, 4, 15, 9, 0, 6, 5])
  _, arrayed = apply(attacks.get("gaussian"), ids=np.array([3, 1, 4, 15, 9, 0, 6, 5]))
  np.testing.assert_allclose(listed, arrayed, rtol=1e-6)


def test_alie_default_z_and_explicit_z():
  x, out = apply(attacks.get("alie"))
  mu, sd = regular_stats(x)
  n, b = MASK.sum(), (BYZ * MASK).sum()
  z = norm.ppf((n - (np.floor(n / 2 + 1) - b)) / n)
  np.testing.assert_allclose(out[6], mu - z * sd, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out[7], mu - z * sd, rtol=1e-4, atol=1e-5)
  x, out = apply(attacks.get("alie", {"alie_z": 1.5}), mask=None)
  mu, sd = regular_stats(x, None)
  np.testing.assert_allclose(out[7], mu - 1.5 * sd, rtol=1e-4, atol=1e-5)


def test_ipm_excludes_padding():
  x, out = apply(attacks.get("ipm", {"ipm_epsilon": 0.5}))
  mu, _ = regular_stats(x)
  np.testing.assert_allclose(out[6], -0.5 * mu, rtol=1e-5, atol=1e-6)
  x_nomask, out_nomask = apply(attacks.get("ipm", {"ipm_epsilon": 0.5}), mask=None)
  assert not np.allclose(out_nomask[6], out[6])  # the padded row would have counted


@pytest.mark.parametrize("value", ["nan", "inf", "mixed"])
def test_nonfinite(value):
  _, out = apply(attacks.get("nonfinite", static={"nonfinite_value": value}))
  assert not np.any(np.isfinite(out[BYZ == 1]))
  if value == "nan":
    assert np.all(np.isnan(out[BYZ == 1]))
  if value == "mixed":
    assert np.any(out[6] > 0) and np.any(out[6] < 0)


def test_bad_names_and_parameters():
  for args in (("sybil",), ("gaussian", {"attack_sigma": 0}), ("ipm", {"ipm_epsilon": -1}),
               ("gaussian", {"attack_shared": 2}), ("nonfinite", {}, {"nonfinite_value": "zero"})):
    with pytest.raises(ConfigError):
      attacks.get(*args)
