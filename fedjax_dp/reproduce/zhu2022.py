"""Reproduction of Zhu and Ling, IJCAI 2022 (DP-RSA), Fig. 1 (MNIST) and the CIFAR-10 preset.

``fedjax-dp reproduce zhu2022 --scale small --output-dir DIR`` runs, on real
MNIST, K=30 workers of which the last b=3 are Byzantine, the paper's MLP
(784-50-50-10, tanh), lambda=0.01, alpha=0.01, f_0 = 0.002 ||x||^2:

* iid (60,000 examples evenly) under the Gaussian and the sign-flipping attack;
* non-iid (for each digit, half its examples spread evenly over all workers,
  the other half to one group of 3 workers) under sample duplication;

for SGD (mean), SignSGD, GM, RSA, DP-RSA(F) and DP-RSA(G) at per-coordinate
epsilon in {0.2, 0.4, 1.38}. It writes ``DIR/results.json`` (``rows``: method,
partition, attack, epsilon, accuracy_mean, accuracy_std (sample std over
seeds), seeds, plus the composed whole-run epsilon; rewritten as runs end),
``DIR/results.md`` (the rows as a table), ``DIR/runs.jsonl`` (every run's
per-round history) and ``DIR/zhu2022_<partition>_<attack>.png`` (accuracy
versus iteration).

Deviations from the paper (stated in the results): fewer iterations than the
paper's 5,000 and minibatches of ``batch_size`` examples per worker per
iteration (the paper's batch size is not given in the text); DP-RSA(G) clips
each coordinate of ``x_0 - x_k`` to ``[-sign_clip, sign_clip]`` so that its
epsilon is a real guarantee, and calibrates sigma to the per-coordinate
epsilon.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np

from fedjax_dp.errors import check_choice
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.plots import Curve, plot_curves
from fedjax_dp.reproduce.runner import Job, group_by, num_seeds, run_jobs, seed_stats
from fedjax_dp.reproduce.tables import markdown_table, mean_std

METHODS = ("sgd", "signsgd", "gm", "rsa", "dp-rsa-f", "dp-rsa-g")
EPSILONS = (0.2, 0.4, 1.38)
SETTINGS = (("iid", "gaussian"), ("iid", "sign-flip"), ("noniid", "sample-duplication"))

SCALES = {
    # For the notebook and the tests: a 3,000-example MNIST subset.
    "tiny": dict(dataset="mnist", num_clients=30, byzantine=3, model="rsa_mlp", rounds=30,
                 batch_size=16, lr=0.01, lam=0.01, l2=0.004, eval_every=10, seeds=1,
                 max_train=3000, max_test=1000, sign_clip=0.002, epsilons=(0.2, 1.38)),
    "small": dict(dataset="mnist", num_clients=30, byzantine=3, model="rsa_mlp", rounds=400,
                  batch_size=32, lr=0.01, lam=0.01, l2=0.004, eval_every=100, seeds=1,
                  max_train=None, max_test=None, sign_clip=0.002, epsilons=EPSILONS),
    "paper": dict(dataset="mnist", num_clients=30, byzantine=3, model="rsa_mlp", rounds=5000,
                  batch_size=32, lr=0.01, lam=0.01, l2=0.004, eval_every=250, seeds=3,
                  max_train=None, max_test=None, sign_clip=0.002, epsilons=EPSILONS),
    # CIFAR-10 preset (Fig. 2): 20 workers, b=2, the ~368k-parameter CNN, lambda=0.002.
    "cifar-small": dict(dataset="cifar10", num_clients=20, byzantine=2, model="rsa_cifar_cnn",
                        rounds=200, batch_size=16, lr=0.01, lam=0.002, l2=0.004, eval_every=50,
                        seeds=1, max_train=10000, max_test=2000, sign_clip=0.002,
                        epsilons=(0.2, 1.38)),
}


def half_spread_groups(labels: np.ndarray, num_clients: int, group_size: int,
                       rng: np.random.Generator) -> list:
  """The paper's non-iid split: for each class c, half of its examples are spread
  evenly over all workers, the other half evenly over the group of ``group_size``
  workers ``c * group_size, ...`` (mod ``num_clients``)."""
  labels = np.asarray(labels)
  parts = [[] for _ in range(num_clients)]
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    half = len(idx) // 2
    for k, chunk in enumerate(np.array_split(idx[:half], num_clients)):
      parts[k].append(chunk)
    group = [(int(c) * group_size + j) % num_clients for j in range(group_size)]
    for k, chunk in zip(group, np.array_split(idx[half:], group_size)):
      parts[k].append(chunk)
  return [np.sort(np.concatenate(p)) for p in parts]


def load_data(scale: dict, partition: str, data_dir, seed: int = 0):
  from fedjax_dp.data import FederatedData, load_central, partition_indices
  central = load_central(scale["dataset"], data_dir=data_dir, max_train=scale["max_train"],
                         max_test=scale["max_test"], seed=seed)
  rng = np.random.default_rng([seed, 2022])
  k = scale["num_clients"]
  if partition == "iid":
    parts = partition_indices(central.train_y, k, "iid", rng)
  else:
    parts = half_spread_groups(central.train_y, k, scale["byzantine"], rng)
  return FederatedData.from_partition(central.name, central.train_x, central.train_y, parts,
                                      central.test_x, central.test_y, central.num_classes)


def runs(scale: dict):
  """``(method, epsilon, options)`` of every run of one setting."""
  out = [(m, None, {}) for m in ("sgd", "signsgd", "gm", "rsa")]
  for eps in scale["epsilons"]:
    out.append(("dp-rsa-f", eps, {"epsilon": eps}))
    out.append(("dp-rsa-g", eps, {"epsilon": eps, "sign_clip": scale["sign_clip"]}))
  return out


def _config(scale, method, opts, attack, data_dir, seed):
  from fedjax_dp.config import make_config
  options = {"l2": scale["l2"], **opts}
  if method.startswith("rsa") or method.startswith("dp-rsa"):
    options["lambda"] = scale["lam"]
  if method == "gm":
    options.update(gm_tol=1e-5, gm_max_iter=20)
  return make_config(
      algorithm=method, dataset=scale["dataset"], data_dir=data_dir, num_clients=scale["num_clients"],
      model=scale["model"], rounds=scale["rounds"], sampling="fixed", cohort_size=scale["num_clients"],
      batch_size=scale["batch_size"], client_lr=scale["lr"], eval_every=scale["eval_every"],
      noise_multiplier=None, target_epsilon=None, seed=seed, byzantine=scale["byzantine"],
      attack=attack.replace("-", "_"), options=options)


def _record(job, res) -> dict:
  """The fields of a run's record after its labels."""
  s = res.summary
  return {"accuracy": s["final_accuracy"], "epsilon_composed": s.get("epsilon"),
          "delta": s.get("delta"), "formal_guarantee": s.get("formal_guarantee"),
          "guarantee_note": s.get("guarantee_note")}


