"""The FedAvg family on the one round: local SGD, client transforms, any attack and aggregator.

A FedAvg-family round is described by a :class:`Pieces` record (static:
which transforms, which aggregator, whether the aggregate is noised) and
built by :func:`fedavg_round`; every number comes from ``hparams``:

* ``client_lr``, ``server_lr``; ``lambda`` (BLUR) and ``sparsity`` (LUS);
* ``canary_seed``, ``canary`` (the ``canary`` transform of audits: each client's canary scale,
  below 0 for a client that is no canary, :func:`fedjax_dp.transforms.replace_by_canary`);
* ``clip``: the L2 bound of the ``clip`` transform, BLUR's radius and the
  unit of the noise (one value, so they cannot disagree);
* ``noise_multiplier``: the noised mean adds ``N(0, (z * clip)^2)`` to the sum;
* ``expected_size``: the mean's public denominator (``denominator="expected"``);
* ``byzantine``, the attack's and the aggregator's numeric options (their static ones, loop
  counts and choices, shape the round).

Privacy is derived from the pieces that run
(:func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`): a round whose
aggregate is not noised, or whose updates are not bounded, has no guarantee,
whatever else the configuration says.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dp import aggregators, objectives
from fedjax_dp.client import local_sgd, make_optimizer, sample_batch
from fedjax_dp.round import ClientOut, Piece, Round, tree_sub
from fedjax_dp.transforms import (clip_l2, global_norm, identity, replace_by_canary,
                                  sparsify_by_utility)

# Client transforms by name: hp -> transform. BOUNDS names the hp key of the L2 bound a transform
# enforces on its output (what a noised sum's sensitivity rests on).
TRANSFORMS = {
    "sparsify": lambda hp: sparsify_by_utility(hp["sparsity"]),
    "clip": lambda hp: clip_l2(hp["clip"]),
    "canary": lambda hp: replace_by_canary(hp["canary_seed"]),
}
BOUNDS = {"clip": "clip"}


@dataclasses.dataclass(frozen=True)
class Pieces:
  """The static pieces of a round, for the privacy derivation and the summary.

  Attributes:
    transforms: client transform names, in order (:data:`TRANSFORMS`).
    aggregator: "mean" or a robust aggregator's name.
    noise: the mean adds Gaussian noise scaled by the bound (``noise_multiplier * bound``).
    weighting: "uniform" or "examples".
    denominator: the mean's "expected" (public) or "realized" denominator.
    regularizer: "none" or "blur".
  """

  transforms: tuple = ()
  aggregator: str = "mean"
  noise: bool = False
  weighting: str = "uniform"
  denominator: str = "realized"
  regularizer: str = "none"

  @property
  def bound(self) -> Optional[str]:
    """The hp key of the L2 bound on each released update: the last bounding transform's.

    A transform after the bound could change the norm again, so only a bound
    that is the last transform counts.
    """
    if self.transforms and self.transforms[-1] in BOUNDS:
      return BOUNDS[self.transforms[-1]]
    return None


@dataclasses.dataclass(frozen=True)
class Training:
  """The run settings that shape the clients' local training and the server's step (static:
  part of a round's structure, :func:`fedjax_dp.algorithms.base.round_key`).

  Attributes:
    local_steps: Q, local steps per client per round.
    batch_size: examples per local step.
    client_optimizer: the clients' optimizer (rate ``hp["client_lr"]``).
    server_optimizer: the server's optimizer on the aggregate (rate ``hp["server_lr"]``).
  """

  local_steps: int = 1
  batch_size: int = 1
  client_optimizer: str = "sgd"
  server_optimizer: str = "sgd"

  @classmethod
  def of(cls, config) -> "Training":
    """The training settings of a :class:`fedjax_dp.config.RunConfig`."""
    return cls(config.local_steps, config.batch_size, config.client_optimizer,
               config.server_optimizer)


def make_aggregator(pieces: Pieces, static: Optional[Mapping] = None) -> Piece:
  """The :class:`fedjax_dp.round.Piece` of ``pieces.aggregator``.

  The mean declares its noise (scaled to the clients' bound) and whether its
  denominator is public; any other declared aggregator (:func:`fedjax_dp.aggregators.robust.get`)
  declares no noise, reads its numeric options from the round's hyper-parameters and its static
  ones (loop counts) from ``static`` (the run's options; a missing one at its default).
  """
  if pieces.aggregator == "mean":
    noise_key = pieces.bound if pieces.noise else None

    def build(hp):
      noise = hp["noise_multiplier"] * hp[noise_key] if noise_key else None
      return aggregators.robust.guard_nonfinite(
          aggregators.mean(pieces.denominator, hp["expected_size"], noise))
    return Piece(build, "mean", noise=noise_key, public_denominator=pieces.denominator == "expected")

  fixed = dict(static or {})
  return Piece(lambda hp: aggregators.robust.get(pieces.aggregator, hp, fixed), pieces.aggregator)


def lus_gradient(objective, batch_size: int, lus_batches: int):
  """LUS's gradient of the local loss at ``w_{t,Q}`` (Cheng et al. 2022, Eq. 10).

  Args:
    objective: the local loss ``f_i``, ``(params, (x, y, mask), anchor) -> loss``, without
      BLUR's regulariser.
    batch_size: examples per minibatch (drawn with replacement, :func:`sample_batch`).
    lus_batches: minibatches averaged (>= 1), or 0 for the exact gradient over all the
      client's examples.

  Returns:
    ``grad(params_q, params0, x, y, count, key) -> gradient``, a pytree like ``params_q``.
  """
  grad_fn = jax.grad(objective)

  def grad(params_q, params0, x, y, count, key):
    """The gradient of ``objective`` at ``params_q`` on the client's data.

    Args:
      params_q: the final local model ``w_{t,Q}``.
      params0: the round's global model (the objective's anchor).
      x: the client's padded examples ``[M, ...]``.
      y: its padded labels ``[M]``.
      count: its number of real examples.
      key: PRNG key of the minibatches (unused when ``lus_batches == 0``).
    """
    if lus_batches == 0:
      mask = (jnp.arange(y.shape[0]) < count).astype(jnp.float32)
      return grad_fn(params_q, (x, y, mask), params0)

    def one(k):
      return grad_fn(params_q, sample_batch(x, y, count, k, batch_size), params0)

    grads = jax.lax.map(one, jax.random.split(key, lus_batches))
    return jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), grads)

  return grad


def fedavg_client(model, pieces: Pieces, training: Training, lus_batches: int = 1) -> Piece:
  """``hp -> client``: Q local SGD steps (BLUR optional), then the client transforms.

  The released update is ``transforms(w_{t,Q} - w_t)``; ``norm`` is the raw
  update's norm (a diagnostic); LUS's ``sparsify`` gets the gradient of the
  local loss at ``w_{t,Q}`` (:func:`lus_gradient`), and every transform the client's own
  hyper-parameters (:attr:`fedjax_dp.round.Hooks.client_hparams`; ``()`` without) as ``client``.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    pieces: the transforms (in order) and the regulariser ("blur": BLUR's objective with
      ``hp["lambda"]`` and radius ``hp["clip"]``).
    training: Q, the batch size and the client optimizer (rate ``hp["client_lr"]``).
    lus_batches: the minibatches of LUS's gradient (:func:`lus_gradient`).

  Returns:
    The client :class:`fedjax_dp.round.Piece`; it declares the L2 bound ``hp["clip"]`` of what
    it releases when its last transform is a clip.
  """
  loss = objectives.supervised(model)
  lus = (lus_gradient(loss, training.batch_size, lus_batches) if "sparsify" in pieces.transforms
         else None)

  def client(hp):
    objective = objectives.blur(loss, hp["lambda"], hp["clip"]) if pieces.regularizer == "blur" else loss
    train = local_sgd(objective, make_optimizer(training.client_optimizer, hp["client_lr"]),
                      training.local_steps, training.batch_size)
    tx = (optax.chain(*(TRANSFORMS[name](hp) for name in pieces.transforms)) if pieces.transforms
          else identity())

    def fn(params0, x, y, count, row, chp, key):
      """One client's local SGD and transforms.

      Args:
        params0: the global model ``w_t`` (a pytree).
        x: the client's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples.
        row: unused (no per-client state).
        chp: its own hyper-parameters (``Hooks.client_hparams``; ``()`` without), passed to
          every transform as ``client`` (the canary transform's ``(id, scale)``).
        key: its PRNG key (split into the training's, the transforms' and LUS's gradient's).

      Returns:
        A :class:`fedjax_dp.round.ClientOut`: the transformed delta, the mean training loss and
        the raw delta's norm.
      """
      del row
      k_train, k_tx, k_extra = jax.random.split(key, 3)
      params_q, train_loss = train(params0, x, y, count, k_train)
      delta = tree_sub(params_q, params0)
      extras = {} if lus is None else {"grad": lus(params_q, params0, x, y, count, k_extra)}
      out, _ = tx.update(delta, tx.init(delta), params_q, key=k_tx, client=chp, **extras)
      return ClientOut(upload=out, loss=train_loss, norm=global_norm(delta))

    return fn

  return Piece(client, "local_sgd+" + "+".join(pieces.transforms), bound=pieces.bound)


def fedavg_round(model, num_clients: int, pieces: Pieces, training: Training, *,
                 attack: str = "none", attack_options: tuple = (), lus_batches: int = 1,
                 static: Optional[Mapping] = None) -> Round:
  """A FedAvg-family :class:`fedjax_dp.round.Round` from its pieces.

  Args:
    model: the :class:`fedjax_dp.models.Model` trained.
    num_clients: the population size.
    pieces: the round's static pieces.
    training: local training and the server's optimizer.
    attack, attack_options: the Byzantine clients' attack and its static options (strengths in
      ``hp``).
    lus_batches: minibatches of LUS's gradient (:func:`lus_gradient`).
    static: the run's options, where the aggregator's static ones (loop counts) are read
      (:func:`make_aggregator`).
  """
  return Round(
      model=model, num_clients=num_clients,
      client=fedavg_client(model, pieces, training, lus_batches),
      aggregator=make_aggregator(pieces, static), attack=attack, attack_options=attack_options,
      weighting=pieces.weighting, server_optimizer=training.server_optimizer)
