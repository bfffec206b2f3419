"""fedjax_dp: federated learning with differential privacy and Byzantine robustness in JAX.

The package import is light: submodules (and TensorFlow, which only the tfds
loader needs) are imported on use.
"""

from fedjax_dp._version import __version__

__all__ = ["__version__", "simulate"]


def __getattr__(name):
  # Lazy, for start-up time: ``fedjax_dp.simulate`` without importing JAX at package import.
  if name == "simulate":
    from fedjax_dp.experiment import simulate
    return simulate
  raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")
