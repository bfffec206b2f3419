"""Update transforms: pure, optax-style functions of one client's update.

Each transform is an ``optax.GradientTransformationExtraArgs``; randomness comes
in as the extra argument ``key=``. Transforms are applied per client under
``jax.vmap`` and chain like the papers' algorithms, e.g.
``optax.chain(clip_l2(S), add_gaussian_noise(sigma * S))``.

``optax.chain`` hands the same ``key`` to every member, so each random transform
first folds its own salt into the key: two different random transforms in one
chain draw independent noise (two of the same kind need distinct ``salt=``).

:mod:`fedjax_dp.transforms.per_example` holds the per-example counterpart used
by DP-SGD: per-example gradients, their clipping and the noise on their sum
(one step's gradient, :func:`dp_gradient`), functions of a batch rather than
optax transforms of one update.
"""

from fedjax_dp.transforms.core import (
    add_gaussian_noise,
    canary_direction,
    clip_l2,
    gaussian_like,
    global_norm,
    identity,
    replace_by_canary,
    salted,
    sample_like,
)
from fedjax_dp.transforms.per_example import (
    DPArgs,
    GradientRule,
    clip_factors,
    dp_args,
    dp_gradient,
    per_example_grads,
    plain_gradient,
)
from fedjax_dp.transforms.sparsify import sparsify_by_utility

__all__ = ["DPArgs", "GradientRule", "add_gaussian_noise", "canary_direction", "clip_factors",
           "clip_l2", "dp_args", "dp_gradient", "gaussian_like", "global_norm", "identity",
           "per_example_grads", "plain_gradient", "replace_by_canary", "salted", "sample_like",
           "sparsify_by_utility"]
