"""The models used by the papers fedjax_dp reproduces, as flax modules.

No model uses BatchNorm: batch statistics mix examples, which breaks
per-example gradient clipping (the sensitivity of one example would leak
through the statistics of the others) and needs mutable state across local
steps. Where a norm is needed GroupNorm is used (per-example statistics).

Every conv goes through :class:`fedjax_dp.models.conv.Conv`, whose ``impl``
(``"auto"`` by default: Winograd or im2col per layer) keeps the backward pass
fast in ``lax.scan`` and ``vmap`` on CPU; pooling uses :func:`fedjax_dp.models.conv.max_pool`.
Conv models accept ``[B, H, W]`` inputs (one channel) as well as NHWC.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_dp.models.conv import Conv, max_pool

ACTIVATIONS: dict[str, Callable] = {"relu": nn.relu, "tanh": jnp.tanh}


def _nhwc(x):
  return x[..., None] if x.ndim == 3 else x


class MLP(nn.Module):
  """Flatten, dense hidden layers with ``activation``, dense ``num_classes``.

  Attributes:
    num_classes: output logits.
    hidden: widths of the hidden layers.
    activation: ``"relu"`` or ``"tanh"``.
  """
  num_classes: int
  hidden: Sequence[int] = (200, 200)
  activation: str = "relu"

  @nn.compact
  def __call__(self, x):
    act = ACTIVATIONS[self.activation]
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = act(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


class TwoConvCNN(nn.Module):
  """conv 3x3 ``features[0]``, relu, conv 3x3 ``features[1]``, relu, 2x2 max-pool, dense
  ``hidden`` relu, dense ``num_classes``.

  Two instances (see :func:`fedjax_dp.models.get_model`):

  * ``digits_cnn``: features (16, 32), SAME padding, hidden 64: a small CNN for
    the 8x8 scikit-learn digits (fast on CPU), 38,282 parameters with 10 classes.
  * ``cnn2``: "CNN-2-layers" of the federated EMNIST benchmarks: features
    (32, 64), VALID padding, hidden 128 (the model of Reddi et al., "Adaptive
    Federated Optimization", ICLR 2021, and of FedJAX's EMNIST CNN, without
    their dropout: training here is deterministic given the key). On 28x28x1
    with 62 classes: 320 + 18,496 + 1,179,776 + 7,998 = 1,206,590 parameters.
    Used for EMNIST by Cheng et al., "Differentially Private Federated
    Learning with Local Regularization and Sparsification" (CVPR 2022).
  """
  num_classes: int
  features: tuple = (32, 64)
  padding: str = "VALID"
  hidden: int = 128
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    x = _nhwc(x)
    for f in self.features:
      x = nn.relu(Conv(f, (3, 3), padding=self.padding, impl=self.conv_impl)(x))
    x = max_pool(x, 2, 2)
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_classes)(x)


class SPFLCNN(nn.Module):
  """CNN of Wu and Li, "Segmental tailoring federated learning algorithm based
  on differential privacy" (SP-FL), Application Research of Computers 41(5),
  2024, Sec. 3.1.

  The paper: two conv layers with 32 and 64 output channels and 4x4 kernels,
  then two dense layers whose inputs are "64x4x4 and 32" and outputs "16 and
  10". A 64x4x4 flatten on 28x28 inputs means VALID convs each followed by a
  2x2 max-pool (28 -> 25 -> 12 -> 9 -> 4), so that is what is built; the
  dense sizes contradict each other (16 vs 32), and the hidden width is taken
  as 32, the input of the last layer (``hidden`` changes it). On 28x28x1 with
  10 classes: 544 + 32,832 + 32,800 + 330 = 66,506 parameters.
  """
  num_classes: int
  hidden: int = 32
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    x = _nhwc(x)
    x = nn.relu(Conv(32, (4, 4), padding="VALID", impl=self.conv_impl)(x))
    x = max_pool(x, 2, 2)
    x = nn.relu(Conv(64, (4, 4), padding="VALID", impl=self.conv_impl)(x))
    x = max_pool(x, 2, 2)
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.num_classes)(x)


class RSACifarCNN(nn.Module):
  """CIFAR-10 CNN of Zhu and Ling, "Bridging Differential Privacy and
  Byzantine-Robustness via Model Aggregation" (DP-RSA), IJCAI 2022, Sec. 6.

  The paper states only "two conv and three dense layers, about 368,000
  parameters". The authors' code (github.com/oyhah/DP-RSA,
  ``code_cnn/MainModel.py``) is conv 5x5 64 VALID, relu, max-pool 3x3 stride
  2, conv 5x5 64 VALID, relu, max-pool 3x3 stride 2, dense 384, 192, classes;
  that has 576,778 parameters on 32x32x3, not 368k. The same layout is used
  here with conv widths ``features=(40, 40)`` by default, which gives 365,074
  parameters (0.8% from the paper's figure); ``features=(64, 64)`` gives the
  authors' code exactly.
  """
  num_classes: int
  features: Sequence[int] = (40, 40)
  hidden: Sequence[int] = (384, 192)
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    x = _nhwc(x)
    for f in self.features:
      x = nn.relu(Conv(f, (5, 5), padding="VALID", impl=self.conv_impl)(x))
      x = max_pool(x, 3, 2)
    x = x.reshape(x.shape[0], -1)
    for width in self.hidden:
      x = nn.relu(nn.Dense(width)(x))
    return nn.Dense(self.num_classes)(x)


class _BasicBlock(nn.Module):
  features: int
  strides: int
  num_groups: int
  conv_impl: str

  @nn.compact
  def __call__(self, x):
    y = Conv(self.features, (3, 3), strides=self.strides, use_bias=False,
             impl=self.conv_impl)(x)
    y = nn.relu(nn.GroupNorm(num_groups=self.num_groups)(y))
    y = Conv(self.features, (3, 3), use_bias=False, impl=self.conv_impl)(y)
    y = nn.GroupNorm(num_groups=self.num_groups)(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      x = Conv(self.features, (1, 1), strides=self.strides, use_bias=False,
               impl=self.conv_impl)(x)
      x = nn.GroupNorm(num_groups=self.num_groups)(x)
    return nn.relu(x + y)


class ResNet18GN(nn.Module):
  """ResNet-18 (He et al., CVPR 2016), CIFAR variant, with GroupNorm.

  3x3 stride-1 stem with 64 channels and no initial max-pool, four stages of
  two basic blocks (64, 128, 256, 512 channels; stride 2 at the start of the
  last three, 1x1 projection shortcuts), global average pooling, dense
  classes. BatchNorm is replaced by GroupNorm (Wu and He, ECCV 2018) with
  ``num_groups=2`` by default, as in Hsieh et al., "The Non-IID Data
  Quagmire of Decentralized Machine Learning" (ICML 2020) and Reddi et al.,
  "Adaptive Federated Optimization" (ICLR 2021); ``num_groups=32`` is the
  GroupNorm paper's choice. 11,173,962 parameters with 10 classes.

  Attributes:
    num_classes: output logits.
    num_groups: GroupNorm groups (must divide 64).
    widths: channels of the four stages.
    conv_impl: see :func:`fedjax_dp.models.conv.conv2d`.
  """
  num_classes: int
  num_groups: int = 2
  widths: Sequence[int] = (64, 128, 256, 512)
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    x = _nhwc(x)
    x = Conv(self.widths[0], (3, 3), use_bias=False, impl=self.conv_impl)(x)
    x = nn.relu(nn.GroupNorm(num_groups=self.num_groups)(x))
    for stage, width in enumerate(self.widths):
      for block in range(2):
        strides = 2 if stage > 0 and block == 0 else 1
        x = _BasicBlock(width, strides, self.num_groups, self.conv_impl)(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes)(x)
