"""Large populations and memory flat in the cohort, each case in its own process (clean peak RSS).

Cases (one JSON line each):

* ``synthetic``: 1,000,000 generated clients (``fedjax_dp.data.synthetic``),
  784-200-200-10 MLP, fixed cohorts of 100 and 1,000, host placement (the
  next cohort is generated and sent while a round runs): rounds per second
  and peak RSS.
* ``mnist``: real MNIST split into 60,000 single-example clients, cohorts of
  1,000, device placement against host placement in the same process: seconds
  per round and their ratio (host / device).
* ``chunk_memory``: XLA's own memory analysis of the compiled round (scratch
  bytes) at 50, 500 and 5,000 MLP clients per round, whole cohort against
  blocks of 50 (``--client-chunk 50``).

Example:
  python benchmarks/population.py --data-dir ../shared/data --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _seconds_per_round(config, data, placement: str, rounds: int) -> float:
  from fedjax_dp.algorithms import build
  from fedjax_dp.engine import Experiment, RunOptions, run
  setup = build(config, data)
  result = run(setup.program, Experiment(setup.hparams, data, setup.sampler), rounds,
               RunOptions(placement=placement, eval_every=rounds))
  return result.summary["diagnostics"]["seconds_per_round_after_first"]


def _config(**kw):
  from fedjax_dp.config import make_config
  base = dict(dataset="mnist", model="mlp", sampling="fixed", local_steps=5, batch_size=1,
              clip=0.5, noise_multiplier=1.0, target_epsilon=None)
  return make_config(**{**base, **kw})


def synthetic(rounds: int, cohort: int) -> dict:
  from fedjax_dp.data.synthetic import synthetic_population
  data = synthetic_population(1_000_000, examples=8)
  config = _config(num_clients=data.num_clients, cohort_size=cohort, batch_size=8)
  s = _seconds_per_round(config, data, "host", rounds)
  return {"case": "synthetic", "clients": data.num_clients, "cohort": cohort,
          "s_per_round": s, "rounds_per_s": 1 / s, "peak_rss_gb": _peak_rss_gb()}


def mnist(rounds: int, data_dir: str, cohort: int) -> dict:
  from fedjax_dp.experiment import load_data
  config = _config(num_clients=60_000, cohort_size=cohort, data_dir=data_dir)
  data = load_data(config)
  device = _seconds_per_round(config, data, "device", rounds)
  host = _seconds_per_round(config, data, "host", rounds)
  return {"case": "mnist", "clients": data.num_clients, "cohort": cohort,
          "device_s_per_round": device, "host_s_per_round": host,
          "host_over_device": host / device, "peak_rss_gb": _peak_rss_gb()}


def chunk_memory() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from fedjax_dp.algorithms import build
  from fedjax_dp.data import FederatedData
  from fedjax_dp.round import compiled_step
  population = 5000
  data = FederatedData("synthetic", np.zeros((population, 8, 28, 28, 1), np.float32),
                       np.zeros((population, 8), np.int32), np.full(population, 8, np.int32),
                       np.zeros((4, 28, 28, 1), np.float32), np.zeros(4, np.int32), 10)
  setup = build(_config(num_clients=population, cohort_size=50, batch_size=4, local_steps=2), data)
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  state = jax.eval_shape(lambda: setup.program.init(jax.random.PRNGKey(0), hp))
  arrays = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data.x, data.y, data.counts))
  out = {"case": "chunk_memory"}
  for chunk in (None, 50):
    for cohort in (50, 500, 5000):
      ids = jax.ShapeDtypeStruct((cohort,), jnp.int32)
      mask = jax.ShapeDtypeStruct((cohort,), jnp.float32)
      compiled = compiled_step(setup.program, "device", None, chunk).lower(
          state, hp, arrays, ids, mask, jax.random.PRNGKey(0)).compile()
      out[f"temp_mb_chunk{chunk}_cohort{cohort}"] = compiled.memory_analysis().temp_size_in_bytes / 2 ** 20
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data-dir", default=os.environ.get("FEDJAX_DP_DATA"))
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--case", help="run one case in this process (used by the driver)")
  p.add_argument("--cohort", type=int, default=1000)
  args = p.parse_args()
  if args.case:
    t0 = time.perf_counter()
    out = {"synthetic": lambda: synthetic(args.rounds, args.cohort),
           "mnist": lambda: mnist(args.rounds, args.data_dir, args.cohort),
           "chunk_memory": chunk_memory}[args.case]()
    out["wall_s"] = time.perf_counter() - t0
    print(json.dumps(out), flush=True)
    return
  cases = [("synthetic", 100), ("synthetic", 1000), ("chunk_memory", 0)]
  if args.data_dir and os.path.isdir(os.path.join(args.data_dir, "mnist")):
    cases.append(("mnist", 1000))
  for case, cohort in cases:
    cmd = [sys.executable, __file__, "--case", case, "--rounds", str(args.rounds),
           "--cohort", str(cohort)] + (["--data-dir", args.data_dir] if args.data_dir else [])
    subprocess.run(cmd, check=True)


if __name__ == "__main__":
  main()
