"""What the robust aggregators' sort of a cohort's rows costs: the merge sort network
(:func:`fedjax_dp.aggregators.robust.sort_rows`, what they use) against XLA's comparison sort
(``jnp.sort(values, axis=0)``, the baseline), in the same process, and the coordinate median and
the geometric median built on it.

  python benchmarks/sort_rows.py --rows 30,100,1000 --columns 42310

For each number of rows ``n`` it sorts ``[n, columns]`` float32 normal draws both ways
(compiled, median of ``--repeats`` calls after one warm-up) and checks that the two agree; then
it times ``coordinate_median`` and ``geometric_median`` (20 Weiszfeld iterations at most) on
the same rows, once with each sort. Prints one JSON line per size: milliseconds per call of each
and the ratios of the network's times to the baseline's.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from round_speed import median_seconds

from fedjax_dp.aggregators import robust


def milliseconds(fn, *args, repeats: int) -> float:
  """The median time of a compiled call of ``fn(*args)``, after one warm-up call."""
  fn = jax.jit(fn)
  return 1000 * median_seconds(lambda: jax.block_until_ready(fn(*args)), repeats)


def measure(n: int, columns: int, repeats: int) -> dict:
  """The sorts and the medians of ``n`` rows of ``columns`` values."""
  values = jnp.asarray(np.random.default_rng(n).normal(size=(n, columns)), jnp.float32)
  mask = jnp.ones(n)
  assert bool(jnp.all(robust.sort_rows(values) == jnp.sort(values, axis=0)))
  out = {"rows": n, "columns": columns}
  network = robust.sort_rows
  for name, opts in (("sort", None), ("coordinate_median", {}),
                     ("geometric_median", {"gm_tol": 1e-5, "gm_max_iter": 20})):
    for sort in ("network", "xla_sort"):
      robust.sort_rows = network if sort == "network" else (lambda v: jnp.sort(v, axis=0))
      try:
        if opts is None:
          out[f"{name}_{sort}_ms"] = milliseconds(robust.sort_rows, values, repeats=repeats)
        else:
          agg = robust.get(name, static=opts)
          out[f"{name}_{sort}_ms"] = milliseconds(
              lambda v, m, agg=agg: agg.aggregate(v, m, m, agg.init(None), None)[0], values,
              mask, repeats=repeats)
      finally:
        robust.sort_rows = network
    out[f"{name}_ratio"] = out[f"{name}_network_ms"] / out[f"{name}_xla_sort_ms"]
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rows", default="30,100,1000", help="comma-separated cohort sizes")
  p.add_argument("--columns", type=int, default=42310,
                 help="values per row (42,310: the DP-RSA MLP's parameters)")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per case")
  args = p.parse_args(argv)
  for n in (int(s) for s in args.rows.split(",")):
    print(json.dumps(measure(n, args.columns, args.repeats)), flush=True)


if __name__ == "__main__":
  main()
