"""Tests for fedjax_dp.models: the conv implementations, pooling and the zoo."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_dp import components
from fedjax_dp.errors import ConfigError
from fedjax_dp.engine import make_evaluator
from fedjax_dp.models import (IGNORE, accuracy, conv2d, cross_entropy, evaluation_sums,
                              get_model, masked_sums, max_pool, multi_hot, multi_label_sums,
                              num_params, ratios, sigmoid_cross_entropy)
from fedjax_dp.models.conv import Conv

FAST_IMPLS = ("im2col", "winograd", "custom_vjp")
TOL = dict(rtol=1e-4, atol=1e-4)


def _ref_conv(x, w, padding, strides):
  return lax.conv_general_dilated(x, w, (strides, strides), padding,
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _loss(conv):
  """A scalar with a non-uniform cotangent, so every gradient entry counts."""
  def f(x, w):
    y = conv(x, w)
    return jnp.sum(y * jnp.sin(jnp.arange(y.size, dtype=y.dtype)).reshape(
        y.shape))
  return f


# (batch, H, W, C, O, kh, kw, stride, padding): odd sizes, non-square
# kernels, even kernels with SAME (asymmetric padding), strides.
CASES = [
    (2, 7, 9, 3, 5, 3, 3, 1, "SAME"),
    (2, 7, 9, 3, 5, 3, 2, 1, "VALID"),
    (1, 8, 8, 2, 3, 4, 4, 1, "SAME"),
    (2, 9, 8, 2, 4, 3, 3, 2, "SAME"),
    (2, 9, 8, 2, 4, 4, 3, 2, "VALID"),
    (2, 5, 5, 2, 3, 1, 1, 2, "SAME"),
    # Winograd tiles: outputs 12x9 (a partial column of tiles), 2x3 (less
    # than one tile).
    (2, 14, 11, 4, 3, 3, 3, 1, "VALID"),
    (1, 4, 5, 2, 3, 3, 3, 1, "VALID"),
]


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("case", CASES)
def test_conv2d_matches_lax(impl, case):
  b, h, w, c, o, kh, kw, s, padding = case
  kx, kk, kb = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (b, h, w, c))
  k = jax.random.normal(kk, (kh, kw, c, o))
  bias = jax.random.normal(kb, (o,))
  got = conv2d(x, k, bias, padding=padding, impl=impl, strides=s)
  want = _ref_conv(x, k, padding, s) + bias
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, **TOL)
  f_got = _loss(lambda x, k: conv2d(x, k, padding=padding, impl=impl,
                                    strides=s))
  f_want = _loss(lambda x, k: _ref_conv(x, k, padding, s))
  g_got = jax.jit(jax.grad(f_got, (0, 1)))(x, k)
  g_want = jax.grad(f_want, (0, 1))(x, k)
  for a, b_ in zip(g_got, g_want):
    np.testing.assert_allclose(a, b_, **TOL)


# (x shape, kernel shape, strides, padding, dtype) -> what "auto" runs on a CPU.
AUTO_CASES = [
    (((16, 10, 10, 32), (3, 3, 32, 4), (1, 1), "VALID", "float32"), "winograd"),  # 64 tiles
    (((15, 10, 10, 32), (3, 3, 32, 4), (1, 1), "VALID", "float32"), "im2col"),    # 60 tiles
    (((16, 10, 10, 16), (3, 3, 16, 4), (1, 1), "VALID", "float32"), "im2col"),    # 16 channels
    (((64, 4, 4, 64), (3, 3, 64, 4), (1, 1), "SAME", "float32"), "im2col"),       # 4x4 output
    (((16, 10, 10, 32), (3, 3, 32, 4), (1, 1), "VALID", "bfloat16"), "im2col"),
    (((16, 10, 10, 32), (3, 3, 32, 4), (2, 2), "SAME", "float32"), "im2col"),
    (((16, 10, 10, 32), (5, 5, 32, 4), (1, 1), "SAME", "float32"), "im2col"),
    (((64, 26, 26, 32), (3, 3, 32, 64), (1, 1), "VALID", "float32"), "winograd"),  # cnn2's 2nd
    (((64, 28, 28, 1), (3, 3, 1, 32), (1, 1), "VALID", "float32"), "im2col"),      # cnn2's 1st
]


@pytest.mark.parametrize("args,want", AUTO_CASES)
def test_auto_impl_per_layer(args, want, monkeypatch):
  """"auto" runs Winograd on a CPU for float32 3x3 stride-1 layers of >= 32 input channels,
  an output of >= 8 a side and >= 64 tiles a batch, im2col otherwise and on accelerators;
  "winograd" is im2col for other kernel shapes; conv2d runs what resolve_impl says."""
  from fedjax_dp.models.conv import resolve_impl
  x_shape, k_shape, strides, padding, dtype = args
  assert resolve_impl("auto", *args) == want
  square = k_shape[:2] == (3, 3) and strides == (1, 1)
  assert resolve_impl("winograd", *args) == ("winograd" if square else "im2col")
  assert resolve_impl("im2col", *args) == "im2col" and resolve_impl("lax", *args) == "lax"
  if x_shape[0] * x_shape[1] <= 200:  # the small cases: auto's output is its choice's, bit for bit
    kx, kk = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, x_shape).astype(dtype)
    k = jax.random.normal(kk, k_shape).astype(dtype)
    conv = lambda impl: jax.jit(lambda x, k: conv2d(x, k, padding=padding, impl=impl,
                                                    strides=strides[0]))(x, k)
    np.testing.assert_array_equal(conv("auto"), conv(want))
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert resolve_impl("auto", *args) == "im2col"


def test_model_conv_impls():
  """Model.conv_impls: what its layers run at a batch size (cnn2 by auto: the first layer by
  im2col, the second by Winograd from a batch of 2, 72 tiles)."""
  cnn2 = get_model("cnn2", (28, 28, 1), 62)
  assert cnn2.conv_impls(64) == {"im2col", "winograd"} and cnn2.conv_impls(1) == {"im2col"}
  assert get_model("cnn2", (28, 28, 1), 62, conv_impl="im2col").conv_impls(64) == {"im2col"}
  assert get_model("cnn2", (28, 28, 1), 62, compute_dtype="bfloat16").conv_impls(64) == {"im2col"}
  assert get_model("digits_cnn", (8, 8, 1), 10).conv_impls(64) == {"im2col"}
  assert get_model("digits_cnn", (8, 8, 1), 10, conv_impl="winograd").conv_impls(4) == {"winograd"}
  assert get_model("rsa_cifar_cnn", (32, 32, 3), 10, conv_impl="winograd").conv_impls(64) == {
      "im2col"}                                                    # 5x5 kernels
  assert get_model("mlp", (784,), 10).conv_impls(64) == frozenset()


def test_conv2d_lax_impl_and_errors():
  x = jnp.ones((1, 5, 5, 2))
  k = jnp.ones((3, 3, 2, 4))
  np.testing.assert_allclose(conv2d(x, k, impl="lax", padding="VALID"),
                             _ref_conv(x, k, "VALID", 1))
  with pytest.raises(ConfigError):
    conv2d(x, k, impl="fft")
  with pytest.raises(ConfigError):
    conv2d(x, k, padding="FULL")
  with pytest.raises(ConfigError):
    conv2d(x, jnp.ones((3, 3, 3, 4)))
  with pytest.raises(ConfigError):
    conv2d(jnp.ones((1, 2, 2, 2)), k, padding="VALID")


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_conv2d_vmap_over_client_kernels_in_scan(impl):
  """Per-client kernels under vmap, local steps in lax.scan, vs lax."""
  n, steps = 3, 2
  kx, kk = jax.random.split(jax.random.key(1))
  xs = jax.random.normal(kx, (n, steps, 2, 6, 7, 2))
  ks = jax.random.normal(kk, (n, 3, 3, 2, 4)) * 0.3

  def client(impl_):
    def run(k, x_steps):
      def step(k, x):
        f = _loss(lambda x, k: conv2d(x, k, padding="SAME", impl=impl_,
                                      strides=1))
        val, (gx, gk) = jax.value_and_grad(f, (0, 1))(x, k)
        return k - 0.01 * gk, (val, gx)
      return lax.scan(step, k, x_steps)
    return jax.jit(jax.vmap(run))

  got = client(impl)(ks, xs)
  want = client("lax")(ks, xs)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, **TOL)


@pytest.mark.parametrize("window,stride,hw", [
    (2, 2, (8, 8)), (2, 2, (7, 9)), (3, 2, (9, 8)), (3, 2, (28, 28)),
    (2, 1, (5, 6))])
def test_max_pool_matches_flax(window, stride, hw):
  x = jax.random.normal(jax.random.key(2), (2, *hw, 3))
  got = max_pool(x, window, stride)
  want = nn.max_pool(x, (window, window), (stride, stride), padding="VALID")
  np.testing.assert_allclose(got, want)
  f = lambda pool: _loss(lambda x, _: pool(x))  # noqa: E731
  g_got = jax.grad(f(lambda x: max_pool(x, window, stride)))(x, None)
  g_want = jax.grad(f(lambda x: nn.max_pool(
      x, (window, window), (stride, stride), padding="VALID")))(x, None)
  np.testing.assert_allclose(g_got, g_want, **TOL)


def test_conv_module_params_like_flax():
  x = jnp.ones((1, 6, 6, 3))
  ours = Conv(8, (3, 3)).init(jax.random.key(0), x)["params"]
  theirs = nn.Conv(8, (3, 3)).init(jax.random.key(0), x)["params"]
  assert jax.tree.map(jnp.shape, ours) == jax.tree.map(jnp.shape, theirs)
  np.testing.assert_allclose(ours["kernel"], theirs["kernel"])
  np.testing.assert_array_equal(ours["bias"], 0.0)
  y = Conv(8, (3, 3)).apply({"params": theirs}, x)
  np.testing.assert_allclose(y, nn.Conv(8, (3, 3)).apply(
      {"params": theirs}, x), **TOL)


MODEL_SHAPES = {
    "mlp": ((28, 28, 1), 10),
    "rsa_mlp": ((28, 28, 1), 10),
    "digits_cnn": ((8, 8, 1), 10),
    "cnn2": ((28, 28, 1), 62),
    "spfl_cnn": ((28, 28, 1), 10),
    "rsa_cifar_cnn": ((32, 32, 3), 10),
    "resnet18_gn": ((32, 32, 3), 10),
    "char_lstm": ((80,), 90),
    "char_lstm_small": ((80,), 90),
    "word_lstm": ((20,), 10_004),
    "bow_lr": ((100,), 500),
}


@pytest.mark.parametrize("name", components.names("model"))
def test_model_init_and_apply(name):
  shape, classes = MODEL_SHAPES[name]
  model = get_model(name, shape, classes)
  params = model.init(jax.random.key(0))
  sequence = components.get("model", name)["sequence"]
  if sequence:  # token ids, stored as float32 like all inputs
    x = jax.random.randint(jax.random.key(1), (2, *shape), 0, classes).astype(jnp.float32)
  else:
    x = jax.random.normal(jax.random.key(1), (2, *shape))
  logits = jax.jit(model.apply)(params, x)
  # A multi-label model has one logit per class for the whole sequence of token ids.
  per_position = sequence and not model.multi_label
  assert logits.shape == ((2, *shape, classes) if per_position else (2, classes))
  assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("impl", ["winograd", "custom_vjp", "lax"])
def test_cnn2_impls_agree(impl):
  """Same params, same logits and gradients whatever the conv impl."""
  ref = get_model("cnn2", (12, 12, 1), 5, conv_impl="im2col")
  other = get_model("cnn2", (12, 12, 1), 5, conv_impl=impl)
  params = ref.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (3, 12, 12, 1))
  y = jnp.array([0, 3, 4])
  def grads(m):
    return jax.jit(jax.grad(lambda p: cross_entropy(m.apply(p, x), y)))(
        params)
  np.testing.assert_allclose(jax.jit(other.apply)(params, x),
                             jax.jit(ref.apply)(params, x), **TOL)
  for a, b in zip(jax.tree.leaves(grads(other)), jax.tree.leaves(grads(ref))):
    np.testing.assert_allclose(a, b, **TOL)


def test_two_dim_input_shape_for_conv_models():
  model = get_model("digits_cnn", (8, 8), 10)
  params = model.init(jax.random.key(0))
  assert jax.jit(model.apply)(params, jnp.zeros((3, 8, 8))).shape == (3, 10)


def _count(name, shape, classes, **kwargs):
  model = get_model(name, shape, classes, **kwargs)
  return num_params(jax.eval_shape(model.init, jax.random.key(0)))


def test_parameter_counts():
  # 320 + 18,496 + (9216 * 128 + 128) + (128 * 62 + 62).
  assert _count("cnn2", (28, 28, 1), 62) == 1_206_590
  # 784-50-50-10.
  assert _count("rsa_mlp", (28, 28, 1), 10) == 42_310
  assert _count("mlp", (784,), 10, hidden=(50, 50),
                activation="tanh") == 42_310
  # The DP-RSA paper: "about 368,000 parameters".
  assert abs(_count("rsa_cifar_cnn", (32, 32, 3), 10) - 368_000) < 0.05 * 368_000
  # The DP-RSA authors' code: 64/64 conv channels.
  assert _count("rsa_cifar_cnn", (32, 32, 3), 10,
                features=(64, 64)) == 576_778
  assert _count("spfl_cnn", (28, 28, 1), 10) == 66_506
  assert _count("resnet18_gn", (32, 32, 3), 10) == 11_173_962
  # 90 * 8 + 4 * (8 + 256 + 1) * 256 + 4 * (256 + 256 + 1) * 256 + (256 * 90 + 90):
  # FedJAX's Shakespeare LSTM.
  assert _count("char_lstm", (80,), 90) == 820_522
  assert _count("char_lstm_small", (80,), 90) == 720 + 4 * (8 + 64 + 1) * 64 + 64 * 90 + 90
  # 10,004 * 96 + 4 * (96 + 670 + 1) * 670 + (670 * 96 + 96) + (96 * 10,004 + 10,004):
  # TFF's StackOverflow next-word LSTM.
  assert _count("word_lstm", (20,), 10_004) == 4_050_748
  # 10,000 * 500 + 500: TFF's StackOverflow tag-prediction logistic regression.
  assert _count("bow_lr", (100,), 500) == 5_000_500


def test_num_params_of_arrays():
  assert num_params({"a": jnp.zeros((2, 3)), "b": [jnp.zeros(4)]}) == 10


def test_cross_entropy_and_accuracy_masks():
  logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [5.0, 0.0]])
  labels = jnp.array([0, 0, 1])
  zero = jnp.zeros(3)
  assert float(cross_entropy(logits, labels, zero)) == 0.0
  assert float(accuracy(logits, labels, zero)) == 0.0
  g = jax.grad(lambda l: cross_entropy(l, labels, zero))(logits)
  np.testing.assert_array_equal(g, 0.0)
  mask = jnp.array([1.0, 1.0, 0.0])
  ce = np.log1p(np.exp(-2.0)), np.log1p(np.exp(2.0))
  np.testing.assert_allclose(cross_entropy(logits, labels, mask),
                             np.mean(ce), rtol=1e-6)
  np.testing.assert_allclose(accuracy(logits, labels, mask), 0.5)
  np.testing.assert_allclose(accuracy(logits, labels), 1 / 3, rtol=1e-6)
  # A padded row with huge logits does not leak through the mask.
  bad = logits.at[2].set(jnp.array([1e30, -1e30]))
  assert np.isfinite(float(cross_entropy(bad, labels, mask)))


def test_sequence_labels_mean_over_real_positions():
  """Labels [B, T] with logits [B, T, V]: means over positions of real examples that are not
  IGNORE, and an example's mask covers all its positions."""
  logits = jax.random.normal(jax.random.key(0), (3, 4, 5))
  labels = jnp.array([[1, 2, 3, IGNORE], [0, 4, IGNORE, IGNORE], [2, 2, 2, 2]])
  mask = jnp.array([1.0, 1.0, 0.0])
  ce, top, lab = -np.asarray(jax.nn.log_softmax(logits)), np.argmax(logits, -1), np.asarray(labels)
  real = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
  want_ce = np.mean([ce[b, t, lab[b, t]] for b, t in real])
  want_acc = np.mean([top[b, t] == lab[b, t] for b, t in real])
  np.testing.assert_allclose(cross_entropy(logits, labels, mask), want_ce, rtol=1e-6)
  np.testing.assert_allclose(accuracy(logits, labels, mask), want_acc, rtol=1e-6)
  loss_sum, correct, weight = masked_sums(logits, labels, mask)
  assert float(weight) == 5 and float(correct) == sum(top[b, t] == lab[b, t] for b, t in real)
  np.testing.assert_allclose(loss_sum, want_ce * 5, rtol=1e-6)
  # Ignored positions and masked examples get no gradient.
  g = np.asarray(jax.jit(jax.grad(lambda l: cross_entropy(l, labels, mask)))(logits))
  assert not np.any(g[0, 3]) and not np.any(g[1, 2:]) and not np.any(g[2])
  assert np.all(np.any(g[0, :3] != 0, axis=-1))
  # Per-example labels are the T = () case: the same numbers as before.
  flat = logits[:, 0]
  np.testing.assert_allclose(cross_entropy(flat, labels[:, 0], mask),
                             np.mean([ce[0, 0, 1], ce[1, 0, 0]]), rtol=1e-6)


