"""How long a new process waits for its first round: the quickstart run without JAX's persistent
compilation cache, with it empty (the first run on a machine) and with it warm (every run after).

  python benchmarks/first_round.py --repeats 3 --out benchmarks/results/cpu_first_round.jsonl

Each case runs ``fedjax-dp run --rounds R`` (the quickstart: DP-FedAvg on the bundled digits) in a
process of its own, ``repeats`` times, in this order: no cache, empty cache, warm cache. A line
of ``--out`` is one process: the case, its wall time (start to exit, JAX's import included), the
first round's and the median later round's seconds (``metrics.jsonl``'s diagnostics) and the
final parameters' ``params_sha256``, which is the same in every case. The last lines printed
are the Markdown table of ``benchmarks/RESULTS.md`` (medians over the repeats, and each case's
ratio to the run without the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("no cache", "empty cache", "warm cache")


def one(case: str, cache: pathlib.Path, out: pathlib.Path, rounds: int) -> dict:
  """Runs the quickstart once in a new process; returns its line."""
  env = dict(os.environ, FEDJAX_DP_JAX_CACHE="off" if case == "no cache" else str(cache))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  began = time.perf_counter()
  subprocess.run([sys.executable, "-m", "fedjax_dp.console", "run", "--rounds", str(rounds),
                  "--no-progress", "--output-dir", str(out), "--overwrite"],
                 env=env, check=True, capture_output=True)
  wall = time.perf_counter() - began
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  seconds = [r["diagnostics"]["seconds"] for r in rows]
  summary = json.loads((out / "summary.json").read_text())
  return {"case": case, "rounds": rounds, "wall_s": wall, "first_round_s": seconds[0],
          "later_round_s": statistics.median(seconds[1:]),
          "params_sha256": summary["params_sha256"]}


def table(lines: list) -> str:
  """The Markdown table of ``lines`` (medians per case)."""
  med = {c: {k: statistics.median(l[k] for l in lines if l["case"] == c)
             for k in ("wall_s", "first_round_s", "later_round_s")} for c in CASES}
  out = ["| case | process wall s | first round s | later round s | wall / no cache |",
         "|---|---|---|---|---|"]
  for c in CASES:
    m = med[c]
    out.append(f"| {c} | {m['wall_s']:.1f} | {m['first_round_s']:.2f} | "
               f"{m['later_round_s']:.3f} | {m['wall_s'] / med['no cache']['wall_s']:.2f} |")
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--out", type=pathlib.Path, required=True)
  args = p.parse_args(argv)
  lines = []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.repeats):
      cache = pathlib.Path(tmp, f"cache{r}")  # empty for this repeat's "empty cache" run
      for case in CASES:
        line = one(case, cache, pathlib.Path(tmp, "run"), args.rounds)
        lines.append(line)
        print(json.dumps(line), flush=True)
  shas = {line["params_sha256"] for line in lines}
  if len(shas) != 1:
    print(f"the cases' parameters differ: {sorted(shas)}", file=sys.stderr)
    return 1
  args.out.parent.mkdir(parents=True, exist_ok=True)
  args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
  print(table(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
