"""Privacy mechanisms, the dp_accounting ledger and noise calibration."""

from fedjax_dp.privacy.ledger import ACCOUNTANTS, PrivacyLedger, epsilon_for, make_accountant
from fedjax_dp.privacy.mechanisms import (
    RELATIONS,
    CohortSampling,
    GaussianSumMechanism,
    NonPrivate,
    calibrate_noise_multiplier,
)
from fedjax_dp.sampling import SAMPLINGS

__all__ = [
    "ACCOUNTANTS",
    "RELATIONS",
    "SAMPLINGS",
    "CohortSampling",
    "GaussianSumMechanism",
    "NonPrivate",
    "PrivacyLedger",
    "calibrate_noise_multiplier",
    "epsilon_for",
    "make_accountant",
]
