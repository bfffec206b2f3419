"""Rounds per second of a PLD run whose accounting sets the pace, with and without workers.

``--case user``: a run on the quickstart's data (digits, DP-FedAvg, Poisson q = 0.1, a fixed
noise multiplier) with a round that takes milliseconds (the MLP, one local step), as a round
on an accelerator does, so the per-round PLD epsilon is most of each round. ``--case
example``: client-side DP-SGD (``dp-fl``) with Poisson batches on digits split by a
Dirichlet(1) partition into 100 clients of 4-29 examples, 20 a round: a ledger per client,
and each report asks for the epsilons of the clients whose participation changed. The same
run is timed in the same process with ``accounting_workers`` 0 (every epsilon in the run's
process: the baseline) and with each count of ``--workers``
(:mod:`fedjax_dp.privacy.ahead`); every run's per-round epsilons are checked equal to the
baseline's, and the ledger's memo of epsilons is emptied before each run.

Prints one JSON line per worker count: seconds in all and per round after the first (the
first compiles the round; the workers start meanwhile) and the ratios to the baseline.

Example:
  python benchmarks/accounting_speed.py --rounds 200 --workers 1,2
  python benchmarks/accounting_speed.py --case example --rounds 10 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os

from fedjax_dp.config import make_config
from fedjax_dp.experiment import load_data, simulate
from fedjax_dp.privacy import ledger


CASES = {
    "user": dict(model="mlp", local_steps=1),
    "example": dict(algorithm="dp-fl", options={"example_sampling": "poisson"}, num_clients=100,
                    partition="dirichlet", dirichlet_alpha=1.0, sampling="fixed",
                    cohort_size=20, batch_size=2, local_steps=2),
}


def measure(rounds: int, workers, case: str = "user") -> list:
  config = make_config(rounds=rounds, eval_every=rounds, accountant="pld", noise_multiplier=1.0,
                       target_epsilon=None, **CASES[case])
  data = load_data(config)
  lines, base = [], None
  for w in [0, *workers]:
    ledger._composed_epsilon.cache_clear()  # no run reads an epsilon an earlier one computed
    res = simulate(config.replace(accounting_workers=w), data)
    diag = res.summary["diagnostics"]
    row = {"case": case, "rounds": rounds, "accounting_workers": w, "cpu_count": os.cpu_count(),
           "seconds_total": diag["seconds_total"],
           "seconds_per_round_after_first": diag["seconds_per_round_after_first"],
           "final_epsilon": res.summary["epsilon"]}
    epsilons = [{k: v for k, v in r.items() if k.startswith("epsilon")} for r in res.history]
    if base is None:
      base = (row, epsilons)
    else:
      row.update(same_epsilons_as_baseline=epsilons == base[1],
                 baseline_over_this_total=base[0]["seconds_total"] / row["seconds_total"],
                 baseline_over_this_per_round=(base[0]["seconds_per_round_after_first"]
                                               / row["seconds_per_round_after_first"]))
    lines.append(row)
  return lines


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--case", choices=tuple(CASES), default="user",
                 help="user: a user-level run, epsilons ahead of the rounds; example: an "
                 "example-level run, its clients' epsilons in parallel (default user)")
  p.add_argument("--rounds", type=int, default=200)
  p.add_argument("--workers", default="1,2",
                 help="comma-separated worker counts to time against none (default 1,2)")
  args = p.parse_args(argv)
  for line in measure(args.rounds, [int(w) for w in args.workers.split(",")], args.case):
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
