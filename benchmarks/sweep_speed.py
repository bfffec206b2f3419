"""A sweep as one program against the same runs one after another, measured in one run.

The grid is Cheng et al.'s small reproduction grid for one method (target
epsilons x seeds on MNIST, 600 clients, the 784-50-50-10 MLP, Q = 15), or the
same on scikit-learn's digits when no MNIST is found. Both sides build the
same configurations on the same data sets (loaded before timing):

* sequential: :func:`fedjax_dp.experiment.simulate` per experiment (runs that
  differ only in numbers already share one compiled round);
* sweep: :func:`fedjax_dp.sweep.sweep`, as one program in one thread
  (``threads=1``; on one CPU device the experiments run one after another
  inside it, elsewhere vmapped over a leading axis), as programs of at most 4
  experiments (``group_size=4``) in one thread, and with the sweep's default
  (``sweep_threads``: on one CPU device one program per core, run at once in
  threads; the record's ``sweep_threads_threads`` says how many).

Each side starts with the privacy caches emptied (noise calibrations and
epsilons are memoized per process, so a side that ran second would get the
first side's for free).

Prints one JSON object: seconds of each, the ratios, and the largest
difference in final accuracy between an experiment and its single run. With
``--client-chunks 0,1,auto`` both sides are measured with the whole cohort in one
vmap (``client_chunk`` 0), blocks of one client (which keep a block's models in
the CPU's cache) and the automatic blocks of
:func:`fedjax_dp.experiment.client_blocks`.

With ``--cli`` the same grid is also run the way a shell user would without
sweeps, one ``fedjax-dp run`` process per experiment (each starts Python and
JAX, loads its data set and compiles its round), against one ``fedjax-dp
sweep`` process: ``cli_loop_s``, ``cli_sweep_s`` and their ratio.

Example:
  python benchmarks/sweep_speed.py --data-dir ../shared/data --rounds 40 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from fedjax_dp.config import make_config
from fedjax_dp.experiment import load_data, recorded_config, simulate
from fedjax_dp.reproduce import cheng2022
from fedjax_dp.sweep import Programs, _data_key, plan as sweep_points, sweep


def base_config(data_dir, rounds: int, method: str):
  small = dict(cheng2022.SCALES["small"]["config"])
  mnist = data_dir and os.path.isdir(os.path.join(data_dir, "mnist"))
  if not mnist:
    small.update(cheng2022.SCALES["tiny"]["config"])
  small.update(rounds=rounds, eval_every=rounds, algorithm=method, data_dir=data_dir,
               target_epsilon=8.0, noise_multiplier=None)
  return make_config(small)


def fresh_privacy_caches() -> None:
  """Empties the per-process memos of noise calibrations and epsilons."""
  from fedjax_dp.privacy import ledger, mechanisms
  for fn in (mechanisms.calibrate_noise_multiplier, ledger.event_rdp, ledger._event_pld,
             ledger._composed_epsilon):
    fn.cache_clear()


def measure(data_dir=None, rounds: int = 40, seeds: int = 3, epsilons=(2.0, 4.0, 6.0, 8.0),
            method: str = "dp_fedavg", sweeps=((None, 1), (4, 1), (None, None)),
            chunks=(0,)) -> dict:
  """Both sides at every ``client_chunk`` of ``chunks`` (0: the whole cohort in one vmap; None:
  automatic); the ratios are against the runs one after another at the first of ``chunks``.
  ``sweeps``: the sweeps' ``(group_size, threads)``, None for the default."""
  base = base_config(data_dir, rounds, method)
  grid = {"target_epsilon": list(epsilons)}
  cache = {}

  def load(cfg):
    key = _data_key(cfg)
    if key not in cache:
      cache[key] = load_data(cfg)
    return cache[key]

  for s in range(seeds):  # data sets load before either side is timed
    load(base.replace(seed=base.seed + s))
  out = {"dataset": base.dataset, "method": method, "rounds": rounds}
  baseline = None
  for chunk in chunks:
    config = base.replace(client_chunk=chunk)
    tag = {0: "", None: "_auto"}.get(chunk, f"_chunk{chunk}")
    fresh_privacy_caches()
    t0 = time.perf_counter()
    alone = [simulate(p.config, load(p.config)) for p in sweep_points(config, grid, seeds)]
    out["experiments"] = len(alone)
    out[f"sequential{tag}_s"] = time.perf_counter() - t0
    baseline = baseline or out[f"sequential{tag}_s"]
    for size, threads in sweeps:
      fresh_privacy_caches()
      t0 = time.perf_counter()
      swept = sweep(config, grid, seeds, load=load, programs=Programs(size, threads))
      name = ("sweep" + ("" if size is None else f"_group{size}")
              + ("_threads" if threads is None else "") + tag)
      out[f"{name}_s"] = time.perf_counter() - t0
      out[f"{name}_threads"] = swept.threads
      out[f"sequential_over_{name}"] = baseline / out[f"{name}_s"]
      out[f"{name}_programs"] = len(swept.groups)
      out[f"{name}_max_accuracy_difference"] = max(
          abs(e["result"].summary["final_accuracy"] - a.summary["final_accuracy"])
          for e, a in zip(swept.experiments, alone))
  return out


