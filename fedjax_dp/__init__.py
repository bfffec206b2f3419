"""fedjax_dp: federated learning with differential privacy and Byzantine robustness in JAX.

The public API is what a user calls and extends, importable from ``fedjax_dp`` alone
(:data:`__all__`):

* running: :func:`simulate`, the :mod:`sweep` module (``fedjax_dp.sweep.sweep``),
  :class:`RunConfig`, :class:`RunOptions`, :class:`RunResult`, :class:`Observer`;
* declaring components: :func:`declare`, :class:`Option`, :class:`Component`, :func:`component`
  (a declared component by kind and name), :func:`component_names`, :func:`load_plugins`;
* writing a round: :class:`Round`, its :class:`Hooks`, :class:`Piece`, :class:`ClientOut`,
  :func:`tree_sub`, :class:`Aggregator`, :func:`mean`, :func:`local_sgd`,
  :func:`make_optimizer`, the client transforms (:func:`clip_l2`, :func:`add_gaussian_noise`,
  :func:`global_norm`) and the :mod:`objectives` and :mod:`aggregators` modules;
* data and models: :class:`FederatedData`, :class:`Model`, :func:`get_model`.

The package import is light: each name's module (and so JAX) is imported the first time the name
is read, and TensorFlow only by the tfds loader.
"""

import importlib

from fedjax_dp._version import __version__

# Public name -> (module, attribute in it).
_EXPORTS = {
    "simulate": ("fedjax_dp.experiment", "simulate"),
    "sweep": ("fedjax_dp.sweep", None),  # the module: importing it binds this name to it
    "RunConfig": ("fedjax_dp.config", "RunConfig"),
    "RunOptions": ("fedjax_dp.engine", "RunOptions"),
    "RunResult": ("fedjax_dp.engine", "RunResult"),
    "Observer": ("fedjax_dp.observers", "Observer"),
    "declare": ("fedjax_dp.components", "declare"),
    "Option": ("fedjax_dp.components", "Option"),
    "Component": ("fedjax_dp.components", "Component"),
    "component": ("fedjax_dp.components", "get"),
    "component_names": ("fedjax_dp.components", "names"),
    "load_plugins": ("fedjax_dp.components", "load_plugins"),
    "Round": ("fedjax_dp.round", "Round"),
    "Hooks": ("fedjax_dp.round", "Hooks"),
    "Piece": ("fedjax_dp.round", "Piece"),
    "ClientOut": ("fedjax_dp.round", "ClientOut"),
    "tree_sub": ("fedjax_dp.round", "tree_sub"),
    "Aggregator": ("fedjax_dp.aggregators", "Aggregator"),
    "mean": ("fedjax_dp.aggregators", "mean"),
    "local_sgd": ("fedjax_dp.client", "local_sgd"),
    "make_optimizer": ("fedjax_dp.client", "make_optimizer"),
    "clip_l2": ("fedjax_dp.transforms", "clip_l2"),
    "add_gaussian_noise": ("fedjax_dp.transforms", "add_gaussian_noise"),
    "global_norm": ("fedjax_dp.transforms", "global_norm"),
    "objectives": ("fedjax_dp.objectives", None),
    "aggregators": ("fedjax_dp.aggregators", None),
    "FederatedData": ("fedjax_dp.data", "FederatedData"),
    "Model": ("fedjax_dp.models", "Model"),
    "get_model": ("fedjax_dp.models", "get_model"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
  """A public name's object, its module imported on first use (start-up time: no JAX at
  ``import fedjax_dp``)."""
  if name not in _EXPORTS:
    raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")
  module, attribute = _EXPORTS[name]
  value = importlib.import_module(module)
  return value if attribute is None else getattr(value, attribute)


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
