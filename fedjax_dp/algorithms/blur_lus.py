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
    0.05, 0.1, 0.2, 0.4, 0.8). BLUR's radius is the clip bound: the same
    ``clip`` hyper-parameter the clip transform and the noise read.
  * ``sparsity`` c (default 0.7): fraction of each layer's update zeroed by LUS
    (paper's grid 0.1, 0.3, 0.5, 0.7, 0.9).
  * ``lus_batches`` (default 1): the gradient ``g`` that LUS scores with is the
    mean gradient of ``f_i`` at ``w_{t,Q}`` over this many minibatches of
    ``batch_size`` examples drawn (with replacement) from the client's own data;
    0 means the exact gradient over all the client's examples. The paper does
    not say which data ``g`` uses; one minibatch costs one extra local step
    (:func:`fedjax_dp.algorithms.fedavg.lus_gradient`).

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

from fedjax_dp.algorithms.base import USER, Setup, algorithm
from fedjax_dp.algorithms.dp_fedavg import PRIVATE_READS, build_fedavg_family
from fedjax_dp.algorithms.options import Option

BLUR_OPTIONS = (
    Option("lambda", 0.4, "BLUR's regularisation weight (paper's grid 0.05-0.8)", low=0),)
LUS_OPTIONS = (
    Option("sparsity", 0.7, "LUS: fraction c of each layer's update zeroed (paper's grid 0.1-0.9)",
           low=0, high=1, high_open=True),
    Option("lus_batches", 1, "LUS: minibatches its gradient averages; 0: the client's whole data",
           kind="int", low=0, static=True),
)
DEFAULTS = {o.name: o.default for o in BLUR_OPTIONS + LUS_OPTIONS}
# What the three variants declare alike: DP-FedAvg's privacy and settings.
_TRAITS = dict(privacy_unit=USER, reads=PRIVATE_READS, central_noise=True)


@algorithm("dp_fedavg+blur", reference="Cheng et al., CVPR 2022 (BLUR)", options=BLUR_OPTIONS,
           about="DP-FedAvg whose clients train with BLUR's bounded local update regulariser",
           **_TRAITS)
def build_dp_fedavg_blur(config, data) -> Setup:
  """DP-FedAvg with BLUR local training (Sec. 4.1)."""
  return build_fedavg_family(config, data, private=True, regularizer="blur")


@algorithm("dp_fedavg+lus", reference="Cheng et al., CVPR 2022 (LUS)", options=LUS_OPTIONS,
           about="DP-FedAvg whose clients sparsify their updates by utility (LUS) before the clip",
           **_TRAITS)
def build_dp_fedavg_lus(config, data) -> Setup:
  """DP-FedAvg with LUS before the clip (Sec. 4.2)."""
  return build_fedavg_family(config, data, private=True, pre_clip=("sparsify",))


@algorithm("blur+lus", reference="Cheng et al., CVPR 2022, Alg. 2",
           options=BLUR_OPTIONS + LUS_OPTIONS, about="DP-FedAvg with BLUR and LUS", **_TRAITS)
def build_blur_lus(config, data) -> Setup:
  """DP-FedAvg with BLUR and LUS (Alg. 2)."""
  return build_fedavg_family(config, data, private=True, regularizer="blur",
                             pre_clip=("sparsify",))
