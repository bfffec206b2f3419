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

Each attack declares itself once, beside its function, with
``fedjax_dp.components.declare("attack", NAME, reference=..., about=..., options=...,
reads_honest=...)``; the registry gives ``--attack``'s values, the ``--set`` options, their
refusal when another attack runs, the hyper-parameters and the compile-cache key. The build
contract of the kind (what :func:`get` calls):

  ``build(**values) -> fn``: one keyword argument per declared option, named as the option, with
  no default of its own (the :class:`fedjax_dp.components.Option` holds it). A numeric option's
  value comes from the round's hyper-parameters, so inside the compiled round it is a traced
  scalar (an unset one, None in its declaration, is NaN there); a static option's is a Python
  value. ``fn(updates, byzantine_mask, key, mask, ids) -> updates`` is the pure attack
  (``mask`` may be None; ``ids`` is given), which :func:`get` wraps in an :class:`Attack`.
  Inside a :class:`fedjax_dp.round.Round`, the static options reach the build through
  ``Round.attack_options`` (:func:`static_options`), and they key the round's compile cache.

The trait every attack declares: ``reads_honest`` (bool), whether its rows are computed from the
regular rows (see below).

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

import dataclasses
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from fedjax_dp import components
from fedjax_dp.components import Option, declare

KNOWLEDGE = ("released", "omniscient")
OMNISCIENT_REASON = ("omniscient attack: the Byzantine messages are computed from honest clients' raw "
                     "state (not from what they release), so they depend on data no mechanism "
                     "protected and the release has no formal guarantee")


@dataclasses.dataclass(frozen=True)
class Attack:
  """A Byzantine attack: ``attack(updates, byzantine_mask, key, mask=None, ids=None) -> updates``.

  Attributes:
    name: a declared attack (``fedjax_dp.components.names("attack")``).
    reads_honest: True when the attackers' rows are computed from the
      regular rows (sample duplication, ALIE, IPM); False when they use only
      their own row or nothing (Gaussian, sign flip, non-finite): the declared trait.
    fn: the pure function ``fn(updates, byzantine_mask, key, mask, ids)`` (``ids`` given).
  """

  name: str
  reads_honest: bool
  fn: Callable

  def __call__(self, updates, byz, key, mask=None, ids=None):
    ids = jnp.arange(byz.shape[0]) if ids is None else ids
    return self.fn(updates, byz, key, mask, jnp.asarray(ids, jnp.int32))


def byzantine_mask(ids: jax.Array, num_clients: int, num_byzantine: int) -> jax.Array:
  """1.0 for the fixed Byzantine set, the last ``num_byzantine`` client ids.

  Args:
    ids: client ids (any shape; a cohort's ``[C]``).
    num_clients: the population size N (ids ``0 .. N-1``).
    num_byzantine: f, the number of Byzantine clients (0 .. N; may be traced, the round's
      ``hp["byzantine"]``).

  Returns:
    float32 array shaped like ``ids``: 1.0 where ``id >= N - f``, else 0.0.
  """
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


@declare("attack", "none", about="the Byzantine clients send their true rows",
         reads_honest=False)
def none():
  """No attack: every row is returned unchanged."""
  def _attack(updates, byz, key, mask, ids):
    """Every row as it is."""
    del byz, key, mask, ids
    return updates
  return _attack


@declare("attack", "gaussian", reference="Zhu and Ling, IJCAI 2022, attack (i)",
         about="rows of Gaussian noise", reads_honest=False, options=(
             Option("attack_sigma", 1e4, "std of the gaussian attack's rows", low=0,
                    low_open=True),
             Option("attack_shared", 0, "gaussian: 1 sends one draw from every attacker (the "
                    "DP-RSA authors' code), 0 a draw per attacker", kind="int", low=0, high=1)))
