"""RSA and DP-RSA: robust stochastic model aggregation with sign perturbation.

Zhu and Ling, "Bridging Differential Privacy and Byzantine-Robustness via
Model Aggregation", IJCAI 2022 (Algorithm 1); RSA: Li et al., AAAI 2019.

Objective (Eq. 4): ``sum_k E[f_k(x_k)] + f_0(x_0) + lambda sum_k ||x_k - x_0||_1``
with ``f_0(x) = (u/2) ||x||^2``. Every worker keeps its own model ``x_k``
across iterations (a ``[num_clients, ...]`` pytree; the cohort's rows are
gathered by ``batch.ids`` and scattered back). At iteration t+1, with
``alpha = client_lr``:

* regular worker k (Eq. 5):
  ``x_k <- x_k - alpha (grad f_k(x_k; batch) + lambda sign(x_k - x_0))``
  and sends ``F/G(sign(x_0 - x_k))`` (both at time t);
* Byzantine worker j (the fixed set of the last ``byzantine`` ids) runs the
  same local update but sends ``sign(x_0 - z_j)`` where ``z_j`` is the attack's
  row computed from its own model (:mod:`fedjax_dp.attacks`; ``gaussian``:
  ``z_j ~ N(0, sigma_b^2)``, ``sign_flip``: ``z_j = -5 x_j``); its message is
  not perturbed. An attack that reads the regular workers (``sample_duplication``,
  ``alie``, ``ipm``) is applied to the regular workers' *messages*, what they
  release (Zhu and Ling's attack (iii) copies a regular worker's message);
  with ``attacker_knowledge="omniscient"`` it reads their raw models instead,
  and the run then claims no DP guarantee;
* master (Eq. 11): ``x_0 <- x_0 - alpha (grad f_0(x_0) + lambda sum_k sign(m_k))``
  (the :func:`fedjax_dp.aggregators.robust.sign_sum` of the messages; a
  message with Inf/NaN is rejected).

``F`` is Sign-Flipping (Eq. 8, keep probability gamma), ``G`` Sign-Gaussian
(Eq. 9); RSA sends ``sign(x_0 - x_k)`` exactly. ``sign(0) = +1`` as in the paper.

Options (``--set name=value``): ``lambda`` (0.01), ``l2`` (u, 0.004), and those
of :mod:`fedjax_dp.algorithms.robust_sgd` for Byzantine workers and attacks;
``dp-rsa-f``: ``keep_prob`` or ``epsilon`` (per coordinate per round);
``dp-rsa-g``: ``sign_sigma`` or ``epsilon``, ``sign_clip`` (the bound that
gives the formal guarantee; unset: no guarantee, flagged), ``sign_clip_norm``
("linf" default, or "l2"). See :mod:`fedjax_dp.privacy.sign` for exactly what
each guarantee covers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dp import attacks, objectives
from fedjax_dp.aggregators import robust
from fedjax_dp.algorithms import Setup, read_options
from fedjax_dp.algorithms.robust_sgd import (BYZANTINE_OPTIONS, byzantine_pieces, nonfinite_count,
                                             stochastic_gradient)
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.transforms import global_norm
from fedjax_dp.transforms.sign import paper_sign, sign_flip, sign_gaussian, to_sign

RSA_OPTIONS = {**BYZANTINE_OPTIONS, "lambda": 0.01}
VARIANTS = ("rsa", "dp-rsa-f", "dp-rsa-g")


class RSAState(NamedTuple):
  master: Any    # x_0
  workers: Any   # x_k, leaves [num_clients, ...]
  round: jax.Array


def _tree_rows(tree, ids):
  return jax.tree_util.tree_map(lambda w: w[ids], tree)


def _scatter_rows(tree, ids, rows, mask, num_clients):
  """``tree[ids] = rows`` for the real rows; padded slots (mask 0) write nothing."""
  safe = jnp.where(mask > 0, ids, num_clients)
  return jax.tree_util.tree_map(lambda w, r: w.at[safe].set(r.astype(w.dtype), mode="drop"), tree, rows)


def _attacker_sign(v):
  """sign(v) for finite entries; Inf/NaN pass through so the master can reject the row."""
  return jnp.where(jnp.isfinite(v), paper_sign(jnp.nan_to_num(v)), v)


def master_step(x0, sign_total, lr: float, lam: float, l2: float):
  """Eq. 11: ``x_0 - alpha (u x_0 + lambda * sum_k sign(m_k))``."""
  return jax.tree_util.tree_map(lambda p, s: p - lr * (l2 * p + lam * s), x0, sign_total)


def worker_step(xk, x0, grad, lr: float, lam: float):
  """Eq. 5: ``x_k - alpha (grad f_k(x_k) + lambda sign(x_k - x_0))``."""
  return jax.tree_util.tree_map(lambda w, m, g: w - lr * (g + lam * paper_sign(w - m)), xk, x0, grad)


@dataclasses.dataclass(frozen=True, eq=False)
class RSAProgram:
  """RSA / DP-RSA(F) / DP-RSA(G) (see module docstring).

  Attributes:
    model: the model.
    gradient: ``(params, x, y, count, key) -> (loss, grad)``.
    perturb: optax-style transform of ``u = x_0 - x_k`` into the sent signs.
    attack: the Byzantine attack (:class:`fedjax_dp.attacks.Attack`).
    num_clients, num_byzantine: K and b.
    lr, lam, l2: alpha, lambda, u.
    mechanism: privacy record of one round.
  """

  model: Any
  gradient: Callable
  perturb: optax.GradientTransformationExtraArgs
  attack: Callable
  num_clients: int
  num_byzantine: int
  lr: float
  lam: float
  l2: float
  mechanism: Any
  clip: Any = None
  attacker_knowledge: str = "released"
  # The master model is post-processing of the messages (see fedjax_dp.engine).
  released_metrics = ("master_norm",)

  def init(self, key):
    x0 = self.model.init(key)
    workers = jax.tree_util.tree_map(lambda p: jnp.broadcast_to(p, (self.num_clients,) + p.shape), x0)
    return RSAState(x0, workers, jnp.zeros((), jnp.int32))

  def eval_params(self, state):
    return state.master

  def _worker(self, x0, xk, x, y, count, key):
    k_grad, k_msg = jax.random.split(key)
    loss, g = self.gradient(xk, x, y, count, k_grad)
    u = jax.tree_util.tree_map(jnp.subtract, x0, xk)
    msg, _ = self.perturb.update(u, self.perturb.init(u), xk, key=k_msg)
    flips = sum(jnp.sum(m != paper_sign(d)) for m, d in zip(jax.tree_util.tree_leaves(msg),
                                                             jax.tree_util.tree_leaves(u)))
    return worker_step(xk, x0, g, self.lr, self.lam), msg, loss, global_norm(u), flips

  def round_step(self, state, batch, key):
    k_workers, k_attack, k_agg = jax.random.split(key, 3)
    keys = jax.random.split(k_workers, batch.mask.shape[0])
    xk = _tree_rows(state.workers, batch.ids)
    new_xk, honest, losses, norms, flips = jax.vmap(self._worker, in_axes=(None, 0, 0, 0, 0, 0))(
        state.master, xk, batch.x, batch.y, batch.counts, keys)
    byz = attacks.byzantine_mask(batch.ids, self.num_clients, self.num_byzantine)
    if self.attack.reads_honest and self.attacker_knowledge == "released":
      # The attackers see what the regular workers send (perturbed under DP-RSA).
      sent = self.attack(honest, byz, k_attack, mask=batch.mask)
    else:
      z = self.attack(xk, byz, k_attack, mask=batch.mask)
      byz_msg = jax.tree_util.tree_map(lambda m, zz: _attacker_sign(m[None] - zz), state.master, z)
      sent = jax.tree_util.tree_map(
          lambda h, a: jnp.where(byz.reshape((-1,) + (1,) * (h.ndim - 1)) > 0, a, h), honest, byz_msg)
    total, _ = robust.get("sign_sum").aggregate(sent, jnp.ones_like(batch.mask), batch.mask,
                                                optax.EmptyState(), k_agg)
    master = master_step(state.master, total, self.lr, self.lam, self.l2)
    workers = _scatter_rows(state.workers, batch.ids, new_xk, batch.mask, self.num_clients)
    regular = batch.mask * (1.0 - byz)
    dim = sum(x.size for x in jax.tree_util.tree_leaves(state.master))
    metrics = {"client_loss": losses, "update_norm": norms, "mask": batch.mask,
               "flip_rate": jnp.sum(flips * regular) / jnp.maximum(jnp.sum(regular) * dim, 1.0),
               "nonfinite_rows": nonfinite_count(sent, batch.mask),
               "master_norm": global_norm(master)}
    return RSAState(master, workers, state.round + 1), metrics


def _perturbation(variant, opts, dim):
  """``(transform, mechanism)`` of the variant."""
  from fedjax_dp.privacy import NonPrivate
  from fedjax_dp.privacy import sign as psign
  if variant == "rsa":
    return to_sign(), NonPrivate(relation="replace_one")
  eps = opts.get("epsilon")
  if variant == "dp-rsa-f":
    gamma = opts.get("keep_prob")
    check((gamma is None) != (eps is None), "keep_prob/epsilon", (gamma, eps),
          "give exactly one of keep_prob (gamma) and epsilon (per coordinate per round)")
    if gamma is None:
      gamma = psign.keep_prob_for_epsilon(float(eps))
    mech = psign.SignFlipMechanism(float(gamma), dim)
    return sign_flip(float(gamma)), mech
  sigma, clip, norm = opts.get("sign_sigma"), opts.get("sign_clip"), opts.get("sign_clip_norm", "linf")
  check((sigma is None) != (eps is None), "sign_sigma/epsilon", (sigma, eps),
        "give exactly one of sign_sigma and epsilon (per coordinate per round)")
  if sigma is None:
    if clip is None or norm != "linf":
      raise ConfigError("epsilon", eps, "calibrating sign_sigma to a per-coordinate epsilon needs "
                        "sign_clip with sign_clip_norm='linf'")
    sigma = psign.sign_gaussian_sigma_for_epsilon(float(eps), float(clip))
  mech = psign.SignGaussianMechanism(float(sigma), dim, None if clip is None else float(clip), norm)
  return sign_gaussian(mech.sigma, mech.clip, mech.norm), mech


def build_rsa_family(config, data, variant: str) -> Setup:
  """RSA (``"rsa"``), DP-RSA with Sign-Flipping (``"dp-rsa-f"``) or Sign-Gaussian (``"dp-rsa-g"``)."""
  from fedjax_dp.accounting import LedgerAccounting
  from fedjax_dp.algorithms.dp_fedavg import make_model
  from fedjax_dp.models import num_params
  from fedjax_dp.privacy.sign import SignAccounting
  from fedjax_dp.sampling import make_sampler
  extra = {"rsa": {}, "dp-rsa-f": {"keep_prob": None, "epsilon": None},
           "dp-rsa-g": {"sign_sigma": None, "epsilon": None, "sign_clip": None, "sign_clip_norm": "linf"}}
  opts = read_options(config, {**RSA_OPTIONS, **extra[variant]})
  check(opts["lambda"] is not None and opts["lambda"] > 0, "lambda", opts["lambda"], "must be > 0")
  b, attack, knowledge = byzantine_pieces(config, data, opts)
  model = make_model(config, data)
  dim = int(num_params(jax.eval_shape(model.init, jax.random.PRNGKey(0))))
  perturb, mechanism = _perturbation(variant, opts, dim)
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  if variant == "rsa":
    accounting = LedgerAccounting(mechanism, config.delta, config.accountant,
                                  attacker_knowledge=knowledge)
  else:
    accounting = SignAccounting(mechanism, config.delta, config.rounds, config.accountant,
                                attacker_knowledge=knowledge)
  program = RSAProgram(
      model=model, gradient=stochastic_gradient(objectives.supervised(model.apply), config.batch_size),
      perturb=perturb, attack=attack, num_clients=data.num_clients, num_byzantine=b,
      lr=float(config.client_lr), lam=float(opts["lambda"]), l2=float(opts["l2"]), mechanism=mechanism,
      attacker_knowledge=knowledge)
  return Setup(program, sampler, accounting)


def build_rsa(config, data) -> Setup:
  """Non-private RSA (signs sent exactly)."""
  return build_rsa_family(config, data, "rsa")


def build_dp_rsa_f(config, data) -> Setup:
  """DP-RSA with Sign-Flipping (Eq. 8)."""
  return build_rsa_family(config, data, "dp-rsa-f")


def build_dp_rsa_g(config, data) -> Setup:
  """DP-RSA with Sign-Gaussian (Eq. 9)."""
  return build_rsa_family(config, data, "dp-rsa-g")
