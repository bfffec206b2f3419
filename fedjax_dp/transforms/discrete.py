"""Integer encodings for secure aggregation: DDGauss's client and server pieces in JAX.

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation", ICML 2021 (Algorithms 1 and 2).
Functions of one client's flat vector (``vmap``-ed over the cohort by the
round) and of the cohort's rows (the server's modular sum):

* :func:`rotate` / :func:`unrotate`: the randomized Hadamard transform
  ``H D x / sqrt(d)`` (``D`` a diagonal of random signs from a public key,
  ``H`` the Walsh-Hadamard matrix) on a vector zero-padded to ``d = 2^k``;
  orthogonal, so norms are kept and :func:`unrotate` inverts it.
* :func:`randomized_round`: each coordinate to ``floor(x)`` or ``floor(x)+1``,
  unbiased; :func:`conditional_round` retries it until the rounded vector's
  L2 norm is within a bound (bounded retries inside ``lax.while_loop``).
* :func:`discrete_gaussian`: N_Z(0, sigma^2) by Canonne, Kamath and
  Steinke's rejection sampler (NeurIPS 2020, Algorithm 3), in float32.
* :func:`modular_sum`, :func:`to_signed`: the secure aggregation's output, the
  sum of the rows modulo ``2^bits``, and its signed representative.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Salts folded into a client's key (see fedjax_dp.transforms) and into the public rotation key.
SALT_ROUNDING = 0x20D0
SALT_DISCRETE_GAUSSIAN = 0xD6A5
SALT_ROTATION = 0x207A
# Rejection rounds of the discrete Gaussian sampler: each accepts with probability >= 0.51 for
# sigma >= 1/2 (0.76 for large sigma), so a coordinate is left unaccepted with probability
# below 0.49^64 < 1e-20 (it is then 0; the sampler counts them).
SAMPLER_TRIES = 64
# The buffers of its retries (see discrete_gaussian): each this fraction of the last (more than the
# 0.49 that a round leaves at worst), down to a final size: at least RETRY_FINAL and 1/RETRY_SHARE of
# the coordinates. Each buffer is compiled code of its own, so the final share bounds the program
# (about 9 buffers at any size), while the last buffer's rounds add about a quarter of n proposals.
RETRY_SHRINK = 0.6
RETRY_FINAL = 32
RETRY_SHARE = 64
# The rounding's norm check, in float32, accepts a norm up to bound * (1 - NORM_MARGIN): the
# pairwise sum of squares (:func:`sum_of_squares`) is within (log2(d) + 1) * 2^-24 of the exact
# integer one (below 1e-5 for d <= 2^100), so every accepted vector is within the bound exactly.
NORM_MARGIN = 1e-5


def padded_dim(size: int) -> int:
  """The smallest power of two ``>= size`` (the rotation's dimension)."""
  return 1 << max(0, int(size) - 1).bit_length()


def hadamard(x: jax.Array) -> jax.Array:
  """``H x / sqrt(d)`` over the last axis (``d`` a power of two): the normalised fast
  Walsh-Hadamard transform, symmetric and orthogonal, hence its own inverse."""
  d = x.shape[-1]
  if d & (d - 1):
    raise ValueError(f"hadamard needs a power-of-two dimension, got {d}")
  y, h = x, 1
  while h < d:
    y = y.reshape(x.shape[:-1] + (d // (2 * h), 2, h))
    y = jnp.stack([y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]], axis=-2)
    h *= 2
  return y.reshape(x.shape) / jnp.sqrt(jnp.float32(d))


def rotation_key(seed, round_index) -> jax.Array:
  """The public key of a round's rotation (shared by every client and the server)."""
  base = jax.random.fold_in(jax.random.PRNGKey(SALT_ROTATION), jnp.asarray(seed, jnp.int32))
  return jax.random.fold_in(base, jnp.asarray(round_index, jnp.int32))


def rotate(x: jax.Array, key: jax.Array) -> jax.Array:
  """``H D x / sqrt(d)`` of a flat vector already padded to a power of two."""
  return hadamard(jax.random.rademacher(key, x.shape, jnp.float32) * x)


def unrotate(y: jax.Array, key: jax.Array) -> jax.Array:
  """The inverse of :func:`rotate` with the same key: ``D H y / sqrt(d)``."""
  return jax.random.rademacher(key, y.shape, jnp.float32) * hadamard(y)


def randomized_round(x: jax.Array, key: jax.Array) -> jax.Array:
  """Each coordinate to ``floor(x) + Bernoulli(x - floor(x))``: integers, ``E[round(x)] = x``."""
  low = jnp.floor(x)
  return low + (jax.random.uniform(key, x.shape) < x - low).astype(x.dtype)


def sum_of_squares(v: jax.Array) -> jax.Array:
  """``sum(v^2)`` of a power-of-two-long vector by pairwise halving, so its float32 error is at
  most ``(log2(d) + 1) * 2^-24`` relative (a plain reduction's order is the compiler's)."""
  s = v * v
  while s.shape[-1] > 1:
    s = s.reshape(s.shape[:-1] + (-1, 2)).sum(-1)
  return s[..., 0]


def conditional_round(x: jax.Array, bound, tries, key: jax.Array):
  """Randomized rounding conditioned on ``||round(x)||_2 <= bound`` (Kairouz et al. 2021, Sec. 4.1).

  Draws :func:`randomized_round` until the result's norm is within ``bound``
  (checked as ``sum_of_squares <= (bound (1 - NORM_MARGIN))^2``), at most
  ``tries`` draws (a ``lax.while_loop``; ``tries`` may be traced). If every
  draw fails, the result is ``trunc(x)`` (rounding towards zero, whose norm is
  at most ``||x||``), or zeros if even that fails the check, so the returned
  vector is always within the bound.

  Args:
    x: a float32 vector ``[d]`` (``d`` a power of two: the pairwise :func:`sum_of_squares`),
      already scaled to integer units.
    bound: ``B``, the L2 bound (> 0; may be traced).
    tries: the most draws (>= 1; may be traced).
    key: PRNG key; draw ``i`` uses ``fold_in(key, i)``.

  Returns:
    ``(rounded, draws, ok)``: the float32 integer-valued vector ``[d]`` with
    ``||rounded||_2 <= B``, the int32 number of draws made, and ``ok`` False when the fallback
    was used.
  """
  limit = jnp.square(bound * (1.0 - NORM_MARGIN))

  def draw(i):
    r = randomized_round(x, jax.random.fold_in(key, i))
    return r, sum_of_squares(r) <= limit

  def cond(c):
    i, _, ok = c
    return jnp.logical_and(jnp.logical_not(ok), i < tries)

  def body(c):
    i, _, _ = c
    r, ok = draw(i)
    return i + 1, r, ok

  r0, ok0 = draw(0)
  draws, r, ok = jax.lax.while_loop(cond, body, (jnp.int32(1), r0, ok0))
  fallback = jnp.trunc(x)
  fallback = jnp.where(sum_of_squares(fallback) <= limit, fallback, jnp.zeros_like(x))
  return jnp.where(ok, r, fallback), draws, ok


def _buffer_sizes(n: int) -> tuple:
  """The buffer sizes of :func:`discrete_gaussian`'s retries: each :data:`RETRY_SHRINK` times
  the last, from ``n``, down to the final buffer's, the largest of :data:`RETRY_FINAL` and
  ``n / RETRY_SHARE`` (at most ``n``)."""
  final, sizes = min(n, max(RETRY_FINAL, math.ceil(n / RETRY_SHARE))), []
  while not sizes or sizes[-1] > final:
    sizes.append(max(final, math.ceil((sizes[-1] if sizes else n) * RETRY_SHRINK)))
  return tuple(sizes)


def discrete_gaussian(key: jax.Array, shape, sigma, tries: int = SAMPLER_TRIES):
  """Samples of the discrete Gaussian N_Z(0, sigma^2), ``P[y] ~ exp(-y^2 / (2 sigma^2))``.

  Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
  Privacy", NeurIPS 2020, Algorithm 3, vectorised: with ``t = floor(sigma) + 1``
  each coordinate proposes ``Y ~`` discrete Laplace (``P[y] ~ exp(-|y|/t)``,
  the difference of two geometric variables ``floor(t E)``, ``E ~ Exp(1)``)
  and accepts it with probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``;
  each coordinate keeps its first accepted proposal.

  Only the coordinates not yet accepted propose again: every coordinate
  proposes once; the rejected ones are gathered into a buffer (their
  positions), which proposes once and is compacted into the next, smaller one
  (:func:`_buffer_sizes`: each holds more than the about 49 % or fewer a round
  leaves), so a round draws for about as many coordinates as are left, not for
  all of them. The last buffer proposes until it is empty, at most ``tries``
  rounds; then the coordinates that a full buffer left out (rare) are gathered
  from the whole vector and retried, at most ``tries`` rounds each. Each
  proposal is a fresh draw and which coordinates draw depends only on earlier
  acceptances, so every accepted value has the target law, independently of
  the others.

  Not bit-exact: the algorithm is exact with exact Bernoulli and geometric
  draws; here they come from float32 uniforms (as TensorFlow Privacy's
  sampler does), so each acceptance probability is off by about 2^-24 and
  the discrete Laplace tail beyond about ``7 t`` is coarse. A coordinate never accepted
  (probability below 0.49^64 < 1e-20 for ``sigma >= 1/2``) is 0.

  Args:
    key: the draws' PRNG key (round ``i`` of proposals uses ``fold_in(key, i)``).
    shape: the samples' shape (static).
    sigma: the standard deviation, >= 1/2 (may be traced).
    tries: the most rounds of the last buffer, and again of the left-out coordinates (static).

  Returns:
    ``(samples, unaccepted)``: float32 integers of ``shape`` and the number of
    coordinates set to 0.
  """
  draw = _Proposals(key, jnp.floor(sigma) + 1.0, jnp.square(sigma), math.prod(shape))
  n = draw.n
  sizes = _buffer_sizes(n)
  y, done = draw.propose(0, n)
  pending = jnp.nonzero(jnp.logical_not(done), size=sizes[0], fill_value=n)[0]
  for i, size in enumerate(sizes[1:], 1):  # one round per buffer, compacting the rejected
    y, done, pending = draw.retry(i, y, done, pending)
    pending = jnp.append(pending, n)[jnp.nonzero(pending < n, size=size,
                                                 fill_value=pending.shape[0])[0]]
  y, done = _drain(draw, y, done, pending, len(sizes), tries)
  return jnp.where(done, y, 0.0).reshape(shape), jnp.sum(jnp.logical_not(done))


class _Proposals(NamedTuple):
  """Canonne, Kamath and Steinke's proposals (Algorithm 3) for :func:`discrete_gaussian`'s ``n``
  coordinates; round ``i`` draws from ``fold_in(key, i)``."""

  key: jax.Array
  t: jax.Array    # floor(sigma) + 1, the discrete Laplace's scale
  var: jax.Array  # sigma^2
  n: int          # the coordinates; in a buffer of positions, ``n`` is an empty slot

  def propose(self, i, size: int):
    """``size`` proposals ``Y`` (discrete Laplace, ``P[y] ~ exp(-|y|/t)``) and whether each is
    accepted (probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``)."""
    t, var = self.t, self.var
    k1, k2, k3 = jax.random.split(jax.random.fold_in(self.key, i), 3)
    y = (jnp.floor(t * jax.random.exponential(k1, (size,)))
         - jnp.floor(t * jax.random.exponential(k2, (size,))))
    accept = (jax.random.uniform(k3, (size,))
              < jnp.exp(-jnp.square(jnp.abs(y) - var / t) / (2.0 * var)))
    return y, accept

  def retry(self, i, y, done, pending):
    """One proposal for each position in ``pending``.

    Args:
      i: the round (its proposals draw from ``fold_in(key, i)``).
      y: ``[n]`` float32 samples so far.
      done: ``[n]`` bool, which coordinates are accepted.
      pending: int positions to propose for (``n``: an empty slot).

    Returns:
      ``(y, done, pending)``: the samples and the accepted mask with this round's acceptances
      written, and the positions still rejected (``n`` where accepted).
    """
    y_new, accept = self.propose(i, pending.shape[0])
    taken = jnp.where(accept, pending, self.n)  # n is out of range: dropped
    return (y.at[taken].set(y_new, mode="drop"), done.at[taken].set(True, mode="drop"),
            jnp.where(accept, self.n, pending))


def _drain(draw: _Proposals, y, done, pending, first: int, tries: int):
  """The last buffer of :func:`discrete_gaussian` retried until it is empty (rounds ``first``
  to ``first + tries``), then the coordinates a full buffer left out, gathered from the whole
  vector into buffers of ``pending``'s size, until none is left (``tries`` more rounds at
  most). Returns ``(y, done)``."""
  n, final = draw.n, pending.shape[0]

  def drain(c):
    i, y, done, pending = c
    return (i + 1, *draw.retry(i, y, done, pending))

  _, y, done, _ = jax.lax.while_loop(
      lambda c: jnp.logical_and(c[0] < first + tries, jnp.any(c[3] < n)), drain,
      (jnp.int32(first), y, done, pending))

  def left_out(c):
    i, y, done = c
    pending = jnp.nonzero(jnp.logical_not(done), size=final, fill_value=n)[0]
    return (i + 1, *draw.retry(i, y, done, pending)[:2])

  _, y, done = jax.lax.while_loop(
      lambda c: jnp.logical_and(c[0] < first + 2 * tries, jnp.logical_not(jnp.all(c[2]))),
      left_out, (first + tries, y, done))
  return y, done


def modular_sum(rows: jax.Array, mask: jax.Array, bits) -> jax.Array:
  """``sum_i mask_i rows_i mod 2^bits`` in ``[0, 2^bits)`` (uint32): what secure aggregation outputs.

  The sum is taken in uint32, which wraps modulo ``2^32``, a multiple of ``2^bits``, so it is
  exact for any cohort.

  Args:
    rows: ``[C, d]`` int32, each client's integer vector (only its residue modulo ``2^bits``
      enters).
    mask: ``[C]``, 1 for real clients and 0 for padding (a padded row adds nothing).
    bits: the modulus' exponent (``<= 31``; may be traced).

  Returns:
    ``[d]`` uint32 residues.
  """
  modulus_mask = jnp.left_shift(jnp.uint32(1), jnp.asarray(bits, jnp.uint32)) - jnp.uint32(1)
  residues = jnp.bitwise_and(jax.lax.bitcast_convert_type(rows.astype(jnp.int32), jnp.uint32),
                             modulus_mask)
  residues = jnp.where(mask.reshape((-1,) + (1,) * (rows.ndim - 1)) > 0, residues, jnp.uint32(0))
  return jnp.bitwise_and(jnp.sum(residues, axis=0, dtype=jnp.uint32), modulus_mask)


def to_signed(residues: jax.Array, bits) -> jax.Array:
  """The representative in ``[-2^(bits-1), 2^(bits-1))`` of residues modulo ``2^bits`` (int32)."""
  bits = jnp.asarray(bits, jnp.int32)
  v = residues.astype(jnp.int32)
  return jnp.where(v >= jnp.left_shift(1, bits - 1), v - jnp.left_shift(1, bits), v)


def wrapped_fraction(rows: jax.Array, mask: jax.Array, bits) -> jax.Array:
  """Fraction of coordinates of the true (integer) sum of the real rows outside
  ``[-2^(bits-1), 2^(bits-1))``, where :func:`to_signed` of the modular sum differs from it.

  The true sum is taken in int32 (exact while its magnitude stays below 2^31).

  Args:
    rows: ``[C, d]`` integer rows (a raw diagnostic: the uploads themselves).
    mask: ``[C]``, 1 for real clients.
    bits: the modulus' exponent (may be traced).

  Returns:
    A float32 scalar in [0, 1].
  """
  total = jnp.sum(jnp.where(mask.reshape((-1,) + (1,) * (rows.ndim - 1)) > 0,
                            rows.astype(jnp.int32), 0), axis=0)
  half = jnp.left_shift(1, jnp.asarray(bits, jnp.int32) - 1)
  return jnp.mean(jnp.logical_or(total < -half, total >= half).astype(jnp.float32))