def _label(method, eps) -> str:
  return method if eps is None else f"{method} eps={eps}"


def _results(runs, n_seeds):
  """The rows and the accuracy curves (mean over seeds, by setting then label) of the settings
  and methods whose ``n_seeds`` runs are all done."""
  rows, curves = [], {}
  for (partition, attack, method, eps), rs in group_by(runs, ("partition", "attack", "method",
                                                              "epsilon")).items():
    if len(rs) < n_seeds:
      continue
    last = rs[-1]
    accs = [math.nan if r["accuracy"] is None else float(r["accuracy"]) for r in rs]
    rows.append({"method": method, "partition": partition, "attack": attack, "epsilon": eps,
                 **seed_stats(accs), "accuracies": accs,
                 "epsilon_composed": last["epsilon_composed"], "delta": last["delta"],
                 "formal_guarantee": last["formal_guarantee"],
                 "guarantee_note": last["guarantee_note"], "seconds_per_run": last["seconds"]})
    evals = [[h for h in r["history"] if "test_accuracy" in h] for r in rs]
    ys = np.nanmean(np.array([[h["test_accuracy"] for h in e] for e in evals], float), axis=0)
    curves.setdefault(f"{partition}/{attack}", {})[_label(method, eps)] = (
        [h["round"] for h in evals[0]], ys.tolist())
  return rows, curves


