"""Empirical privacy audits: a lower bound on epsilon from releases on neighbouring inputs.

``fedjax-dp audit --mechanism NAME`` runs one round (one local step for the
DP-SGD family) of a mechanism many times, vmapped, on two neighbouring inputs
under the relation its ledger claims, and turns the error rates of the best
threshold test between them into a lower bound on epsilon (Jagielski, Ullman
and Oprea, "Auditing Differentially Private Machine Learning: How Private is
Private SGD?", NeurIPS 2020; Nasr et al., S&P 2021 and USENIX Security 2023).

Everything that runs is the library's: each audit builds the algorithm's
:class:`fedjax_dp.algorithms.Setup` through its own builder (the real client
piece with its transforms, the aggregator, the attack, DP-SGD's sampling and
per-example clipping, the sign perturbations) from a small synthetic data set
holding a worst-case canary, runs :func:`fedjax_dp.round.step` (or, for DP-RSA,
the worker piece whose messages the master sees), and takes ``epsilon_claimed``
from the Setup's own accounting after that one round.

The test (:func:`epsilon_lower_bound`). The releases of each world are split
in halves. On the first half the attacker learns a direction ``v`` (the
difference of the two worlds' mean releases) and the best threshold on the
statistic ``<release - midpoint, v>`` (either orientation); on the second half
that one test's false positive and false negative rates get Clopper-Pearson
upper bounds, each one-sided at ``(1 - confidence) / 2`` so both hold together
with probability ``confidence``. Then
``epsilon >= max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u))``
(an (epsilon, delta)-DP mechanism has ``FPR e^eps + delta >= 1 - FNR`` for
every test). Selecting on one half and bounding on the other needs no
correction for multiple testing.

``fedjax-dp audit --one-run`` audits a whole DP-FedAvg training run instead, in one run, with
many canary clients (:mod:`fedjax_dp.audit_one_run`).

A lower bound is evidence, not proof: a mechanism whose bound stays below its
claim is not shown private, while a bound above the claim (exit status 1)
shows that the claim is false for the code that ran (at the stated confidence).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
import numpy as np
from scipy.stats import norm

from fedjax_dp.algorithms import build
from fedjax_dp.audit_one_run import CANARIES, ONE_RUN, SETTINGS, one_run_audit
from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData
from fedjax_dp.errors import ConfigError, check, check_choice
from fedjax_dp.jsonio import dumps
from fedjax_dp.lower_bounds import (Family, SignFamily, family_bound, sign_bound, error_rates,
                                    threshold_epsilon)
from fedjax_dp.models import Model
from fedjax_dp.models.zoo import MLP
from fedjax_dp.round import CohortBatch, messages, step
from fedjax_dp.sampling import Cohort

DELTA = 1e-5
SCALES = (1.0, 10.0, 100.0)
CANARY = 50.0      # the canary's feature value: its gradient is far above every clip bound
DIM = 2            # inputs: feature 0 is the canary's alone (0 for every other example)
PARAMS = DIM * 2 + 2  # the audited model's parameters (a 2-by-2 kernel and 2 biases)


# ----------------------------------------------------------------------------------------------
# The tests: the releases projected on a learned direction, then bounded.

def _project(r0: np.ndarray, r1: np.ndarray, coords: Optional[np.ndarray]):
  """The statistic ``<release - midpoint, v>`` of every release, world 1 higher on average.

  ``v`` is the difference of the two worlds' mean releases on the first half of each world's
  trials and the midpoint their average; ``coords`` (a ``[d]`` mask) restricts both to the
  coordinates the canary was designed to reach (a Dirac canary's), which the auditor knows in
  advance.
  """
  r0 = np.asarray(r0, np.float64).reshape(len(r0), -1)
  r1 = np.asarray(r1, np.float64).reshape(len(r1), -1)
  if coords is not None:
    r0, r1 = r0[:, coords], r1[:, coords]
  h = len(r0) // 2
  m0, m1 = r0[:h].mean(0), r1[:h].mean(0)
  v, mid = m1 - m0, (m0 + m1) / 2
  return (r0 - mid) @ v, (r1 - mid) @ v


def epsilon_lower_bound(r0: np.ndarray, r1: np.ndarray, delta: float, confidence: float,
                        coords: Optional[np.ndarray] = None) -> dict:
  """Assumption-free lower bound on epsilon from releases ``r0``, ``r1`` (``[trials, d]``).

  The statistic is :func:`_project`'s; the orientation and threshold of the best test
  (:func:`fedjax_dp.lower_bounds.threshold_epsilon`) are chosen on the first half of each world's
  trials, and that one test's rates are bounded on the second half (Clopper-Pearson, each
  one-sided at ``(1 - confidence) / 2``). Selecting on one half and bounding on the other needs
  no correction for multiple testing.

  Args:
    r0, r1: the releases of worlds 0 and 1, ``[trials, d]`` each.
    delta: the delta at which epsilon is bounded.
    confidence: the joint confidence of the two rate bounds.
    coords: a ``[d]`` mask of the coordinates the statistic reads (None: all).

  Returns:
    The bound (0 when no test beats guessing), the largest bound the trial counts can show
    (a test without errors), and the chosen test's counts.
  """
  s0, s1 = _project(r0, r1, coords)
  h = len(s0) // 2
  alpha = 1.0 - confidence
  best = None
  for sign in (1.0, -1.0):
    a, b = sign * s0, sign * s1
    u = np.unique(np.concatenate([a[:h], b[:h]]))
    # Midpoints between consecutive values: on the selection half each splits it as the value
    # below does, and on fresh data it sits in the middle of a gap rather than at its edge.
    cand = np.concatenate([[-np.inf], (u[:-1] + u[1:]) / 2])
    eps = threshold_epsilon(*error_rates(cand, np.sort(a[:h]), np.sort(b[:h]), alpha / 2)[2:],
                            delta)
    i = int(np.nanargmax(np.where(np.isfinite(eps), eps, -np.inf)))
    if best is None or eps[i] > best[0]:
      best = (eps[i], sign, cand[i], a[h:], b[h:])
  _, sign, t, e0, e1 = best
  fp, fn, fpr_u, fnr_u = (x[0] for x in error_rates(np.array([t]), np.sort(e0), np.sort(e1),
                                                    alpha / 2))
  eps = threshold_epsilon(fpr_u, fnr_u, delta)
  cap = threshold_epsilon(*error_rates(np.array([0.5]), np.zeros(len(e0)), np.ones(len(e1)),
                                      alpha / 2)[2:], delta)
  return {"epsilon_lower_bound": max(0.0, float(eps)) if np.isfinite(eps) else 0.0,
          "max_lower_bound_at_trials": float(cap[0]),
          "test": {"orientation": "above" if sign > 0 else "below", "threshold": float(t),
                   "false_positives": int(fp), "false_negatives": int(fn),
                   "evaluated_per_world": [len(e0), len(e1)],
                   "fpr_upper": float(fpr_u), "fnr_upper": float(fnr_u)}}


# ----------------------------------------------------------------------------------------------
# The synthetic federation holding the canary.

def linear_model():
  """Softmax regression on ``DIM`` features, 2 classes (6 parameters)."""
  return Model("audit_linear", MLP(2, hidden=()), (DIM,), 2)


def federation(num_clients: int, examples: int, seed: int, special=None, alone: bool = False,
               crowd=None):
  """Benign clients (feature 0 is 0, feature 1 ~ N(0, 1), random labels), ``examples`` each.

  ``crowd = (x0, label)``: instead, every example of every client is ``(x0, 0)`` with
  ``label``. ``special = (client, x0, label)``: example 0 of ``client`` becomes ``(x0, 0)``
  with ``label`` (the canary, an anti-canary, or a zero example); with ``alone`` that
  client holds just that example.

  Args:
    num_clients: the clients.
    examples: the examples of each.
    seed: the seed of the features and labels.
    special: ``(client, x0, label)``, or None for none.
    alone: the special client holds its special example only.
    crowd: ``(x0, label)`` held by every example before ``special`` is set, or None.

  Returns:
    The :class:`fedjax_dp.data.FederatedData` (its test set: client 0's first example).
  """
  rng = np.random.default_rng([seed, 0xA0D1])
  x = np.zeros((num_clients, examples, DIM), np.float32)
  x[..., 1] = rng.normal(size=(num_clients, examples))
  y = rng.integers(0, 2, size=(num_clients, examples)).astype(np.int32)
  if crowd is not None:
    x[..., 0], x[..., 1], y[...] = crowd[0], 0.0, crowd[1]
  counts = np.full(num_clients, examples, np.int32)
  if special is not None:
    client, x0, label = special
    x[client, 0] = (x0, 0.0)
    y[client, 0] = label
    if alone:
      counts[client] = 1
  return FederatedData("audit", x, y, counts, x[0, :1], y[0, :1], 2)


def _config(**fields):
  base = dict(model=linear_model(), rounds=1, delta=DELTA, target_epsilon=None, client_lr=1.0,
              server_lr=1.0, local_steps=1, batch_size=1, eval_every=1)
  return make_config(base, **fields)


def _zero_state(rnd, hp):
  state = rnd.init(jax.random.PRNGKey(0), hp)
  return state._replace(params=jax.tree_util.tree_map(jnp.zeros_like, state.params))


@functools.lru_cache(maxsize=64)
def _step_fn(rnd):
  """``(keys, ids, mask, state, hp, x, y, counts) -> [trials, d]``: the new global model after one
  :func:`fedjax_dp.round.step` per trial, compiled once per Round (both neighbours, any noise)."""

  def one(k, i, m, state, hp, x, y, c):
    new, _ = step(rnd, state, hp, CohortBatch(x[i], y[i], c[i], i, m), k)
    return ravel_pytree(new.params)[0]

  return jax.jit(jax.vmap(one, in_axes=(0, 0, 0) + (None,) * 5))


# Trials per compiled call: the releases of one audit are computed in chunks of this size.
CHUNK = 1 << 15


def _chunked(fn, keys, per_trial=(), shared=()) -> np.ndarray:
  """``fn(keys, *per_trial, *shared)`` over the leading axis in chunks of :data:`CHUNK` (the
  last padded with its own first rows, then cut), stacked on the host."""
  n, out = len(keys), []
  for lo in range(0, n, CHUNK):
    idx = np.arange(lo, lo + CHUNK) % n if n > CHUNK else np.arange(n)
    part = fn(keys[idx], *(a[idx] for a in per_trial), *shared)
    out.append(np.asarray(part)[:min(CHUNK, n - lo)])
  return np.concatenate(out)


def _round_releases(setup, data, hp, ids, mask, key, trials: int):
  """One round per trial on ``data`` with cohorts ``ids``, ``mask`` (``[trials, C]``)."""
  rnd = setup.program
  keys = jax.random.split(key, trials)
  return _chunked(_step_fn(rnd), keys, (ids, mask),
                  (_zero_state(rnd, hp), hp, data.x, data.y, data.counts))


def _canary_coords(setup, hp) -> np.ndarray:
  """The model coordinates only the canary's feature reaches (its row of the kernel)."""
  params = _zero_state(setup.program, hp).params
  marked = jax.tree_util.tree_map_with_path(
      lambda path, p: p.at[0].set(1.0) if getattr(path[-1], "key", None) == "kernel" else p, params)
  return np.asarray(ravel_pytree(marked)[0]) > 0


def _claim(setup, cohort) -> dict:
  """The setup's own accounting after one round with ``cohort``."""
  setup.accounting.on_round(cohort)
  rep = setup.accounting.report()
  keep = ("epsilon", "delta", "accountant", "formal_guarantee", "privacy_unit",
          "neighbouring_relation", "guarantee_note", "dp_event", "epsilon_exact")
  return {k: rep[k] for k in keep if k in rep}


def _hp(setup, key: str, factor: float) -> dict:
  """The setup's hparams with ``hp[key]`` multiplied by ``factor`` (what the release runs with)."""
  hp = dict(setup.hparams)
  hp[key] = np.asarray(hp[key] * factor, hp[key].dtype)
  return hp


# ----------------------------------------------------------------------------------------------
# The audits. Each ``run(trials, key, factor, scale) -> (r0, r1, claim, coords)``.

NUM_USERS = 8  # the population of the user-level audits (the canary is the last client)


def _user_level(algorithm: str, sampling: str, options=None, noise_key: str = "noise_multiplier",
                users: int = NUM_USERS, cohort: int = 4, crowd: bool = False):
  """DP-FedAvg family: the round's noisy mean of clipped updates, one round.

  Poisson (add/remove): world 1 has the canary client, world 0 has not (its slot
  never joins; the population size and the public denominator ``qN`` are kept).
  Fixed cohorts (replace-one): the canary is replaced by the anti-canary (the same
  example with the other label, whose update is the canary's negated). ``noise_key``: the
  hyper-parameter the noise factor scales; ``users`` clients, fixed cohorts of ``cohort``.

  ``crowd``: every other client holds the anti-canary too (:func:`_crowd_signal`), the
  worst case of replace-one under cohorts drawn without replacement.
  """
  def run(trials, key, factor, scale):
    cfg = dict(algorithm=algorithm, num_clients=users, sampling=sampling, clip=1.0,
               noise_multiplier=1.5 if sampling == "poisson" else 3.0, options=options or {})
    cfg.update(sampling_prob=0.5) if sampling == "poisson" else cfg.update(cohort_size=cohort)
    canary = users - 1
    out = []
    for world in (0, 1):
      label = 0 if world else 1
      data = federation(users, 4, 0, (canary, CANARY * scale, label), alone=True,
                        crowd=(CANARY * scale, 1) if crowd else None)
      setup = _build(_config(**cfg, seed=world), data)
      ids, mask = setup.sampler.sample_many(trials)
      if sampling == "poisson" and world == 0:
        mask = np.where(ids == canary, 0.0, mask).astype(np.float32)
      hp = _hp(setup, noise_key, factor)
      out.append(_round_releases(setup, data, hp, ids, mask, jax.random.fold_in(key, world), trials))
    claim = _claim(setup, Cohort(np.arange(users, dtype=np.int32), np.ones(users, np.float32)))
    claim["signal"] = _crowd_signal(crowd) / (cfg["noise_multiplier"] * factor)
    return out[0], out[1], claim, _canary_coords(setup, hp)
  return run


def _crowd_signal(crowd: bool) -> float:
  """The canary's shift, in clip bounds, of a release that sums clipped contributions.

  Alone (every other contribution 0 along the canary's direction) the canary moves the sum by
  +1 and the anti-canary by -1: a mixture against a mixture under sampling
  (``Family(p, replace=True)``). In a crowd of anti-canaries (every other client, or example,
  holds the anti-canary), world 0 is the crowd alone, and in world 1 the canary takes its slot's
  place when that slot is drawn, moving the sum by +2 with the slot's probability ``p``: the
  add/remove family ``Family(p)`` with twice the signal, and a larger epsilon than the mixture
  pair's for the same noise (for ``p = 1/2``, noise 3 clip bounds and delta 1e-5: 2.02 against
  1.26), since under sampling without replacement the slot a sampled-out canary leaves is taken
  by another member of the population.
  """
  return 2.0 if crowd else 1.0


def _build(config, data):
  return build(config, data)


def _example_level(algorithm: str, example_sampling: str, cls: Optional[str] = None):
  """DP-SGD family: one client's upload after one local DP-SGD step (replace one example).

  Two clients (one per SP-FL privacy class); the audited client (of class
  ``cls``) is the cohort. Its example 0 is the canary in world 1 and the
  anti-canary in world 0 (published SP-FL: a zero example, since its low class
  scales the noise by the batch's own norms). Under fixed-size batches its other 63
  examples are anti-canaries (:func:`_crowd_signal`), otherwise benign.
  """
  def run(trials, key, factor, scale):
    options = {"example_sampling": example_sampling}
    if cls is not None:
      options["high_fraction"] = 0.5
    cfg = dict(algorithm=algorithm, num_clients=2, sampling="fixed", cohort_size=1, clip=1.0,
               noise_multiplier=2.0 if example_sampling == "poisson" else 3.0,
               batch_size=32 if example_sampling == "poisson" else 48,
               weighting="uniform", options=options,
               accountant="pld" if example_sampling == "poisson" else "rdp")
    setup = _build(_config(**cfg), federation(2, 64, 0))
    client = int(np.flatnonzero(np.asarray(setup.hparams["client_class"]) ==
                                (1 if cls == "low" else 0))[0])
    zero = algorithm == "spfl"
    crowd = example_sampling == "fixed" and not zero
    noise_key = "z_grad" if cls == "high" and not zero else "sigma"
    out = []
    for world in (0, 1):
      special = (client, CANARY * scale if (world or not zero) else 0.0, 0 if world else 1)
      data = federation(2, 64, 0, special, crowd=(CANARY * scale, 1) if crowd else None)
      setup = _build(_config(**cfg), data)
      ids = np.full((trials, 1), client, np.int32)
      mask = np.ones((trials, 1), np.float32)
      hp = _hp(setup, noise_key, factor)
      out.append(_round_releases(setup, data, hp, ids, mask, jax.random.fold_in(key, world), trials))
    claim = _claim(setup, Cohort(np.array([client], np.int32), np.ones(1, np.float32)))
    eps = setup.accounting.client_epsilon(client)
    claim.update(epsilon=eps, formal_guarantee=eps is not None)
    claim["class"] = "all" if cls is None else cls
    claim["signal"] = _crowd_signal(crowd) / float(hp[noise_key])
    return out[0], out[1], claim, _canary_coords(setup, hp)
  return run


PUBLIC = 4  # AE-DPFL's public examples in its audit


def _votes(trials, key, factor, scale):
  """AE-DPFL: the noisy vote counts the server step receives, one round (add/remove a client).

  Two clients: the canary (one example, 50 on feature 0, label 0; after its local step it votes
  class 0 on every public example) and the holder of the public set (``PUBLIC`` examples), who
  leaves the population. Poisson sampling (q = 0.5): in world 1 the canary joins with
  probability q, in world 0 never. The release is what the round's server step receives (the
  step is swapped for one that returns it: training on the noisy labels is post-processing).
  """
  cfg = dict(algorithm="ae-dpfl", num_clients=2, sampling="poisson", sampling_prob=0.5,
             noise_multiplier=1.5, options={"public_size": PUBLIC})
  data = federation(2, PUBLIC, 0, (0, CANARY * scale, 0), alone=True)
  setup = _build(_config(**cfg), data)
  rnd = setup.program
  released = dataclasses.replace(rnd, hooks=rnd.hooks._replace(
      server_step=lambda state, counts, hp, key: (counts, state.opt_state)))
  hp = _hp(setup, "noise_multiplier", factor)
  out = []
  for world in (0, 1):
    ids, mask = setup.sampler.sample_many(trials)
    mask = mask * world
    keys = jax.random.split(jax.random.fold_in(key, world), trials)
    out.append(_chunked(_step_fn(released), keys, (ids, mask),
                        (_zero_state(rnd, hp), hp, data.x, data.y, data.counts)))
  claim = _claim(setup, Cohort(np.zeros(1, np.int32), np.ones(1, np.float32)))
  claim["signal"] = 1.0 / float(hp["noise_multiplier"])  # votes of norm sqrt(m), noise z sqrt(m)
  return out[0], out[1], claim, np.arange(2 * PUBLIC) % 2 == 0  # the counts of class 0


@functools.lru_cache(maxsize=16)
def _message_fn(rnd):
  """``(keys, x0, row, hp, x, y, count) -> [trials, d]``: one worker's message per trial (the
  worker piece the master hears), compiled once per Round."""

  def one(k, x0, row, hp, x, y, c):
    return ravel_pytree(rnd.client(hp)(x0, x, y, c, row, (), k).upload)[0]

  return jax.jit(jax.vmap(one, in_axes=(0,) + (None,) * 6))


def _sign(variant: str, options: dict, perturb_key: str, flip: bool):
  """DP-RSA: the messages one worker sends in one iteration (replace the worker's data set).

  The worker's model ``x_k``, which its data set determines, is ``x_0 + scale`` in
  every coordinate in world 0 and ``x_0 - scale`` in world 1 (``x_0 = 0``): every
  sign of ``u = x_0 - x_k`` differs. ``flip``: the factor scales the flip
  probability ``1 - keep_prob`` (else it scales ``hp[perturb_key]``).
  """
  def run(trials, key, factor, scale):
    cfg = dict(algorithm=variant, num_clients=1, sampling="fixed", cohort_size=1, options=options)
    data = federation(1, 4, 0)
    setup = _build(_config(**cfg), data)
    rnd, hp = setup.program, dict(setup.hparams)
    if flip:
      hp[perturb_key] = np.float32(1.0 - (1.0 - hp[perturb_key]) * factor)
    else:
      hp = _hp(setup, perturb_key, factor)
    state = _zero_state(rnd, hp)
    out = []
    for world in (0, 1):
      s = scale if world == 0 else -scale
      row = jax.tree_util.tree_map(lambda p: p + s, state.params)
      keys = jax.random.split(jax.random.fold_in(key, world), trials)
      out.append(_chunked(_message_fn(rnd), keys,
                          shared=(state.params, row, hp, data.x[0], data.y[0], data.counts[0])))
    claim = _claim(setup, Cohort(np.zeros(1, np.int32), np.ones(1, np.float32)))
    clip = hp.get("sign_clip")  # a Sign-Gaussian coordinate past its clip flips w.p. Phi(-c/sd)
    claim["signal"] = (float(hp["keep_prob"]) if flip else None if clip is None
                       else float(norm.cdf(clip / hp["sign_sigma"])))  # the keep probability
    return out[0], out[1], claim, None
  return run


def _omniscient(trials, key, factor, scale):
  """DP-RSA(F) with one Byzantine worker running IPM on the regular workers' raw models.

  Release: every message the master receives in one iteration (the regular
  workers' perturbed signs and the attacker's), composed from the round's own
  pieces by :func:`fedjax_dp.round.messages` (what the step aggregates). Four regular
  workers, one Byzantine; worker 0's model is ``-/+ scale`` in every coordinate
  (worlds 0/1), the other workers' models are fixed N(0, 1) draws.
  """
  K = 5
  cfg = dict(algorithm="dp-rsa-f", num_clients=K, sampling="fixed", cohort_size=K, byzantine=1,
             attack="ipm", attacker_knowledge="omniscient",
             options={"keep_prob": 0.6, "ipm_epsilon": 1.0})
  data = federation(K, 4, 0)
  setup = _build(_config(**cfg), data)
  rnd, hp = setup.program, dict(setup.hparams)
  hp["keep_prob"] = np.float32(1.0 - (1.0 - hp["keep_prob"]) * factor)
  state = _zero_state(rnd, hp)
  rng = np.random.default_rng(0xA0D2)
  others = jax.tree_util.tree_map(lambda r: jnp.asarray(rng.normal(size=r.shape), jnp.float32),
                                  state.rows)
  ids = jnp.arange(K, dtype=jnp.int32)
  mask = jnp.ones((K,), jnp.float32)
  x, y, c = (jnp.asarray(a) for a in (data.x, data.y, data.counts))

  def one(k, rows):
    sent = messages(rnd, state._replace(rows=rows), hp, CohortBatch(x, y, c, ids, mask), k)[1]
    return ravel_pytree(sent)[0]

  fn = jax.jit(jax.vmap(one, in_axes=(0, None)))
  out = []
  for world in (0, 1):
    s = -scale if world == 0 else scale
    rows = jax.tree_util.tree_map(lambda o: o.at[0].set(s), others)
    keys = jax.random.split(jax.random.fold_in(key, world), trials)
    out.append(_chunked(fn, keys, shared=(rows,)))
  claim = _claim(setup, Cohort(np.arange(K, dtype=np.int32), np.ones(K, np.float32)))
  return out[0], out[1], claim, None


@dataclasses.dataclass(frozen=True)
class Audit:
  """One audited mechanism: what its two neighbours are and how it is run.

  Attributes:
    run: ``(trials, key, noise_factor, scale) -> (releases0, releases1, claim, coords)``; the
      claim holds the ledger's report and ``signal``, the parameter of the release that ran in
      ``family``'s terms (its exact epsilon is ``epsilon_of_release``).
    covers: the relation, the number of rounds/steps and the canary, in words.
    formal: whether the library claims a guarantee (False: audited over ``--scales``).
    family: the family the release along the canary's direction belongs to
      (:mod:`fedjax_dp.lower_bounds`), for the bound that assumes it.
    trials: the default number of releases per neighbour.
    max_noise_factor: the largest ``noise_factor`` the mechanism can run with (Sign-Flipping's
      flip probability, which the factor scales, is at most 1/2).
  """

  run: Callable
  covers: str
  formal: bool = True
  family: Union[Family, SignFamily, None] = None
  trials: int = 200_000
  max_noise_factor: float = math.inf


_FEDAVG = ("user-level, one round, population 8 (4 examples each), clip 1; canary: one client "
           "whose single example (50 on feature 0, which benign clients leave at 0) moves its "
           "update far past the clip")
_DPSGD = ("example-level, replace one example, one client, one local DP-SGD step (64 examples), "
          "clip 1; canary: an example (50 on feature 0, which benign "
          "examples leave at 0) replaced by the same example with the other label")
_CROWD = ("the other 63 examples are anti-canaries (the worst case under batches drawn without "
          "replacement)")
_SIGN = ("worker-level, replace one worker's data set, one iteration, 6 coordinates; the worker's "
         "model x_k is x_0 - 1 in world 1 and x_0 + 1 in world 0 (every sign differs)")
AUDITS = {
    "dp_fedavg-poisson": Audit(_user_level("dp_fedavg", "poisson"),
                               _FEDAVG + "; add/remove the canary client under Poisson sampling "
                               "(q = 0.5), noise multiplier 1.5", family=Family(0.5)),
    "dp_fedavg-fixed": Audit(_user_level("dp_fedavg", "fixed", cohort=6, crowd=True),
                             _FEDAVG + "; replace the canary client by its anti-canary (the other "
                             "label), every other client holding the anti-canary (the worst case "
                             "under cohorts drawn without replacement), cohorts of 6 without "
                             "replacement, noise multiplier 3",
                             family=Family(6 / NUM_USERS), trials=500_000),
    "ddgauss": Audit(_user_level("ddgauss", "fixed", noise_key="sigma", users=2, cohort=2),
                     "user-level, one round, 2 clients (4 examples each), both in every cohort, "
                     "clip 1; DDGauss (16-bit secure sum of discrete Gaussian shares after "
                     "rotation, scaling and randomized rounding), noise multiplier 3; replace "
                     "the canary client (one example, 50 on a feature no other client has) by "
                     "its anti-canary (the other label)",
                     family=Family(1.0, replace=True), trials=50_000),
    "ae-dpfl": Audit(_votes, "user-level, one round: the noisy vote counts on 4 public examples "
                     "(a canary client that votes class 0 on each, added or removed under "
                     "Poisson sampling, q = 0.5), noise multiplier 1.5", family=Family(0.5)),
    "blur+lus": Audit(_user_level("blur+lus", "poisson"),
                      _FEDAVG + "; BLUR local training, LUS sparsification (0.7) then clip then "
                      "noise; add/remove under Poisson sampling (q = 0.5), noise multiplier 1.5",
                      family=Family(0.5)),
    "dp-sgd-fixed": Audit(_example_level("dp-fl", "fixed"),
                          _DPSGD + "; fixed-size batches of 48 sampled without replacement, "
                          "noise multiplier 3; " + _CROWD, family=Family(48 / 64), trials=500_000),
    "dp-sgd-poisson": Audit(_example_level("dp-fl", "poisson"),
                            _DPSGD + "; Poisson batches (rate 1/2) truncated at the library's "
                            "capacity, noise multiplier 2, PLD accountant",
                            family=Family(0.5, replace=True)),
    "spfl-sound-high": Audit(_example_level("spfl-sound", "fixed", "high"),
                             _DPSGD + "; fixed batches of 48, spfl-sound's high class, sigma 3 (the gradient's share "
                             "of it, beside the noisy norm statistic); " + _CROWD,
                             family=Family(48 / 64), trials=500_000),
    "spfl-sound-low": Audit(_example_level("spfl-sound", "fixed", "low"),
                            _DPSGD + "; fixed batches of 48, spfl-sound's low class, sigma 3: gradients scaled by "
                            "beta_low 0.9 under the cap low_cap = clip; " + _CROWD,
                            family=Family(48 / 64), trials=500_000),
    "dp-rsa-f": Audit(_sign("dp-rsa-f", {"keep_prob": 0.6}, "keep_prob", True),
                      _SIGN + "; Sign-Flipping, keep probability 0.6", max_noise_factor=1.25,
                      family=SignFamily(PARAMS)),
    "dp-rsa-g": Audit(_sign("dp-rsa-g", {"sign_sigma": 1.5, "sign_clip": 0.5}, "sign_sigma", False),
                      _SIGN.replace("- 1 in", "- 100 in").replace("+ 1 in", "+ 100 in")
                      + "; Sign-Gaussian, sigma 1.5, coordinates clipped to [-0.5, 0.5]",
                      family=SignFamily(PARAMS)),
    "spfl": Audit(_example_level("spfl", "fixed", "low"),
                  "published SP-FL's low class (noise scaled by the batch's own gradient norms): "
                  "one client, one step (64 examples, fixed batches of 48); canary: a zero example replaced "
                  "by one of value `scale` on its own feature (benign features are N(0, 1))", formal=False, trials=10000),
    "dp-rsa-g-unclipped": Audit(
        _sign("dp-rsa-g", {"sign_sigma": 1.0}, "sign_sigma", False),
        "Sign-Gaussian without a clip, sigma 1: " + _SIGN.replace("1 in", "scale / 4 in"),
        formal=False, trials=10000),
    "dp-rsa-f-omniscient": Audit(
        _omniscient, "DP-RSA(F), keep probability 0.6, 4 regular workers and 1 Byzantine running "
        "IPM (epsilon 1) on the regular workers' raw models; release: every message the master "
        "receives in one iteration; worker 0's model is -/+ scale / 100 in every coordinate", formal=False,
        trials=10000, max_noise_factor=1.25),
}
# The canary's distance per scale step of the no-guarantee audits.
BASE_SCALE = {"spfl": 1.0 / CANARY, "dp-rsa-g-unclipped": 0.25, "dp-rsa-f-omniscient": 0.01}
# The largest scale each no-guarantee audit computes in float32 without overflowing (past it the
# releases hold inf or NaN and the bound is a meaningless 0): the sign audits' models hold
# ``scale * BASE_SCALE`` itself; SP-FL's canary example holds ``CANARY * scale * BASE_SCALE`` and
# its noise scales with the canary gradient's squared norm, the square of that value.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_SCALE = {"spfl": math.sqrt(_FLOAT32_MAX) / (CANARY * BASE_SCALE["spfl"]),
             "dp-rsa-g-unclipped": _FLOAT32_MAX / BASE_SCALE["dp-rsa-g-unclipped"],
             "dp-rsa-f-omniscient": _FLOAT32_MAX / BASE_SCALE["dp-rsa-f-omniscient"]}
