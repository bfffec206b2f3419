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

Every worker's model is a per-client state row of the one round
(:mod:`fedjax_dp.round`); the master's step is the round's descent step with
rate ``alpha = hp["server_lr"]`` on ``lambda * sum_k sign(m_k) + u x_0``.

Byzantine workers and their attack come from the run's ``byzantine``,
``attack`` and ``attacker_knowledge`` settings. Options (``--set
name=value``): ``lambda`` (0.01), ``l2`` (u, 0.004), the attack strengths;
``dp-rsa-f``: ``keep_prob`` (0.8) or ``epsilon`` (per coordinate per round,
calibrating ``keep_prob``); ``dp-rsa-g``: ``sign_sigma`` (0.016) or ``epsilon``
(calibrating ``sign_sigma``), ``sign_clip`` (the bound that
gives the formal guarantee; unset: no guarantee, flagged), ``sign_clip_norm``
("linf" default, or "l2"). See :mod:`fedjax_dp.privacy.sign` for exactly what
each guarantee covers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fedjax_dp import components, objectives
from fedjax_dp.attacks import static_options
from fedjax_dp.aggregators import Aggregator, robust
from fedjax_dp.algorithms.base import (NONE, WORKER, Setup, algorithm, cached_round,
                                       common_hparams, read_options, round_key)
from fedjax_dp.algorithms.options import L2, Option
from fedjax_dp.algorithms.robust_sgd import attacker_knowledge, stochastic_gradient
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.round import ClientOut, Hooks, Piece, Round, Uploads
from fedjax_dp.transforms import global_norm
from fedjax_dp.transforms.sign import paper_sign, sign_flip, sign_gaussian, to_sign
from fedjax_dp.privacy import sign as psign
from fedjax_dp.privacy.randomized_response import keep_prob_for_epsilon
from fedjax_dp.algorithms.dp_fedavg import make_model
from fedjax_dp.models import num_params
from fedjax_dp.privacy import NonPrivate
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.privacy.sign import SignAccounting
from fedjax_dp.sampling import make_sampler

EPSILON = Option("epsilon", None, "the per-coordinate per-round epsilon to calibrate the "
                 "perturbation to, instead of keep_prob / sign_sigma (give one of the two)",
                 low=0, low_open=True)
OPTIONS = {
    "rsa": L2 + (Option("lambda", 0.01, "weight of the L1 consensus penalty (Eq. 4)", low=0,
                        low_open=True),),
}
OPTIONS["dp-rsa-f"] = OPTIONS["rsa"] + (
    Option("keep_prob", 0.8, "Sign-Flipping's gamma: each sign kept with this probability (0.8: "
           "epsilon ln 4 per coordinate per round)", low=0.5, high=1), EPSILON)
OPTIONS["dp-rsa-g"] = OPTIONS["rsa"] + (
    Option("sign_sigma", 0.016, "Sign-Gaussian's noise std (0.016: about epsilon 0.2 per "
           "coordinate per round with sign_clip=0.002)", low=0, low_open=True), EPSILON,
    Option("sign_clip", None, "bound on x_0 - x_k before the noise (the formal guarantee needs "
           "it); unset: no guarantee", low=0, low_open=True),
    Option("sign_clip_norm", "linf", "the sign_clip norm", kind="choice", choices=("linf", "l2")))


def _attacker_sign(v):
  """sign(v) for finite entries; Inf/NaN pass through so the master can reject the row."""
  return jnp.where(jnp.isfinite(v), paper_sign(jnp.nan_to_num(v)), v)


def worker_step(xk, x0, grad, lr, lam):
  """Eq. 5: ``x_k - alpha (grad f_k(x_k) + lambda sign(x_k - x_0))`` (``sign(0) = +1``).

  Args:
    xk: the worker's model ``x_k`` (a pytree).
    x0: the master's model ``x_0``, a pytree like ``xk``.
    grad: the stochastic gradient ``grad f_k(x_k)``, a pytree like ``xk``.
    lr: ``alpha`` > 0, the step size.
    lam: ``lambda`` > 0, the weight of the L1 consensus penalty.

  Returns:
    The worker's new model, a pytree like ``xk``.
  """
  return jax.tree_util.tree_map(lambda w, m, g: w - lr * (g + lam * paper_sign(w - m)), xk, x0, grad)