# ------------------------------------------------------------------- multi-label


def test_bow_lr_is_a_dense_layer_on_tffs_bag_of_words():
  """The logits are Dense(num_tags) of TFF's features: each vocabulary word's count over the
  number of words (out-of-vocabulary ones counted, padding not), the OOV coordinate dropped."""
  vocab, tags = 6, 4
  model = get_model("bow_lr", (5,), tags, vocab_size=vocab)
  assert model.multi_label and model.token_ids
  params = model.init(jax.random.key(0))
  params = {"kernel": jax.random.normal(jax.random.key(1), (vocab, tags)),
            "bias": jnp.arange(tags, dtype=jnp.float32)}
  oov = vocab + 1
  x = np.array([[1, 2, 2, oov, 0], [6, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
  one_hot = np.eye(vocab + 2)[x.astype(int)]  # columns: padding, words 1..6, OOV
  words = np.maximum((x > 0).sum(1, keepdims=True), 1)
  bow = (one_hot * (x > 0)[..., None]).sum(1)[:, 1:vocab + 1] / words
  np.testing.assert_allclose(bow[0], [1 / 4, 2 / 4, 0, 0, 0, 0])  # 4 words, one OOV
  want = bow @ np.asarray(params["kernel"]) + np.asarray(params["bias"])
  np.testing.assert_allclose(model.apply(params, x), want, rtol=1e-5, atol=1e-6)
  # An example of padding only has an empty bag (TFF's mean of no words is NaN).
  np.testing.assert_allclose(model.apply(params, x)[2], np.arange(tags))
  # In bfloat16 the ids stay exact (bfloat16 holds integers exactly only up to 256).
  wide = get_model("bow_lr", (2,), tags, vocab_size=1000, compute_dtype="bfloat16")
  p = wide.init(jax.random.key(2))
  ids = np.array([[999, 0]], np.float32)  # 999 is 1000 in bfloat16
  np.testing.assert_allclose(wide.apply(p, ids)[0], p["kernel"][998] + p["bias"], rtol=1e-2,
                             atol=1e-3)


def test_sigmoid_cross_entropy_by_hand():
  """Keras' BinaryCrossentropy of one example: the mean over the classes of
  -t log sigmoid(z) - (1 - t) log(1 - sigmoid(z)); over the batch, the mean of real examples."""
  logits = jnp.array([[0.0, 2.0, -1.0], [3.0, 3.0, 3.0], [1e30, -1e30, 0.0]])
  labels = jnp.array([[1, IGNORE], [0, 0], [2, IGNORE]])  # a repeated id counts once
  np.testing.assert_array_equal(multi_hot(labels, 3), [[0, 1, 0], [1, 0, 0], [0, 0, 1]])
  first = np.mean([np.log(2.0), np.log1p(np.exp(-2.0)), np.log1p(np.exp(-1.0))])
  second = np.mean([np.log1p(np.exp(-3.0)), np.log1p(np.exp(3.0)), np.log1p(np.exp(3.0))])
  mask = jnp.array([1.0, 1.0, 0.0])
  np.testing.assert_allclose(sigmoid_cross_entropy(logits, labels, mask),
                             (first + second) / 2, rtol=1e-6)
  np.testing.assert_allclose(sigmoid_cross_entropy(logits[:1], labels[:1]), first, rtol=1e-6)
  # The padded row's huge logits do not leak, nor get a gradient; no real example gives 0.
  g = jax.grad(lambda l: sigmoid_cross_entropy(l, labels, mask))(logits)
  assert np.all(np.isfinite(g)) and not np.any(g[2])
  assert float(sigmoid_cross_entropy(logits, labels, jnp.zeros(3))) == 0.0


def test_recall_at_5_and_precision_by_hand():
  """TFF's recall_at_5 (Keras' Recall(top_k=5)) and precision (Keras' Precision(): a class is
  predicted where its sigmoid exceeds 0.5), both micro-averaged over the classes of all
  examples."""
  logits = jnp.array([[7.0, 6, 5, 4, 3, 2, 1],        # top 5: classes 0..4, all predicted
                      [-3.0, -2, -1, 4, 5, 6, 7],     # top 5: classes 2..6; predicted 3..6
                      [9.0, 9, 9, 9, 9, 9, 9]])       # padding
  labels = jnp.array([[0, 6, IGNORE], [0, 1, 2], [3, IGNORE, IGNORE]])
  mask = jnp.array([1.0, 1.0, 0.0])
  sums = multi_label_sums(logits, labels, mask)
  # Recall: 1 of {0, 6} and 1 of {0, 1, 2} in the top 5: 2 / 5 (the mean of the examples'
  # recalls, 5/12, is not it).
  assert [float(v) for v in sums["recall_at_5"]] == [2.0, 5.0]
  # Precision: row 0 predicts 7 classes, 2 true; row 1 predicts 3..6, none true: 2 / 11.
  assert [float(v) for v in sums["precision"]] == [2.0, 11.0]
  assert float(sums["loss"][1]) == 2.0
  metrics = ratios(evaluation_sums(logits, labels, mask, multi_label=True))
  np.testing.assert_allclose([metrics["recall_at_5"], metrics["precision"]], [0.4, 2 / 11],
                             rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], sigmoid_cross_entropy(logits, labels, mask),
                             rtol=1e-6)
  # Single-label labels keep their accuracy and loss.
  single = ratios(evaluation_sums(logits[:2], jnp.array([0, 6])))
  assert set(single) == {"accuracy", "loss"} and float(single["accuracy"]) == 1.0
  # The evaluator's chunked sums give the same numbers, recall at 5 in the headline place.
  model = get_model("bow_lr", (2,), 7, vocab_size=3)
  params = model.init(jax.random.key(0))
  x = np.array([[1, 2], [3, 0], [2, 4], [1, 1], [0, 0]], np.float32)
  y = np.array([[0, IGNORE], [1, 2], [6, IGNORE], [5, IGNORE], [IGNORE, IGNORE]])
  whole = ratios(evaluation_sums(model.apply(params, x), y, multi_label=True))
  chunked = make_evaluator(model, x, y, batch_size=2, all_metrics=True)(params)
  for name in ("loss", "recall_at_5", "precision"):
    np.testing.assert_allclose(chunked[name], whole[name], rtol=1e-6)
  recall, loss = make_evaluator(model, x, y, batch_size=2)(params)
  np.testing.assert_allclose([recall, loss], [whole["recall_at_5"], whole["loss"]], rtol=1e-6)


@pytest.mark.parametrize("args,kwargs,field", [
    (("lenet", (28, 28, 1), 10), {}, "model"),
    (("cnn2", (4, 4, 1), 10), {}, "input_shape"),
    (("cnn2", (784,), 10), {}, "input_shape"),
    (("cnn2", (28, 28, 1), 1), {}, "num_classes"),
    (("cnn2", (28, 28, 1), 10), {"conv_impl": "fft"}, "conv_impl"),
    (("cnn2", (28, 28, 1), 10), {"conv_impl": "winograd", "compute_dtype": "bfloat16"},
     "conv_impl"),
    (("mlp", (784,), 10), {"activation": "gelu"}, "activation"),
    (("mlp", (784,), 10), {"depth": 3}, "mlp option"),
    (("resnet18_gn", (32, 32, 3), 10), {"num_groups": 3}, "num_groups"),
    (("char_lstm", (28, 28, 1), 90), {}, "input_shape"),
    (("char_lstm", (80,), 90), {"hidden": ()}, "hidden"),
])
def test_get_model_config_errors(args, kwargs, field):
  with pytest.raises(ConfigError) as e:
    get_model(*args, **kwargs)
  assert e.value.field == field