FORMAL_SCALE = {"dp-rsa-g": 100.0}
# The noise factor at which --table checks that every audit catches a mis-calibrated release.
CAUGHT_FACTOR = 0.5


def _family_bound(family, r0, r1, delta: float, confidence: float, coords) -> dict:
  """:func:`fedjax_dp.lower_bounds.family_bound` on :func:`_project`'s statistic, or
  :func:`fedjax_dp.lower_bounds.sign_bound` on the signs."""
  if isinstance(family, SignFamily):
    return sign_bound(np.asarray(r0), np.asarray(r1), family, delta, confidence)
  return family_bound(*_project(r0, r1, coords), family, delta, confidence)


def audit(mechanism: str, trials: Optional[int] = None, seed: int = 0, confidence: float = 0.95,
          noise_factor: float = 1.0, scales=SCALES) -> dict:
  """Audits ``mechanism`` (a key of :data:`AUDITS`); returns the JSON-ready report.

  ``noise_factor`` multiplies the noise (the flip probability for Sign-Flipping)
  the release runs with while the ledger accounts the nominal one: a factor
  below 1 is a mis-calibrated implementation, which a sound audit must catch.

  Args:
    mechanism: a key of :data:`AUDITS`.
    trials: releases per neighbouring input (default: the mechanism's).
    seed: the PRNG seed of the releases.
    confidence: the joint confidence of every bound reported.
    noise_factor: the factor on the noise that runs (at most the mechanism's
      ``max_noise_factor``).
    scales: the canary scales of a mechanism without a guarantee.

  Returns:
    The report: the bounds, the claim (the setup's own accounting), the tests' counts.

  Raises:
    ConfigError: an unknown mechanism or a setting out of its range, before anything runs.
  """
  check_choice("mechanism", mechanism, sorted(AUDITS))
  a = AUDITS[mechanism]
  trials = a.trials if trials is None else trials
  check(isinstance(trials, int) and 2 <= trials <= 10 ** 6, "trials", trials,
        "must be an integer in [2, 1000000]")
  check(isinstance(seed, int) and 0 <= seed < 2 ** 32, "seed", seed, "must be an integer in [0, 2**32)")
  check(0 < confidence < 1, "confidence", confidence, "must be in (0, 1)")
  check(math.isfinite(noise_factor) and noise_factor > 0, "noise_factor", noise_factor,
        "must be a finite number > 0")
  check(noise_factor <= a.max_noise_factor, "noise_factor", noise_factor,
        f"must be <= {a.max_noise_factor:g} for {mechanism}: it scales the mechanism's flip "
        "probability, which cannot pass 1/2")
  if not a.formal:
    check(len(scales) >= 1 and all(math.isfinite(s) and s > 0 for s in scales), "scales", scales,
          "must be one or more finite numbers > 0")
    check(max(scales) <= MAX_SCALE[mechanism], "scales", scales,
          f"must be at most {MAX_SCALE[mechanism]:.4g} for {mechanism}: a larger canary "
          "overflows float32 (the releases would hold inf or NaN and bound nothing)")
  key = jax.random.PRNGKey(seed)
  t0 = time.perf_counter()
  out = {"mechanism": mechanism, "covers": a.covers, "trials": trials, "confidence": confidence,
         "seed": seed, "noise_factor": noise_factor}
  if a.formal:
    r0, r1, claim, coords = a.run(trials, key, noise_factor, FORMAL_SCALE.get(mechanism, 1.0))
    # Two bounds, each at half the error budget, so that both hold together at `confidence`.
    each = 1.0 - (1.0 - confidence) / 2
    free = epsilon_lower_bound(r0, r1, claim["delta"], each, coords)
    fam = _family_bound(a.family, r0, r1, claim["delta"], each, coords)
    eps = claim["epsilon"]
    exact = a.family.epsilon(claim["signal"], claim["delta"])
    out.update(epsilon_lower_bound=fam.pop("epsilon_lower_bound"), epsilon_claimed=eps,
               epsilon_of_release=exact,
               epsilon_lower_bound_threshold=free["epsilon_lower_bound"],
               max_threshold_bound_at_trials=free["max_lower_bound_at_trials"],
               threshold_test=free["test"], **fam)
    out["tightness"] = out["epsilon_lower_bound"] / eps if eps else None
    out["tightness_to_release"] = out["epsilon_lower_bound"] / exact if exact else None
  else:
    by_scale, claim = {}, None
    for s in scales:
      r0, r1, claim, coords = a.run(trials, jax.random.fold_in(key, len(by_scale)), noise_factor,
                                    s * BASE_SCALE[mechanism])
      b = epsilon_lower_bound(r0, r1, DELTA, confidence, coords)
      by_scale[f"{s:g}"] = b["epsilon_lower_bound"]
      out["max_lower_bound_at_trials"] = b["max_lower_bound_at_trials"]
    check(not claim["formal_guarantee"], "mechanism", mechanism,
          "is listed without a guarantee but its ledger claims one")
    out.update(epsilon_lower_bound=max(by_scale.values()), epsilon_claimed=None, tightness=None,
               lower_bound_by_scale=by_scale)
  out.update(formal_guarantee=bool(claim["formal_guarantee"]), delta=claim["delta"],
             rounds=1, claim=claim, seconds=round(time.perf_counter() - t0, 2))
  return out


