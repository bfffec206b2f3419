"""2-D convolution and max-pooling that stay fast inside ``lax.scan`` and ``vmap``.

Why this module exists: inside a ``lax.scan`` XLA:CPU lowers the two backward
convolutions that JAX derives for ``lax.conv_general_dilated`` (the input
gradient, a transposed conv, and the weight gradient, a conv with the batch as
contraction dim and a large "kernel") into naive loop convolutions
(jax-ml/jax#12868), many times slower than the same step outside a scan.
Three replacements stay on the fast path, and ``impl="auto"`` (the default)
chooses between im2col and Winograd per layer (:func:`resolve_impl`):

* ``impl="im2col"``: the padded input is cut into ``kh * kw`` shifted
  (and, for strides, strided) static slices, concatenated on the channel axis
  and multiplied by the reshaped kernel. Slices transpose to pads and matmuls
  to matmuls, so plain autodiff is fast; under ``vmap`` over per-client
  kernels the matmul becomes a batched matmul. Preferred for vmapped clients.
* ``impl="custom_vjp"``: the forward pass is a ``lax`` conv and the
  ``jax.custom_vjp`` writes both gradients as ordinary forward NHWC/HWIO
  convolutions. Fast in a scan for one model, but under ``vmap`` over kernels
  the convs become grouped convolutions (slow on CPU).
* ``impl="winograd"``: 3x3 stride-1 convolutions by Winograd's minimal
  filtering F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional
  Neural Networks", CVPR 2016): each 6x6 input tile and the kernel are
  transformed by small constant matrices, multiplied channel-wise as 36
  batched matmuls, and transformed back into a 4x4 output tile: 36 instead of
  144 multiplications per output tile and channel pair, and no im2col patches.
  The ``jax.custom_vjp`` writes both gradients with the same transforms
  (transposed), since autodiff of the tile slicing compiles to slow padded
  selects. Every other kernel size or stride falls back to im2col. Its
  rounding error is larger than im2col's (about 1e-6 relative in float32).
* ``impl="lax"``: ``lax.conv_general_dilated`` with default autodiff (the
  reference; on accelerators not compared with im2col, which ``auto`` uses
  there).

All four compute the same function (tested to float32 rounding).

Layout: inputs NHWC, kernels HWIO (as ``flax.linen.Conv``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_dp.errors import check_choice, ConfigError

CONV_IMPLS = ("auto", "im2col", "winograd", "custom_vjp", "lax")
# ``impl="auto"`` runs a layer by Winograd on a CPU when it has at least this many input
# channels, an output of at least this size a side and at least this many 4x4 output tiles
# in the batch it sees; every other layer by im2col.
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_OUTPUT = 8
WINOGRAD_MIN_TILES = 64
PADDINGS = ("SAME", "VALID")
_DN = ("NHWC", "HWIO", "NHWC")


def _pair(v, field: str) -> tuple[int, int]:
  if isinstance(v, int):
    v = (v, v)
  v = tuple(int(a) for a in v)
  if len(v) != 2 or min(v) < 1:
    raise ConfigError(field, v, "must be a positive int or a pair of them")
  return v


def _pads(size: int, k: int, s: int, padding: str) -> tuple[int, int, int]:
  """Returns ``(lo, hi, out)`` for one spatial dim, as ``lax`` does."""
  if padding == "VALID":
    out = (size - k) // s + 1
    return 0, 0, out
  out = -(-size // s)
  total = max((out - 1) * s + k - size, 0)
  return total // 2, total - total // 2, out


def conv_output_size(size: int, kernel: int, stride: int = 1,
                     padding: str = "SAME") -> int:
  """Output length of one spatial dim (``<= 0`` means impossible), as ``lax`` computes it.

  Args:
    size: the input's length along the dim.
    kernel: the kernel's length along the dim.
    stride: the stride, ``>= 1``.
    padding: "SAME" (``ceil(size / stride)``) or "VALID" (``(size - kernel) // stride + 1``).

  Returns:
    The output length.
  """
  if padding == "VALID" and size < kernel:
    return 0
  return _pads(size, kernel, stride, padding)[2]


def resolve_impl(impl: str, x_shape, kernel_shape, strides, padding: str, dtype) -> str:
  """The implementation a layer runs: ``"winograd"`` is Winograd for 3x3 stride-1 kernels and
  im2col for every other one; ``"auto"`` is Winograd on a CPU (``jax.default_backend()``)
  for a float32 3x3 stride-1 layer with at least :data:`WINOGRAD_MIN_CHANNELS` input
  channels, an output of at least :data:`WINOGRAD_MIN_OUTPUT` a side and at least
  :data:`WINOGRAD_MIN_TILES` output tiles in the batch (``x_shape[0]`` times the tiles of one
  example), else im2col. Under a ``vmap`` the batch is what one mapped call sees: a vmap over
  clients keeps each client's batch, per-example gradients (a vmap over examples) see one.
  Elsewhere than on a CPU ``"auto"`` is im2col (Winograd is unmeasured there).

  Args:
    impl: one of :data:`CONV_IMPLS`.
    x_shape: the input's shape, NHWC.
    kernel_shape: the kernel's shape, HWIO.
    strides: ``(sh, sw)``.
    padding: "SAME" or "VALID".
    dtype: the dtype the layer computes in.

  Returns:
    "winograd" or "im2col" for ``impl`` "auto" or "winograd"; any other ``impl`` as it is.
  """
  if impl not in ("auto", "winograd"):
    return impl
  if tuple(kernel_shape[:2]) != (3, 3) or tuple(strides) != (1, 1):
    return "im2col"
  if impl == "winograd":
    return impl
  oh, ow = (conv_output_size(n, 3, 1, padding) for n in x_shape[1:3])
  tiles = x_shape[0] * -(-oh // _M) * -(-ow // _M)
  pays = (jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.float32
          and kernel_shape[2] >= WINOGRAD_MIN_CHANNELS
          and min(oh, ow) >= WINOGRAD_MIN_OUTPUT and tiles >= WINOGRAD_MIN_TILES)
  return "winograd" if pays else "im2col"


def _check_shapes(x, kernel, padding, strides):
  check_choice("padding", padding, PADDINGS)
  if x.ndim != 4 or kernel.ndim != 4:
    raise ConfigError("conv2d shapes", (x.shape, kernel.shape),
                      "need x NHWC (4-D) and kernel HWIO (4-D)")
  if x.shape[-1] != kernel.shape[2]:
    raise ConfigError("conv2d channels", (x.shape[-1], kernel.shape[2]),
                      "x channels must equal kernel input channels")
  for d in (0, 1):
    if conv_output_size(x.shape[1 + d], kernel.shape[d], strides[d],
                        padding) < 1:
      raise ConfigError("conv2d input size", x.shape,
                        f"too small for kernel {kernel.shape[:2]} with "
                        f"padding {padding}")


def _pad_spec(x_hw, k_hw, strides, padding):
  """``((lo, hi), (lo, hi))`` and ``(oh, ow)``."""
  pads, outs = [], []
  for d in (0, 1):
    lo, hi, out = _pads(x_hw[d], k_hw[d], strides[d], padding)
    pads.append((lo, hi))
    outs.append(out)
  return tuple(pads), tuple(outs)


# ---------------------------------------------------------------------------
# im2col of shifted slices.


def _padded(x, k_hw, strides, padding):
  """``x`` zero-padded as ``padding`` asks, and the output size ``(oh, ow)``."""
  (ph, pw), out = _pad_spec(x.shape[1:3], k_hw, strides, padding)
  if ph != (0, 0) or pw != (0, 0):
    x = jnp.pad(x, ((0, 0), ph, pw, (0, 0)))
  return x, out


def _im2col(x, k_hw, strides, padding):
  """Patches ``[B, oh, ow, kh * kw * C]`` ordered (kh, kw, C) like HWIO."""
  x, (oh, ow) = _padded(x, k_hw, strides, padding)
  sh, sw = strides
  cols = []
  for i in range(k_hw[0]):
    for j in range(k_hw[1]):
      cols.append(lax.slice(
          x, (0, i, j, 0),
          (x.shape[0], i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1,
           x.shape[3]),
          (1, sh, sw, 1)))
  if len(cols) == 1:
    return cols[0]
  return jnp.concatenate(cols, axis=-1)


def _conv_im2col(x, kernel, strides, padding):
  kh, kw, c, o = kernel.shape
  patches = _im2col(x, (kh, kw), strides, padding)
  return lax.dot_general(patches, kernel.reshape(kh * kw * c, o),
                         (((3,), (0,)), ((), ())))


# ---------------------------------------------------------------------------
# Winograd F(4x4, 3x3).

# Input transform B^T (6x6), kernel transform G (6x3), output transform A^T
# (4x6): a 6x6 tile d and a 3x3 kernel g give the 4x4 tile of their VALID
# cross-correlation as A^T [(G g G^T) * (B^T d B)] A.
_WINO_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0],
                     [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                     [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float)
_WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6],
                    [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                    [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
_WINO_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0],
                     [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], float)
_M, _A = 4, 6  # output and input tile sizes


def _combine(mat, parts):
  """``[sum_j mat[i, j] * parts[j] for i]`` without the zero terms."""
  out = []
  for row in mat:
    acc = None
    for c, part in zip(row, parts):
      if c == 0:
        continue
      term = part if c == 1 else -part if c == -1 else part * float(c)
      acc = term if acc is None else acc + term
    out.append(acc)
  return out


def _sandwich(mat, rows, cols):
  """``mat`` applied along two axes, as ``mat X mat^T``.

  ``rows`` are the parts along the first axis; ``cols(r)`` splits a combined
  row along the second. Returns the ``len(mat) ** 2`` results, row-major.
  """
  out = []
  for r in _combine(mat, rows):
    out.extend(_combine(mat, cols(r)))
  return out


def _tile_parts(x, axis, tiles):
  """The ``_A`` overlapping tile rows (stride ``_M``) along ``axis`` of
  size ``_M * (tiles + 1)``, each with ``axis`` replaced by the tile index.

  Reshapes of two unit-stride slices, no strided gathers."""
  def blocks(lo):
    s = lax.slice_in_dim(x, lo, lo + _M * tiles, axis=axis)
    return s.reshape(x.shape[:axis] + (tiles, _M) + x.shape[axis + 1:])
  head, nxt = blocks(0), blocks(_M)
  return ([lax.index_in_dim(head, i, axis + 1, False) for i in range(_M)] +
          [lax.index_in_dim(nxt, i, axis + 1, False) for i in range(_A - _M)])


def _fold(parts, axis, tiles):
  """The transpose of :func:`_tile_parts`: overlap-adds the tile rows."""
  def merge(ps):
    s = jnp.stack(ps, axis + 1)
    return s.reshape(s.shape[:axis] + (tiles * _M,) + s.shape[axis + 2:])
  zero = jnp.zeros_like(parts[0])
  head = merge(parts[:_M])
  nxt = merge(list(parts[_M:]) + [zero] * (2 * _M - _A))
  pad = [(0, 0)] * head.ndim
  hi, lo = list(pad), list(pad)
  hi[axis], lo[axis] = (0, _M), (_M, 0)
  return jnp.pad(head, hi) + jnp.pad(nxt, lo)


def _wino_tiles(shape):
  """``(oh, ow, th, tw)``: the VALID output size and the tiles covering it."""
  oh, ow = shape[1] - 2, shape[2] - 2
  return oh, ow, -(-oh // _M), -(-ow // _M)


def _wino_input(x, th, tw):
  """``B^T d B`` of every tile: ``[36, B * th * tw, C]``."""
  b, h, w, c = x.shape
  x = jnp.pad(x, ((0, 0), (0, _M * (th + 1) - h), (0, _M * (tw + 1) - w),
                  (0, 0)))
  v = _sandwich(_WINO_BT, _tile_parts(x, 1, th),
                lambda r: _tile_parts(r, 2, tw))
  return jnp.stack(v).reshape(_A * _A, b * th * tw, c)


def _wino_kernel(kernel):
  """``G g G^T``: ``[36, C, O]``."""
  return jnp.stack(_sandwich(_WINO_G, list(kernel), list))


def _wino_forward(x, kernel):
  oh, ow, th, tw = _wino_tiles(x.shape)
  v, u = _wino_input(x, th, tw), _wino_kernel(kernel)
  m = lax.dot_general(v, u, (((2,), (1,)), ((0,), (0,))))  # [36, N, O]
  y = _sandwich(_WINO_AT, list(m.reshape(_A, _A, x.shape[0], th, tw, -1)),
                list)  # the 16 [B, th, tw, O] of (p, q), row-major
  y = jnp.stack([jnp.stack(y[p * _M:(p + 1) * _M], 3) for p in range(_M)], 2)
  y = y.reshape(x.shape[0], _M * th, _M * tw, -1)[:, :oh, :ow]
  return y, (v, u)


@jax.custom_vjp
def _conv_winograd_valid(x, kernel):
  """VALID stride-1 3x3 cross-correlation by Winograd F(4x4, 3x3)."""
  return _wino_forward(x, kernel)[0]


def _conv_winograd_fwd(x, kernel):
  y, (v, u) = _wino_forward(x, kernel)
  return y, (v, u, x.shape)


def _conv_winograd_bwd(res, g):
  """Both gradients through the transposed transforms (see module doc)."""
  v, u, shape = res
  b, h, w, c = shape
  oh, ow, th, tw = _wino_tiles(shape)
  g = jnp.pad(g, ((0, 0), (0, _M * th - oh), (0, _M * tw - ow), (0, 0)))
  g = g.reshape(b, th, _M, tw, _M, -1)
  dm = jnp.stack(_sandwich(
      _WINO_AT.T, [lax.index_in_dim(g, p, 2, False) for p in range(_M)],
      lambda r: [lax.index_in_dim(r, q, 3, False) for q in range(_M)]))
  dm = dm.reshape(_A * _A, b * th * tw, -1)  # [36, N, O]
  dv = lax.dot_general(dm, u, (((2,), (2,)), ((0,), (0,))))  # [36, N, C]
  du = lax.dot_general(v, dm, (((1,), (1,)), ((0,), (0,))))  # [36, C, O]
  d = _sandwich(_WINO_BT.T, list(dv.reshape(_A, _A, b, th, tw, c)), list)
  rows = [_fold(d[i * _A:(i + 1) * _A], 2, tw) for i in range(_A)]
  dx = _fold(rows, 1, th)[:, :h, :w]
  dk = _sandwich(_WINO_G.T, list(du.reshape(_A, _A, *du.shape[1:])), list)
  return dx, jnp.stack(dk).reshape(3, 3, *du.shape[1:])


_conv_winograd_valid.defvjp(_conv_winograd_fwd, _conv_winograd_bwd)


def _conv_winograd(x, kernel, padding):
  """Winograd for a 3x3 stride-1 kernel with ``padding``."""
  return _conv_winograd_valid(_padded(x, (3, 3), (1, 1), padding)[0], kernel)


# ---------------------------------------------------------------------------
# Forward-conv-only custom VJP.


def _fwd_conv(x, kernel, pads, strides=(1, 1)):
  return lax.conv_general_dilated(x, kernel, strides, pads,
                                  dimension_numbers=_DN)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_custom(x, kernel, strides, padding):
  pads, _ = _pad_spec(x.shape[1:3], kernel.shape[:2], strides, padding)
  return _fwd_conv(x, kernel, pads, strides)


def _conv_custom_fwd(x, kernel, strides, padding):
  return _conv_custom(x, kernel, strides, padding), (x, kernel)


def _conv_custom_bwd(strides, padding, res, g):
  """Both gradients as stride-1 NHWC/HWIO forward convolutions.

  A strided conv equals the stride-1 conv sampled every ``s`` pixels, so its
  cotangent is ``g`` dilated by ``s`` (zeros in between, an interior pad) and
  zero-padded to the stride-1 output size; then the stride-1 rules apply:

  * ``dx = conv(g, flip_hw(kernel) with I/O swapped)`` with padding
    ``(kh - 1 - lo, kh - 1 - hi)``;
  * ``dkernel[i, j, c, o] = sum_{b, p} xpad[b, p + (i, j), c] g[b, p, o]``:
    a forward conv whose "batch" is ``C``, whose contraction dim is the batch
    ``B`` and whose kernel is ``g`` (``[oh, ow, B, O]``), giving
    ``[C, kh, kw, O]``.
  """
  x, kernel = res
  kh, kw, c, o = kernel.shape
  (ph, pw), _ = _pad_spec(x.shape[1:3], (kh, kw), strides, padding)
  full = (x.shape[1] + ph[0] + ph[1] - kh + 1,
          x.shape[2] + pw[0] + pw[1] - kw + 1)
  if strides != (1, 1):
    sh, sw = strides
    zero = jnp.zeros((), g.dtype)
    g = lax.pad(g, zero, (
        (0, 0, 0),
        (0, full[0] - ((g.shape[1] - 1) * sh + 1), sh - 1),
        (0, full[1] - ((g.shape[2] - 1) * sw + 1), sw - 1),
        (0, 0, 0)))
  # Input gradient.
  k_t = jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2))  # [kh, kw, O, C]
  dx = _fwd_conv(g, k_t, ((kh - 1 - ph[0], kh - 1 - ph[1]),
                          (kw - 1 - pw[0], kw - 1 - pw[1])))
  # Weight gradient.
  lhs = jnp.transpose(x, (3, 1, 2, 0))  # [C, H, W, B]
  rhs = jnp.transpose(g, (1, 2, 0, 3))  # [oh, ow, B, O]
  dk = _fwd_conv(lhs, rhs, (ph, pw))  # [C, kh, kw, O]
  dk = jnp.transpose(dk, (1, 2, 0, 3))
  return dx.astype(x.dtype), dk.astype(kernel.dtype)


_conv_custom.defvjp(_conv_custom_fwd, _conv_custom_bwd)


# ---------------------------------------------------------------------------
# Public API.


def conv2d(x: jax.Array,
           kernel: jax.Array,
           bias: jax.Array | None = None,
           padding: str = "SAME",
           impl: str = "auto",
           strides: int | Sequence[int] = 1) -> jax.Array:
  """2-D cross-correlation ``NHWC x HWIO -> NHWC`` (as ``flax.linen.Conv``).

  Args:
    x: input ``[B, H, W, C]``.
    kernel: ``[kh, kw, C, O]``.
    bias: optional ``[O]``.
    padding: ``"SAME"`` (``ceil(H / s)`` outputs, padding split as ``lax``
      does: the extra pixel at the end) or ``"VALID"``.
    impl: ``"auto"`` (default: Winograd where it pays on a CPU, im2col
      elsewhere; :func:`resolve_impl`), ``"im2col"`` (shifted slices + matmul,
      fast under ``scan`` and ``vmap`` on CPU), ``"winograd"`` (F(4x4, 3x3)
      for 3x3 stride-1 kernels, im2col otherwise), ``"custom_vjp"`` (gradients
      written as forward convolutions) or ``"lax"``
      (``lax.conv_general_dilated``).
    strides: int or ``(sh, sw)``.

  Returns:
    ``[B, oh, ow, O]``.

  Raises:
    ConfigError: unknown ``impl``/``padding`` or incompatible shapes.
  """
  check_choice("conv_impl", impl, CONV_IMPLS)
  strides = _pair(strides, "strides")
  _check_shapes(x, kernel, padding, strides)
  impl = resolve_impl(impl, x.shape, kernel.shape, strides, padding, x.dtype)
  if impl == "im2col":
    y = _conv_im2col(x, kernel, strides, padding)
  elif impl == "winograd":
    y = _conv_winograd(x, kernel, padding)
  elif impl == "custom_vjp":
    y = _conv_custom(x, kernel, strides, padding)
  else:
    pads, _ = _pad_spec(x.shape[1:3], kernel.shape[:2], strides, padding)
    y = _fwd_conv(x, kernel, pads, strides)
  if bias is not None:
    y = y + bias
  return y


def max_pool(x: jax.Array,
             window: int | Sequence[int] = 2,
             stride: int | Sequence[int] | None = None) -> jax.Array:
  """VALID max-pooling of NHWC ``x`` without ``reduce_window``.

  ``reduce_window``'s gradient (``select_and_scatter``) is avoided: when the
  stride equals the window the input is cropped to a multiple of it and
  reduced by reshape + ``max`` (one fused reduction); otherwise the maximum of
  ``wh * ww`` strided slices is taken. Both agree with
  ``flax.linen.max_pool(..., padding="VALID")`` in value, and in gradient
  wherever the maximum is unique (at ties the gradient is split among the
  tied entries instead of going to the first one; both are subgradients).

  Args:
    x: ``[B, H, W, C]``.
    window: int or ``(wh, ww)``.
    stride: int or ``(sh, sw)``; defaults to ``window``.

  Returns:
    ``[B, (H - wh) // sh + 1, (W - ww) // sw + 1, C]``.
  """
  window = _pair(window, "window")
  stride = window if stride is None else _pair(stride, "stride")
  b, h, w, c = x.shape
  (wh, ww), (sh, sw) = window, stride
  if h < wh or w < ww:
    raise ConfigError("max_pool input size", x.shape,
                      f"must be at least the window {window}")
  oh, ow = (h - wh) // sh + 1, (w - ww) // sw + 1
  if window == stride:
    x = x[:, :oh * wh, :ow * ww]
    return jnp.max(x.reshape(b, oh, wh, ow, ww, c), axis=(2, 4))
  out = None
  for i in range(wh):
    for j in range(ww):
      s = lax.slice(x, (0, i, j, 0),
                    (b, i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, c),
                    (1, sh, sw, 1))
      out = s if out is None else jnp.maximum(out, s)
  return out


class Conv(nn.Module):
  """Drop-in for ``flax.linen.Conv`` (2-D, NHWC) built on :func:`conv2d`.

  Parameters are named ``kernel`` (``[kh, kw, C, features]``, LeCun normal)
  and ``bias`` (``[features]``, zeros), as in flax.

  Attributes:
    features: output channels.
    kernel_size: int or ``(kh, kw)``.
    strides: int or ``(sh, sw)``.
    padding: ``"SAME"`` or ``"VALID"``.
    use_bias: add a bias.
    impl: see :func:`conv2d`.
  """
  features: int
  kernel_size: Any = (3, 3)
  strides: Any = 1
  padding: str = "SAME"
  use_bias: bool = True
  impl: str = "auto"
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros_init()

  def resolved_impl(self, x) -> str:
    """The implementation this layer runs on input ``x`` (:func:`resolve_impl`)."""
    kh, kw = _pair(self.kernel_size, "kernel_size")
    return resolve_impl(self.impl, x.shape, (kh, kw, x.shape[-1], self.features),
                        _pair(self.strides, "strides"), self.padding, x.dtype)

  @nn.compact
  def __call__(self, x):
    kh, kw = _pair(self.kernel_size, "kernel_size")
    kernel = self.param("kernel", self.kernel_init,
                        (kh, kw, x.shape[-1], self.features), jnp.float32)
    bias = (self.param("bias", self.bias_init, (self.features,), jnp.float32)
            if self.use_bias else None)
    return conv2d(x, kernel.astype(x.dtype),
                  None if bias is None else bias.astype(x.dtype),
                  padding=self.padding, impl=self.impl, strides=self.strides)
