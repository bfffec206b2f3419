"""Seconds to calibrate DP-FedAvg's noise multiplier to a target epsilon with the PLD accountant.

For each setting (target epsilon, rounds, Poisson sampling probability; delta 1e-5) one JSON
line compares, in the same process, the library's search
(:func:`fedjax_dp.privacy.mechanisms.calibrate`: a coarse grid first, then checked and moved
on the ledger's grid) against the same search on the ledger's grid alone (``coarse_first=False``:
halving from 1, then ``dp_accounting.calibrate_dp_mechanism``, the search before the coarse
grid was added). Both answers are checked with the ledger's accountant: each meets the target,
and ``answer - 1e-4`` of the library's does not.

Example:
  python benchmarks/calibration_speed.py
"""

from __future__ import annotations

import argparse
import json
import time

from fedjax_dp.privacy.ledger import epsilon_for
from fedjax_dp.privacy.mechanisms import calibrate, gaussian_round_event

# (target epsilon, rounds, sampling probability): the quickstart's (8, 50, 0.1) and others.
SETTINGS = [(8.0, 50, 0.1), (1.0, 50, 0.1), (30.0, 50, 0.1), (4.0, 300, 0.01), (4.0, 300, 0.1)]
TINY = [(4.0, 20, 0.1)]
DELTA = 1e-5


def measure(target: float, rounds: int, q: float) -> dict:
  def event(z):
    return gaussian_round_event(z, "poisson", q)

  t = time.perf_counter()
  z = calibrate(event, rounds, "add_remove", target, DELTA, "pld")
  library_s = time.perf_counter() - t
  t = time.perf_counter()
  z_base = calibrate(event, rounds, "add_remove", target, DELTA, "pld", coarse_first=False)
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
