"""How far the ledger's claim for sampling without replacement is above the exact epsilon of the
worst-case pair, one round: the most any audit of such a mechanism can show, over its claim.

  python benchmarks/wor_claims.py

The claim is dp_accounting's RDP bound for ``SampledWithoutReplacementDpEvent(n, m,
GaussianDpEvent(z / 2))`` under replace-one (what the ledger composes for fixed cohorts and
fixed-size batches). The worst-case pair puts every other member of the population on the
anti-canary's side, so that the canary moves the sum by twice the clip bound with probability
``m / n`` (``fedjax_dp.audit._crowd_signal``); its exact epsilon is
``fedjax_dp.lower_bounds.Family(m / n).epsilon(2 / z, delta)``. Prints the Markdown table of
``docs/how-to/audits.md``: the exact epsilon over the claim, per cohort and noise multiplier.
"""

from __future__ import annotations

import argparse

import dp_accounting

from fedjax_dp.lower_bounds import Family

COHORTS = ((6, 8), (4, 8), (2, 8))
NOISES = (1.5, 2.0, 3.0, 4.0, 6.0)


def claim(n: int, m: int, z: float, delta: float) -> float:
  """The ledger's one-round RDP epsilon for a cohort of ``m`` of ``n`` at noise multiplier ``z``."""
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
      n, m, dp_accounting.GaussianDpEvent(z / 2.0)))
  return float(acc.get_epsilon(delta))


def exact(n: int, m: int, z: float, delta: float) -> float:
  """The exact epsilon of the worst-case pair (the add/remove family with signal ``2 / z``)."""
  return Family(m / n).epsilon(2.0 / z, delta)


def table(cohorts=COHORTS, noises=NOISES, delta: float = 1e-5) -> str:
  """The Markdown table of exact over claim, one row per ``(m, n)`` of ``cohorts``."""
  out = ["| cohort / population | " + " | ".join(f"z = {z:g}" for z in noises) + " |",
         "|---" * (len(noises) + 1) + "|"]
  for m, n in cohorts:
    ratios = [exact(n, m, z, delta) / claim(n, m, z, delta) for z in noises]
    out.append(f"| {m} / {n} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
  return "\n".join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--delta", type=float, default=1e-5)
  args = parser.parse_args(argv)
  print(table(delta=args.delta))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
