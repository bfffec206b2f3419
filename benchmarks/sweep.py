"""Runs a preset list of round_speed measurements in one process, one JSON line each.

  python benchmarks/sweep.py --preset cpu --out results.jsonl
  python benchmarks/sweep.py --preset gpu --out results.jsonl   # an accelerator machine
  python benchmarks/sweep.py --table results.jsonl               # Markdown table of a sweep
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from round_speed import measure

PRESETS = {
    # (model, clients, local_steps, batch, conv_impl, skip_loop[, client_chunk])
    # cnn2 with 50 clients x 30 steps takes about 3 minutes a round on 2 CPU cores: left to "gpu".
    "cpu": [("mlp", 10, 30, 64, "im2col", False), ("mlp", 50, 30, 64, "im2col", False),
            ("cnn2", 10, 30, 64, "im2col", False)],
    "gpu": [("mlp", 10, 30, 64, "im2col", False), ("mlp", 50, 30, 64, "im2col", False),
            ("cnn2", 10, 30, 64, "im2col", False), ("cnn2", 50, 30, 64, "im2col", False),
            ("cnn2", 50, 30, 64, "lax", True), ("cnn2", 200, 30, 64, "im2col", True),
            ("cnn2", 200, 30, 64, "lax", True), ("mlp", 1000, 30, 64, "im2col", True),
            ("mlp", 5000, 30, 64, "im2col", True), ("cnn2", 500, 30, 64, "im2col", True)],
    # Client blocks on a CPU: blocks small enough that a block's models and gradients stay in
    # the core's cache (the MLP is 0.8 MB a client, the 2 MB L2 holds about two models).
    "cpu-chunk": [("mlp", 50, 30, 64, "im2col", True, None), ("mlp", 50, 30, 64, "im2col", True, 1),
                  ("mlp", 50, 30, 64, "im2col", True, 2), ("mlp", 50, 30, 64, "im2col", True, 5),
                  ("mlp", 10, 30, 64, "im2col", True, 2)],
}


def _fmt(v, spec):
  return "-" if v is None else format(v, spec)


def table(path: str) -> str:
  """A Markdown table of the JSON lines in ``path``."""
  lines = ["| model | clients/round | conv | client chunk | engine s/round | loop s/round | centralized s/round "
           "| loop / engine | engine / centralized | client steps/s | process peak RSS GB (so far) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for line in open(path):
    r = json.loads(line)
    if "error" in r:
      lines.append(f"| {r['model']} | {r['clients']} | {r['conv_impl']} | {_fmt(r.get('chunk'), '')} "
                   f"| failed: {r['error'][:60]} |||||||")
      continue
    lines.append(
        f"| {r['model']} | {r['clients']} | {r['conv_impl']} | {_fmt(r.get('chunk'), '')} "
        f"| {_fmt(r['engine_s_per_round'], '.4f')} "
        f"| {_fmt(r.get('loop_s_per_round'), '.4f')} | {_fmt(r['centralized_s_per_round'], '.4f')} "
        f"| {_fmt(r.get('loop_over_engine'), '.2f')} | {_fmt(r['engine_over_centralized'], '.2f')} "
        f"| {_fmt(r['client_steps_per_s'], ',.0f')} | {_fmt(r['peak_rss_gb'], '.1f')} |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
  p.add_argument("--out", help="append one JSON line per measurement here")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--table", metavar="JSONL", help="print a Markdown table of a finished sweep and exit")
  args = p.parse_args(argv)
  if args.table:
    print(table(args.table))
    return 0
  if not args.out:
    p.error("--out is required to run a sweep")
  with open(args.out, "a") as f:
    for model, clients, q, batch, impl, skip, *chunk in PRESETS[args.preset]:
      chunk = chunk[0] if chunk else None
      t0 = time.perf_counter()
      try:
        r = measure(model, clients, q, batch, 128, args.repeats, impl, skip, chunk=chunk)
      except Exception as e:  # record and go on: one failed size must not lose the rest
        r = {"model": model, "clients": clients, "conv_impl": impl, "chunk": chunk,
             "error": repr(e)[:500]}
      r["wall_s"] = time.perf_counter() - t0
      print(json.dumps(r), flush=True)
      f.write(json.dumps(r) + "\n")
      f.flush()


if __name__ == "__main__":
  sys.exit(main())