def perturbation(variant: str, sign_clip: bool = False, norm: str = "linf") -> Piece:
  """The :class:`fedjax_dp.round.Piece` turning ``u = x_0 - x_k`` into the sent signs (Eq. 6, 8, 9).

  It declares the privacy record of what it releases, from the same
  hyper-parameters its transform reads (RSA's exact signs declare none): Sign-Flipping keeps
  each sign with probability ``gamma = hp["keep_prob"]``, ``ln(gamma / (1 - gamma))``-DP per
  coordinate per round (Theorem 1); Sign-Gaussian sends ``sign(clip(u) + N(0, sigma^2 I))``,
  ``sigma = hp["sign_sigma"]``, with a guarantee only with ``sign_clip``
  (:mod:`fedjax_dp.privacy.sign`).

  Args:
    variant: "rsa" (exact signs, Eq. 6), "dp-rsa-f" (Sign-Flipping, Eq. 8) or anything else
      (Sign-Gaussian, Eq. 9).
    sign_clip: Sign-Gaussian bounds ``u`` by ``hp["sign_clip"]`` before the noise.
    norm: the bound's norm, "linf" (per coordinate) or "l2".

  Returns:
    ``hp -> transform`` as a Piece, with ``(hp, dimension) -> record`` as its ``mechanism``
    (:class:`fedjax_dp.privacy.sign.SignFlipMechanism`,
    :class:`fedjax_dp.privacy.sign.SignGaussianMechanism`; None for "rsa").
  """
  if variant == "rsa":
    return Piece(lambda hp: to_sign(), "sign")
  if variant == "dp-rsa-f":
    return Piece(lambda hp: sign_flip(hp["keep_prob"]), "sign_flip",
                 mechanism=lambda hp, dim: psign.SignFlipMechanism(float(hp["keep_prob"]), dim))
  return Piece(
      lambda hp: sign_gaussian(hp["sign_sigma"], hp["sign_clip"] if sign_clip else None, norm),
      "sign_gaussian",
      mechanism=lambda hp, dim: psign.SignGaussianMechanism(
          float(hp["sign_sigma"]), dim, float(hp["sign_clip"]) if sign_clip else None, norm))


def rsa_client(gradient, perturb) -> Piece:
  """``hp -> worker``: Eq. 5 on its own model (the state row) and the message ``F/G(x_0 - x_k)``.

  ``gradient``: ``(params, x, y, count, key) -> (loss, grad)``; ``perturb``: ``hp -> transform``
  (a :class:`fedjax_dp.round.Piece` whose declared mechanism the worker passes on).
  """

  def client(hp):
    tx = perturb(hp)

    def fn(x0, x, y, count, xk, chp, key):
      """One worker's step (Eq. 5) and message ``F/G(x_0 - x_k)``, both from time t.

      Args:
        x0: the master's model ``x_0``.
        x: the worker's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples.
        xk: its own model ``x_k`` (its state row), a pytree like ``x0``.
        chp: unused (no per-client hyper-parameters).
        key: its PRNG key (split into the gradient's and the message's).

      Returns:
        A :class:`fedjax_dp.round.ClientOut`: the message, the new ``x_k`` as the row, the
        minibatch loss, ``||x_0 - x_k||``, the number of signs the perturbation flipped
        (``aux["flips"]``) and ``x_k`` as ``raw`` (what a model-level attack acts on).
      """
      del chp
      k_grad, k_msg = jax.random.split(key)
      loss, g = gradient(xk, x, y, count, k_grad)
      u = jax.tree_util.tree_map(jnp.subtract, x0, xk)
      msg, _ = tx.update(u, tx.init(u), xk, key=k_msg)
      flips = sum(jnp.sum(m != paper_sign(d)) for m, d in
                  zip(jax.tree_util.tree_leaves(msg), jax.tree_util.tree_leaves(u)))
      return ClientOut(upload=msg, row=worker_step(xk, x0, g, hp["client_lr"], hp["lambda"]),
                       loss=loss, norm=global_norm(u), aux={"flips": flips}, raw=xk)

    return fn

  return Piece(client, "rsa_worker", mechanism=getattr(perturb, "mechanism", None))


