"""fedjax_dp: federated learning with differential privacy and Byzantine robustness in JAX.

The package import is light: submodules (and TensorFlow, which only the tfds
loader needs) are imported on use.
"""

__version__ = "0.1.0"
