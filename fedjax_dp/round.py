"""The one federated round: its contract and the generic round every algorithm composes.

::

  step(round, state, hparams, cohort, key) -> (state, metrics)      # one compiled function

  per client, under jax.vmap (keys: fold_in(round key, client id)):
    client(hp)(params, x, y, count, row, client_hp, key) -> ClientOut
        local update (local SGD, DP-SGD, one gradient, an RSA worker step)
        then the client's transforms (sparsify -> clip, sign perturbation)
  attack:      Byzantine rows replaced; attacks see what clients release
  aggregate:   aggregator(hp).aggregate(rows, weights, mask, agg_state, key)
  server:      params <- params - server_lr * opt(grads), grads = -aggregate for model
               deltas, aggregate + l2 * params for gradients (``descent``); or the
               round's own ``server_step`` (AE-DPFL trains on labels read off the aggregate)
  server rule: the algorithm's server state (adaptive clip bounds) from the
               clients' ``aux`` outputs; per-client state rows scattered back

Hyper-parameters are data. Every number that is not a shape (clip bounds, noise
multipliers, learning rates, lambda, sparsity, keep probabilities, attack
strengths, even the number of Byzantine clients) comes in ``hparams``, a dict
of float32 / int32 arrays, and the pieces are built from it *inside* the
trace (``client(hp)``, ``aggregator(hp)``, ``attack(hp)``), the way
``optax.inject_hyperparams`` builds a transform from traced values. A
:class:`Round` holds only static structure (model, shapes, which pieces), so
changing a number never recompiles, and the step can be ``vmap``-ed over a
leading experiment axis of ``(hparams, key)``. :func:`compiled_step` caches
the jitted step per :class:`Round`; builders return the same :class:`Round`
for the same structure (see :func:`fedjax_dp.algorithms.cached_round`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp import attacks as attacks_lib
from fedjax_dp.aggregators.base import weighted_sum
from fedjax_dp.aggregators.robust import finite_rows
from fedjax_dp.client import make_optimizer
from fedjax_dp.errors import ConfigError, check
from fedjax_dp.models import conv_layers
from fedjax_dp.transforms import global_norm


class CohortBatch(NamedTuple):
  """The cohort's data, gathered inside the compiled round."""

  x: jax.Array       # [C, M, ...]
  y: jax.Array       # [C, M]
  counts: jax.Array  # [C]
  ids: jax.Array     # [C] client ids (rows of per-client state)
  mask: jax.Array    # [C] 1.0 for real clients


class DataSets(NamedTuple):
  """Several populations' ``(x, y, counts)`` stacked on a leading data-set axis, and which one
  a round reads (``index``): a sweep's experiments on a few distinct data sets (one per seed)
  share one copy of each, indexed inside the round, instead of one copy per experiment."""

  arrays: tuple       # (x [D, N, M, ...], y [D, N, M], counts [D, N])
  index: jax.Array    # [] (per experiment) the data set this round reads


def gather_clients(data, ids):
  """The clients ``ids``' ``(x, y, counts)`` from a population's arrays or :class:`DataSets`
  (one gather each, the data set and the clients indexed together)."""
  if isinstance(data, DataSets):
    return tuple(a[data.index, ids] for a in data.arrays)
  return tuple(a[ids] for a in data)


class RoundState(NamedTuple):
  """Everything that carries over between rounds."""

  params: Any        # the global model
  opt_state: Any     # the server optimizer's state
  agg_state: Any     # the aggregator's state (centered clipping's last aggregate)
  rows: Any          # per-client state rows, leaves [num_clients, ...] (RSA's workers); () if none
  server: Any        # the algorithm's server state (adaptive clip bounds); () if none
  round: jax.Array


class ClientOut(NamedTuple):
  """What one client's update returns (batched over the cohort by ``vmap``).

  Attributes:
    upload: what the client releases, after its transforms (a pytree; an aggregator's row).
    row: its new per-client state row (stateful algorithms; ``()`` without).
    loss: its mean local training loss (a raw diagnostic).
    norm: the L2 norm of its update before any transform (a raw diagnostic).
    aux: a pytree of per-client values for the server rule and the metrics (``()`` without).
    raw: what a model-level attack acts on (RSA: the worker's model; None without).
  """

  upload: Any
  row: Any = ()
  loss: Any = 0.0
  norm: Any = 0.0
  aux: Any = ()
  raw: Any = None


class ClientInputs(NamedTuple):
  """The cohort's per-client inputs (:func:`run_clients`), each with a leading client axis [C]."""

  batch: CohortBatch  # their ids and mask, and their data unless gathered (ClientLayout.data)
  rows: Any           # their per-client state rows (RoundState.rows); () if none
  hparams: Any        # their own hyper-parameters (Hooks.client_hparams); () if none
  keys: jax.Array     # their keys (client_keys)