def measure_cli(data_dir=None, rounds: int = 40, seeds: int = 3, epsilons=(2.0, 4.0, 6.0, 8.0),
                method: str = "dp_fedavg") -> dict:
  """One ``fedjax-dp run`` process per experiment against one ``fedjax-dp sweep`` process, both
  from the same configuration file; each experiment's final accuracy is compared."""
  base = base_config(data_dir, rounds, method)
  grid = {"target_epsilon": list(epsilons)}
  cli = [sys.executable, "-m", "fedjax_dp.cli"]
  quiet = dict(check=True, stdout=subprocess.DEVNULL)
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    settings = {k: v for k, v in recorded_config(base).items() if k != "not_used"}
    (tmp / "base.json").write_text(json.dumps(settings))
    t0 = time.perf_counter()
    loop = []
    for i, p in enumerate(sweep_points(base, grid, seeds)):
      overrides = ["--target-epsilon", str(p.values["target_epsilon"]), "--seed", str(p.seed)]
      subprocess.run(cli + ["run", "--config", str(tmp / "base.json"), *overrides,
                            "--output-dir", str(tmp / f"run{i}"), "--no-progress"], **quiet)
      loop.append(json.loads((tmp / f"run{i}" / "summary.json").read_text())["final_accuracy"])
    loop_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(cli + ["sweep", "--config", str(tmp / "base.json"), "--grid",
                          "target_epsilon=" + ",".join(str(e) for e in epsilons),
                          "--seeds", str(seeds), "--output-dir", str(tmp / "sweep"),
                          "--no-progress"], **quiet)
    sweep_s = time.perf_counter() - t0
    swept = [e["summary"]["final_accuracy"] for e in
             json.loads((tmp / "sweep" / "results.json").read_text())["experiments"]]
  return {"cli_experiments": len(loop), "cli_loop_s": loop_s, "cli_sweep_s": sweep_s,
          "cli_loop_over_cli_sweep": loop_s / sweep_s,
          "cli_max_accuracy_difference": max(abs(a - b) for a, b in zip(loop, swept))}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data-dir", default=os.environ.get("FEDJAX_DP_DATA"))
  p.add_argument("--rounds", type=int, default=40)
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--epsilons", default="2,4,6,8")
  p.add_argument("--method", default="dp_fedavg")
  p.add_argument("--client-chunks", default="0",
                 help="client_chunk values to measure both sides at, comma-separated: 0 is the "
                 "whole cohort in one vmap (also 'none'), 'auto' the automatic blocks, k blocks "
                 "of k clients; the first is the baseline of the ratios (default: 0)")
  p.add_argument("--cli", action="store_true",
                 help="also time one fedjax-dp run process per experiment against one fedjax-dp "
                 "sweep process (default: off)")
  args = p.parse_args()
  named = {"auto": None, "none": 0}  # "none": the whole cohort, as RESULTS.md's older commands say
  chunks = tuple(named[c] if c in named else int(c) for c in args.client_chunks.split(","))
  epsilons = tuple(float(e) for e in args.epsilons.split(","))
  out = measure(args.data_dir, args.rounds, args.seeds, epsilons, args.method, chunks=chunks)
  if args.cli:
    out.update(measure_cli(args.data_dir, args.rounds, args.seeds, epsilons, args.method))
  print(json.dumps(out))


if __name__ == "__main__":
  main()
