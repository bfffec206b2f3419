"""Per-example clipping and noise: the gradient of one DP-SGD step (Abadi et al., CCS 2016).

Given a sampled batch (the client's local loop,
:func:`fedjax_dp.client.dp_sgd`, draws it), one DP-SGD gradient
(:func:`dp_gradient`) is:

1. per-example gradients ``g_i`` by a nested ``jax.vmap`` (clients x examples);
   a gradient with a NaN or Inf entry is replaced by zeros (and counted);
2. per-example scaling and clipping ``g_i * min(1, s, C / ||g_i||)`` (``s`` is
   a constant scale, the SP-FL proportional factor beta; ``s = 1`` is plain
   clipping to ``C``);
3. Gaussian noise ``N(0, (sigma C)^2 I)`` on the batch's clipped sum, divided
   by the expected batch size ``L`` (public).

``C``, ``s`` and ``sigma`` come in per client as arrays (:class:`DPArgs`), so
a clip bound that changes every round or differs between privacy classes does
not recompile the round.

Optionally each step also releases a noisy per-example *statistic* of the
batch's gradient norms (for adaptive clip bounds): ``sum_i (s_i - 1/2) +
N(0, stat_noise^2)`` with ``s_i`` in ``[0, 1]`` (``"below"``:
``1[||g_i|| <= C]``, Andrew et al., NeurIPS 2021; ``"norm"``:
``min(||g_i||, B) / B``). Shifting by 1/2 halves its add/remove sensitivity
to 1/2 (Andrew et al., Sec. 3).

Privacy of one step (the privacy unit is one example of one client): with a
data-independent ``C`` (or one computed only from earlier noisy releases)
each step is a sampled Gaussian mechanism with multiplier ``z = sigma``
without a statistic and ``z = (sigma^-2 + (2 stat_noise)^-2)^(-1/2)`` with
one (the sampling is the client loop's, :func:`fedjax_dp.client.dp_sgd`). SP-FL's proportional
clipping as published needs ``data_dependent_noise=True`` (a static choice):
then a client with ``C = inf`` gets noise scaled by its batch's own mean
gradient norm and *no* DP guarantee holds. Without it the noise is always
``sigma * C`` (an infinite ``C`` then gives an infinite noise, never a
silent data-dependent one). The per-example losses and raw norm sums
returned beside the gradient are diagnostics, not covered.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dp.errors import check, check_choice
from fedjax_dp.transforms.core import gaussian_like, global_norm

STATISTICS = ("none", "below", "norm")


class DPArgs(NamedTuple):
  """One client's DP-SGD settings for this round (arrays; batched under vmap).

  Attributes:
    clip: per-example L2 bound ``C`` (``inf``: no bound; the noise scale is
      then data-dependent and there is no DP guarantee).
    scale: constant factor ``s`` applied to every per-example gradient before
      clipping (SP-FL's proportional clipping factor beta; 1 for plain DP-SGD).
    noise_multiplier: ``sigma``: the noise on a step's clipped sum has standard
      deviation ``sigma * C`` (``sigma * s * mean_i ||g_i||`` when ``C = inf``).
    stat_noise: standard deviation of the noise on the step's norm statistic.
    stat_bound: ``B`` of the ``"norm"`` statistic ``min(||g_i||, B) / B``.
  """

  clip: jax.Array
  scale: jax.Array
  noise_multiplier: jax.Array
  stat_noise: jax.Array
  stat_bound: jax.Array


def dp_args(clip, scale=1.0, noise_multiplier=0.0, stat_noise=0.0, stat_bound=1.0) -> DPArgs:
  """A :class:`DPArgs` of float32 arrays (broadcast to a common shape: ``[C]`` for a cohort).

  Args:
    clip: ``C``, the per-example L2 bound (> 0; ``inf``: no bound and no guarantee).
    scale: ``s``, the factor on every per-example gradient before clipping (SP-FL's beta).
    noise_multiplier: ``sigma``: noise std ``sigma * C`` on a step's clipped sum.
    stat_noise: the norm statistic's noise std.
    stat_bound: ``B`` of the ``"norm"`` statistic (> 0).
  """
  vals = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in
                                (clip, scale, noise_multiplier, stat_noise, stat_bound)))
  return DPArgs(*vals)


def per_example_grads(objective: Callable, params, anchor, x: jax.Array, y: jax.Array):
  """Per-example losses ``[B]`` and gradients (leaves ``[B, ...]``) by ``jax.vmap``.

  ``objective(params, (x, y, mask), anchor)`` is evaluated on one example at a
  time; under the engine's client ``vmap`` this is the nested clients x
  examples vmap.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
    params: the model the gradients are taken at (a pytree).
    anchor: passed through to the objective (the round's global model).
    x: ``[B, ...]`` examples.
    y: ``[B]`` labels.

  Returns:
    ``(losses [B], grads)``, ``grads`` like ``params`` with a leading ``[B]`` axis.
  """
  def one(p, xi, yi):
    """The objective on one example.

    Args:
      p: the model.
      xi: one example (``x``'s row).
      yi: its label.
    """
    return objective(p, (xi[None], yi[None], jnp.ones((1,), jnp.float32)), anchor)
  return jax.vmap(jax.value_and_grad(one), in_axes=(None, 0, 0))(params, x, y)


def clip_factors(norms: jax.Array, clip: jax.Array, scale: jax.Array) -> jax.Array:
  """Per-example factors ``min(1, s, C / ||g_i||)``: ``||factor_i g_i|| <= min(C, s ||g_i||)``.

  Args:
    norms: ``[K]`` per-example gradient L2 norms (>= 0).
    clip: ``C``, the bound (a scalar; ``inf``: no bound).
    scale: ``s``, the constant factor (a scalar, > 0).

  Returns:
    ``[K]`` factors in ``[0, min(1, s)]``.
  """
  return jnp.minimum(jnp.minimum(1.0, scale), clip / jnp.maximum(norms, 1e-30))


@dataclasses.dataclass(frozen=True)
class GradientRule:
  """The static part of one DP-SGD gradient (:func:`dp_gradient`); its numbers come in
  :class:`DPArgs`.

  Attributes:
    expected_batch: ``L``, the public denominator of the noisy sum.
    statistic: the noisy norm statistic the step releases beside the gradient: "none",
      "below" or "norm" (module docstring).
    data_dependent_noise: SP-FL's published rule: where ``C = inf``, the noise is scaled by the
      batch's mean gradient norm (then the step has no DP guarantee).

  Raises:
    ConfigError: an unknown ``statistic``.
  """

  expected_batch: float
  statistic: str = "none"
  data_dependent_noise: bool = False

  def __post_init__(self):
    check_choice("statistic", self.statistic, STATISTICS)


def dp_gradient(objective: Callable, params, anchor, batch: tuple, args: DPArgs, key: jax.Array,
                rule: GradientRule, stat_key: Optional[jax.Array] = None):
  """One DP-SGD gradient: ``(sum_i mask_i clip(g_i) + N(0, (sigma C)^2 I)) / L``.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``.
    params: the current local model.
    anchor: the round's global model (passed through to the objective).
    batch: the sampled ``(x, y, mask)``: ``[K, ...]``, ``[K]``, and ``mask`` ``[K]`` 1.0 for
      sampled examples (0 for the capacity's padding).
    args: this client's :class:`DPArgs`.
    key: the gradient noise's key (drawn from, nothing derived from it).
    rule: the static :class:`GradientRule` (``L``, the statistic, the noise rule).
    stat_key: the statistic's noise key, independent of ``key`` (needed with a statistic).

  Returns:
    ``(gradient, info)`` with ``info`` a dict of scalars: ``loss_sum``,
    ``norm_sum``, ``examples``, ``clipped``, ``noise_std``, ``stat``,
    ``nonfinite`` (examples whose gradient had NaN/Inf and was zeroed).

  Raises:
    ConfigError: a statistic without ``stat_key``.

  Privacy: the noise standard deviation is ``sigma * C`` for the bound in
  force. With ``data_dependent_noise`` and ``C = inf`` (SP-FL's proportional
  clipping, Eq. 7) the bound in force is ``s * ||g_i||`` per example and the
  noise uses ``sigma * s * mean_i ||g_i||`` over the batch: it depends on the
  data and the step has no sensitivity bound, hence no DP guarantee. A
  non-finite gradient is zeroed before clipping, so it cannot turn the sum
  into NaN and void the bound.
  """
  check(rule.statistic == "none" or stat_key is not None, "stat_key", stat_key,
        f"must be given with statistic {rule.statistic!r}")
  x, y, mask = batch
  losses, grads = per_example_grads(objective, params, anchor, x, y)
  grads, norms, finite = _zero_nonfinite(grads)
  factors = clip_factors(norms, args.clip, args.scale) * mask
  clipped_sum = jax.tree_util.tree_map(
      lambda g: jnp.tensordot(factors, g, axes=(0, 0)).astype(g.dtype), grads)
  examples = jnp.sum(mask)
  mean_norm = jnp.sum(norms * mask) / jnp.maximum(examples, 1.0)
  if rule.data_dependent_noise:
    bound = jnp.where(jnp.isfinite(args.clip), args.clip, args.scale * mean_norm)
  else:
    bound = args.clip
  noise_std = args.noise_multiplier * bound
  noisy = jax.tree_util.tree_map(jnp.add, clipped_sum, gaussian_like(clipped_sum, noise_std, key))
  grad = jax.tree_util.tree_map(lambda g: g / rule.expected_batch, noisy)
  stat = _norm_statistic(norms, mask, args, rule.statistic, stat_key)
  info = {"loss_sum": jnp.sum(losses * mask), "norm_sum": jnp.sum(norms * mask),
          "examples": examples, "clipped": jnp.sum((factors < 1.0) * mask),
          "noise_std": noise_std, "stat": stat, "nonfinite": jnp.sum((~finite) * mask)}
  return grad, info


def _zero_nonfinite(grads):
  """``(grads, norms, finite)``: per-example gradients (leaves ``[K, ...]``) with those holding a
  NaN or Inf set to zeros, their L2 norms (0 for those) and which were finite."""
  norms = jax.vmap(global_norm)(grads)
  finite = jnp.isfinite(norms)
  grads = jax.tree_util.tree_map(
      lambda g: jnp.where(finite.reshape((-1,) + (1,) * (g.ndim - 1)), g, jnp.zeros_like(g)), grads)
  return grads, jnp.where(finite, norms, 0.0), finite


def _norm_statistic(norms: jax.Array, mask: jax.Array, args: DPArgs, statistic: str,
                   key: Optional[jax.Array]) -> jax.Array:
  """A step's noisy shifted norm statistic ``sum_i mask_i (s_i - 1/2) + N(0, stat_noise^2)``
  (module docstring): ``s_i = 1[||g_i|| <= C]`` ("below") or ``min(||g_i||, B) / B`` ("norm");
  0 for "none" (no draw from ``key``, which may then be None)."""
  if statistic == "none":
    return jnp.zeros((), jnp.float32)
  if statistic == "below":
    s = (norms <= args.clip).astype(jnp.float32)
  else:
    s = jnp.minimum(norms, args.stat_bound) / args.stat_bound
  return jnp.sum((s - 0.5) * mask) + args.stat_noise * jax.random.normal(key, (), jnp.float32)


def plain_gradient(objective: Callable, params, anchor, batch: tuple, expected_batch: float):
  """Non-private counterpart of :func:`dp_gradient`: ``sum_i mask_i g_i / L`` of the batch
  ``(x, y, mask)``, no per-example work.

  Args:
    objective: ``(params, (x, y, mask), anchor) -> loss``, the batch's masked mean loss.
    params: the current local model.
    anchor: the round's global model (passed through to the objective).
    batch: the sampled ``(x, y, mask)``: ``[K, ...]``, ``[K]`` and ``[K]`` (1.0 for sampled
      examples).
    expected_batch: ``L``, the denominator (as :func:`dp_gradient`'s).

  Returns:
    ``(gradient, info)``: ``info`` has :func:`dp_gradient`'s keys, with ``loss_sum`` and
    ``examples`` computed and the other entries zero.
  """
  x, y, mask = batch

  def total(p):
    return objective(p, (x, y, mask), anchor) * jnp.sum(mask)
  loss_sum, g = jax.value_and_grad(total)(params)
  grad = jax.tree_util.tree_map(lambda t: t / expected_batch, g)
  zero = jnp.zeros((), jnp.float32)
  return grad, {"loss_sum": loss_sum, "norm_sum": zero, "examples": jnp.sum(mask),
                "clipped": zero, "noise_std": zero, "stat": zero, "nonfinite": zero}
