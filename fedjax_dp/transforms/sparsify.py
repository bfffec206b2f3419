"""LUS, local update sparsification by first-order utility (Cheng et al., CVPR 2022, Sec. 4.2).

For every element ``k`` of the client's update ``Delta = w_{t,Q} - w_{t,0}`` the
utility cost of zeroing it is the first-order Taylor term (Eq. 9-11)
``T_k = |g_k * Delta_k|`` with ``g`` the gradient of the local loss at the final
local model ``w_{t,Q}``. In each layer ``j`` (here: each leaf of the parameter
pytree, so a layer's kernel and bias are ranked separately) the ``s_j``
elements with the largest ``T`` are kept and the rest are zeroed (Eq. 12). The
sparsity ``c = 1 - s_j / d_j`` is the fraction zeroed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.errors import check_unless_traced


def kept_count(size: int, sparsity) -> jax.Array:
  """``s_j``: elements kept in a leaf of ``size`` elements, ``round((1 - c) * d_j)``, at least 1.

  A Python number is computed in float64 with a half rounding down (a tolerance of 1e-9 absorbs
  the rounding of ``1 - c``: ``c = 0.7`` on 35 elements keeps 10, from ``10.500000000000002``).
  A traced ``sparsity`` (the compiled round's float32 hyper-parameter) is computed in float32
  with a tolerance of 1e-6, which does not cover float32's rounding of ``1 - c`` in every leaf:
  there a count at an exact half may be either neighbour (one element of the leaf). An int32
  array.
  """
  if isinstance(sparsity, (int, float)):
    return jnp.int32(min(size, max(1, math.floor((1.0 - sparsity) * size + 0.5 - 1e-9))))
  c = jnp.asarray(sparsity, jnp.float32)
  s = jnp.floor((1.0 - c) * size + 0.5 - 1e-6)
  return jnp.clip(s, 1, size).astype(jnp.int32)


def _sortable_bits(x: jax.Array) -> jax.Array:
  """uint32 keys with the same order as the float32 values (NaN lowest)."""
  x = x.astype(jnp.float32) + 0.0  # -0.0 -> +0.0: equal floats, equal keys
  u = jax.lax.bitcast_convert_type(x, jnp.uint32)
  sign = jnp.uint32(0x80000000)
  key = jnp.where((u & sign) != 0, ~u, u | sign)
  return jnp.where(jnp.isnan(x), jnp.uint32(0), key)


def top_s_mask(scores: jax.Array, s: int) -> jax.Array:
  """0/1 mask (same shape as ``scores``) of exactly ``s`` largest entries.

  The s-th largest value is found exactly by a 32-step bitwise search over
  order-preserving integer keys (cheap under ``vmap``, unlike a sort or a
  large-k ``top_k`` on CPU). Ties are broken deterministically: among equal
  scores the element with the lower flat (row-major) index is kept. NaN
  scores rank lowest.
  """
  flat = scores.reshape(-1)
  d = flat.shape[0]
  if isinstance(s, int) and s >= d:
    return jnp.ones_like(scores)
  keys = _sortable_bits(flat)

  def bit(i, t):
    cand = t | jnp.left_shift(jnp.uint32(1), jnp.uint32(31 - i))
    return jnp.where(jnp.sum(keys >= cand) >= s, cand, t)

  threshold = jax.lax.fori_loop(0, 32, bit, jnp.uint32(0))  # the s-th largest key
  above = keys > threshold
  at = keys == threshold
  room = s - jnp.sum(above)
  keep = above | (at & (jnp.cumsum(at) <= room)) | (s >= d)
  return keep.astype(scores.dtype).reshape(scores.shape)


def sparsify_by_utility(sparsity: float) -> optax.GradientTransformationExtraArgs:
  """Per-layer top-s sparsification of the update by utility ``|g * Delta|`` (Eq. 12).

  Called as ``update(delta, state, params, grad=g)``: ``grad`` is a pytree like
  ``delta`` holding the gradient of the local loss at ``w_{t,Q}`` (Eq. 10; LUS's
  clients average minibatch gradients, :func:`fedjax_dp.algorithms.fedavg.lus_gradient`).
  Without ``grad`` it raises a TypeError.

  Privacy: the mask depends on the client's data, so it is not private by
  itself; it is safe only when clipping and noise come after it (as in
  Alg. 2: sparsify, clip to S, add noise): the clipped update still has
  L2 norm <= S, so the sum's sensitivity and the accounting are DP-FedAvg's.

  Args:
    sparsity: c in [0, 1), the fraction of each layer's elements zeroed
      (the paper's grid: 0.1, 0.3, 0.5, 0.7, 0.9; default in the paper 0.7).
      ``c = 0`` keeps everything.

  Returns:
    The transform (stateless: ``init`` gives ``optax.EmptyState()``).

  Raises:
    ConfigError: a concrete ``sparsity`` outside [0, 1) (a traced one, the compiled round's
      hyper-parameter, is checked where the settings are read).
  """
  check_unless_traced(lambda c: c is not None and 0 <= c < 1, "sparsity", sparsity,
                      "must be in [0, 1)")

  def update(updates, state, params=None, *, grad, **extra):
    """``(sparsified, state)``: each leaf keeps its ``s_j`` elements of largest ``|g * Delta|``.

    Args:
      updates: ``Delta``, the client's update (a pytree).
      state: ``optax.EmptyState()``, returned as it is.
      params: unused.
      grad: the local loss's gradient at ``w_{t,Q}``, a pytree like ``updates``.
      **extra: unused extra arguments of the chain.
    """
    del params, extra

    def one(u, g):
      scores = jnp.abs(g.astype(jnp.float32) * u.astype(jnp.float32))
      return u * top_s_mask(scores, kept_count(u.size, sparsity)).astype(u.dtype)

    return jax.tree_util.tree_map(one, updates, grad), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)
