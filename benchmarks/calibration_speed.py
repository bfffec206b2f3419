"""Seconds to calibrate DP-FedAvg's noise multiplier to a target epsilon with the PLD accountant.

For each setting (target epsilon, rounds, Poisson sampling probability; delta 1e-5) one JSON
line compares, in the same process, the library's search
(:func:`fedjax_dp.privacy.mechanisms.calibrate`: a coarse grid first, then checked and moved
on the ledger's grid) against ``dp_accounting.calibrate_dp_mechanism`` run on the ledger's grid
alone from the same bracket search (halving from 1, as the library's first stage does). Both
answers are checked with the ledger's accountant: each meets the target, and ``answer - 1e-4``
of the library's does not.

Example:
  python benchmarks/calibration_speed.py
"""

from __future__ import annotations

import argparse
import json
import time

import dp_accounting

from fedjax_dp.privacy.ledger import epsilon_for, make_accountant
from fedjax_dp.privacy.mechanisms import calibrate, gaussian_round_event

# (target epsilon, rounds, sampling probability): the quickstart's (8, 50, 0.1) and others.
SETTINGS = [(8.0, 50, 0.1), (1.0, 50, 0.1), (30.0, 50, 0.1), (4.0, 300, 0.01), (4.0, 300, 0.1)]
TINY = [(4.0, 20, 0.1)]
DELTA = 1e-5


def ledger_grid_only(event, rounds: int, target: float) -> float:
  """dp_accounting's search on the ledger's grid, bracketed by halving from 1 (floor 0.1)."""
  calib = dp_accounting.mechanism_calibration

  def composed(z):
    return dp_accounting.SelfComposedDpEvent(event(z), rounds)

  def meets(z):
    return epsilon_for(event(z), rounds, DELTA, "pld") <= target

  if not meets(1.0):
    bracket = calib.LowerEndpointAndGuess(1.0, 2.0)
  else:
    hi, lo = 1.0, 0.5
    while lo > 0.1 and meets(lo):
      hi, lo = lo, lo / 2
    bracket = calib.ExplicitBracketInterval(max(lo, 0.1), hi)
  return float(dp_accounting.calibrate_dp_mechanism(
      lambda: make_accountant("pld"), composed, target, DELTA, bracket, tol=1e-4))


def measure(target: float, rounds: int, q: float) -> dict:
  def event(z):
    return gaussian_round_event(z, "poisson", q)

  t = time.perf_counter()
  z = calibrate(event, rounds, "add_remove", target, DELTA, "pld")
  library_s = time.perf_counter() - t
  t = time.perf_counter()
  z_base = ledger_grid_only(event, rounds, target)
  base_s = time.perf_counter() - t
  return {"target_epsilon": target, "rounds": rounds, "sampling_prob": q, "delta": DELTA,
          "noise_multiplier": z, "noise_multiplier_ledger_grid_only": z_base,
          "epsilon": epsilon_for(event(z), rounds, DELTA, "pld"),
          "epsilon_ledger_grid_only": epsilon_for(event(z_base), rounds, DELTA, "pld"),
          "epsilon_at_minus_1e-4": epsilon_for(event(z - 1e-4), rounds, DELTA, "pld"),
          "library_s": library_s, "ledger_grid_only_s": base_s,
          "ledger_grid_only_over_library": base_s / library_s}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tiny", action="store_true", help="one small setting (the tests' size)")
  args = p.parse_args(argv)
  for setting in TINY if args.tiny else SETTINGS:
    print(json.dumps(measure(*setting)), flush=True)


if __name__ == "__main__":
  main()
