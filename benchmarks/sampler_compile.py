"""What the discrete Gaussian sampler's last retry buffer costs in compilation and in time: the
sampler with its final buffer a 64th of the coordinates (``RETRY_SHARE``, the default) against
one of ``RETRY_FINAL`` = 32 coordinates at any size (the baseline), in the same process.

  python benchmarks/sampler_compile.py --sizes 200000,2000000

Each case compiles ``jax.jit(discrete_gaussian)`` for ``n`` coordinates at sigma 6 (fresh, without
JAX's persistent compilation cache) and times the compiled sampler (median of ``--repeats``
calls after one warm-up). Prints one JSON line per size and case: the number of buffers (each a
compiled round of proposals of its own), the compile seconds, the milliseconds per call and
the ratios of the default to the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax

from fedjax_dp.transforms import discrete

DEFAULT_SHARE = discrete.RETRY_SHARE


def measure(n: int, share: int, repeats: int) -> dict:
  """Compiles and times the sampler for ``n`` coordinates with ``RETRY_SHARE = share``."""
  discrete.RETRY_SHARE = share
  try:
    fn = jax.jit(lambda key: discrete.discrete_gaussian(key, (n,), 6.0))
    began = time.perf_counter()
    compiled = fn.lower(jax.random.PRNGKey(0)).compile()
    compile_s = time.perf_counter() - began
    jax.block_until_ready(compiled(jax.random.PRNGKey(0)))
    times = []
    for i in range(repeats):
      began = time.perf_counter()
      jax.block_until_ready(compiled(jax.random.PRNGKey(i + 1)))
      times.append(time.perf_counter() - began)
    return {"buffers": len(discrete._buffer_sizes(n)), "compile_s": compile_s,
            "ms_per_call": 1000 * statistics.median(times)}
  finally:
    discrete.RETRY_SHARE = DEFAULT_SHARE


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="200000,2000000", help="comma-separated coordinate counts")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per case")
  args = p.parse_args(argv)
  jax.config.update("jax_enable_compilation_cache", False)
  for n in (int(s) for s in args.sizes.split(",")):
    # A share of n makes the final buffer RETRY_FINAL at this size: the baseline.
    base = measure(n, n, args.repeats)
    new = measure(n, DEFAULT_SHARE, args.repeats)
    print(json.dumps({"n": n, "baseline": base, "default": new,
                      "compile_ratio": new["compile_s"] / base["compile_s"],
                      "time_ratio": new["ms_per_call"] / base["ms_per_call"]}), flush=True)


if __name__ == "__main__":
  main()
