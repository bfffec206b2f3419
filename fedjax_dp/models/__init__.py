"""Models (flax modules), masked losses and the conv that stays fast on CPU.

Usage::

  model = get_model("cnn2", (28, 28, 1), 62)
  params = model.init(jax.random.key(0))
  logits = model.apply(params, x)            # x: [B, 28, 28, 1]
  loss = cross_entropy(logits, y, mask)

A sequence model returns logits ``[B, T, num_classes]`` for labels ``[B, T]``
(one per position); the losses and metrics take either, and a label equal to
:data:`IGNORE` counts nowhere. A multi-label model (``multi_label``: StackOverflow tag
prediction) returns logits ``[B, num_classes]``, one sigmoid per class, for labels ``[B, T]``
that list an example's classes; it trains on :func:`sigmoid_cross_entropy` and is evaluated by
recall at 5 and precision (:func:`multi_label_sums`).

Each model declares itself once, below (:func:`fedjax_dp.components.declare`, kind
``"model"``): its name, paper, one line about it, its keyword options and its traits
(``convolutional``: it runs :class:`Conv` layers and reads ``conv_impl``; ``sequence``: its
input is ``(T,)`` token ids; ``multi_label``: its outputs are independent sigmoids, one per
class). ``fedjax_dp.components.declared("model")`` lists them; a plugin
may declare its own. :mod:`fedjax_dp.models.zoo` and :mod:`fedjax_dp.models.recurrent` hold the
architectures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dp import components
from fedjax_dp.errors import check_choice, ConfigError
from fedjax_dp.models import bag_of_words, recurrent, zoo
from fedjax_dp.models.conv import CONV_IMPLS, Conv, conv2d, max_pool
from fedjax_dp.models.losses import (IGNORE, METRIC_LABELS, METRICS, RECALL_K, accuracy,
                                     cross_entropy, evaluation_sums, masked_sums,
                                     multi_hot, multi_label_sums, num_params,
                                     per_example_cross_entropy,
                                     per_example_sigmoid_cross_entropy, ratios,
                                     sigmoid_cross_entropy, supervised_loss)

__all__ = [
    "CONV_IMPLS", "COMPUTE_DTYPES", "Model", "get_model", "cross_entropy",
    "per_example_cross_entropy", "accuracy", "masked_sums", "IGNORE",
    "num_params", "conv2d",
    "max_pool", "Conv", "METRICS", "METRIC_LABELS", "RECALL_K", "evaluation_sums", "multi_hot",
    "multi_label_sums", "per_example_sigmoid_cross_entropy", "ratios", "sigmoid_cross_entropy",
    "supervised_loss",
]

# The dtype of the forward and backward pass; parameters stay float32 (Model.apply).
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Model:
  """A flax module with its per-example input shape and number of classes.

  Attributes:
    name: the name given to :func:`get_model`.
    module: the flax module; ``module.apply({"params": p}, x)``.
    input_shape: per-example input shape, e.g. ``(28, 28, 1)``.
    num_classes: number of output logits (a sequence model's vocabulary).
    compute_dtype: ``"float32"`` or ``"bfloat16"``: the dtype :meth:`apply` computes in
      (parameters, gradients and everything outside the model stay float32).
    multi_label: its logits are one sigmoid per class and its labels list each example's
      classes (:func:`sigmoid_cross_entropy`, :func:`multi_label_sums`); False: one class per
      label (softmax, :func:`cross_entropy`).
    token_ids: its inputs are token ids (stored as floats), which :meth:`apply` passes as they
      are in any ``compute_dtype`` (bfloat16 holds integers exactly only up to 256).
  """
  name: str
  module: nn.Module
  input_shape: tuple
  num_classes: int
  compute_dtype: str = "float32"
  multi_label: bool = False
  token_ids: bool = False

  def init(self, key: jax.Array) -> Any:
    """Initial parameters (a pytree; float32) from a PRNG key (jitted)."""
    return _init(self, key)

  def apply(self, params: Any, x: jax.Array) -> jax.Array:
    """Logits ``[B, num_classes]`` (a sequence model: ``[B, T, num_classes]``)
    for inputs ``x`` of shape ``[B, *input_shape]``.

    With ``compute_dtype="bfloat16"`` the float parameters and inputs (not :attr:`token_ids`)
    are cast to bfloat16, the module runs in bfloat16 and the logits come back as float32; the
    gradient of a loss of them with respect to the float32 ``params`` is float32 (the cast's
    transpose).
    """
    if self.compute_dtype == "float32":
      return self.module.apply({"params": params}, x)
    dtype = jnp.dtype(self.compute_dtype)

    def cast(a):
      return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a

    logits = self.module.apply({"params": jax.tree_util.tree_map(cast, params)},
                               x if self.token_ids else cast(x))
    return logits.astype(jnp.float32)

  def conv_impls(self, batch: int) -> frozenset:
    """The implementations its :class:`Conv` layers run for a batch of ``batch`` examples in
    :attr:`compute_dtype` (:func:`fedjax_dp.models.conv.resolve_impl`; empty without them)."""
    return _conv_impls(self, batch, jax.default_backend())


@functools.lru_cache(maxsize=64)
def _conv_impls(model: Model, batch: int, backend: str) -> frozenset:
  del backend  # a key of the cache: resolve_impl reads it
  params = jax.eval_shape(model.init, jax.random.key(0))
  with conv_layers() as found:
    jax.eval_shape(model.apply, params,
                   jax.ShapeDtypeStruct((batch, *model.input_shape), jnp.float32))
  return frozenset(impl for impls in found.values() for impl in impls)


@contextlib.contextmanager
def conv_layers():
  """Records, while models are traced inside it, the implementation each :class:`Conv` layer
  resolves (:func:`fedjax_dp.models.conv.resolve_impl` on the input it is traced with):
  yields a dict ``layer path -> sorted list of implementations``, filled as layers run."""
  found = {}

  def record(call, args, kwargs, context):
    """Flax's method interceptor: records a Conv call's implementation, then makes the call.

    Args:
      call: the intercepted method, bound to its module.
      args: its positional arguments (a Conv's first is its input).
      kwargs: its keyword arguments.
      context: flax's ``InterceptorContext`` (module and method name).
    """
    if isinstance(context.module, Conv) and context.method_name == "__call__":
      path = "/".join(context.module.scope.path)
      found[path] = sorted(set(found.get(path, [])) | {context.module.resolved_impl(args[0])})
    return call(*args, **kwargs)

  with nn.intercept_methods(record):
    yield found


@functools.partial(jax.jit, static_argnums=0)
def _init(model: Model, key: jax.Array) -> Any:
  x = jnp.zeros((1, *model.input_shape), jnp.float32)
  return model.module.init(key, x)["params"]


def _tuple_of_ints(field, value):
  try:
    t = tuple(int(v) for v in value)
  except TypeError:
    t = None
  if not t or t != tuple(value) or min(t) < 1:
    raise ConfigError(field, value, "must be a non-empty tuple of positive ints")
  return t


def model(name: str, *, about: str, reference: str = "", kwargs: tuple = (),
          convolutional: bool = False, sequence: bool = False, multi_label: bool = False):
  """Declares the decorated ``build(num_classes, conv_impl, **kwargs) -> flax module`` as model
  ``name`` (:func:`fedjax_dp.components.declare`).

  Args:
    name: the model's name (``--model``).
    about: one line saying what it is.
    reference: the paper it comes from.
    kwargs: the keyword options ``build`` takes (:func:`get_model`'s ``**kwargs``).
    convolutional: it runs :class:`Conv` layers, as ``conv_impl`` says.
    sequence: its input is ``(T,)`` token ids; else an image ``(H, W[, C])`` or a vector.
    multi_label: its outputs are one sigmoid per class, for multi-label data sets
      (:attr:`Model.multi_label`).
  """
  return components.declare("model", name, reference=reference, about=about,
                            kwargs=tuple(kwargs), convolutional=convolutional, sequence=sequence,
                            multi_label=multi_label)


@model("mlp", about="dense layers", kwargs=("hidden", "activation"))
def _mlp(num_classes, conv_impl, hidden=(200, 200), activation="relu"):
  del conv_impl
  check_choice("activation", activation, zoo.ACTIVATIONS)
  return zoo.MLP(num_classes, hidden=_tuple_of_ints("hidden", hidden), activation=activation)


@model("rsa_mlp", reference="Zhu and Ling, IJCAI 2022",
       about="DP-RSA's MNIST MLP 784-50-50-10 with tanh")
def _rsa_mlp(num_classes, conv_impl):
  del conv_impl
  return zoo.MLP(num_classes, hidden=(50, 50), activation="tanh")


@model("digits_cnn", convolutional=True, about="a small CNN for the 8x8 scikit-learn digits")
def _digits_cnn(num_classes, conv_impl):
  return zoo.TwoConvCNN(num_classes, features=(16, 32), padding="SAME", hidden=64,
                        conv_impl=conv_impl)


@model("cnn2", convolutional=True, reference="Cheng et al., CVPR 2022",
       about="CNN-2-layers of federated EMNIST")
def _cnn2(num_classes, conv_impl):
  return zoo.TwoConvCNN(num_classes, conv_impl=conv_impl)


@model("spfl_cnn", convolutional=True, reference="Wu and Li, 2024", kwargs=("hidden",),
       about="SP-FL's CNN (hidden=32)")
def _spfl_cnn(num_classes, conv_impl, hidden=32):
  return zoo.SPFLCNN(num_classes, hidden=_tuple_of_ints("hidden", (hidden,))[0],
                     conv_impl=conv_impl)


@model("rsa_cifar_cnn", convolutional=True, reference="Zhu and Ling, IJCAI 2022",
       kwargs=("features", "hidden"),
       about="DP-RSA's CIFAR-10 CNN, about 368k parameters (features=(40, 40), "
             "hidden=(384, 192))")
def _rsa_cifar_cnn(num_classes, conv_impl, features=(40, 40), hidden=(384, 192)):
  return zoo.RSACifarCNN(num_classes, features=_tuple_of_ints("features", features),
                         hidden=_tuple_of_ints("hidden", hidden), conv_impl=conv_impl)


@model("resnet18_gn", convolutional=True, reference="Cheng et al., CVPR 2022",
       kwargs=("num_groups", "widths"),
       about="CIFAR ResNet-18 with GroupNorm (num_groups=2, widths=(64, 128, 256, 512))")
def _resnet18_gn(num_classes, conv_impl, num_groups=2, widths=(64, 128, 256, 512)):
  widths = _tuple_of_ints("widths", widths)
  if len(widths) != 4:
    raise ConfigError("widths", widths, "must have 4 entries (one per stage)")
  num_groups = int(num_groups)
  if num_groups < 1 or any(w % num_groups for w in widths):
    raise ConfigError("num_groups", num_groups,
                      f"must be >= 1 and divide every width in {widths}")
  return zoo.ResNet18GN(num_classes, num_groups=num_groups, widths=widths, conv_impl=conv_impl)


@model("char_lstm", sequence=True, reference="federated Shakespeare (TFF)",
       kwargs=("embed", "hidden"),
       about="next-character LSTM: embedding 8, two LSTM layers of 256 (820,522 parameters with "
             "90 tokens)")
def _char_lstm(num_classes, conv_impl, embed=8, hidden=(256, 256)):
  del conv_impl
  return recurrent.CharLSTM(num_classes, embed=_tuple_of_ints("embed", (embed,))[0],
                            hidden=_tuple_of_ints("hidden", hidden))


@model("char_lstm_small", sequence=True,
       about="char_lstm with one LSTM layer of 64 units (25,258 parameters with 90 tokens), "
             "fast enough for a CPU")
def _char_lstm_small(num_classes, conv_impl):
  del conv_impl
  return recurrent.CharLSTM(num_classes, hidden=(64,))


@model("word_lstm", sequence=True, reference="federated StackOverflow (TFF)",
       kwargs=("embed", "hidden", "project"),
       about="next-word LSTM: embedding 96, one LSTM layer of 670, dense 96 (4,050,748 "
             "parameters with 10,004 tokens)")
def _word_lstm(num_classes, conv_impl, embed=96, hidden=(670,), project=96):
  del conv_impl
  return recurrent.CharLSTM(num_classes, embed=_tuple_of_ints("embed", (embed,))[0],
                            hidden=_tuple_of_ints("hidden", hidden),
                            project=_tuple_of_ints("project", (project,))[0])


@model("bow_lr", sequence=True, multi_label=True,
       reference="StackOverflow tag prediction (TFF's logistic regression)",
       kwargs=("vocab_size",),
       about="logistic regression on the normalized bag of words of word ids, a sigmoid per "
             "tag (5,000,500 parameters with 10,000 words and 500 tags)")
def _bow_lr(num_classes, conv_impl, vocab_size=10_000):
  del conv_impl
  return bag_of_words.BagOfWordsLR(num_classes,
                                   vocab_size=_tuple_of_ints("vocab_size", (vocab_size,))[0])


def is_convolutional(name: str) -> bool:
  """Whether declared model ``name`` runs convolutions (reads ``conv_impl``); False for a name
  that is not declared (a :class:`Model` built by hand)."""
  return name in components.names("model") and components.get("model", name)["convolutional"]


def check_labels(model: str, multi_label: bool, dataset: str, data_multi_label: bool) -> None:
  """Refuses a model whose outputs do not fit the data's labels: a single-label model (softmax)
  for a multi-label data set (each example a set of classes: StackOverflow's tags) or a
  multi-label one (a sigmoid per class) for a data set of one class per label.

  Args:
    model: the model's name.
    multi_label: it is multi-label (:attr:`Model.multi_label`).
    dataset: the data set's name.
    data_multi_label: its examples each have a set of classes.

  Raises:
    ConfigError: naming the model and the data set (and, for a multi-label one, the declared
      models that fit it).
  """
  if bool(multi_label) == bool(data_multi_label):
    return
  if data_multi_label:
    fits = [m.name for m in components.declared("model") if m.traits.get("multi_label", False)]
    raise ConfigError("model", model, "must be a multi-label model (a sigmoid per class) for "
                      f"dataset {dataset}, whose examples each have a set of classes: one of "
                      f"{fits}")
  raise ConfigError("model", model, "is a multi-label model (a sigmoid per class), but dataset "
                    f"{dataset} has one class per label: use a single-label model")


def check_conv_dtype(conv_impl: str, compute_dtype: str) -> None:
  """Refuses Winograd convolutions outside float32 (field ``conv_impl``): in bfloat16 their
  tile transforms lose about 5% relative accuracy against 0.3% for im2col."""
  if conv_impl == "winograd" and compute_dtype != "float32":
    raise ConfigError("conv_impl", conv_impl,
                      f"computes in float32 only: in {compute_dtype} its tile transforms "
                      "lose about 5% relative accuracy (use im2col with "
                      f"compute_dtype={compute_dtype})")


def get_model(name: str, input_shape, num_classes: int,
              conv_impl: str = "auto", compute_dtype: str = "float32", **kwargs) -> Model:
  """Builds a model by name and checks that it accepts ``input_shape``.

  Args:
    name: a declared model (``fedjax_dp.components.names("model")``).
    input_shape: per-example shape; conv models take ``(H, W, C)`` or
      ``(H, W)`` (one channel).
    num_classes: number of classes (>= 2).
    conv_impl: ``"auto"`` (default; per layer, Winograd where it pays on a
      CPU, else im2col), ``"im2col"`` (fast under ``scan`` and ``vmap`` on
      CPU), ``"winograd"`` (float32 only), ``"custom_vjp"`` or ``"lax"``; see
      :func:`fedjax_dp.models.conv.conv2d`. Ignored by dense models.
    compute_dtype: one of :data:`COMPUTE_DTYPES` (:attr:`Model.compute_dtype`).
    **kwargs: the model's keyword options (its declaration's ``kwargs``).

  Returns:
    A :class:`Model`.

  Raises:
    ConfigError: unknown name, option or conv impl, Winograd with a compute
      dtype other than float32, or an input shape the model cannot take
      (e.g. too small for its convs and pools).
  """
  check_choice("model", name, components.names("model"))
  check_choice("conv_impl", conv_impl, CONV_IMPLS)
  check_choice("compute_dtype", compute_dtype, COMPUTE_DTYPES)
  check_conv_dtype(conv_impl, compute_dtype)
  declared = components.get("model", name)
  for key in kwargs:
    check_choice(f"{name} option", key, declared["kwargs"])
  if isinstance(input_shape, int):
    input_shape = (input_shape,)
  input_shape = _tuple_of_ints("input_shape", input_shape)
  if declared["convolutional"] and len(input_shape) not in (2, 3):
    raise ConfigError("input_shape", input_shape,
                      f"model {name} needs (H, W, C) or (H, W)")
  if declared["sequence"] and len(input_shape) != 1:
    raise ConfigError("input_shape", input_shape,
                      f"model {name} needs (T,): a sequence of token ids")
  if isinstance(num_classes, bool) or int(num_classes) != num_classes or (
      num_classes < 2):
    raise ConfigError("num_classes", num_classes, "must be an int >= 2")
  module = declared.build(int(num_classes), conv_impl, **kwargs)
  model = Model(name, module, input_shape, int(num_classes), compute_dtype,
                multi_label=declared.traits.get("multi_label", False),
                token_ids=declared["sequence"])
  x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
  try:
    out = jax.eval_shape(module.init, jax.random.key(0), x)
  except (ConfigError, ValueError, TypeError) as e:
    raise ConfigError("input_shape", input_shape,
                      f"model {name} cannot take it ({e})") from e
  del out
  return model
