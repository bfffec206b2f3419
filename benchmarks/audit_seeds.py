"""Audits every mechanism with a guarantee over many seeds at its nominal noise: no lower bound
may exceed its claim, and the largest ratio of bound to claim says how close the audits come.

  python benchmarks/audit_seeds.py --seeds 20 --out benchmarks/results/audit_seeds.jsonl

Each line of ``--out`` is one audit (mechanism, seed, both bounds, the claim); an audit whose
mechanism and seed ``--out`` already holds is not run again (so an interrupted run, or more
seeds, continues the file), and the table covers every line of ``--out``. The last printed
lines are the Markdown table of ``benchmarks/RESULTS.md`` (per mechanism: seeds, the largest and
the mean ratio of each bound to the claim, violations). ``--table FILE`` prints the table of a
finished file.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from fedjax_dp import audit


def rows(path: pathlib.Path) -> list:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(results: list) -> str:
  """The Markdown table of ``results`` (the lines :func:`main` writes)."""
  out = ["| mechanism | seeds | trials | largest bound / claim | mean bound / claim | "
         "largest threshold bound / claim | violations |", "|---|---|---|---|---|---|---|"]
  for name in dict.fromkeys(r["mechanism"] for r in results):
    mine = [r for r in results if r["mechanism"] == name]
    ratio = [r["epsilon_lower_bound"] / r["epsilon_claimed"] for r in mine]
    free = [r["epsilon_lower_bound_threshold"] / r["epsilon_claimed"] for r in mine]
    bad = sum(bool(r["violations"]) for r in mine)
    out.append(f"| `{name}` | {len(mine)} | {mine[0]['trials']:,} | {max(ratio):.3f} | "
               f"{sum(ratio) / len(ratio):.3f} | {max(free):.3f} | {bad} |")
  return "\n".join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=20)
  parser.add_argument("--trials", type=int, help="default: each mechanism's")
  parser.add_argument("--mechanisms", help="comma-separated (default: every one with a guarantee)")
  parser.add_argument("--out", type=pathlib.Path, help="append one JSON line per audit")
  parser.add_argument("--table", type=pathlib.Path, help="print the table of a finished --out")
  args = parser.parse_args(argv)
  if args.table:
    print(table(rows(args.table)))
    return 0
  names = (args.mechanisms.split(",") if args.mechanisms else
           [k for k, a in audit.AUDITS.items() if a.formal])
  results = rows(args.out) if args.out and args.out.is_file() else []
  done = {(r["mechanism"], r["seed"]) for r in results}
  for name in names:
    for seed in range(args.seeds):
      if (name, seed) in done:
        continue
      rep = audit.audit(name, args.trials, seed)
      line = {k: rep[k] for k in ("mechanism", "seed", "trials", "epsilon_lower_bound",
                                  "epsilon_lower_bound_threshold", "epsilon_claimed", "seconds")}
      line["violations"] = [n for n, _ in audit.violations(rep)]
      results.append(line)
      if args.out:
        with args.out.open("a") as f:
          f.write(json.dumps(line) + "\n")
      print(json.dumps(line), flush=True)
  print(table(results))
  return 1 if any(r["violations"] for r in results) else 0


if __name__ == "__main__":
  sys.exit(main())