# ----------------------------------------------------------------------------------------------
# The command.

def add_parser(sub):
  """Adds ``fedjax-dp audit`` to the argparse subparsers ``sub``."""
  p = sub.add_parser("audit", help="empirical privacy audit: a lower bound on epsilon from "
                     "releases on neighbouring inputs, against the ledger's claim")
  p.add_argument("--mechanism", help="the mechanism audited (default: none; needed unless "
                 f"--list, --table or --one-run; one of: {', '.join(sorted(AUDITS))})")
  p.add_argument("--trials", type=int, help="releases per neighbouring input (default: the "
                 "mechanism's, see --list); half select the test, half bound its errors")
  p.add_argument("--seed", type=int, default=0, help="PRNG seed of the releases (default: 0)")
  p.add_argument("--confidence", type=float, default=0.95,
                 help="joint confidence of all the bounds reported (default 0.95)")
  p.add_argument("--noise-factor", type=float, default=1.0,
                 help="multiply the noise the release runs with (the ledger keeps the nominal "
                 "one); below 1 simulates a mis-calibrated mechanism, which the audit must catch; "
                 "at most 1.25 for the Sign-Flipping audits (default: 1.0)")
  p.add_argument("--scales", help="no-guarantee mechanisms: comma-separated canary scales "
                 "(default 1,10,100)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--list", action="store_true", help="list the mechanisms and what each audit covers")
  p.add_argument("--table", action="store_true",
                 help="audit every mechanism with a guarantee at noise factors 1 and "
                 f"{CAUGHT_FACTOR:g} and print the Markdown table of the documentation")
  p.add_argument("--one-run", action="store_true",
                 help="audit one whole DP-FedAvg training run (the engine's, Poisson sampling, "
                 "digits, an MLP) with canary clients, each included with probability 1/2 "
                 "(Steinke, Nasr and Jagielski 2023)")
  p.add_argument("--canaries", type=int, help="--one-run: the canary clients (default "
                 f"{CANARIES})")
  p.add_argument("--rounds", type=int, help="--one-run: the run's rounds (default "
                 f"{SETTINGS['rounds']})")