def gaussian(attack_sigma, attack_shared):
  """Attackers send N(0, sigma^2) in every element (Zhu and Ling 2022, attack (i)), ``sigma =
  attack_sigma``: a draw per attacker, or with ``attack_shared`` 1 one draw that every attacker
  sends, as the DP-RSA authors' released code does (aligned rows: a stronger attack on a sum of
  signs, where independent rows partly cancel)."""

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows of N(0, attack_sigma^2) entries: a draw per attacker from
    ``fold_in(fold_in(leaf key, 0), id)``, or (``attack_shared`` 1) one draw from
    ``fold_in(leaf key, 1)`` that every attacker sends."""
    del mask
    # A draw per leaf (transforms.sample_like), and each attacker's row from its own client
    # id's key, so that no row depends on the cohort's padding, order or devices.
    leaves, treedef = jax.tree_util.tree_flatten(updates)
    keys = jax.random.split(key, len(leaves))
    # Only the attackers' rows are drawn, one at a time (the other rows stay zero and are not
    # sent): the draws cost the attackers' count, not the cohort's.
    attacking = byz > 0
    attackers = jnp.nonzero(attacking, size=byz.shape[0], fill_value=0)[0]

    def draw(k, shape):
      per_id = jax.random.fold_in(k, 0)

      def draw_row(j, own):
        i = attackers[j]
        return own.at[i].set(jax.random.normal(jax.random.fold_in(per_id, ids[i]), shape[1:],
                                                jnp.float32))

      own = jax.lax.fori_loop(0, jnp.sum(attacking), draw_row, jnp.zeros(shape, jnp.float32))
      one = jax.random.normal(jax.random.fold_in(k, 1), shape[1:], jnp.float32)
      return attack_sigma * jnp.where(jnp.asarray(attack_shared) > 0, one, own)
    noise = [draw(k, u.shape) for k, u in zip(keys, leaves)]
    return _replace(updates, byz, jax.tree_util.tree_unflatten(treedef, noise))
  return _attack


@declare("attack", "sign_flip", reference="Zhu and Ling, IJCAI 2022, attack (ii)",
         about="the attacker's true row times a factor", reads_honest=False, options=(
             Option("attack_scale", -5.0, "factor of the sign_flip attack (the attacker's true "
                    "row times it)"),))
def sign_flip(attack_scale):
  """Attackers send their true row times ``attack_scale`` (-5 in Zhu and Ling 2022, attack
  (ii))."""

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows ``attack_scale * u_i``."""
    del key, mask, ids
    return _replace(updates, byz, jax.tree_util.tree_map(lambda u: attack_scale * u, updates))
  return _attack


@declare("attack", "sample_duplication", reference="Zhu and Ling, IJCAI 2022, attack (iii)",
         about="every attacker copies one regular row", reads_honest=True)
def sample_duplication():
  """Every attacker copies the row of one regular worker, the real regular worker of lowest id
  (Zhu and Ling 2022, attack (iii))."""

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows copying the real regular row of lowest client id."""
    del key
    regular = _regular_weights(byz, mask) > 0
    src = jnp.argmin(jnp.where(regular, ids, jnp.iinfo(ids.dtype).max))
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u: jnp.broadcast_to(u[src], u.shape), updates))
  return _attack


@declare("attack", "alie", reference="Baruah et al., NeurIPS 2019",
         about="a little is enough: the regular rows' mean minus z of their standard deviations",
         reads_honest=True,
         options=(Option("alie_z", None, "ALIE's shift in standard deviations; unset: the "
                         "paper's z_max"),))
def alie(alie_z):
  """"A little is enough" (Baruah et al., NeurIPS 2019): mean - z * std of the regular rows.

  Args:
    alie_z: how many standard deviations to shift; None (or NaN) computes the paper's
      ``z_max = Phi^{-1}((n - s) / n)`` with ``s = floor(n / 2 + 1) - b`` from
      the cohort's ``n`` real rows and ``b`` attackers.
  """

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows ``mu - z sigma``, from the regular rows' coordinate-wise mean ``mu`` and
    standard deviation ``sigma`` (``z = alie_z``, or ``z_max`` of the cohort's real rows)."""
    del key, ids
    w = _regular_weights(byz, mask)
    mu = _regular_mean(updates, w)
    var = _regular_mean(jax.tree_util.tree_map(
        lambda u, m: jnp.square(u - m[None]), updates, mu), w)
    n = jnp.sum(mask) if mask is not None else jnp.asarray(float(byz.shape[0]))
    b = jnp.sum(byz * (mask if mask is not None else 1.0))
    s = jnp.floor(n / 2 + 1) - b
    z_max = ndtri(jnp.clip((n - s) / jnp.maximum(n, 1.0), 1e-6, 1 - 1e-6))
    zz = z_max if alie_z is None else jnp.where(jnp.isnan(alie_z), z_max, alie_z)
    new = jax.tree_util.tree_map(lambda m, v: jnp.broadcast_to(m - zz * jnp.sqrt(v), m.shape), mu, var)
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u, n_: jnp.broadcast_to(n_[None], u.shape), updates, new))
  return _attack


