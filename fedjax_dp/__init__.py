"""fedjax_dp: federated learning with differential privacy and Byzantine robustness in JAX.

The package import is light: submodules (and TensorFlow, which only the tfds
loader needs) are imported on use.
"""

__version__ = "0.1.0"


def __getattr__(name):
  # ``fedjax_dp.simulate`` without importing JAX at package import.
  if name == "simulate":
    from fedjax_dp.experiment import simulate
    return simulate
  raise AttributeError(f"module 'fedjax_dp' has no attribute {name!r}")
