"""fedjax_dp: federated learning with differential privacy and Byzantine robustness in JAX.

The public API is what a user calls and extends, importable from ``fedjax_dp`` alone
(:data:`__all__`):

* running: :func:`simulate`, the :mod:`sweep` module (``fedjax_dp.sweep.sweep``),
  :class:`RunConfig` and :func:`make_config` (a configuration with its algorithm's and data
  set's defaults), :class:`RunOptions`, :class:`RunResult`, :class:`Observer`;
* declaring components: :func:`declare`, :class:`Option`, :class:`Component`, :func:`component`
  (a declared component by kind and name), :func:`component_names`, :func:`load_plugins`;
* writing a round: :class:`Round`, its :class:`Hooks`, :class:`Piece`, :class:`ClientOut`,
  :func:`tree_sub`, :class:`Aggregator`, :func:`mean`, :func:`local_sgd`,
  :func:`make_optimizer`, the client transforms (:func:`clip_l2`, :func:`add_gaussian_noise`,
  :func:`global_norm`, :func:`sparsify_by_utility`, :func:`sign_flip`, :func:`sign_gaussian`)
  and the :mod:`objectives`, :mod:`aggregators` and :mod:`attacks` modules;
* privacy: the :mod:`privacy` module (noise calibration, epsilon of a mechanism, the sign
  mechanisms' randomized response) and :func:`spfl_classes` (SP-FL's clients by privacy class);
* data and models: :class:`FederatedData`, :func:`load_data`, :class:`Model`, :func:`get_model`,
  :func:`make_evaluator`;
* figures: the :mod:`plots` module.

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
    "make_config": ("fedjax_dp.config", "make_config"),
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
    "sparsify_by_utility": ("fedjax_dp.transforms", "sparsify_by_utility"),
    "sign_flip": ("fedjax_dp.transforms.sign", "sign_flip"),
    "sign_gaussian": ("fedjax_dp.transforms.sign", "sign_gaussian"),
    "objectives": ("fedjax_dp.objectives", None),
    "aggregators": ("fedjax_dp.aggregators", None),
    "attacks": ("fedjax_dp.attacks", None),
    "privacy": ("fedjax_dp.privacy", None),
    "spfl_classes": ("fedjax_dp.algorithms.spfl", "spfl_classes"),
    "FederatedData": ("fedjax_dp.data", "FederatedData"),
    "load_data": ("fedjax_dp.experiment", "load_data"),
    "Model": ("fedjax_dp.models", "Model"),
    "get_model": ("fedjax_dp.models", "get_model"),
    "make_evaluator": ("fedjax_dp.engine", "make_evaluator"),
    "plots": ("fedjax_dp.plots", None),
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
