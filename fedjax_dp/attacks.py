"""Byzantine attacks: ``attack(updates[N], byzantine_mask[N], key, mask=None, ids=None)
-> updates[N]``.

``updates`` is a pytree whose leaves have a leading client axis; the rows with
``byzantine_mask == 1`` are replaced by what the attackers send, the others are
returned unchanged. ``mask`` (optional, 1 for real clients) keeps padded rows
out of the statistics an omniscient attacker computes from the regular rows.
``ids`` (optional; the rows' positions ``0..N-1`` without it) are the rows' client ids: what
an attacker sends depends on its id, never on its row's position, so a cohort's padding, order
and split over devices change no message (a random attack draws each attacker's row from its
key folded with the id, ``fold_in(fold_in(leaf key, 0), id)``; sample duplication copies the
regular row of lowest id).
What a row *is* depends on the algorithm: a stochastic gradient for the
gradient-aggregation baselines, the worker's local model ``z_j`` for RSA /
DP-RSA, which then sends ``sign(x_0 - z_j)`` (Zhu and Ling, IJCAI 2022, Eq. 7).

Attacks of Zhu and Ling (2022, Sec. "Numerical experiments"):

* ``gaussian``: each element from N(0, sigma_b^2), sigma_b = 1e4 (``attack_shared``: one draw
  for every attacker, as the authors' released code does).
* ``sign_flip``: the worker's true row times -5.
* ``sample_duplication``: every attacker copies one regular worker's row.

and also ``alie`` (Baruah et al., NeurIPS 2019: mean - z * std of the regular
rows, coordinate-wise), ``ipm`` (Xie et al., UAI 2020: -epsilon * mean of the
regular rows) and ``nonfinite`` (rows of NaN or Inf, to test rejection).

What an attacker knows matters for privacy. Every :class:`Attack` says
whether it reads the regular (honest) rows (``reads_honest``). An algorithm
with a privacy mechanism hands such an attack only what honest clients
*release* (for DP-RSA: their perturbed sign messages), so the attackers'
messages are post-processing of private releases and the guarantee stands:
the run's ``attacker_knowledge`` is ``"released"``. An attack that is given
honest clients' raw state instead (``attacker_knowledge="omniscient"``; e.g.
ALIE on the workers' raw models) makes the attackers' messages depend on
honest data that no mechanism protected, so the run reports
``formal_guarantee: false`` with that reason (see :data:`OMNISCIENT_REASON`).
"""

from __future__ import annotations

from typing import Callable, Optional

import dataclasses

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from fedjax_dp.errors import check_choice, check_unless_traced

ATTACKS = ("none", "gaussian", "sign_flip", "sample_duplication", "alie", "ipm", "nonfinite")
KNOWLEDGE = ("released", "omniscient")
OMNISCIENT_REASON = ("omniscient attack: the Byzantine messages are computed from honest clients' raw "
                     "state (not from what they release), so they depend on data no mechanism "
                     "protected and the release has no formal guarantee")


@dataclasses.dataclass(frozen=True)
class Attack:
  """A Byzantine attack: ``attack(updates, byzantine_mask, key, mask=None, ids=None) -> updates``.

  Attributes:
    name: one of :data:`ATTACKS`.
    reads_honest: True when the attackers' rows are computed from the
      regular rows (sample duplication, ALIE, IPM); False when they use only
      their own row or nothing (Gaussian, sign flip, non-finite).
    fn: the pure function ``fn(updates, byzantine_mask, key, mask, ids)`` (``ids`` given).
  """

  name: str
  reads_honest: bool
  fn: Callable

  def __call__(self, updates, byz, key, mask=None, ids=None):
    ids = jnp.arange(byz.shape[0]) if ids is None else ids
    return self.fn(updates, byz, key, mask, jnp.asarray(ids, jnp.int32))


def byzantine_mask(ids: jax.Array, num_clients: int, num_byzantine: int) -> jax.Array:
  """1.0 for the fixed Byzantine set, the last ``num_byzantine`` client ids."""
  return (ids >= num_clients - num_byzantine).astype(jnp.float32)