class ClientLayout(NamedTuple):
  """Where the cohort's data come from and how its clients' work is laid out.

  Attributes:
    data: the population's ``(x, y, counts)`` (or :class:`DataSets`): each block of clients
      gathers its own rows from it (so the cohort's data is never held at once); None: the
      cohort's :class:`CohortBatch` holds them.
    chunk: clients per block on each device; None: the whole cohort in one ``vmap``.
    axis_name: the name of a sweep's ``vmap``-ed experiment axis around the round, or None.
    mesh: the devices the clients are split over (:func:`client_mesh`); None: one device.
  """

  data: Any = None
  chunk: Optional[int] = None
  axis_name: Optional[str] = None
  mesh: Optional[jax.sharding.Mesh] = None


class Sums(NamedTuple):
  """A linear aggregator's sums over the cohort's uploads, added up block by block."""

  total: Any            # sum_i w_i m_i u_i of the prepared uploads (Aggregator.prepare)
  weight: jax.Array     # sum_i w_i m_i
  nonfinite: jax.Array  # real uploads holding a NaN or Inf (nonfinite_rows)


class Uploads(NamedTuple):
  """The cohort's uploads as the attack receives them, and who sent them."""

  rows: Any             # [C, ...] what each client releases (padded rows zero)
  byzantine: jax.Array  # [C] 1.0 for a Byzantine client (attacks.byzantine_mask)
  mask: jax.Array       # [C] 1.0 for a real client
  ids: jax.Array        # [C] the clients' ids


class Messages(NamedTuple):
  """What a round's clients computed and what the server receives (:func:`messages`)."""

  out: ClientOut        # every client's outputs (its upload None when summed)
  sent: Any             # the uploads after the attack (padded rows zero); None when summed
  byzantine: jax.Array  # [C] 1.0 for a Byzantine client
  sums: Optional[Sums]  # the uploads' sums when a linear aggregator summed them block by block


def tree_sub(a, b):
  """``a - b`` leaf by leaf.

  Args:
    a: a pytree of arrays.
    b: a pytree of the same structure, broadcastable leaf by leaf.

  Returns:
    The pytree of differences.
  """
  return jax.tree_util.tree_map(jnp.subtract, a, b)


def client_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
  """One key per client, a function of the round key and the client id only.

  A client's randomness does not depend on its slot in the cohort or on the
  cohort's padded capacity.
  """
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)


def mask_rows(tree, mask):
  """Zeros the rows of padded clients (exact zeros, whatever they computed)."""
  return jax.tree_util.tree_map(
      lambda u: jnp.where(mask.reshape((-1,) + (1,) * (u.ndim - 1)) > 0, u, jnp.zeros_like(u)), tree)


def gather_rows(tree, ids):
  return jax.tree_util.tree_map(lambda w: w[ids], tree)


def scatter_rows(tree, ids, rows, mask, num_clients: int):
  """``tree[ids] = rows`` for the real rows; padded slots (mask 0) write nothing.

  Args:
    tree: the per-client state, a pytree with leaves ``[num_clients, ...]``.
    ids: ``[C]`` int client ids of the cohort's slots.
    rows: their new rows, a pytree like ``tree`` with leaves ``[C, ...]`` (cast to its dtypes).
    mask: ``[C]``, 1 for real clients and 0 for padding.
    num_clients: the population size (a padded slot writes to this out-of-range row: dropped).

  Returns:
    ``tree`` with the real clients' rows replaced.
  """
  safe = jnp.where(mask > 0, ids, num_clients)
  return jax.tree_util.tree_map(lambda w, r: w.at[safe].set(r.astype(w.dtype), mode="drop"),
                                tree, rows)


WEIGHTINGS = ("uniform", "examples")
SALT_ATTACK = 0xA77C
SALT_SERVER = 0x5E2F


def client_weights(weighting: str, batch: CohortBatch) -> jax.Array:
  """Aggregation weights: 1 per client ("uniform") or its number of examples ("examples")."""
  return (jnp.ones_like(batch.mask) if weighting == "uniform"
          else batch.counts.astype(jnp.float32))


@dataclasses.dataclass(frozen=True, eq=False)
class Piece:
  """A piece of the round built from hyper-parameters, with what it declares about privacy.

  Privacy travels with the pieces (as jax-privacy's bounded-sensitivity
  callables do): the run's mechanism is derived from what the client and the
  aggregator that actually run declare, never from the configuration
  (:func:`fedjax_dp.privacy.mechanisms.user_level_mechanism`). A plain
  callable declares nothing, so a round built from one claims no guarantee.

  Attributes:
    make: ``hp -> piece`` (a client function or an ``Aggregator``).
    name: a short name for reports.
    bound: client: the ``hp`` key of the L2 bound every released update
      satisfies (None: unbounded).
    noise: aggregator: the ``hp`` key of the bound its Gaussian noise is
      scaled to (std ``hp["noise_multiplier"] * hp[noise]`` on the weighted
      sum; None: no noise).
    public_denominator: aggregator: divides the noisy sum by a public number.
    mechanism: a piece that perturbs what each client releases by itself
      (DP-RSA's sign perturbation): ``(hp, dimension) -> mechanism record``
      of one round (:mod:`fedjax_dp.privacy.sign`); None: declares none.
  """

  make: Callable
  name: str = ""
  bound: Optional[str] = None
  noise: Optional[str] = None
  public_denominator: bool = False
  mechanism: Optional[Callable] = None

  def __call__(self, hp):
    return self.make(hp)


