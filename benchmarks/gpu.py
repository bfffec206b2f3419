"""Client steps per second on an accelerator: float32 against bfloat16, and a vmapped sweep.

One prepared run, one JSON line per measurement (printed as each ends, so a run
stopped early keeps what it finished):

* ``round``: DP-FedAvg rounds of the engine (``round_speed.measure``, engine
  only) for CNN-2-layers (``cnn2``, Q = 30, batch 64) and ResNet-18-GN
  (``resnet18_gn``, 32x32x3, Q = 5, batch 32, in blocks of 50 clients) at 100
  and 1,000 clients per round, each with ``--compute-dtype`` float32 and
  bfloat16, and ``cnn2`` at 100 clients with ``--conv-impl winograd`` and
  ``lax`` (float32; the default, ``auto``, is im2col on accelerators: these
  two lines say whether Winograd, the fastest on a CPU, or XLA's own
  convolution beats it there);
* ``sweep``: 8 experiments (clip x noise multiplier) of ``cnn2`` at 100
  clients per round as one vmapped program (:func:`fedjax_dp.sweep.sweep`),
  timed after a one-round run that compiles it;
* ``padded``: ``cnn2`` at Cheng et al.'s Table 2 setting (Q = 30, batch 50, 100
  examples per client) in a cohort of 47 slots of which 30 are real clients (a
  Poisson cohort of p = 0.06 of 500 padded as the reproduction pads it), the
  whole cohort in one vmap (the accelerators' default, which computes the padded
  slots) against blocks of 10 clients (blocks of padded slots only are skipped);
* ``accounting``: 100 rounds of a PLD run whose round takes milliseconds
  (``accounting_speed.measure``) with no accounting workers and with the
  automatic number (:func:`fedjax_dp.privacy.ahead.workers_for`: one per core but
  one, at most 8);
* ``table2`` (only with ``--table2``): Cheng et al.'s Table 2 with CNN-2-layers at one of its
  epsilons, as ``fedjax-dp reproduce cheng2022 --scale cifar`` runs it (4 alphas x 5 methods,
  FedAvg and the 4 columns, x 3 seeds: 60 runs of Q = 30, batch 50, p = 0.06 of 500 clients,
  grouped into sweeps by the reproduction's runner), on random data of CIFAR-10's shapes (500
  clients of 100 examples, 10,000 test images), at a few of its 300 rounds: cold (compiling)
  at R1 rounds, a first run at R2 rounds (its noise calibrated), then warm at R1 and R2 rounds
  (evaluating once, at the end) and at R2 rounds evaluating every round; the 300-round time is
  extrapolated as ``cold(R1) + round (300 - R1) + evaluation (300 / 20 - 1)``, with ``round =
  (warm(R2) - warm(R1)) / (R2 - R1)`` and ``evaluation`` the R2 - 1 extra evaluations' time
  (Table 2 evaluates every 20 rounds).

Inputs are random (``round_speed.synthetic_data``); speed does not depend on
pixel values. ``--tiny`` runs the same code paths with small models
(``digits_cnn`` in place of ``cnn2``; an 8-unit MLP in place of ResNet-18-GN,
whose 20 layers take over a minute to compile on a CPU at any width) and 2
clients, in about a minute on a CPU.

  python benchmarks/gpu.py > h200_gpu.jsonl        # one H200: about 10 minutes
  python benchmarks/gpu.py --only-table2           # Table 2 alone
  python benchmarks/gpu.py --tiny --table2         # the smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional

from accounting_speed import measure as measure_accounting
from round_speed import measure, synthetic_data

from fedjax_dp.config import make_config
from fedjax_dp.models import get_model
from fedjax_dp.reproduce.runner import Execution
from fedjax_dp.sweep import sweep

DTYPES = ("float32", "bfloat16")
SWEEP_GRID = {"clip": [0.25, 0.5, 1.0, 2.0], "noise_multiplier": [0.5, 1.0]}  # 8 experiments


def plan(tiny: bool) -> dict:
  """The sizes: models with their (local steps, batch, examples per client, clients per block),
  the cohort sizes, repeats and the sweep's rounds."""
  if tiny:  # compiling is most of a CPU's time: small, shallow models and one cohort size
    mlp = get_model("mlp", (8, 8, 1), 10, hidden=(8,))
    return {"models": [(get_model("digits_cnn", (8, 8, 1), 10), 1, 2, 4, None),
                       (mlp, 1, 2, 4, 1)], "clients": (2,), "repeats": 1,
            "sweep": (mlp, 2, 1, 2, 4), "accounting_rounds": 3,
            "padded": (get_model("digits_cnn", (8, 8, 1), 10), 1, 2, 4, 5, 2, 2)}
  return {"models": [("cnn2", 30, 64, 128, 500), ("resnet18_gn", 5, 32, 64, 50)],
          "clients": (100, 1000), "repeats": 2, "sweep": ("cnn2", 100, 3, 30, 64),
          "accounting_rounds": 100, "padded": ("cnn2", 30, 50, 100, 47, 30, 10)}


