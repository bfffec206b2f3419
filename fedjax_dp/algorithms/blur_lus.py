"""BLUR and LUS for user-level DP-FedAvg (Cheng et al., "Differentially Private
Federated Learning with Local Regularization and Sparsification", CVPR 2022, Alg. 2).

Each sampled client, from the global model ``w_t``:

1. runs Q local SGD steps on ``h_i(w) = f_i(w) + (lambda/2) max(0, ||w - w_t||^2 - S^2)``
   (BLUR, Eq. 5; :func:`fedjax_dp.objectives.blur`);
2. scores every element of ``Delta = w_{t,Q} - w_t`` by ``|g * Delta|`` with ``g``
   the gradient of the local loss ``f_i`` at ``w_{t,Q}`` and keeps the top
   ``(1 - c)`` fraction per layer (LUS, Eq. 9-12;
   :func:`fedjax_dp.transforms.sparsify_by_utility`);
3. clips to S; the server adds N(0, (z S)^2 I) to the sum, as DP-FedAvg (Alg. 1).

Variants: ``dp_fedavg+blur`` (1, 3), ``dp_fedavg+lus`` (2, 3), ``blur+lus`` (1, 2, 3).

Options (``config.options``, ``--set name=value``):
  * ``lambda`` (default 0.4): BLUR's regularisation weight (paper's grid
    0.05, 0.1, 0.2, 0.4, 0.8). BLUR's radius is the clip bound ``config.clip``.
  * ``sparsity`` c (default 0.7): fraction of each layer's update zeroed by LUS
    (paper's grid 0.1, 0.3, 0.5, 0.7, 0.9).
  * ``lus_batches`` (default 1): the gradient ``g`` that LUS scores with is the
    mean gradient of ``f_i`` at ``w_{t,Q}`` over this many minibatches of
    ``batch_size`` examples drawn (with replacement) from the client's own data;
    0 means the exact gradient over all the client's examples. The paper does
    not say which data ``g`` uses; one minibatch costs one extra local step.

Privacy: user-level DP with exactly DP-FedAvg's guarantee at the same noise
multiplier, sampling and rounds (Sec. 5.1, Theorem 1). BLUR changes only local
training (``S`` and ``w_t`` are public); LUS's mask depends on the client's
data, but it is applied before the clip, so every released update still has L2
norm <= S and the noisy sum has the same sensitivity. The accounting is the
same :class:`fedjax_dp.privacy.GaussianSumMechanism` record. Not covered: the
pre-clip update norms in the run's metrics (diagnostics, not private), and the
choice of hyper-parameters (S, lambda, c) by grid search on test accuracy,
which the paper does and which is not accounted for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp import objectives
from fedjax_dp.algorithms import Setup, read_options
from fedjax_dp.algorithms.dp_fedavg import build_fedavg_family, make_model
from fedjax_dp.client import sample_batch
from fedjax_dp.errors import check
from fedjax_dp.transforms import sparsify_by_utility

DEFAULTS = {"lambda": 0.4, "sparsity": 0.7, "lus_batches": 1}


def blur_lus_options(config) -> dict:
  """``lambda``, ``sparsity`` and ``lus_batches`` from ``config.options``, validated."""
  out = read_options(config, DEFAULTS)
  opts = dict(config.options or {})
  try:
    lam, c, nb = float(out["lambda"]), float(out["sparsity"]), out["lus_batches"]
  except (TypeError, ValueError):
    check(False, "options", opts, "lambda and sparsity must be numbers")
  check(lam >= 0, "lambda", lam, "must be >= 0")
  check(0 <= c < 1, "sparsity", c, "must be in [0, 1)")
  check(isinstance(nb, int) and not isinstance(nb, bool) and nb >= 0, "lus_batches", nb,
        "must be an integer >= 0 (0: the client's whole data set)")
  return {"lambda": lam, "sparsity": c, "lus_batches": nb}


def lus_gradient(objective, batch_size: int, lus_batches: int):
  """``client_extras`` giving LUS its gradient: ``{"grad": grad f_i(w_{t,Q})}``.

  Args:
    objective: the local loss ``f_i`` (``(params, (x, y, mask), anchor) -> loss``),
      without BLUR's regulariser (Eq. 10 differentiates ``f_i``).
    batch_size: examples per minibatch.
    lus_batches: minibatches averaged; 0 for all of the client's examples.
  """
  grad_fn = jax.grad(objective)

  def extras(params_q, params0, x, y, count, key):
    if lus_batches == 0:
      mask = (jnp.arange(y.shape[0]) < count).astype(jnp.float32)
      return {"grad": grad_fn(params_q, (x, y, mask), params0)}

    def one(k):
      return grad_fn(params_q, sample_batch(x, y, count, k, batch_size), params0)

    grads = jax.lax.map(one, jax.random.split(key, lus_batches))
    return {"grad": jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), grads)}

  return extras


def _build(config, data, *, use_blur: bool, use_lus: bool) -> Setup:
  opts = blur_lus_options(config)
  wrap = (lambda f: objectives.blur(f, opts["lambda"], config.clip)) if use_blur else None
  pre_clip, extras = (), None
  if use_lus:
    pre_clip = (sparsify_by_utility(opts["sparsity"]),)
    loss = objectives.supervised(make_model(config, data).apply)
    extras = lus_gradient(loss, config.batch_size, opts["lus_batches"])
  return build_fedavg_family(config, data, private=True, wrap_objective=wrap,
                             pre_clip=pre_clip, client_extras=extras)


def build_dp_fedavg_blur(config, data) -> Setup:
  """DP-FedAvg with BLUR local training (Sec. 4.1)."""
  return _build(config, data, use_blur=True, use_lus=False)


def build_dp_fedavg_lus(config, data) -> Setup:
  """DP-FedAvg with LUS before the clip (Sec. 4.2)."""
  return _build(config, data, use_blur=False, use_lus=True)


def build_blur_lus(config, data) -> Setup:
  """DP-FedAvg with BLUR and LUS (Alg. 2)."""
  return _build(config, data, use_blur=True, use_lus=True)