@declare("attack", "ipm", reference="Xie, Koyejo and Gupta, UAI 2020",
         about="inner-product manipulation: minus a multiple of the regular rows' mean",
         reads_honest=True, options=(
             Option("ipm_epsilon", 0.1, "IPM's factor: attackers send -epsilon * the regular "
                    "mean", low=0, low_open=True),))
def ipm(ipm_epsilon):
  """Inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020): ``-epsilon * mean`` of the
  regular rows, ``epsilon = ipm_epsilon``."""

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows ``-ipm_epsilon * mu``, ``mu`` the regular rows' mean."""
    del key, ids
    mu = _regular_mean(updates, _regular_weights(byz, mask))
    return _replace(updates, byz, jax.tree_util.tree_map(
        lambda u, m: jnp.broadcast_to(-ipm_epsilon * m[None], u.shape), updates, mu))
  return _attack


@declare("attack", "nonfinite", about="rows of NaN or Inf (to test the aggregators' rejection)",
         reads_honest=False, options=(
             Option("nonfinite_value", "nan", "what the nonfinite attack sends", kind="choice",
                    choices=("nan", "inf", "mixed")),))
def nonfinite(nonfinite_value):
  """Attackers send rows of NaN ("nan"), +Inf ("inf") or alternating +-Inf ("mixed")."""

  def _attack(updates, byz, key, mask, ids):
    """Byzantine rows of NaN, +Inf or alternating +-Inf (``nonfinite_value``)."""
    del key, mask, ids
    def fill(u):
      if nonfinite_value == "nan":
        return jnp.full(u.shape, jnp.nan)
      if nonfinite_value == "inf":
        return jnp.full(u.shape, jnp.inf)
      return jnp.where(jnp.arange(u.size).reshape(u.shape) % 2 == 0, jnp.inf, -jnp.inf)
    return _replace(updates, byz, jax.tree_util.tree_map(fill, updates))
  return _attack


def canonical(name: str) -> str:
  """An attack's name as declared: "-" may stand for "_" (``sign-flip``)."""
  return str(name).replace("-", "_")


def get(name: str, hp: Optional[Mapping] = None, static: Optional[Mapping] = None) -> Attack:
  """The declared attack ``name`` (:func:`canonical`).

  Args:
    name: a declared attack (``fedjax_dp.components.names("attack")``).
    hp: where its numeric options (strengths) are read, by option name: inside the compiled
      round its hyper-parameters, so the strengths are data (``alie_z`` NaN: the paper's
      ``z_max``).
    static: where its static options are read (``nonfinite_value``), by option name.

  Each option missing from both is at its default; other names are ignored. Python numbers and
  text are checked against the option's declaration (:meth:`fedjax_dp.components.Option.parse`);
  arrays pass as they are.

  Returns:
    The :class:`Attack`, ``attack(updates, byzantine_mask, key, mask=None, ids=None) ->
    updates``: the rows of ``byzantine_mask == 1`` replaced by what the attackers send.

  Raises:
    ConfigError: for an undeclared name or a value its option does not allow.
  """
  component = components.get("attack", canonical(name))
  fn = component.build(**component.values(hp or {}, static or {}))
  return Attack(component.name, component["reads_honest"], fn)


def static_options(name: str, values: Mapping) -> tuple:
  """Attack ``name``'s static options (those that shape the compiled round, such as
  ``nonfinite_value``) read from ``values`` (a run's options; defaults for the missing), as
  ``((option, value), ...)``: hashable, for :attr:`fedjax_dp.round.Round.attack_options`.

  Raises:
    ConfigError: for an undeclared name.
  """
  return components.get("attack", canonical(name)).static_key(values)[2]


def knowledge_of_unreleased(attack: str, byzantine: int) -> Optional[str]:
  """A run's ``attacker_knowledge`` where the regular clients' uploads are not released (only a
  noised aggregate is: DP-FedAvg, DDGauss, a hand-built round): None without Byzantine clients;
  else "omniscient" when the attack reads the regular rows (they are unprotected data then,
  whatever the configuration's ``attacker_knowledge`` says), "released" when it does not."""
  if not byzantine:
    return None
  return ("omniscient" if components.get("attack", canonical(attack))["reads_honest"]
          else "released")