def _replace(updates, byz, new):
  def one(u, n):
    b = byz.reshape((-1,) + (1,) * (u.ndim - 1)) > 0
    return jnp.where(b, n.astype(u.dtype), u)
  return jax.tree_util.tree_map(one, updates, new)


def _regular_weights(byz, mask):
  w = 1.0 - byz
  if mask is not None:
    w = w * mask
  return w


def _regular_mean(updates, w):
  denom = jnp.maximum(jnp.sum(w), 1.0)
  return jax.tree_util.tree_map(lambda u: jnp.tensordot(w, u, axes=(0, 0)) / denom, updates)


def none() -> Attack:
  def attack(updates, byz, key, mask, ids):
    del byz, key, mask, ids
    return updates
  return Attack("none", False, attack)


def gaussian(sigma: float = 1e4, shared=0) -> Attack:
  """Attackers send N(0, sigma^2) in every element (Zhu and Ling 2022, attack (i)): a draw per
  attacker, or with ``shared`` (1; a hyper-parameter, so it may be traced) one draw that every
  attacker sends, as the DP-RSA authors' released code does (aligned rows: a stronger attack on
  a sum of signs, where independent rows partly cancel)."""
  check_unless_traced(lambda s: s > 0, "attack_sigma", sigma, "must be > 0")

  def attack(updates, byz, key, mask, ids):
    del mask
    # A draw per leaf (transforms.sample_like), and each attacker's row from its own client
    # id's key, so that no row depends on the cohort's padding, order or devices.
    leaves, treedef = jax.tree_util.tree_flatten(updates)
    keys = jax.random.split(key, len(leaves))

    def draw(k, shape):
      per_id = jax.random.fold_in(k, 0)
      own = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(per_id, i), shape[1:],
                                                 jnp.float32))(ids)
      one = jax.random.normal(jax.random.fold_in(k, 1), shape[1:], jnp.float32)
      return sigma * jnp.where(jnp.asarray(shared) > 0, one, own)
    noise = [draw(k, u.shape) for k, u in zip(keys, leaves)]
    return _replace(updates, byz, jax.tree_util.tree_unflatten(treedef, noise))
  return Attack("gaussian", False, attack)


def sign_flip(scale: float = -5.0) -> Attack:
  """Attackers send their true row times ``scale`` (-5 in Zhu and Ling 2022, attack (ii))."""

  def attack(updates, byz, key, mask, ids):
    del key, mask, ids
    return _replace(updates, byz, jax.tree_util.tree_map(lambda u: scale * u, updates))
  return Attack("sign_flip", False, attack)


def sample_duplication() -> Attack:
  """Every attacker copies the row of one regular worker, the real regular worker of lowest id
  (Zhu and Ling 2022, attack (iii))."""

  def attack(updates, byz, key, mask, ids):
    del key
    regular = _regular_weights(byz, mask) > 0
    src = jnp.argmin(jnp.where(regular, ids, jnp.iinfo(ids.dtype).max))
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u: jnp.broadcast_to(u[src], u.shape), updates))
  return Attack("sample_duplication", True, attack)


def alie(z: Optional[float] = None) -> Attack:
  """"A little is enough" (Baruah et al., NeurIPS 2019): mean - z * std of the regular rows.

  Args:
    z: how many standard deviations to shift; None (or NaN) computes the paper's
      ``z_max = Phi^{-1}((n - s) / n)`` with ``s = floor(n / 2 + 1) - b`` from
      the cohort's ``n`` real rows and ``b`` attackers.
  """

  def attack(updates, byz, key, mask, ids):
    del key, ids
    w = _regular_weights(byz, mask)
    mu = _regular_mean(updates, w)
    var = _regular_mean(jax.tree_util.tree_map(
        lambda u, m: jnp.square(u - m[None]), updates, mu), w)
    n = jnp.sum(mask) if mask is not None else jnp.asarray(float(byz.shape[0]))
    b = jnp.sum(byz * (mask if mask is not None else 1.0))
    s = jnp.floor(n / 2 + 1) - b
    z_max = ndtri(jnp.clip((n - s) / jnp.maximum(n, 1.0), 1e-6, 1 - 1e-6))
    zz = z_max if z is None else jnp.where(jnp.isnan(z), z_max, z)
    new = jax.tree_util.tree_map(lambda m, v: jnp.broadcast_to(m - zz * jnp.sqrt(v), m.shape), mu, var)
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u, n_: jnp.broadcast_to(n_[None], u.shape), updates, new))
  return Attack("alie", True, attack)


