"""Milliseconds of one convolution layer's forward and backward pass, per implementation.

For each shape (batch, H, W, C -> O, 3x3 kernel, stride 1) the jitted gradient of a scalar
loss with respect to both the input and the kernel is timed for every ``--impls`` entry (the
best of ``--repeats`` calls after a compiling one; the loss, a squared distance to a fixed
target, needs the layer's output, so the forward pass is timed too), and one JSON line is
printed per shape with each implementation's milliseconds and ``im2col / <impl>`` ratios. It says where Winograd's
F(4x4, 3x3) pays on this machine (see :func:`fedjax_dp.models.conv.conv2d`).

Example:
  python benchmarks/conv_speed.py --impls im2col,winograd
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp

from fedjax_dp.models import CONV_IMPLS, conv2d

# (batch, H, W, C, O, padding): CNN-2-layers' two layers (batch 64, 28x28 EMNIST), ResNet-like
# stages and small layers, ResNet-18's four CIFAR stages at batch 32, then layers with few
# output tiles a batch (where conv_impl "auto" keeps im2col, fedjax_dp.models.conv.resolve_impl).
SHAPES = [
    (64, 28, 28, 1, 32, "VALID"), (64, 26, 26, 32, 64, "VALID"),
    (32, 26, 26, 8, 32, "SAME"), (32, 16, 16, 16, 32, "SAME"), (32, 16, 16, 64, 64, "SAME"),
    (32, 8, 8, 128, 128, "SAME"), (32, 8, 8, 16, 32, "VALID"),
    (32, 32, 32, 64, 64, "SAME"), (32, 16, 16, 128, 128, "SAME"), (32, 8, 8, 256, 256, "SAME"),
    (32, 4, 4, 512, 512, "SAME"),
    (8, 8, 8, 256, 256, "SAME"), (16, 8, 8, 256, 256, "SAME"), (64, 4, 4, 128, 128, "SAME"),
]
TINY = [(2, 8, 8, 3, 4, "SAME"), (2, 9, 7, 4, 4, "VALID")]


def measure(shape, impls, repeats: int) -> dict:
  b, h, w, c, o, padding = shape
  kx, kk, kr = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (b, h, w, c))
  k = jax.random.normal(kk, (3, 3, c, o)) / (3 * c ** 0.5)
  oh, ow = (h, w) if padding == "SAME" else (h - 2, w - 2)
  r = jax.random.normal(kr, (b, oh, ow, o))
  rec = {"shape": [b, h, w, c, o], "padding": padding}
  for impl in impls:
    grad = jax.jit(jax.grad(
        lambda x, k, impl=impl: jnp.sum(jnp.square(conv2d(x, k, padding=padding, impl=impl) - r)),
        (0, 1)))
    jax.block_until_ready(grad(x, k))
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      jax.block_until_ready(grad(x, k))
      best = min(best, time.perf_counter() - t)
    rec[f"{impl}_ms"] = 1000 * best
  for impl in impls:
    if impl != "im2col" and "im2col_ms" in rec:
      rec[f"im2col_over_{impl}"] = rec["im2col_ms"] / rec[f"{impl}_ms"]
  return rec


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--impls", default="im2col,winograd",
                 help=f"comma-separated, from {', '.join(CONV_IMPLS)}")
  p.add_argument("--repeats", type=int, default=9)
  p.add_argument("--tiny", action="store_true", help="two small shapes (a quick check)")
  args = p.parse_args(argv)
  impls = args.impls.split(",")
  bad = [i for i in impls if i not in CONV_IMPLS]
  if bad or args.repeats < 1:
    p.error(f"--impls must name implementations among {', '.join(CONV_IMPLS)} (got {bad}) "
            f"and --repeats must be >= 1 (got {args.repeats})")
  for shape in TINY if args.tiny else SHAPES:
    print(json.dumps(measure(shape, impls, args.repeats)), flush=True)


if __name__ == "__main__":
  sys.exit(main())