def rsa_attack_step(knowledge: str, rnd, state, out, uploads: Uploads, hp, key):
  """Zhu and Ling's attacks: model-level (``sign(x_0 - z_j)`` with ``z_j`` from the attack on
  the workers' models) unless the attack reads the regular workers and may only read what
  they release, their messages.

  Args:
    knowledge: "released" or "omniscient" (what an attack that reads the regular workers sees).
    rnd: the round (its attack).
    state: the round's state (the master's model ``x_0``).
    out: the workers' :class:`fedjax_dp.round.ClientOut` (``raw``: their models).
    uploads: the workers' messages, who sent them and which are real.
    hp: the round's hyper-parameters (the attack's strengths).
    key: the attack's PRNG key.

  Returns:
    The messages the master receives: the Byzantine rows replaced (an Inf/NaN entry of
    ``x_0 - z_j`` passes through, so the master rejects the row).
  """
  attack = rnd.build_attack(hp)
  byz = uploads.byzantine
  if attack.reads_honest and knowledge == "released":
    return attack(uploads.rows, byz, key, mask=uploads.mask, ids=uploads.ids)
  z = attack(out.raw, byz, key, mask=uploads.mask, ids=uploads.ids)
  byz_msg = jax.tree_util.tree_map(lambda m, zz: _attacker_sign(m[None] - zz), state.params, z)
  return jax.tree_util.tree_map(
      lambda h, a: jnp.where(byz.reshape((-1,) + (1,) * (h.ndim - 1)) > 0, a, h), uploads.rows,
      byz_msg)


def sign_sum_scaled(hp) -> Aggregator:
  """``lambda * sum_k sign(m_k)``: the master's aggregate (Eq. 11; rows with Inf/NaN rejected)."""
  agg = robust.get("sign_sum")

  def aggregate(updates, weights, mask, state, key):
    """``lambda`` times the sum of the real, finite messages' signs.

    Args:
      updates: the cohort's messages, a pytree with leaves ``[C, ...]``.
      weights: ignored (every worker weighs 1).
      mask: ``[C]``, 1 for real workers.
      state: the sign sum's state (``optax.EmptyState()``).
      key: PRNG key, passed on (unused).

    Returns:
      ``(aggregate, state)``, the aggregate a pytree like one message.
    """
    total, state = agg.aggregate(updates, jnp.ones_like(weights), mask, state, key)
    return jax.tree_util.tree_map(lambda t: hp["lambda"] * t, total), state

  return Aggregator(agg.init, aggregate)


def rsa_metrics(state, params, out, sent, mask, hp):
  """The perturbation's realized flip rate over the cohort's own messages (every worker
  computes one; attackers' are replaced afterwards) and the new master model's norm.

  Args:
    state: unused.
    params: the new master model.
    out: the workers' :class:`fedjax_dp.round.ClientOut` (``aux["flips"]``, ``[C]``).
    sent: unused.
    mask: ``[C]``, 1 for real workers.
    hp: unused.

  Returns:
    ``{"flip_rate": flips / (real workers * d), "master_norm": ||x_0||}``.
  """
  del state, sent, hp
  dim = sum(x.size for x in jax.tree_util.tree_leaves(params))
  return {"flip_rate": jnp.sum(out.aux["flips"] * mask) / jnp.maximum(jnp.sum(mask) * dim, 1.0),
          "master_norm": global_norm(params)}


def rsa_round(model, num_clients: int, gradient, perturb, *, attack: str = "none",
              attack_options: tuple = (), knowledge: str = "released") -> Round:
  """RSA / DP-RSA as a :class:`fedjax_dp.round.Round` (workers' models as state rows).

  Args:
    model: the model (``init``; the master's and every worker's start).
    num_clients: K.
    gradient: ``(params, x, y, count, key) -> (loss, grad)`` of a worker's local loss.
    perturb: ``hp -> transform`` of ``u = x_0 - x_k`` (:func:`perturbation`).
    attack, attack_options: the attack and its static options (strengths in ``hp``).
    knowledge: "released" or "omniscient" (what an attack that reads the regular workers sees).
  """
  return Round(
      model=model, num_clients=num_clients, client=rsa_client(gradient, perturb),
      aggregator=sign_sum_scaled, attack=attack, attack_options=attack_options, descent=True,
      server_optimizer="sgd",
      hooks=Hooks(init_row=lambda params: params,
                  attack_step=functools.partial(rsa_attack_step, knowledge), metrics=rsa_metrics),
      released_metrics=("master_norm", "aggregate_norm"))