def attack_uploads(rnd: "Round", state: RoundState, out: ClientOut, uploads: Uploads, hp: dict,
                   key: jax.Array):
  """The default attack step: the attack replaces the Byzantine rows of the uploads.

  Args:
    rnd: the round (its attack, :meth:`Round.build_attack`).
    state: the round's state before the step (unused here).
    out: the clients' :class:`ClientOut` (unused here).
    uploads: the cohort's uploads, who sent them and which are real.
    hp: the round's hyper-parameters (the attack's strengths, ``byzantine``).
    key: the attack's PRNG key (:func:`round_keys`).

  Returns:
    The uploads as the server receives them: ``uploads.rows`` with the Byzantine rows replaced.
  """
  del state, out
  attack = rnd.build_attack(hp)
  return attack(uploads.rows, uploads.byzantine, key, mask=uploads.mask, ids=uploads.ids)


class Hooks(NamedTuple):
  """What an algorithm adds to the one round, each at its default where it adds nothing. A new
  algorithm composes these (and its client, aggregator and attack); :class:`Round` has no field
  of any one paper's.

  Attributes:
    init_row: ``params -> one client's state row`` (broadcast to every client; RSA's workers'
      models), or None: no per-client state.
    init_server: ``(params, hp) -> server state`` (SP-FL's thresholds), or None.
    client_hparams: ``(server_state, hp, ids) -> per-client pytree [C]``: each client's own
      hyper-parameters from the server state (its class's clip bound), or None.
    server_rule: ``(server_state, hp, aux [C], mask, ids) -> server_state``: the server state's
      update from what the clients reported, or None.
    server_step: ``(state, aggregate, hp, key) -> (params, opt_state)``, the server's update
      from the aggregate in place of :func:`server_update`'s optimizer step (AE-DPFL trains the
      model on labels read off the aggregate), or None. Its key is the round's own
      (:func:`round_keys`), apart from the aggregator's and the attack's.
    attack_step: how the attack enters, ``(rnd, state, out, uploads: Uploads, hp, key) -> sent``
      (:func:`attack_uploads` by default). With attack "none" and no ``init_row`` it must send
      the uploads as they are: a round split into blocks of clients then sums them block by
      block without calling it (:func:`step`).
    metrics: ``(state, new_params, out, sent, mask, hp) -> dict`` of extra scalars, or None.
  """

  init_row: Optional[Callable] = None
  init_server: Optional[Callable] = None
  client_hparams: Optional[Callable] = None
  server_rule: Optional[Callable] = None
  server_step: Optional[Callable] = None
  attack_step: Callable = attack_uploads
  metrics: Optional[Callable] = None


@dataclasses.dataclass(frozen=True, eq=False)
class Round:
  """The static structure of one federated round; every number comes in ``hparams``.

  Attributes:
    model: the :class:`fedjax_dp.models.Model`.
    num_clients: the population size (rows of per-client state, Byzantine ids).
    client: ``hp -> (params, x, y, count, row, client_hp, key) -> ClientOut``.
    aggregator: ``hp -> Aggregator``.
    attack: a declared attack's name (:mod:`fedjax_dp.attacks`); its
      strengths and the number of Byzantine clients are in ``hp``.
    attack_options: the attack's static options as ``((option, value), ...)``
      (:func:`fedjax_dp.attacks.static_options`; the others are at their defaults).
    weighting: "uniform" or "examples".
    descent: the aggregate is a gradient (robust SGD, RSA's sign sum):
      ``grads = aggregate + l2 * params``; else a model delta, ``grads = -aggregate``.
    server_optimizer: name of the server optimizer (:data:`fedjax_dp.client.OPTIMIZERS`);
      its learning rate is ``hp["server_lr"]``.
    hooks: what the algorithm adds to the round (:class:`Hooks`).
    released_metrics: metric names computed only from the released aggregate
      (see :mod:`fedjax_dp.engine`).
    model_batch: examples the client's step applies the model to at once, when not the
      configuration's batch size (DP-SGD's per-example gradients: 1); the convolutions it
      runs are predicted from it (:func:`fedjax_dp.experiment.client_blocks`).
  """

  model: Any
  num_clients: int
  client: Callable
  aggregator: Callable
  attack: str = "none"
  attack_options: tuple = ()
  weighting: str = "uniform"
  descent: bool = False
  server_optimizer: str = "sgd"
  hooks: Hooks = Hooks()
  released_metrics: tuple = ("aggregate_norm",)
  model_batch: Optional[int] = None

  def init(self, key: jax.Array, hparams: dict) -> RoundState:
    """The state before round 1 (the server optimizer's state, per-client rows, server state)."""
    params = self.model.init(key)
    opt = make_optimizer(self.server_optimizer, 1.0)
    rows = ()
    if self.hooks.init_row is not None:
      row = self.hooks.init_row(params)
      rows = jax.tree_util.tree_map(lambda p: jnp.broadcast_to(p, (self.num_clients,) + p.shape), row)
    server = () if self.hooks.init_server is None else self.hooks.init_server(params, hparams)
    agg_state = self.aggregator(hparams).init(params)
    return RoundState(params, opt.init(params), agg_state, rows, server, jnp.zeros((), jnp.int32))

  def eval_params(self, state: RoundState):
    return state.params

  def build_attack(self, hp: dict) -> attacks_lib.Attack:
    """The round's attack, its strengths read from ``hp`` and its static options from
    :attr:`attack_options` (:func:`fedjax_dp.attacks.get`)."""
    return attacks_lib.get(self.attack, hp, dict(self.attack_options))