def _markdown(rows, scale_name) -> str:
  lines = [f"DP-RSA reproduction, scale {scale_name}: test accuracy (%), mean ± std over seeds; "
           "epsilon per coordinate per iteration (the paper's) and composed over the whole run "
           "at delta", ""]
  lines += markdown_table(
      ["partition", "attack", "method", "eps / coord / iter", "accuracy", "whole-run eps",
       "delta", "formal DP"],
      [{"partition": r["partition"], "attack": r["attack"], "method": r["method"],
        "eps / coord / iter": "" if r["epsilon"] is None else r["epsilon"],
        "accuracy": mean_std(r["accuracy_mean"], r["accuracy_std"]),
        "whole-run eps": "" if r["epsilon_composed"] is None else f"{r['epsilon_composed']:.4g}",
        "delta": "" if r["delta"] is None else f"{r['delta']:g}",
        "formal DP": r["formal_guarantee"]} for r in rows])
  return "\n".join(lines) + "\n"


def reproduce(scale: str = "small", output_dir: str = "runs/zhu2022", data_dir=None, seeds=None,
              settings=SETTINGS, methods=METHODS, progress: bool = True) -> int:
  """Runs the experiments of ``scale`` and writes results.json, results.md, runs.jsonl and the
  plots (returns 0)."""
  check_choice("scale", scale, sorted(SCALES))
  sc = SCALES[scale]
  n_seeds = num_seeds(seeds, sc["seeds"])
  for m in methods:
    check_choice("method", m, METHODS)
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  t_start = time.perf_counter()
  jobs = [Job(_config(sc, method, opts, attack, data_dir, seed),
              {"partition": partition, "attack": attack, "method": method, "epsilon": eps,
               "seed": seed},
              name=f"{partition} {attack} {_label(method, eps)} seed={seed}", data=partition)
          for partition, attack in settings for method, eps, opts in runs(sc) if method in methods
          for seed in range(n_seeds)]
  log = (lambda line: print(f"[zhu2022] {line}", flush=True)) if progress else (lambda line: None)
  records = run_jobs(jobs, _record, load_data=lambda partition: load_data(sc, partition, data_dir),
                     runs_path=out / "runs.jsonl",
                     on_record=lambda rs: _write(out, scale, sc, *_results(rs, n_seeds), t_start),
                     log=log)
  rows, curves = _results(records, n_seeds)
  _write(out, scale, sc, rows, curves, t_start)
  (out / "results.md").write_text(_markdown(rows, scale))
  for partition, attack in settings:
    cs = curves.get(f"{partition}/{attack}")
    if not cs:
      continue
    plot_curves([(f"MNIST {partition}, {attack} attack, K={sc['num_clients']}, b={sc['byzantine']}",
                  [Curve(label, xs, ys, style="--" if label.startswith("dp-rsa-g") else
                         "-." if label.startswith("dp-rsa-f") else "-")
                   for label, (xs, ys) in cs.items()])],
                out / f"zhu2022_{partition}_{attack}.png", xlabel="iteration", ylim=(0, 1),
                size=(5.2, 3.6), legend_columns=2, legend_size=6)
  log(f"wrote {out / 'results.json'}, {out / 'results.md'} and the plots in "
      f"{time.perf_counter() - t_start:.0f} s")
  return 0


def _write(out, scale_name, sc, rows, curves, t_start):
  doc = {"paper": "Zhu and Ling, Bridging Differential Privacy and Byzantine-Robustness via Model "
                  "Aggregation, IJCAI 2022", "scale": scale_name, "settings": sc, "rows": rows,
         "curves": {k: {lab: {"iteration": xs, "accuracy": ys} for lab, (xs, ys) in v.items()}
                    for k, v in curves.items()},
         "wall_seconds": time.perf_counter() - t_start,
         "notes": ["epsilon is per coordinate per iteration (the paper's quantity); epsilon_composed is "
                   "the whole-run value over d coordinates x rounds (dp_accounting RDP, replace-one, "
                   "worker-level) at delta",
                   "DP-RSA(G) clips each coordinate of x_0 - x_k to [-sign_clip, sign_clip] (formal "
                   "guarantee) and calibrates sigma to epsilon",
                   "Byzantine workers are the last b ids; their messages are not perturbed"]}
  write_text_atomic(out / "results.json", json.dumps(doc, indent=1, default=str) + "\n")


def run(scale: str, output_dir: str, data_dir=None, seeds=None) -> int:
  """Entry point of ``fedjax-dp reproduce zhu2022``."""
  return reproduce(scale=scale, output_dir=output_dir, data_dir=data_dir, seeds=seeds)