def perturbation_hparams(variant: str, opts: dict, given) -> dict:
  """The perturbation's hyper-parameters from the options.

  Args:
    variant: "rsa", "dp-rsa-f" or "dp-rsa-g".
    opts: the options as read (:func:`fedjax_dp.algorithms.base.read_options`).
    given: the names of the options the run gives: an ``epsilon`` given is calibrated here to
      the perturbation's parameter (``keep_prob``, ``sign_sigma``), which otherwise takes its
      value (given or default).

  Raises:
    ConfigError: for both ``epsilon`` and the parameter it calibrates, or for ``epsilon`` with
      Sign-Gaussian without ``sign_clip`` in the linf norm.
  """
  if variant == "rsa":
    return {}
  eps = opts.get("epsilon")
  param = "keep_prob" if variant == "dp-rsa-f" else "sign_sigma"
  check(not {param, "epsilon"} <= set(given), f"{param}/epsilon", (opts[param], eps),
        f"give at most one of {param} and epsilon (per coordinate per round; neither: "
        f"{param}={components.get('algorithm', variant).defaults[param]})")
  if variant == "dp-rsa-f":
    return {"keep_prob": opts["keep_prob"] if eps is None else keep_prob_for_epsilon(eps)}
  sigma, clip, norm = opts["sign_sigma"], opts.get("sign_clip"), opts.get("sign_clip_norm", "linf")
  if eps is not None:
    if clip is None or norm != "linf":
      raise ConfigError("epsilon", eps, "calibrating sign_sigma to a per-coordinate epsilon needs "
                        "sign_clip with sign_clip_norm='linf'")
    sigma = psign.sign_gaussian_sigma_for_epsilon(eps, clip)
  return {"sign_sigma": sigma, "sign_clip": 0.0 if clip is None else clip}


def build_rsa_family(config, data) -> Setup:
  """RSA (``"rsa"``), DP-RSA with Sign-Flipping (``"dp-rsa-f"``) or Sign-Gaussian
  (``"dp-rsa-g"``): ``config.algorithm``.

  Raises:
    ConfigError: for another aggregator than RSA's sum of signs, or a bad option.
  """
  variant = config.algorithm
  check(config.aggregator in (None, "sign_sum"), "aggregator", config.aggregator,
        "must be unset or 'sign_sum': RSA's master sums the signs of the messages (Eq. 11)")
  opts = read_options(config)
  knowledge = attacker_knowledge(config)
  model = make_model(config, data)
  dim = int(num_params(jax.eval_shape(model.init, jax.random.PRNGKey(0))))
  perturb_hp = perturbation_hparams(variant, opts, config.options)
  clipped, norm = opts.get("sign_clip") is not None, opts.get("sign_clip_norm", "linf")
  key = round_key(config, opts, model, data.num_clients, knowledge, clipped)
  rnd = cached_round(key, lambda: rsa_round(
      model, data.num_clients,
      stochastic_gradient(objectives.supervised(model), config.batch_size),
      perturbation(variant, clipped, norm), attack=config.attack,
      attack_options=static_options(config.attack, opts), knowledge=knowledge))
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  hparams = common_hparams(config, opts, server_lr=config.client_lr, client_lr=config.client_lr,
                           l2=opts["l2"], **{"lambda": opts["lambda"]}, **perturb_hp)
  # The privacy record is the one the worker's perturbation piece declares, read from the same
  # hyper-parameters its transform uses; exact signs declare none.
  declared = getattr(rnd.client, "mechanism", None)
  if declared is None:
    accounting = LedgerAccounting(NonPrivate(relation="replace_one"), config.delta,
                                  config.accountant, attacker_knowledge=knowledge)
  else:
    accounting = SignAccounting(declared(hparams, dim), config.delta, config.rounds,
                                config.accountant, attacker_knowledge=knowledge)
  return Setup(rnd, sampler, accounting, hparams)


# What the three variants declare alike.
_TRAITS = dict(chooses_knowledge=True)
algorithm("rsa", reference="Li et al., AAAI 2019", options=OPTIONS["rsa"], privacy_unit=NONE,
          about="RSA: workers keep their own models, the master sums the signs of their "
                "differences", **_TRAITS)(build_rsa_family)
algorithm("dp-rsa-f", reference="Zhu and Ling, IJCAI 2022, Sign-Flipping",
          options=OPTIONS["dp-rsa-f"], privacy_unit=WORKER,
          about="DP-RSA: RSA whose workers flip each sign with probability 1 - keep_prob",
          **_TRAITS)(build_rsa_family)
algorithm("dp-rsa-g", reference="Zhu and Ling, IJCAI 2022, Sign-Gaussian",
          options=OPTIONS["dp-rsa-g"], privacy_unit=WORKER,
          about="DP-RSA: RSA whose workers send the signs of their differences plus Gaussian "
                "noise",
          unaccounted=lambda options: None if options.get("sign_clip") is not None else
          "dp-rsa-g without sign_clip has no guarantee", **_TRAITS)(build_rsa_family)