def server_update(rnd: Round, state: RoundState, aggregate, hp):
  """``params - server_lr * optimizer(grads)``; returns ``(params, opt_state)``.

  The optimizer is built with learning rate 1 and its step scaled by
  ``hp["server_lr"]``, so the rate is data (SGD, momentum, Adam, ... all end
  in a learning-rate scale in optax).

  Args:
    rnd: the round (``descent`` and ``server_optimizer``).
    state: the round's state (its ``params`` and ``opt_state``).
    aggregate: the round's aggregate, a pytree like ``params``: a gradient when
      ``rnd.descent`` (``grads = aggregate + hp["l2"] * params``), else a model delta
      (``grads = -aggregate``).
    hp: the round's hyper-parameters (``server_lr``, ``l2``).

  Returns:
    ``(params, opt_state)``: the new global model and server optimizer state.
  """
  if rnd.descent:
    grads = jax.tree_util.tree_map(lambda a, p: a + hp["l2"] * p, aggregate, state.params)
  else:
    grads = jax.tree_util.tree_map(jnp.negative, aggregate)
  opt = make_optimizer(rnd.server_optimizer, 1.0)
  updates, opt_state = opt.update(grads, state.opt_state, state.params)
  updates = jax.tree_util.tree_map(lambda u: hp["server_lr"] * u, updates)
  return optax.apply_updates(state.params, updates), opt_state


def nonfinite_rows(rows, mask) -> jax.Array:
  """Real rows holding a NaN or Inf (the robust aggregators reject them)."""
  return jnp.sum(mask) - jnp.sum(finite_rows(rows, mask))


def _pad_axis(a, axis: int, length: int):
  """``a`` padded with zeros (inert slots: their mask is 0) along ``axis`` to ``length``."""
  pad = length - a.shape[axis]
  if not pad:
    return a
  shape = a.shape[:axis] + (pad,) + a.shape[axis + 1:]
  return jnp.concatenate([a, jnp.zeros(shape, a.dtype)], axis=axis)