def ipm(epsilon: float = 0.1) -> Attack:
  """Inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020): ``-epsilon * mean`` of regular rows."""
  check_unless_traced(lambda e: e > 0, "ipm_epsilon", epsilon, "must be > 0")

  def attack(updates, byz, key, mask, ids):
    del key, ids
    mu = _regular_mean(updates, _regular_weights(byz, mask))
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u, m: jnp.broadcast_to(-epsilon * m[None], u.shape), updates, mu))
  return Attack("ipm", True, attack)


def nonfinite(value: str = "nan") -> Attack:
  """Attackers send rows of NaN ("nan"), +Inf ("inf") or alternating +-Inf ("mixed")."""
  check_choice("nonfinite_value", value, ("nan", "inf", "mixed"))

  def attack(updates, byz, key, mask, ids):
    del key, mask, ids
    def fill(u):
      if value == "nan":
        return jnp.full(u.shape, jnp.nan)
      if value == "inf":
        return jnp.full(u.shape, jnp.inf)
      return jnp.where(jnp.arange(u.size).reshape(u.shape) % 2 == 0, jnp.inf, -jnp.inf)
    return _replace(updates, byz, jax.tree_util.tree_map(fill, updates))
  return Attack("nonfinite", False, attack)


ATTACK_HPARAMS = {"attack_sigma": 1e4, "attack_shared": 0, "attack_scale": -5.0,
                  "alie_z": float("nan"), "ipm_epsilon": 0.1}


def from_hparams(name: str, hp: dict, nonfinite_value: str = "nan") -> Attack:
  """The attack ``name`` with its strengths read from ``hp`` (:data:`ATTACK_HPARAMS` keys).

  Called inside the compiled round, so the strengths are data (``alie_z``
  NaN means the paper's ``z_max``); a strength missing from ``hp`` takes its default.
  """
  v = {k: hp.get(k, d) for k, d in ATTACK_HPARAMS.items()}
  return get(name, sigma=v["attack_sigma"], shared=v["attack_shared"], scale=v["attack_scale"],
             alie_z=v["alie_z"], ipm_epsilon=v["ipm_epsilon"], nonfinite_value=nonfinite_value)


def get(name: str, *, sigma: float = 1e4, shared=0, scale: float = -5.0,
        alie_z: Optional[float] = None, ipm_epsilon: float = 0.1,
        nonfinite_value: str = "nan") -> Attack:
  """An attack by name (one of :data:`ATTACKS`); "-" may stand for "_" (``sign-flip``)."""
  name = str(name).replace("-", "_")
  check_choice("attack", name, ATTACKS)
  makers = {"none": none, "gaussian": lambda: gaussian(sigma, shared),
            "sign_flip": lambda: sign_flip(scale), "sample_duplication": sample_duplication,
            "alie": lambda: alie(alie_z), "ipm": lambda: ipm(ipm_epsilon), "nonfinite": lambda: nonfinite(nonfinite_value)}
  return makers[name]()


def knowledge_of_unreleased(attack: str, byzantine: int) -> Optional[str]:
  """A run's ``attacker_knowledge`` where the regular clients' uploads are not released (only a
  noised aggregate is: DP-FedAvg, DDGauss, a hand-built round): None without Byzantine clients;
  else "omniscient" when the attack reads the regular rows (they are unprotected data then,
  whatever the configuration's ``attacker_knowledge`` says), "released" when it does not."""
  if not byzantine:
    return None
  return "omniscient" if get(attack).reads_honest else "released"