def _parse_scales(text):
  try:
    scales = tuple(float(s) for s in text.split(","))
  except ValueError:
    raise ConfigError("scales", text, "must be comma-separated numbers, e.g. 1,10,100") from None
  check(len(set(scales)) == len(scales), "scales", text, "names a scale twice")
  return scales


def violations(rep: dict) -> list:
  """The bounds of report ``rep`` that exceed its claimed epsilon: ``[(name, bound)]``."""
  claimed = rep["epsilon_claimed"]
  if claimed is None:
    return []
  if rep["mechanism"] == ONE_RUN:
    bounds = (("the one-run bound", rep["epsilon_lower_bound"]),)
  else:
    bounds = (("the family's bound", rep["epsilon_lower_bound"]),
              ("the threshold bound", rep["epsilon_lower_bound_threshold"]))
  return [(name, b) for name, b in bounds if b > claimed]


def table(trials: Optional[int] = None, seed: int = 0, confidence: float = 0.95):
  """Every mechanism with a guarantee audited at noise factors 1 and :data:`CAUGHT_FACTOR`.

  Args:
    trials: releases per neighbouring input (default: each mechanism's).
    seed: the PRNG seed of the releases.
    confidence: the joint confidence of each audit's bounds.

  Returns:
    ``(markdown, reports)``: the documentation's table (one row per mechanism: the claim, the
    exact epsilon of the release that ran, both bounds and the tightness at factor 1; at the
    smaller factor the exact epsilon, the family's bound and whether a bound exceeds the claim)
    and the reports, in pairs.
  """
  rows = ["| mechanism | claimed | exact (release) | lower bound | tightness | threshold bound | "
          f"x{CAUGHT_FACTOR:g}: exact | x{CAUGHT_FACTOR:g}: lower bound | caught | trials |",
          "|---|---|---|---|---|---|---|---|---|---|"]
  reports = []
  for name, a in AUDITS.items():
    if not a.formal:
      continue
    ok = audit(name, trials, seed, confidence)
    low = audit(name, trials, seed, confidence, noise_factor=CAUGHT_FACTOR)
    reports.append((ok, low))
    rows.append(f"| `{name}` | {ok['epsilon_claimed']:.3f} | {ok['epsilon_of_release']:.3f} | "
                f"{ok['epsilon_lower_bound']:.3f} | {ok['tightness']:.2f} | "
                f"{ok['epsilon_lower_bound_threshold']:.3f} | {low['epsilon_of_release']:.3f} | "
                f"{low['epsilon_lower_bound']:.3f} | {'yes' if violations(low) else 'no'} | "
                f"{ok['trials']:,} |")
  return "\n".join(rows), reports