def measure_sweep(model, clients: int, rounds: int, local_steps: int, batch: int) -> dict:
  """Seconds of ``rounds`` rounds of the 8-experiment sweep, after a one-round run compiles it."""
  config = make_config(model=model, num_clients=clients, sampling="fixed", cohort_size=clients,
                       local_steps=local_steps, batch_size=batch, noise_multiplier=1.0,
                       target_epsilon=None, client_lr=0.01, rounds=1, eval_every=1)

  def load(c):
    return synthetic_data(model, clients, 2 * batch, seed=c.seed)

  t0 = time.perf_counter()
  sweep(config, SWEEP_GRID, load=load)
  first_s = time.perf_counter() - t0
  done = sweep(config.replace(rounds=rounds, eval_every=rounds), SWEEP_GRID, load=load)
  experiments = len(done.points)
  return {"kind": "sweep", "model": getattr(model, "name", model), "experiments": experiments,
          "programs": len(done.groups), "clients": clients, "local_steps": local_steps,
          "batch": batch, "rounds": rounds, "compile_and_one_round_s": first_s,
          "seconds": done.seconds,
          "client_steps_per_s": experiments * rounds * clients * local_steps / done.seconds}


def measure_table2(tiny: bool) -> dict:
  """The ``table2`` record (module docstring): seconds of the cold and warm runs and the
  extrapolated 300-round time of the Table 2 reproduction's ``cnn2`` half."""
  import tempfile
  from fedjax_dp.reproduce import cheng2022
  if tiny:  # digits-sized images, 10 clients, one alpha
    base, model, alphas, shape, examples, tests = ("tiny-cifar", "digits_cnn", (1.0,), (8, 8, 1),
                                                   40, 50)
  else:
    base, model, alphas, shape, examples, tests = ("cifar", "cnn2", None, (32, 32, 3), 100,
                                                   10_000)
  scale = cheng2022.SCALES[base]
  alphas = alphas or scale["alphas"]
  data = synthetic_data(get_model(model, shape, 10), scale["config"]["num_clients"], examples,
                        tests=tests)
  r1, r2 = (1, 3) if tiny else (1, 4)

  def run(rounds, eval_every=None):
    spec = dict(scale, models=(model,), figures=None, alphas=alphas,
                epsilons=scale["epsilons"][-1:],
                config=dict(scale["config"], rounds=rounds, eval_every=eval_every or rounds))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
      done = cheng2022.run_small(base, out, data=data, spec=spec,
                                 execution=Execution(log=lambda *a: None))
    return time.perf_counter() - t0, len(done["runs"])

  # Warm runs only: a first run at R2 rounds also calibrates the noise to R2 rounds' epsilons.
  (cold, runs), (first2, _), (warm1, _), (warm2, _), (evals, _) = (
      run(r1), run(r2), run(r1), run(r2), run(r2, eval_every=1))
  per_round = (warm2 - warm1) / (r2 - r1)  # every run's round, one evaluation at the end
  per_eval = (evals - warm2) / (r2 - 1)  # every run's evaluation on the test set
  every = scale["config"]["eval_every"]
  return {"kind": "table2", "model": model, "runs": runs, "alphas": len(alphas),
          "rounds": [r1, r2], "cold_s": cold, "first_r2_s": first2, "warm_s": [warm1, warm2],
          "warm_eval_every_round_s": evals, "per_round_s": per_round, "per_evaluation_s": per_eval,
          "extrapolated_300_rounds_s": (cold + per_round * (300 - r1)
                                        + per_eval * (300 // every - 1))}


def measure_ahead(rounds: int) -> dict:
  """The PLD run without accounting workers and with the automatic number (at least one)."""
  import jax
  from fedjax_dp.privacy.ahead import workers_for
  base, helped = measure_accounting(rounds, [max(1, workers_for(None, jax.default_backend()))])
  return {"kind": "accounting", "baseline": base, "workers": helped}


def measure_round(spec, clients: int, dtype: str, repeats: int, conv_impl: str = "im2col",
                  live: Optional[int] = None) -> dict:
  model, q, batch, examples, chunk = spec
  try:
    r = measure(model, clients, q, batch, examples, repeats, conv_impl, skip_loop=True,
                compute_dtype=dtype, chunk=chunk, skip_centralized=True, live=live)
  except Exception as e:  # record and go on: one size out of memory must not lose the rest
    r = {"model": getattr(model, "name", model), "clients": clients, "compute_dtype": dtype,
         "error": repr(e)[:500]}
  return {"kind": "round", **r}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tiny", action="store_true", help="small models and cohorts (a CPU smoke test)")
  p.add_argument("--table2", action="store_true",
                 help="also time Table 2's cnn2 half (the table2 record), last")
  p.add_argument("--only-table2", action="store_true", help="the table2 record alone")
  args = p.parse_args(argv)
  sizes = plan(args.tiny)
  first, *rest = sizes["models"]
  jobs = [lambda s=first, c=c, d=d: measure_round(s, c, d, sizes["repeats"])
          for c in sizes["clients"] for d in DTYPES]
  jobs += [lambda impl=impl: measure_round(first, sizes["clients"][0], "float32",
                                           sizes["repeats"], impl) for impl in ("winograd", "lax")]
  jobs.append(lambda: measure_sweep(*sizes["sweep"]))  # before the largest model
  model, q, batch, examples, slots, live, block = sizes["padded"]
  jobs += [lambda chunk=chunk: {**measure_round((model, q, batch, examples, chunk), slots,
                                                "float32", sizes["repeats"], live=live),
                                "kind": "padded"} for chunk in (None, block)]
  jobs.append(lambda: measure_ahead(sizes["accounting_rounds"]))
  jobs += [lambda s=s, c=c, d=d: measure_round(s, c, d, sizes["repeats"])
           for s in rest for c in sizes["clients"] for d in DTYPES]
  if args.only_table2:
    jobs = []
  if args.table2 or args.only_table2:
    jobs.append(lambda: measure_table2(args.tiny))
  for job in jobs:
    t0 = time.perf_counter()
    record = job()
    record["wall_s"] = time.perf_counter() - t0
    print(json.dumps(record), flush=True)

if __name__ == "__main__":
  sys.exit(main())
