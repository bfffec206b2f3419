"""Runs a preset list of round_speed measurements in one process, one JSON line each.

  python benchmarks/sweep.py --preset cpu --out results.jsonl
  python benchmarks/sweep.py --preset gpu --out results.jsonl   # an accelerator machine
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from round_speed import measure

PRESETS = {
    # (model, clients, local_steps, batch, conv_impl, skip_loop)
    "cpu": [("mlp", 10, 30, 64, "im2col", False), ("mlp", 50, 30, 64, "im2col", False),
            ("cnn2", 10, 30, 64, "im2col", False), ("cnn2", 50, 30, 64, "im2col", False)],
    "gpu": [("mlp", 10, 30, 64, "im2col", False), ("mlp", 50, 30, 64, "im2col", False),
            ("cnn2", 10, 30, 64, "im2col", False), ("cnn2", 50, 30, 64, "im2col", False),
            ("cnn2", 50, 30, 64, "lax", True), ("cnn2", 200, 30, 64, "im2col", True),
            ("cnn2", 200, 30, 64, "lax", True), ("mlp", 1000, 30, 64, "im2col", True),
            ("mlp", 5000, 30, 64, "im2col", True), ("cnn2", 500, 30, 64, "im2col", True)],
}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
  p.add_argument("--out", required=True)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  with open(args.out, "a") as f:
    for model, clients, q, batch, impl, skip in PRESETS[args.preset]:
      t0 = time.perf_counter()
      try:
        r = measure(model, clients, q, batch, 128, args.repeats, impl, skip)
      except Exception as e:  # record and go on: one failed size must not lose the rest
        r = {"model": model, "clients": clients, "conv_impl": impl, "error": repr(e)[:500]}
      r["wall_s"] = time.perf_counter() - t0
      print(json.dumps(r), flush=True)
      f.write(json.dumps(r) + "\n")
      f.flush()


if __name__ == "__main__":
  sys.exit(main())