def command(args) -> int:
  """``fedjax-dp audit``: 0 when every bound is within the claim, 1 when one exceeds it."""
  if not args.one_run:
    for flag in ("canaries", "rounds"):
      check(getattr(args, flag) is None, flag, getattr(args, flag),
            "is read only by --one-run: leave it out")
  else:
    return _one_run(args)
  if args.list or args.table:  # neither audits one mechanism: its settings would be ignored
    mode = "--list" if args.list else "--table"
    for flag in ("mechanism", "scales") + (("trials",) if args.list else ()):
      check(getattr(args, flag) is None, flag, getattr(args, flag),
            f"is not read by {mode}: leave it out")
    check(not (args.list and args.table), "table", True, "is not read with --list: leave it out")
  if args.list:
    listing = {k: {"formal_guarantee": a.formal, "trials": a.trials, "covers": a.covers,
                   "assumption": a.family.describe() if a.family else None}
               for k, a in AUDITS.items()}
    print(dumps(listing) if args.json else
          "\n".join(f"{k}: {a.covers}" for k, a in AUDITS.items()))
    return 0
  if args.table:
    check(args.noise_factor == 1.0, "noise_factor", args.noise_factor,
          f"is not read by --table, which audits at 1 and {CAUGHT_FACTOR:g}: leave it out")
    markdown, reports = table(args.trials, args.seed, args.confidence)
    print(dumps([r for pair in reports for r in pair]) if args.json else markdown)
    return _exit_status([ok for ok, _ in reports])
  check_choice("mechanism", args.mechanism, sorted(AUDITS))
  scales = SCALES
  if args.scales is not None:
    check(not AUDITS[args.mechanism].formal, "scales", args.scales,
          f"applies only to the mechanisms without a guarantee "
          f"({sorted(k for k, a in AUDITS.items() if not a.formal)})")
    scales = _parse_scales(args.scales)
  rep = audit(args.mechanism, args.trials, args.seed, args.confidence, args.noise_factor, scales)
  if args.json:
    print(dumps(rep))
  else:
    claimed = rep["epsilon_claimed"]
    bounds = (f"epsilon lower bound {rep['epsilon_lower_bound']:.3f}" if claimed is None else
              f"epsilon lower bound {rep['epsilon_lower_bound']:.3f} (assumption-free "
              f"threshold bound {rep['epsilon_lower_bound_threshold']:.3f})")
    print(f"{rep['mechanism']}: {bounds}, claimed "
          + (f"{claimed:.3f}" if claimed is not None else "none (no formal guarantee)")
          + (f", by scale {rep['lower_bound_by_scale']}" if "lower_bound_by_scale" in rep else "")
          + f" ({rep['trials']} trials per neighbour, {rep['seconds']} s)")
  return _exit_status([rep])