def _blocks(tree, size: int, count: int, shards: int = 1):
  """Leading axis ``[C]`` -> ``[count, shards * size]``: ``C`` is cut into ``shards`` parts of
  ``ceil(C / shards)`` (one device's clients, as XLA splits the axis), each padded to ``count``
  blocks of ``size``, and block ``i`` holds the ``i``-th block of every part, so that each
  device runs its own clients block after block (a block of the whole axis would split the
  blocks, not the clients, over the devices: each device would wait for the others')."""
  def split(a):
    part = -(-a.shape[0] // shards)
    a = _pad_axis(a, 0, shards * part).reshape((shards, part) + a.shape[1:])
    a = _pad_axis(a, 1, count * size).reshape((shards, count, size) + a.shape[2:])
    return jnp.swapaxes(a, 0, 1).reshape((count, shards * size) + a.shape[3:])
  return jax.tree_util.tree_map(split, tree)


def _unblocks(tree, length: int, shards: int = 1):
  """The inverse of :func:`_blocks`: ``[count, shards * size]`` -> ``[length]``."""
  part = -(-length // shards)

  def merge(a):
    a = a.reshape((a.shape[0], shards, -1) + a.shape[2:])
    a = jnp.swapaxes(a, 0, 1).reshape((shards, -1) + a.shape[3:])
    return a[:, :part].reshape((shards * part,) + a.shape[2:])[:length]
  return jax.tree_util.tree_map(merge, tree)


def run_clients(rnd: Round, hp: dict, params, inputs: ClientInputs,
                layout: ClientLayout = ClientLayout(), accumulate: Optional[Callable] = None):
  """The cohort's client updates: one ``vmap``, or blocks of ``layout.chunk`` clients on each
  device of ``layout.mesh`` (:func:`_in_blocks`).

  Args:
    rnd: the round (its ``client(hp)`` runs on each client; ``weighting`` weighs the sums).
    hp: the round's hyper-parameters.
    params: the global model every client starts from.
    inputs: the cohort's per-client inputs.
    layout: where the clients' data come from and how their work is laid out.
    accumulate: the ``prepare`` of a linear aggregator
      (:attr:`fedjax_dp.aggregators.Aggregator.linear`), or None: each block adds its masked,
      prepared uploads to running :class:`Sums`, and the uploads themselves are not kept.

  Returns:
    ``(out, sums)``: every client's :class:`ClientOut` (its ``upload`` None when accumulating)
    and the uploads' :class:`Sums` (``nonfinite`` counted as the whole cohort's would be), or
    None when not accumulating.
  """
  client = rnd.client(hp)

  def block(inputs):
    batch = inputs.batch
    x, y, counts = ((batch.x, batch.y, batch.counts) if layout.data is None
                    else gather_clients(layout.data, batch.ids))
    out = jax.vmap(client, in_axes=(None, 0, 0, 0, 0, 0, 0))(
        params, x, y, counts, inputs.rows, inputs.hparams, inputs.keys)
    if accumulate is None:
      return out, None
    uploads = mask_rows(out.upload, batch.mask)
    u, m = accumulate(uploads, batch.mask)
    w = client_weights(rnd.weighting, batch._replace(counts=counts))
    return out._replace(upload=None), Sums(weighted_sum(u, w, m), jnp.sum(w * m),
                                           nonfinite_rows(uploads, batch.mask))

  if layout.chunk is None or layout.chunk * _shards(layout) >= inputs.batch.ids.shape[0]:
    return block(inputs)
  return _in_blocks(block, inputs, layout, accumulate is not None)


def _shards(layout: ClientLayout) -> int:
  return 1 if layout.mesh is None else layout.mesh.size


def _in_blocks(block: Callable, inputs: ClientInputs, layout: ClientLayout, summing: bool):
  """``block(inputs) -> (out, sums)`` run on blocks of ``layout.chunk`` clients on each device
  (:func:`_blocks`); returns ``(out, sums)`` with ``out`` of every client and, when
  ``summing``, the blocks' ``sums`` added up (else None).

  Blocks run one after another (``lax.scan``) and a block of padded slots only is skipped (its
  ``out`` and ``sums`` zeros). Inside a sweep's ``vmap`` over experiments
  (``layout.axis_name``) a block is skipped when it holds padded slots only in every
  experiment: the skip stays a branch instead of becoming a select of both (the other
  experiments' real clients in that block are computed for all, and masked where padded).
  """
  size, shards = inputs.batch.ids.shape[0], _shards(layout)
  count = -(-size // (shards * layout.chunk))  # blocks of every device's ceil(size / shards)
  blocks = _blocks(inputs, layout.chunk, count, shards)
  if shards > 1:
    blocks = shard_clients(blocks, layout.mesh, 1)
  shapes = jax.eval_shape(block, jax.tree_util.tree_map(lambda a: a[0], blocks))

  def zeros(*_):
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def body(sums, blk):
    live = jnp.any(blk.batch.mask > 0)
    if layout.axis_name is not None:
      live = jax.lax.pmax(live.astype(jnp.int32), layout.axis_name) > 0
    out, block_sums = jax.lax.cond(live, block, zeros, blk)
    if summing:
      sums = jax.tree_util.tree_map(jnp.add, sums, block_sums)
    return sums, out

  sums, out = jax.lax.scan(body, zeros()[1], blocks)
  return _unblocks(out, size, shards), sums


def round_keys(key: jax.Array) -> tuple:
  """``(k_clients, k_agg, k_attack, k_server)`` of a round key.

  The split the FedAvg and DP-SGD programs used before the one round, so their
  runs reproduce; the attack and the server's own step (:attr:`Hooks.server_step`) draw from
  their own salts.
  """
  k_clients, k_agg = jax.random.split(key)
  return (k_clients, k_agg, jax.random.fold_in(k_agg, SALT_ATTACK),
          jax.random.fold_in(k_agg, SALT_SERVER))


def _messages(rnd: Round, state: RoundState, hp: dict, batch: CohortBatch, key: jax.Array,
              layout: ClientLayout = ClientLayout(),
              accumulate: Optional[Callable] = None) -> Messages:
  """The round's :class:`Messages` (:func:`run_clients`' ``layout`` and ``accumulate``); the
  attack step runs only when the uploads are kept (not summed)."""
  k_clients, _, k_attack, _ = round_keys(key)
  keys = client_keys(k_clients, batch.ids)
  rows = gather_rows(state.rows, batch.ids)
  hooks = rnd.hooks
  chp = () if hooks.client_hparams is None else hooks.client_hparams(state.server, hp, batch.ids)
  out, sums = run_clients(rnd, hp, state.params, ClientInputs(batch, rows, chp, keys), layout,
                          accumulate)
  byz = attacks_lib.byzantine_mask(batch.ids, rnd.num_clients, hp["byzantine"])
  sent = None
  if accumulate is None:
    uploads = Uploads(mask_rows(out.upload, batch.mask), byz, batch.mask, batch.ids)
    sent = hooks.attack_step(rnd, state, out, uploads, hp, k_attack)
  return Messages(out, sent, byz, sums)


def messages(rnd: Round, state: RoundState, hp: dict, batch: CohortBatch, key: jax.Array):
  """What the server receives in one round, exactly as :func:`step` computes it before
  aggregating. For audits of what a round releases.

  Args:
    rnd: the round.
    state: the round's state before the step.
    hp: the round's hyper-parameters.
    batch: the cohort (its data, ids and mask).
    key: the round's key (the same as :func:`step`'s).

  Returns:
    ``(out, sent)``: the clients' :class:`ClientOut` (leaves ``[C, ...]``) and the cohort's
    uploads after the attack (padded rows zero).
  """
  msgs = _messages(rnd, state, hp, batch, key)
  return msgs.out, msgs.sent


def step(rnd: Round, state: RoundState, hp: dict, batch: CohortBatch, key: jax.Array,
         layout: ClientLayout = ClientLayout()):
  """One federated round (pure; see the module docstring).

  Split into blocks (``layout.chunk``), a round whose aggregator is linear
  (:attr:`fedjax_dp.aggregators.Aggregator.linear`: the noised mean) and that has no attack and
  no per-client state sums the uploads block by block, so its memory does not grow with the
  cohort; any other keeps every client's upload (the aggregators that need all rows at once
  say what they hold).

  Args:
    rnd: the round's static structure.
    state: the :class:`RoundState` before the round.
    hp: the round's hyper-parameters (a dict of float32 / int32 arrays).
    batch: the cohort: ``[C]`` ids and mask, and its data unless ``layout.data`` holds them
      (``batch.x``, ``batch.y`` and ``batch.counts`` are then unused).
    key: the round's PRNG key (split by :func:`round_keys`).
    layout: where the cohort's data come from and how its clients' work is laid out
      (:func:`run_clients`).

  Returns:
    ``(state, metrics)``: the next :class:`RoundState` and a dict of arrays (per-client ``[C]``
    ones such as ``client_loss`` and ``mask``, scalars such as ``aggregate_norm``, and the
    algorithm's ``Hooks.metrics``).
  """
  aggregator, hooks = rnd.aggregator(hp), rnd.hooks
  summed = (layout.chunk is not None and aggregator.linear and rnd.attack == "none"
            and hooks.init_row is None)
  msgs = _messages(rnd, state, hp, batch, key, layout, aggregator.prepare if summed else None)
  k_agg = round_keys(key)[1]
  if msgs.sums is None:
    counts = batch.counts if layout.data is None else gather_clients(layout.data, batch.ids)[2]
    aggregate, agg_state = aggregator.aggregate(
        msgs.sent, client_weights(rnd.weighting, batch._replace(counts=counts)), batch.mask,
        state.agg_state, k_agg)
    nonfinite = nonfinite_rows(msgs.sent, batch.mask)
  else:
    aggregate, agg_state = aggregator.finish(msgs.sums.total, msgs.sums.weight, state.agg_state,
                                             k_agg)
    nonfinite = msgs.sums.nonfinite
  out = msgs.out
  if hooks.server_step is None:
    params, opt_state = server_update(rnd, state, aggregate, hp)
  else:
    params, opt_state = hooks.server_step(state, aggregate, hp, round_keys(key)[3])
  server = state.server if hooks.server_rule is None else hooks.server_rule(
      state.server, hp, out.aux, batch.mask, batch.ids)
  new_rows = state.rows if hooks.init_row is None else scatter_rows(
      state.rows, batch.ids, out.row, batch.mask, rnd.num_clients)
  metrics = {"client_loss": out.loss, "update_norm": out.norm, "mask": batch.mask,
             "aggregate_norm": global_norm(aggregate),
             "nonfinite_rows": nonfinite,
             "nonfinite_updates": jnp.sum(batch.mask * ~jnp.isfinite(out.norm)),
             "byzantine_in_cohort": jnp.sum(msgs.byzantine * batch.mask)}
  if hooks.metrics is not None:
    metrics.update(hooks.metrics(state, params, out, msgs.sent, batch.mask, hp))
  new_state = RoundState(params, opt_state, agg_state, new_rows, server, state.round + 1)
  return new_state, metrics


# The name of a sweep's vmapped experiment axis (:func:`compiled_step`).
EXPERIMENTS_AXIS = "experiments"


def one_cpu_device(devices: Optional[int] = None) -> bool:
  """Whether a run's clients go to one CPU device (``devices``, default every device JAX sees):
  where a sweep's programs run in threads (:func:`fedjax_dp.sweep.threads_for`)."""
  return jax.default_backend() == "cpu" and (devices or jax.device_count()) == 1


def use_cpu_devices(n: Optional[int]) -> None:
  """Sets JAX's CPU device count to ``n`` (None: unchanged; ``--cpu-devices``) before JAX starts;
  refused when this process already started JAX with another count."""
  if n is None:
    return
  check(not isinstance(n, bool) and isinstance(n, int) and n >= 1, "cpu_devices", n,
        "must be an integer >= 1")
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # JAX started in this process before (fedjax_dp.cli.main from Python)
    have = len(jax.devices("cpu"))
    check(have == n, "cpu_devices", n, f"JAX already started in this process with {have} CPU "
          f"device(s); the count is set before JAX starts: a new process (or JAX_NUM_CPU_DEVICES="
          f"{n} in its environment)")


def check_backend() -> None:
  """Starts JAX's backend (its devices are listed), refusing one that cannot start here in one
  :class:`fedjax_dp.errors.ConfigError` naming ``JAX_PLATFORMS`` (``JAX_PLATFORMS=tpu`` on a
  machine without a TPU, a platform JAX does not know), in place of JAX's traceback."""
  try:
    jax.devices()
  # RuntimeError: a platform asked for failed to start; AssertionError: JAX 0.10 asserts it
  # started one after skipping each asked for (JAX_PLATFORMS=cuda without an NVIDIA GPU).
  except (RuntimeError, AssertionError) as e:
    # JAX's message, less its hint on JAX_PLATFORMS (the refusal gives its own).
    detail = (str(e).splitlines() or ["no platform asked for has a device"])[0]
    detail = detail.split(" (set JAX_PLATFORMS=")[0].split(" (you may need to")[0][:300]
    asked = jax.config.jax_platforms or ""
    raise ConfigError("JAX_PLATFORMS", asked, (
        f"names a platform that JAX cannot start on this machine ({detail}): leave it unset to "
        "run on what the machine has, or set JAX_PLATFORMS=cpu" if asked else
        f"JAX cannot start a platform of this machine ({detail}): set JAX_PLATFORMS=cpu "
        "to run on the CPU")) from None


def check_devices(devices: Optional[int]) -> int:
  """The number of devices a run splits its clients over: ``devices``, or every device JAX sees
  (across every process) when None; more than JAX sees is refused (run and sweep call it
  before any data set loads)."""
  available = jax.devices()
  n = len(available) if devices is None else devices
  check(1 <= n <= len(available), "devices", devices,
        f"must be in [1, {len(available)}] (the devices JAX sees: {available[0].platform} x "
        f"{len(available)})")
  return n


def client_mesh(devices: Optional[int] = None) -> jax.sharding.Mesh:
  """A one-axis mesh ``("clients",)`` over the first ``devices`` devices (default: all of them,
  across every process of a multi-process run)."""
  return jax.sharding.Mesh(np.asarray(jax.devices()[:check_devices(devices)]), ("clients",))


def shard_clients(tree, mesh: jax.sharding.Mesh, axis: int):
  """Constrains axis ``axis`` (the cohort's clients) of every leaf to be split over ``mesh``.

  Args:
    tree: a pytree whose leaves have the cohort's clients on axis ``axis``.
    mesh: a mesh with axis ``"clients"`` (:func:`client_mesh`).
    axis: the clients' axis (0, or 1 behind a sweep's experiment axis).

  Returns:
    ``tree`` with a sharding constraint on every leaf (the values unchanged).
  """
  def constrain(a):
    spec = jax.sharding.PartitionSpec(*([None] * axis + ["clients"]))
    return jax.lax.with_sharding_constraint(a, jax.sharding.NamedSharding(mesh, spec))
  return jax.tree_util.tree_map(constrain, tree)


def _in_sequence(fn: Callable, in_axes: tuple) -> Callable:
  """``fn`` run for each index of the leading axis of the arguments that ``in_axes`` (as
  ``vmap``'s: 0 or None per argument, or a pytree prefix of them) maps, one index after
  another (``lax.map``); the arguments it marks None enter whole. The last argument (the
  round keys) is always mapped."""
  def mapped(*args):
    def take(e):
      return jax.tree_util.tree_map(
          lambda spec, a: a if spec is None else jax.tree_util.tree_map(lambda l: l[e], a),
          in_axes, args, is_leaf=lambda x: x is None)
    size = jax.tree_util.tree_leaves(args[-1])[0].shape[0]
    return jax.lax.map(lambda e: fn(*take(e)), jnp.arange(size))
  return mapped


_CONV_LAYERS: "weakref.WeakKeyDictionary[Round, dict]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _recording_conv_layers(rnd: Round):
  with conv_layers() as found:
    yield
  _CONV_LAYERS[rnd] = found


def traced_conv_layers(rnd: Round) -> dict:
  """``layer path -> implementations`` of the convolutions ``rnd``'s compiled step runs, as
  recorded when it was last traced (empty before, and for a model without :class:`Conv`
  layers): what the clients' steps really run, e.g. im2col where DP-SGD's per-example
  gradients give each layer one example, though ``conv_impl`` "auto" picks Winograd at the
  configuration's batch size."""
  return dict(_CONV_LAYERS.get(rnd, {}))


@functools.lru_cache(maxsize=128)
def compiled_step(rnd: Round, placement: str = "device", experiments: Optional[str] = None,
                  chunk: Optional[int] = None, devices: Optional[int] = None,
                  in_sequence: bool = False) -> Callable:
  """The jitted step of ``rnd``, compiled once per :class:`Round` and argument shapes.

  Args:
    rnd: the round (with the other arguments, the cache key).
    placement: "device": the step is ``fn(state, hp, (x, y, counts), ids, mask, key)`` and
      gathers the cohort's rows from every client's arrays inside the compiled round; "host":
      ``fn(state, hp, CohortBatch, key)``.
    experiments: None for one experiment; otherwise the step is ``vmap``-ed over a leading
      experiment axis of every argument (a sweep), except, with device placement, the clients'
      arrays: with "shared" all experiments read one copy, with "stacked" the arrays are
      :class:`DataSets` (each distinct data set once) and only their ``index`` has the
      experiment axis (:func:`fedjax_dp.engine.group_mode`).
    chunk: clients per block on each device (:func:`run_clients`); None: one ``vmap``.
    devices: the cohort's clients are split over this many devices (:func:`client_mesh`;
      None: all), one code path for one device and many: the cohort's ids and mask (host
      placement: its whole batch) are constrained to be sharded along the clients, and XLA's
      SPMD partitioner runs each device's clients there and sums across devices where the
      round aggregates. Everything else (the model, the state, the population's data) is
      replicated. The cohort's capacity must be a multiple of the device count
      (:func:`fedjax_dp.engine.run_group` pads it).
    in_sequence: the experiments run one after another inside the step (``lax.map``) instead
      of side by side (``vmap``): on one CPU device a vmap of experiments only takes their
      models out of cache and makes every client block run while any experiment has a real
      client in it (:func:`fedjax_dp.engine.experiments_vmapped`).

  Returns:
    The jitted step, returning ``(state, metrics)`` whole on every device (and every process).
  """
  mesh = client_mesh(devices)
  axis = 0 if experiments is None else 1
  name = None if experiments is None or in_sequence else EXPERIMENTS_AXIS
  layout = ClientLayout(chunk=chunk, axis_name=name, mesh=mesh)
  device = placement == "device"
  fn = functools.partial(_gathering_step if device else _recorded_step, rnd, layout)
  if experiments is not None:
    if device:
      data = None if experiments == "shared" else DataSets(None, 0)
      in_axes = (0, 0, data, 0, 0, 0)
    else:
      in_axes = (0, 0, 0, 0)
    fn = (_in_sequence(fn, in_axes) if in_sequence else
          jax.vmap(fn, in_axes=in_axes, axis_name=name))
  shard = functools.partial(shard_clients, mesh=mesh, axis=axis)
  fn = functools.partial(_sharded_gathering if device else _sharded, fn, shard)
  return jax.jit(fn, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def _recorded_step(rnd: Round, layout: ClientLayout, state, hp, batch, key):
  """:func:`step`, recording the convolutions it traces (:func:`traced_conv_layers`)."""
  with _recording_conv_layers(rnd):
    return step(rnd, state, hp, batch, key, layout)


def _gathering_step(rnd: Round, layout: ClientLayout, state, hp, arrays, ids, mask, key):
  """:func:`_recorded_step` of the cohort ``ids``, ``mask`` whose rows it gathers from the
  population's ``arrays``."""
  return _recorded_step(rnd, layout._replace(data=arrays), state, hp,
                        CohortBatch(None, None, None, ids, mask), key)


def _sharded(step_fn: Callable, shard: Callable, state, hp, batch, key):
  """``step_fn`` of the cohort ``batch`` split over the devices by ``shard``."""
  return step_fn(state, hp, shard(batch), key)


def _sharded_gathering(step_fn: Callable, shard: Callable, state, hp, arrays, ids, mask, key):
  """``step_fn`` of the cohort ``ids``, ``mask`` split over the devices by ``shard`` (the
  population's ``arrays`` replicated)."""
  return step_fn(state, hp, arrays, *shard((ids, mask)), key)


def run_keys(seed: int, secret: Optional[int] = None):
  """``(k_init, k_run)``: the initial state is ``program.init(k_init, hparams)``, round ``r``'s
  key ``fold_in(k_run, r)`` (a builder that must see the initial model uses ``k_init`` too).
  ``secret``: a 128-bit integer folded into ``k_run`` only (a private release's entropy), so the
  rounds' draws do not follow from ``seed`` while the initial model still does."""
  k_init, k_run = jax.random.split(jax.random.PRNGKey(seed))
  if secret is not None:
    for word in range(4):
      k_run = jax.random.fold_in(k_run, (secret >> (32 * word)) & 0xFFFFFFFF)
  return k_init, k_run
