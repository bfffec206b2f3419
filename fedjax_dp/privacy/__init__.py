"""Privacy mechanisms, the dp_accounting ledger and noise calibration.

What a notebook or a hand-built round uses, importable as ``fedjax_dp.privacy``:

* user-level DP: :class:`GaussianSumMechanism` (a clipped sum with Gaussian noise),
  :class:`CohortSampling`, :class:`NonPrivate`, :func:`calibrate_noise_multiplier` (target
  epsilon -> noise multiplier), :func:`epsilon_for` (epsilon of a composed ``DpEvent``),
  :class:`PrivacyLedger`, :func:`make_accountant`;
* DP-RSA's sign mechanisms (Zhu and Ling, IJCAI 2022; worker-level, replace-one):
  :func:`keep_prob_for_epsilon` and :func:`epsilon_of_keep_prob` (Sign-Flipping's keep
  probability gamma and its per-coordinate epsilon ``ln(gamma / (1 - gamma))``),
  :func:`sign_gaussian_sigma_for_epsilon`, :class:`SignFlipMechanism`,
  :class:`SignGaussianMechanism` and :func:`composed_epsilon` (a whole run's epsilon: ``d``
  coordinates times ``T`` rounds);
* the choices: :data:`ACCOUNTANTS`, :data:`RELATIONS` (neighbouring relations),
  :data:`SAMPLINGS`.

The sign mechanisms' names (:data:`_SIGN`) import their module, and so JAX, the first time one
is read: the processes that compute epsilons ahead (:mod:`fedjax_dp.privacy.ahead`) import this
package without JAX.
"""

import importlib

from fedjax_dp.privacy.ledger import ACCOUNTANTS, PrivacyLedger, epsilon_for, make_accountant
from fedjax_dp.privacy.mechanisms import (
    RELATIONS,
    CohortSampling,
    GaussianSumMechanism,
    NonPrivate,
    calibrate_noise_multiplier,
)
from fedjax_dp.privacy.randomized_response import epsilon_of_keep_prob, keep_prob_for_epsilon
from fedjax_dp.sampling import SAMPLINGS

# Names of fedjax_dp.privacy.sign, read from it on first use.
_SIGN = ("SignFlipMechanism", "SignGaussianMechanism", "composed_epsilon",
         "sign_gaussian_sigma_for_epsilon")

__all__ = [
    "ACCOUNTANTS",
    "RELATIONS",
    "SAMPLINGS",
    "CohortSampling",
    "GaussianSumMechanism",
    "NonPrivate",
    "PrivacyLedger",
    "SignFlipMechanism",
    "SignGaussianMechanism",
    "calibrate_noise_multiplier",
    "composed_epsilon",
    "epsilon_for",
    "epsilon_of_keep_prob",
    "keep_prob_for_epsilon",
    "make_accountant",
    "sign_gaussian_sigma_for_epsilon",
]


def __getattr__(name):
  """A sign mechanism's name of :data:`_SIGN`, its module imported on first use."""
  if name not in _SIGN:
    raise AttributeError(f"module 'fedjax_dp.privacy' has no attribute {name!r}")
  return getattr(importlib.import_module("fedjax_dp.privacy.sign"), name)


def __dir__():
  return sorted(set(globals()) | set(_SIGN))