def _exit_status(reports) -> int:
  """1 (with one line on stderr per violation) when a bound exceeds its claim, else 0."""
  status = 0
  for rep in reports:
    for name, bound in violations(rep):
      print(f"fedjax-dp: audit failed: {rep['mechanism']}: {name} {bound:.3f} exceeds the "
            f"claimed epsilon {rep['epsilon_claimed']:.3f}", file=sys.stderr)
      status = 1
  return status


def _one_run(args) -> int:
  """``fedjax-dp audit --one-run``: one DP-FedAvg run audited with canary clients."""
  for flag in ("mechanism", "trials", "scales"):
    check(getattr(args, flag) is None, flag, getattr(args, flag),
          "is not read by --one-run: leave it out")
  for flag in ("list", "table"):
    check(not getattr(args, flag), flag, True, "is not read with --one-run: leave it out")
  settings = {} if args.rounds is None else {"rounds": args.rounds}
  rep = one_run_audit(CANARIES if args.canaries is None else args.canaries, args.seed,
                      args.confidence, args.noise_factor, **settings)
  if args.json:
    print(dumps(rep))
  else:
    print(f"{rep['mechanism']}: epsilon lower bound {rep['epsilon_lower_bound']:.3f} "
          f"({rep['v']} of {rep['r']} guesses right, {rep['m']} canaries), claimed "
          f"{rep['epsilon_claimed']:.3f} ({rep['settings']['rounds']} rounds, {rep['seconds']} s)")
  return _exit_status([rep])
