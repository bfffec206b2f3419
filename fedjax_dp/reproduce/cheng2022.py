"""Reproduction of Cheng et al., CVPR 2022 (BLUR + LUS): Tables 1, 2 and 3 and Figs. 2, 3 and 4.

``fedjax-dp reproduce cheng2022 --scale small --output-dir DIR`` runs, on real
MNIST split among several hundred clients, Table 1's columns: DP-FedAvg,
AE-DPFL, DDGauss, DP-FedAvg+BLUR, DP-FedAvg+LUS and BLUR+LUS at epsilon in
{2, 4, 6, 8} (delta = 1e-5, each method's noise multiplier calibrated by the
ledger), non-private FedAvg, and the sparsity ablation of Table 3 (c in
{0.1, ..., 0.9} at epsilon = 6), each over ``seeds`` seeds. ``--scale cifar``
runs Table 2 (real CIFAR-10, Dirichlet alpha in {0.1, 1, 10, 100}, CNN-2-layers
then ResNet-18, columns DP-FedAvg, AE-DPFL, DDGauss, BLUR+LUS and FedAvg) and Figs. 3
and 4 (FedAvg, DP-FedAvg and BLUR+LUS against the local steps Q and the sampling
probability p; :func:`figure_plan`), an accelerator scale; ``--scale cifar-small`` a
two-core variant of Table 2 and ``--scale tiny-cifar`` a test-sized one of Table 2 and
the figures. DDGauss runs with fixed-size cohorts
(replace-one), the other columns under Poisson sampling (add/remove): see
:func:`method_config`. It writes

* ``DIR/results.json``: ``rows`` (``table``, ``model``, ``alpha``, ``method``,
  ``epsilon`` (the ledger's, at delta), ``target_epsilon``, ``noise_multiplier``,
  ``sampling``, ``lambda``, ``sparsity``, ``local_steps``, ``sampling_prob``,
  ``accuracy_mean``, ``accuracy_std`` (sample std over seeds), ``seeds``, ...), the
  ``settings`` (the scale and all :func:`render` needs), and the paper's numbers;
* ``DIR/runs.jsonl``: every run's labels, seed, accuracy and per-round history;
* ``DIR/results.md``: Table 1 or 2 (ours, then the paper's), Table 3, Figs. 3 and 4
  as tables, and the verdicts (:func:`claims`);
* ``DIR/cheng2022_update_norms.png`` (Fig. 2: per-round distribution of
  pre-clip update norms, DP-FedAvg vs BLUR+LUS),
  ``DIR/cheng2022_accuracy.png`` (test accuracy versus round) and
  ``DIR/cheng2022_fig3.png``, ``DIR/cheng2022_fig4.png``.

``results.md`` and the figures are written by :func:`render` from ``results.json``
and ``runs.jsonl``; ``fedjax-dp reproduce cheng2022 --render --output-dir DIR``
rewrites them for an earlier run without running anything.

``--scale paper`` runs the paper's Table 1 settings (federated EMNIST with TFF's
HDF5 files in ``--data-dir``): sized for an accelerator, never run on the
project's CPUs.

Deviations at the small scale (stated in the results): MNIST instead of
federated EMNIST, a small MLP instead of CNN-2-layers/ResNet-18, fewer
rounds, local steps and clients; S is taken from the paper's grid without a
search.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Callable, NamedTuple, Optional

import numpy as np

from fedjax_dp.algorithms.blur_lus import DEFAULTS
from fedjax_dp.config import make_config
from fedjax_dp.data import load_federated_emnist, specs
from fedjax_dp.data.sources import tff
from fedjax_dp.data.sources.common import resolve_data_dir
from fedjax_dp.errors import check, check_choice
from fedjax_dp.experiment import load_data
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.plots import Curve, Layout, plot_curves, plot_quantiles
from fedjax_dp.reproduce.runner import (Execution, Job, Kept, group_by, identity, num_seeds,
                                        read_records, release, run_jobs, wall_seconds, wrote)
from fedjax_dp.reproduce.tables import (Claim, markdown_table, mean_std, seed_difference, verdict,
                                       verdict_table)
from fedjax_dp.stats import seed_stats

METHODS = ("dp_fedavg", "dp_fedavg+blur", "dp_fedavg+lus", "blur+lus")
# The paper's other baselines: AE-DPFL (voting on a public set) and DDGauss (the distributed
# discrete Gaussian, fixed-size cohorts).
BASELINES = ("ae-dpfl", "ddgauss")
# Not the paper's: DP-FedAvg with DDGauss's fixed cohorts and replace-one accounting, the control
# that tells DDGauss's encoding apart from its sampling and relation (Table 1 only).
FIXED_CONTROL = "dp_fedavg-fixed"
# The columns of each table: Table 1 (epsilon rows) and Table 2 (Dirichlet alpha rows, the
# paper's four columns: DP-FedAvg, AE-DPFL, DDGauss, Ours = BLUR+LUS).
COLUMNS = {"table1": ("dp_fedavg", "ae-dpfl", "ddgauss", FIXED_CONTROL, "dp_fedavg+blur",
                      "dp_fedavg+lus", "blur+lus"),
           "table2": ("dp_fedavg", "ae-dpfl", "ddgauss", "blur+lus")}
LABELS = {"dp_fedavg": "DP-FedAvg", "dp_fedavg+blur": "DP-FedAvg+BLUR",
          "dp_fedavg+lus": "DP-FedAvg+LUS", "blur+lus": "BLUR+LUS", "ae-dpfl": "AE-DPFL",
          "ddgauss": "DDGauss", FIXED_CONTROL: "DP-FedAvg (DDGauss's fixed M)",
          "fedavg": "FedAvg (non-private)"}
EPSILONS = (2.0, 4.0, 6.0, 8.0)
SPARSITIES = (0.1, 0.3, 0.5, 0.7, 0.9)
ABLATION_EPSILON = 6.0
DELTA = 1e-5

# Cheng et al. 2022, Table 1 (federated EMNIST): model -> epsilon -> method -> (mean, std) in %.
# Read from the machine-translated text; all 32 entries are legible. The text's "4.83% at
# eps=2, 2.73% at eps=8" for CNN-2-layers matches these numbers.
_T1 = ("dp_fedavg", "ae-dpfl", "ddgauss", "blur+lus")
PAPER_TABLE1 = {
    "cnn2": {2.0: dict(zip(_T1, ((69.65, 0.74), (71.16, 0.47), (69.35, 0.61), (74.48, 0.52)))),
             4.0: dict(zip(_T1, ((72.32, 0.81), (74.63, 0.59), (72.16, 0.76), (75.85, 0.61)))),
             6.0: dict(zip(_T1, ((74.12, 0.75), (76.25, 0.42), (74.34, 0.70), (77.48, 0.54)))),
             8.0: dict(zip(_T1, ((75.36, 0.64), (77.41, 0.33), (75.20, 0.68), (78.09, 0.46))))},
    "resnet18_gn": {
        2.0: dict(zip(_T1, ((73.52, 0.53), (76.37, 0.41), (73.16, 0.58), (78.58, 0.39)))),
        4.0: dict(zip(_T1, ((75.51, 0.60), (79.22, 0.46), (75.65, 0.64), (80.29, 0.47)))),
        6.0: dict(zip(_T1, ((77.19, 0.55), (80.24, 0.37), (77.64, 0.61), (81.55, 0.46)))),
        8.0: dict(zip(_T1, ((78.06, 0.49), (81.33, 0.46), (78.03, 0.52), (82.12, 0.52))))},
}
# Table 2 (CIFAR-10, Dirichlet alpha): model -> alpha -> method -> (mean, std) in %. All 32
# entries legible; the paper does not state the epsilon of this table.
PAPER_TABLE2 = {
    "cnn2": {0.1: dict(zip(_T1, ((53.84, 1.04), (55.79, 0.86), (53.55, 1.12), (58.95, 0.95)))),
             1.0: dict(zip(_T1, ((58.67, 0.85), (60.00, 0.57), (58.28, 0.96), (63.74, 0.70)))),
             10.0: dict(zip(_T1, ((62.25, 0.71), (63.93, 0.45), (62.43, 0.77), (65.34, 0.52)))),
             100.0: dict(zip(_T1, ((63.73, 0.64), (64.51, 0.32), (63.80, 0.69), (66.05, 0.45))))},
    "resnet18_gn": {
        0.1: dict(zip(_T1, ((59.73, 0.96), (63.11, 0.65), (59.37, 1.04), (64.50, 0.88)))),
        1.0: dict(zip(_T1, ((63.49, 0.81), (65.80, 0.51), (63.84, 0.89), (67.27, 0.62)))),
        10.0: dict(zip(_T1, ((65.64, 0.69), (67.62, 0.42), (65.85, 0.72), (68.96, 0.54)))),
        100.0: dict(zip(_T1, ((66.58, 0.60), (68.39, 0.35), (66.74, 0.63), (69.42, 0.47))))},
}
# Table 3 (EMNIST, ResNet-18, epsilon = 6): sparsity c -> accuracy (%). Legible:
# DP-FedAvg (c = 0), DP-FedAvg+LUS for every c, DP-FedAvg+BLUR (c = 0). The
# BLUR+LUS rows for c > 0 are lost in the extracted text.
PAPER_TABLE3 = {
    "dp_fedavg+lus": {0.0: 76.24, 0.1: 76.52, 0.3: 77.28, 0.5: 77.75, 0.7: 77.54, 0.9: 77.39},
    "blur+lus": {0.0: 78.28},
}

# AE-DPFL's public set: the library default m = 100 public examples at every scale (the last
# clients' examples, held out of the population). Its count noise is z sqrt(m) = 10 z per
# count against the ~p N votes of a round (12 to 30 here), so a larger m buys more server
# training examples with noisier labels; the paper does not state its m.
AE_DPFL_OPTIONS = {"public_size": 100}

_SMALL = dict(
    dataset="mnist", partition="shards", shards_per_client=2, num_clients=600, model="rsa_mlp",
    rounds=40, sampling="poisson", sampling_prob=0.04, local_steps=15, batch_size=10,
    client_optimizer="sgd", client_lr=0.05, server_optimizer="sgd", server_lr=1.0,
    denominator="expected", clip=0.3, delta=DELTA, accountant="rdp", eval_every=5)
# Table 2's settings (Sec. 6): T = 300, p = 0.06, batch 50, eta_l = 0.1, Q = 30, eta_g = 1,
# S = 0.3; delta = 1e-5 assumed (illegible in the extracted text); 500 clients (Hsu et al.
# 2019's Dirichlet label split of the 50,000 training images, 100 examples per client on average).
_CIFAR = dict(dataset="cifar10", partition="dirichlet", num_clients=500, rounds=300,
              sampling="poisson", sampling_prob=0.06, local_steps=30, batch_size=50,
              client_optimizer="sgd", client_lr=0.1, server_optimizer="sgd", server_lr=1.0,
              clip=0.3, denominator="expected", delta=DELTA, accountant="rdp", eval_every=20)

# Figs. 3 and 4 (CIFAR-10): test accuracy of FedAvg, DP-FedAvg and Ours (BLUR+LUS) against the
# local steps Q (Fig. 3) and the client sampling probability p (Fig. 4), everything else at
# Table 2's settings. The paper does not state the figures' model, alpha or epsilon. We use
# CNN-2-layers, alpha = 1 (Table 2's middle heterogeneity, where the paper's gain of Ours over
# DP-FedAvg, 5.07 points, is near its largest, so a change with Q or p has room to show) and
# epsilon = 6 (the budget of the paper's other ablations, Fig. 1 and Table 3).
FIGURE_METHODS = ("fedavg", "dp_fedavg", "blur+lus")
FIGURE_AXES = {"fig3": "local_steps", "fig4": "sampling_prob"}
_FIGURES = dict(model="cnn2", alpha=1.0, epsilon=6.0, local_steps=(10, 20, 30, 40, 50),
                sampling_prob=(0.02, 0.04, 0.06, 0.08, 0.1))

SCALES = {
    # For tests and the notebook: real scikit-learn digits, seconds.
    "tiny": dict(config=dict(_SMALL, dataset="digits", model="rsa_mlp", num_clients=60,
                             shards_per_client=2, rounds=4, sampling_prob=0.2, local_steps=4,
                             batch_size=8, eval_every=2),
                 epsilons=(2.0, 8.0), sparsities=(0.5,), ablation_epsilon=8.0, seeds=1),
    # CPU scale: ~10-12 minutes on two idle cores for the four BLUR/LUS columns (measured
    # before the AE-DPFL and DDGauss columns were added).
    "small": dict(config=_SMALL, epsilons=EPSILONS, sparsities=SPARSITIES,
                  ablation_epsilon=ABLATION_EPSILON, seeds=3, ablation_seeds=2),
    # Table 2 on real CIFAR-10: CNN-2-layers then ResNet-18 (GroupNorm), the four alphas,
    # every epsilon, 3 seeds: 408 runs of 300 rounds; then Figs. 3 and 4: 72 runs (their Q = 30
    # and p = 0.06 are Table 2's runs). Accelerator scale.
    "cifar": dict(config=_CIFAR, table="table2", models=("cnn2", "resnet18_gn"),
                  alphas=(0.1, 1.0, 10.0, 100.0), epsilons=EPSILONS, seeds=3, figures=_FIGURES),
    # Table 2 on two cores: 100 clients of 100 examples (a class-balanced 10,000-image subset,
    # 2,000 test images), CNN-2-layers, alpha = 1, epsilon = 8, T = 20 rounds, Q = 5,
    # p = 0.1 (10 clients a round), one seed: 5 runs.
    "cifar-small": dict(config=dict(_CIFAR, model="cnn2", num_clients=100, max_train=10_000,
                                    max_test=2_000, rounds=20, sampling_prob=0.1,
                                    local_steps=5, eval_every=5),
                        table="table2", models=("cnn2",), alphas=(1.0,), epsilons=(8.0,),
                        seeds=1),
    # For tests: 10 clients of 40 real CIFAR-10 images, 2 rounds; Figs. 3 and 4 at two values
    # each (Q = 2 and p = 0.5 are Table 2's runs): 11 runs.
    "tiny-cifar": dict(config=dict(_CIFAR, model="cnn2", num_clients=10, max_train=400,
                                   max_test=200, rounds=2, sampling_prob=0.5, local_steps=2,
                                   batch_size=10, eval_every=1),
                       table="table2", models=("cnn2",), alphas=(1.0,), epsilons=(8.0,),
                       seeds=1, ae_dpfl=dict(public_size=40),
                       figures=dict(_FIGURES, epsilon=8.0, local_steps=(1, 2),
                                    sampling_prob=(0.3, 0.5))),
}

# The paper's Table 1 (Sec. 6): federated EMNIST, Q = 30 local steps, eta_g = 1, lambda = 0.4,
# c = 0.7; delta = 1e-5 assumed (illegible in the extracted text). Accelerator scale; not run on
# the project's CPUs. (Table 2 is --scale cifar.)
_EMNIST = dict(dataset="federated_emnist", partition="natural", model="cnn2", rounds=1000,
               sampling="poisson", sampling_prob=0.04, local_steps=30, batch_size=64,
               client_lr=0.03, server_lr=1.0, clip=0.03, denominator="expected", delta=DELTA,
               eval_every=50)
PAPER_PRESETS = {
    # Federated EMNIST (3,400 writers): needs TFF's fed_emnist_{train,test}.h5 in --data-dir.
    "emnist_cnn2": dict(_EMNIST),
    "emnist_resnet18": dict(_EMNIST, model="resnet18_gn"),
}
SCALES["paper"] = dict(presets=PAPER_PRESETS, epsilons=EPSILONS, sparsities=SPARSITIES,
                       ablation_epsilon=ABLATION_EPSILON, seeds=3)


def capacity_for(num_clients: int, prob: float) -> int:
  """Padded cohort size: expected size plus 3 standard deviations (grows if exceeded)."""
  mean = num_clients * prob
  return int(min(num_clients, math.ceil(mean + 3.0 * math.sqrt(mean * (1 - prob)) + 1)))


class PlannedRun(NamedTuple):
  """One run of :func:`plan` or :func:`figure_plan`.

  Attributes:
    table: the table or figure it belongs to (``table1``, ``table2``, ``table3``, ``fig3``,
      ``fig4``).
    model: the model (None: the configuration's).
    alpha: the Dirichlet alpha of the partition (None: the configuration's partition).
    method: the method, a key of :data:`LABELS` or ``fedavg``.
    epsilon: the target epsilon (None: non-private).
    sparsity: LUS's sparsity c (None: its default).
    seed: the run's seed.
    overrides: configuration fields a figure varies (its Q or p); None: none.
  """

  table: str
  model: Optional[str]
  alpha: Optional[float]
  method: str
  epsilon: Optional[float]
  sparsity: Optional[float]
  seed: int
  overrides: Optional[dict] = None


def plan(epsilons, sparsities, ablation_epsilon, seeds: int, ablation_seeds: int,
         table: str = "table1", settings=((None, None),)) -> list:
  """Every run, a :class:`PlannedRun`, for each ``(model, alpha)`` of ``settings``: per seed,
  non-private FedAvg and each column of ``table`` at each epsilon, then (Table 1 only) the
  Table 3 sparsity ablation.

  Args:
    epsilons: the target epsilons of the table's rows.
    sparsities: LUS's sparsities ``c`` of the ablation (empty: none); ``c = 0.7`` reuses the
      Table 1 runs when ``ablation_epsilon`` is among ``epsilons``.
    ablation_epsilon: the target epsilon of the ablation.
    seeds: seeds ``0 .. seeds - 1`` of every run.
    ablation_seeds: the ablation runs seeds ``0 .. ablation_seeds - 1``.
    table: "table1" or "table2", naming the columns (:data:`COLUMNS`).
    settings: the ``(model, alpha)`` pairs; a None keeps the configuration's model or
      partition.

  Returns:
    The planned runs, in run order.
  """
  jobs = []
  for model, alpha in settings:
    for seed in range(seeds):
      jobs.append(PlannedRun(table, model, alpha, "fedavg", None, None, seed))
      for eps in epsilons:
        for m in COLUMNS[table]:
          jobs.append(PlannedRun(table, model, alpha, m, eps, None, seed))
      for c in sparsities if table == "table1" and seed < ablation_seeds else ():
        if c == 0.7 and ablation_epsilon in epsilons:
          continue  # the default c: the Table 1 runs at this epsilon are reused
        for m in ("dp_fedavg+lus", "blur+lus"):
          jobs.append(PlannedRun("table3", model, alpha, m, ablation_epsilon, c, seed))
  return jobs


def figure_plan(figures: dict, base: dict, seeds: int, table_runs, epsilons) -> list:
  """The runs of Figs. 3 and 4, each a :class:`PlannedRun` with ``overrides={field: value}``, for
  each value of ``figures["local_steps"]`` (Fig. 3) and
  ``figures["sampling_prob"]`` (Fig. 4) and each of :data:`FIGURE_METHODS`. A point at Table 2's
  own Q or p is Table 2's run when that table runs the figures' model, alpha and epsilon.

  How they run (:func:`fedjax_dp.sweep.run_configs`): seeds and noise multipliers are numbers,
  so the seeds of a method at one Q share one compiled program; Q is a loop count, so each Q is
  a program of its own. p is not part of the compiled round (the expected cohort size is a
  number and every cohort is padded to the group's largest capacity), so a method's runs at
  every p, seeds included, are one program, each experiment padded to the capacity at the
  largest p (72 clients at p = 0.1 of 500). At the ``cifar`` scale (Q = 30 and p = 0.06 are
  Table 2's runs) that makes three programs of 12 runs for Fig. 4 and twelve programs of 3 runs
  (three methods at four values of Q) for Fig. 3.

  Args:
    figures: the scale's ``figures``: ``model``, ``alpha``, ``epsilon`` and the values of
      ``local_steps`` and ``sampling_prob``.
    base: the scale's configuration (its own ``local_steps`` and ``sampling_prob``).
    seeds: seeds ``0 .. seeds - 1`` of every point.
    table_runs: the ``(model, alpha)`` pairs the table runs.
    epsilons: the table's target epsilons.

  Returns:
    The planned runs.
  """
  reused = (figures["model"], figures["alpha"]) in table_runs and figures["epsilon"] in epsilons
  jobs = []
  for fig, field in FIGURE_AXES.items():
    for value in figures[field]:
      if reused and value == base[field]:
        continue
      for seed in range(seeds):
        for m in FIGURE_METHODS:
          jobs.append(PlannedRun(fig, figures["model"], figures["alpha"], m,
                                 None if m == "fedavg" else figures["epsilon"], None, seed,
                                 {field: value}))
  return jobs


def method_config(base: dict, method: str, eps, ae_options=None) -> dict:
  """A method's run configuration at target epsilon ``eps`` (None: non-private FedAvg).

  The BLUR/LUS family and AE-DPFL run under Poisson sampling at ``sampling_prob`` (user-level,
  add/remove one client); DDGauss needs fixed-size cohorts, so it runs with cohorts of
  ``M = round(p N)`` (replace-one), as does :data:`FIXED_CONTROL`, DP-FedAvg. Each calibrates
  its own noise multiplier to ``eps`` through the library's ledger (``target_epsilon``).
  AE-DPFL's server trains on its noisy labels at the clients' learning rate (``server_lr =
  client_lr``; eta_g = 1 is FedAvg's server step).

  Args:
    base: the scale's configuration fields (``num_clients`` and ``sampling_prob`` among them).
    method: "fedavg", a column of :data:`COLUMNS` or :data:`FIXED_CONTROL`.
    eps: the target epsilon; None: non-private (noise multiplier 0).
    ae_options: AE-DPFL's options (None: :data:`AE_DPFL_OPTIONS`).

  Returns:
    The configuration fields, a new dict (for :func:`fedjax_dp.config.make_config`).
  """
  n, p = base["num_clients"], base["sampling_prob"]
  cfg = dict(base, algorithm="dp_fedavg" if method == FIXED_CONTROL else method,
             target_epsilon=eps, noise_multiplier=0.0 if eps is None else None,
             capacity=capacity_for(n, p), options={})
  if method in ("ddgauss", FIXED_CONTROL):
    cfg.update(sampling="fixed", cohort_size=int(round(p * n)), capacity=None)
  elif method == "ae-dpfl":
    # capacity: the library's default for the population left after the public set
    cfg.update(server_lr=base["client_lr"], options=dict(ae_options or AE_DPFL_OPTIONS),
               capacity=None)
  return cfg


def _job(base: dict, run: PlannedRun, ae_options=None) -> Job:
  """The :class:`Job` of a planned run on the scale's configuration ``base``."""
  model, alpha, method, eps, sparsity = run.model, run.alpha, run.method, run.epsilon, run.sparsity
  cfg = method_config(dict(base, **({} if model is None else {"model": model}),
                           **({} if alpha is None else {"dirichlet_alpha": alpha}),
                           **(run.overrides or {})),
                      method, eps, ae_options)
  cfg["seed"] = run.seed
  if method in ("dp_fedavg+lus", "blur+lus") and sparsity is not None:
    cfg["options"] = {"sparsity": sparsity}
  labels = {"table": run.table, "model": cfg["model"], "alpha": alpha, "method": method,
            "target_epsilon": eps, "seed": run.seed,
            "sparsity": (DEFAULTS["sparsity"] if sparsity is None else sparsity) if "lus" in method
            else None,
            "lambda": DEFAULTS["lambda"] if "blur" in method else None,
            "local_steps": cfg["local_steps"], "sampling_prob": cfg["sampling_prob"]}
  return Job(make_config(cfg), labels, data=alpha,
             name=f"{run.table} {cfg['model']} alpha={alpha} {method} eps={eps} c={sparsity} "
                  f"Q={cfg['local_steps']} p={cfg['sampling_prob']:g} seed={run.seed}")


def _record(job: Job, result) -> dict:
  """The fields of a run's record after its labels."""
  s, private = result.summary, job.labels["method"] != "fedavg"
  clipped = [h["diagnostics"]["fraction_clipped"] for h in result.history
             if "fraction_clipped" in h["diagnostics"]]
  return {
      "epsilon": s.get("epsilon") if private else None, "delta": DELTA,
      "noise_multiplier": s.get("noise_multiplier") if private else None,
      "sampling": job.config.sampling, "cohort_size": job.config.cohort_size,
      "accuracy": s["final_accuracy"],
      # Raw diagnostics of the runs (pre-clip norms, fraction clipped): not covered by epsilon.
      "fraction_clipped": float(np.mean(clipped)) if private and clipped else None,
      "update_norm_q50_last": result.history[-1]["diagnostics"]["update_norm"]["q50"],
  }


# What tells the rows apart. Records of reproductions run before Figs. 3 and 4 were added lack
# local_steps and sampling_prob: they are the scale's (:func:`_with_defaults`).
ROW_KEYS = ("table", "model", "alpha", "method", "target_epsilon", "sparsity", "local_steps",
            "sampling_prob")


def _summarize(runs: list) -> list:
  rows = []
  for key, rs in group_by(runs, ROW_KEYS).items():
    rows.append({
        **dict(zip(ROW_KEYS, key)),
        "epsilon": rs[0]["epsilon"], "delta": rs[0]["delta"],
        "noise_multiplier": rs[0]["noise_multiplier"], "sampling": rs[0]["sampling"],
        "cohort_size": rs[0]["cohort_size"], "lambda": rs[0]["lambda"],
        **seed_stats([r["accuracy"] for r in rs]),
        "fraction_clipped_mean": float(np.mean([r["fraction_clipped"] for r in rs]))
        if rs[0]["fraction_clipped"] is not None else None,
        "update_norm_median_last": float(np.mean([r["update_norm_q50_last"] for r in rs])),
    })
  return rows


def _paper_cells(p) -> dict:
  return {m: mean_std(*p[m], scale=1) for m in _T1} if p else {}


def _key(record) -> tuple:
  return tuple(record[k] for k in ROW_KEYS)


# A run that one table reuses from another: Table 3 at the default c is Table 1's run, a
# figure's point at Table 2's own Q or p is Table 2's run.
_REUSED = {"table3": ("table1",), "fig3": ("table2",), "fig4": ("table2",)}


def _by_seed(runs: list) -> dict:
  """Row key (:data:`ROW_KEYS`) -> {seed: test accuracy} of the runs' records."""
  acc = {}
  for r in runs:
    acc.setdefault(_key(r), {})[r["seed"]] = r["accuracy"]
  return acc


def _finder(keys, settings: dict):
  """``find(table, model, alpha, method, eps, c=None, local_steps=None, sampling_prob=None)``:
  the key (:data:`ROW_KEYS`) among ``keys`` of that run, or None. ``c`` None is LUS's default;
  Q and p default to the scale's; a reused run (:data:`_REUSED`) is found where it ran."""
  cfg = settings["config"]

  def find(table, model, alpha, method, eps, c=None, local_steps=None, sampling_prob=None):
    """The key of one run, or None.

    Args:
      table: "table1", "table2", "table3", "fig3" or "fig4".
      model: the model's name.
      alpha: the Dirichlet alpha (None: the scale's partition).
      method: the method.
      eps: the target epsilon (None: FedAvg).
      c: LUS's sparsity (None: the default; ignored without LUS).
      local_steps: Q (None: the scale's).
      sampling_prob: p (None: the scale's).
    """
    if "lus" not in method:
      c = None
    elif c is None:
      c = settings["sparsity_default"]
    q = cfg["local_steps"] if local_steps is None else local_steps
    p = cfg["sampling_prob"] if sampling_prob is None else sampling_prob
    for t in (table,) + _REUSED.get(table, ()):
      if (t, model, alpha, method, eps, c, q, p) in keys:
        return t, model, alpha, method, eps, c, q, p
    return None
  return find


def _accuracy_cell(row) -> str:
  """A row's accuracy, mean ± std over its seeds; n/a for a run that is missing."""
  return mean_std(row["accuracy_mean"], row["accuracy_std"]) if row else "n/a"


def _z_cell(row) -> str:
  """A row's noise multiplier; empty for a run that is missing or has none."""
  return f"{row['noise_multiplier']:.3f}" if row and row["noise_multiplier"] is not None else ""


def _row_getter(rows: list, settings: dict) -> Callable:
  """``get(table, model, alpha, method, eps, sparsity=None, **axis)``: the row of that run
  (:func:`_finder`), or None where it did not run."""
  by = {_key(r): r for r in rows}
  find = _finder(by, settings)

  def get(*args, **kwargs):
    key = find(*args, **kwargs)
    return by[key] if key else None

  return get


def _main_table(rows: list, settings: dict, get: Callable) -> list:
  """results.md's opening lines: the setting, the privacy, Table 1 or Table 2 as measured, then
  the paper's for reference."""
  table = settings["table"]
  # The table's columns that ran (results written before the control column have none of it).
  columns = [m for m in COLUMNS[table] if any(r["method"] == m for r in rows)]
  ours = []
  for model, alpha in settings["runs"]:
    for eps in settings["epsilons"]:
      r0, rd = get(table, model, alpha, "dp_fedavg", eps), get(table, model, alpha, "ddgauss", eps)
      ours.append({
          "model": model, "alpha": f"{alpha:g}" if alpha is not None else "",
          "eps": f"{eps:g} ({r0['epsilon']:.3f})" if r0 and r0["epsilon"] is not None else f"{eps:g}",
          "z": _z_cell(r0), "z_dd": f"{_z_cell(rd)} ({rd['epsilon']:.3f})" if rd else "",
          "z_fixed": _z_cell(get(table, model, alpha, FIXED_CONTROL, eps)),
          **{m: _accuracy_cell(get(table, model, alpha, m, eps)) for m in columns},
          "fedavg": _accuracy_cell(get(table, model, alpha, "fedavg", None))})
  lead = ["model"] + (["alpha"] if table == "table2" else [])
  lines = [f"Setting: {settings['description']}", "", f"Privacy: {settings['privacy']}", "",
           f"### {'Table 1' if table == 'table1' else 'Table 2'}: test accuracy (%), mean ± std "
           f"over {settings['seeds']} seeds (delta = {DELTA:g})", ""]
  lines += markdown_table(
      lead + [("eps", "epsilon (ledger, Poisson)"), ("z", "z (DP-FedAvg)"),
              ("z_dd", "z (DDGauss, fixed M; ledger epsilon)")] +
      ([("z_fixed", "z (DP-FedAvg, fixed M)")] if FIXED_CONTROL in columns else []) +
      [(m, LABELS[m]) for m in columns] + [("fedavg", "FedAvg (non-private)")], ours)
  if table == "table1":
    paper = [{"eps": f"{eps:g}", **{f"{k}_{m}": v for k in PAPER_TABLE1
                                     for m, v in _paper_cells(PAPER_TABLE1[k][eps]).items()}}
             for eps in sorted(PAPER_TABLE1["cnn2"])]
    lines += ["", "The paper's Table 1 (federated EMNIST), for reference:", ""]
    lines += markdown_table(["eps"] + [(f"{k}_{m}", f"{k}: {LABELS[m]}") for k in PAPER_TABLE1
                                       for m in _T1], paper)
  else:
    paper = [{"model": k, "alpha": f"{a:g}", **_paper_cells(PAPER_TABLE2[k][a])}
             for k in PAPER_TABLE2 for a in sorted(PAPER_TABLE2[k])]
    lines += ["", "The paper's Table 2 (CIFAR-10, 500 clients assumed; its epsilon is not stated), "
              "for reference:", ""]
    lines += markdown_table(["model", "alpha"] + [(m, LABELS[m]) for m in _T1], paper)
  return lines


def _table3(runs: list, settings: dict, get: Callable) -> list:
  """Table 3's lines (the sparsity ablation at the ablation epsilon, beside the paper's); none
  for a scale that does not run it."""
  if settings["table"] != "table1" or not settings["sparsities"]:
    return []
  (model, alpha), ae = settings["runs"][0], settings["ablation_epsilon"]
  base = {"dp_fedavg+lus": get("table1", model, alpha, "dp_fedavg", ae),
          "blur+lus": get("table1", model, alpha, "dp_fedavg+blur", ae)}
  # Every row over the ablation's own seeds: the rows it reuses from Table 1 (c = 0, and the
  # default c) ran more seeds.
  per_seed = _by_seed(runs)
  seeds = sorted({r["seed"] for r in runs if r["table"] == "table3"} or {r["seed"] for r in runs})

  def ablation_acc(r):
    if r is None:
      return "n/a"
    s = seed_stats([per_seed[_key(r)].get(k) for k in seeds])
    return mean_std(s["accuracy_mean"], s["accuracy_std"])
  table3 = []
  for c in (0.0,) + tuple(settings["sparsities"]):
    row = {"c": f"{c:g}" + (" (no LUS)" if c == 0 else "")}
    for m in ("dp_fedavg+lus", "blur+lus"):
      row[m] = ablation_acc(base[m] if c == 0.0 else get("table3", model, alpha, m, ae, c))
      row[f"paper_{m}"] = (f"{PAPER_TABLE3[m][c]:.2f}" if c in PAPER_TABLE3[m] else
                           "illegible" if m == "blur+lus" else "")
    table3.append(row)
  lines = ["", f"### Table 3: sparsity c of LUS at epsilon = {ae:g} (test accuracy %, mean ± std "
           f"over seeds {', '.join(map(str, seeds))})", ""]
  return lines + markdown_table(
      ["c", ("dp_fedavg+lus", "DP-FedAvg+LUS"), ("blur+lus", "BLUR+LUS"),
       ("paper_dp_fedavg+lus", "paper DP-FedAvg+LUS (ResNet-18)"),
       ("paper_blur+lus", "paper BLUR+LUS")], table3)


def _figure_tables(settings: dict, get: Callable) -> list:
  """Figs. 3 and 4 as tables (accuracy against Q and p); none for a scale without figures."""
  figures, lines = settings.get("figures"), []
  for fig, field in FIGURE_AXES.items() if figures else ():
    m, a, e = figures["model"], figures["alpha"], figures["epsilon"]
    points = [{"v": f"{v:g}", "z": _z_cell(get(fig, m, a, "dp_fedavg", e, **{field: v})),
               **{k: _accuracy_cell(get(fig, m, a, k, None if k == "fedavg" else e,
                                        **{field: v}))
                  for k in FIGURE_METHODS}} for v in figures[field]]
    lines += ["", f"### Fig. {fig[-1]}: {_AXIS_NAMES[field]} ({settings['config']['dataset']}, "
              f"{m}, alpha = {a:g}, epsilon = {e:g}; test accuracy %, mean ± std over "
              f"{settings['seeds']} seeds; the paper's values are not legible)", ""]
    lines += markdown_table([("v", _AXIS_NAMES[field].split()[-1]), ("z", "z (DP-FedAvg, Ours)")]
                            + [(k, LABELS[k]) for k in FIGURE_METHODS], points)
  return lines


def markdown(rows: list, runs: list, settings: dict) -> str:
  """results.md: Table 1 or Table 2 (ours, then the paper's), Table 3, Figs. 3 and 4 as tables
  and the verdicts (:func:`claims`).

  Args:
    rows: the rows of ``results.json`` (one per setting, mean and std over seeds).
    runs: the run records (:func:`fedjax_dp.reproduce.runner.read_records`), each with its seed.
    settings: ``results.json``'s ``settings`` (:func:`_small_settings`), its ``runs`` as
      ``(model, alpha)`` tuples.

  Returns:
    The Markdown text.
  """
  get = _row_getter(rows, settings)
  lines = (_main_table(rows, settings, get) + _table3(runs, settings, get)
           + _figure_tables(settings, get))
  notes = ([_VERDICT_NOTE] + [_TABLE1_NOTE] * (settings["table"] == "table1")
           + [_FIGURE_NOTE] * bool(settings.get("figures")))
  lines += ["", "### Verdicts", "", " ".join(notes), ""]
  lines += verdict_table(claims(rows, runs, settings))
  return "\n".join(lines) + "\n"


_AXIS_NAMES = {"local_steps": "local steps Q", "sampling_prob": "client sampling probability p"}
_VERDICT_NOTE = (
    "Each claim is a difference in final test accuracy, in points; \"Ours\" is BLUR+LUS. The "
    "column \"ours (points)\" is the measured difference's mean over the seeds both sides ran, "
    "paired by seed (run s of each side has seed s); ± is the sample standard deviation of the "
    "per-seed difference (2 seeds or more). Verdict (`fedjax_dp.reproduce.tables.verdict`): "
    "reproduced = the claimed sign, at least half the claimed size and above the spread; "
    "partly = the claimed sign, but under half the claimed size or within the spread; not "
    "reproduced = zero or the opposite sign.")
_TABLE1_NOTE = (
    "Table 1 claims compare our differences with the paper's federated EMNIST CNN-2-layers "
    "differences, Table 3 claims with its EMNIST ResNet-18 ones: a different data set and "
    "model.")
_FIGURE_NOTE = (
    "The figures' values are not legible in the paper's text, so their claims give a direction "
    "only (sign only: the claimed sign above the spread is reproduced).")


def _paired(acc: dict, keys: list, fn) -> tuple:
  """``(mean, std)`` in points of ``fn(accuracies of keys)`` over the seeds every key ran: std
  with 2 seeds or more, else None; ``(None, None)`` when a key is missing; mean NaN when a
  run's accuracy is not finite."""
  if any(k is None for k in keys):
    return None, None
  seeds = sorted(set.intersection(*(set(acc[k]) for k in keys)))
  if not seeds:
    return None, None
  d = 100.0 * np.array([fn([math.nan if acc[k][s] is None else acc[k][s] for k in keys])
                        for s in seeds], float)
  if not np.all(np.isfinite(d)):
    return math.nan, None
  return seed_difference(d)


def _difference(v):
  return v[0] - v[1]


def _change_of_difference(v):
  return (v[0] - v[1]) - (v[2] - v[3])


# Measured at the small scale (docs/cheng2022_ae_dpfl.md): why AE-DPFL falls far below the
# paper's gap when clients hold label shards.
AE_DPFL_SHARDS_REASON = (
    "with label shards AE-DPFL's public set is one client's data (2 digits: true-label ceiling "
    "20.6% at small scale) and 2-digit clients' vote margin is below the count noise z sqrt(m); "
    "iid clients give 56% at epsilon 8 (docs/cheng2022_ae_dpfl.md)")


def _blur_reason(row, clip: float) -> str:
  """The measured reason a BLUR run gains little: its pre-clip norms (before LUS) stay above S."""
  if not row or "blur" not in row["method"] or (row.get("fraction_clipped_mean") or 0) < 0.5:
    return ""
  where = " before LUS" if "lus" in row["method"] else ""
  return (f"BLUR leaves {row['fraction_clipped_mean']:.0%} of updates above S = {clip:g}{where} "
          f"(last-round median {row['update_norm_median_last']:.2f}); see "
          f"docs/cheng2022_norms.md")


class _Claims:
  """The claims of :func:`claims`, gathered in ``out`` in the order they are added."""

  def __init__(self, rows: list, runs: list, settings: dict):
    self.by, self.acc = {_key(r): r for r in rows}, _by_seed(runs)
    self.find, self.settings, self.out = _finder(self.acc, settings), settings, []

  def claim(self, text, paper, keys, fn=_difference, why=None, sign_only=False, above=""):
    """Adds the claim ``text`` (the paper's difference ``paper``) beside ``fn`` of the runs
    ``keys`` paired by seed. A reason is given for a claim not reproduced (``why``: the BLUR run
    whose norms may explain it) and for one whose difference exceeds the paper's by more than
    half of it and more than the spread (``above``: the measured reason for that, else "not
    analysed").

    Args:
      text: the claim, in words.
      paper: the paper's difference, in points.
      keys: the row keys of the runs ``fn`` compares (a None: a run that is missing).
      fn: the measured quantity from the keys' accuracies of one seed (default: the first
        minus the second).
      why: the key of the BLUR run whose norms may explain a claim not reproduced.
      sign_only: the paper gives a direction only.
      above: the measured reason a difference exceeds the paper's.
    """
    measured, spread = _paired(self.acc, keys, fn)
    if measured is not None and math.isnan(measured):
      self.out.append(Claim(text, paper, None, reason="a run's accuracy is not finite (diverged)",
                            sign_only=sign_only))
      return
    reason, v = "", verdict(paper, measured, spread, sign_only)
    if v in ("partly", "not reproduced"):
      reason = _blur_reason(self.by.get(why), self.settings["clip"]) or "not analysed"
    elif v == "reproduced" and not sign_only:
      excess = (measured - paper) * (1.0 if paper > 0 else -1.0)
      if excess > 0.5 * abs(paper) and excess > (spread or 0.0):
        reason = above or "not analysed"
    self.out.append(Claim(text, paper, measured, spread, reason, sign_only))

  def versus(self, where, paper, table, model, alpha, eps):
    """Ours (BLUR+LUS) minus each baseline at one setting, against the paper's cells ``paper``.

    Args:
      where: the claims' prefix naming the setting.
      paper: the paper's ``{method: (mean, std)}`` at the setting.
      table: the table of the runs.
      model: the model's name.
      alpha: the Dirichlet alpha (None: the scale's partition).
      eps: the target epsilon.
    """
    find, by = self.find, self.by
    ours, dp = (find(table, model, alpha, k, eps) for k in ("blur+lus", "dp_fedavg"))
    for other in ("dp_fedavg", "ae-dpfl", "ddgauss"):
      key, above = find(table, model, alpha, other, eps), ""
      if other == "ddgauss" and key and dp:
        above = (f"DDGauss's z {by[key]['noise_multiplier']:.2f} vs DP-FedAvg's "
                 f"{by[dp]['noise_multiplier']:.2f} (replace-one)")
        control = find(table, model, alpha, FIXED_CONTROL, eps)
        if control:  # the same cohorts and accounting without DDGauss's encoding
          above += (f"; DP-FedAvg with its fixed cohorts and accounting: "
                    f"{100 * by[control]['accuracy_mean']:.2f}% against DDGauss's "
                    f"{100 * by[key]['accuracy_mean']:.2f}%")
      if other == "ae-dpfl" and self.settings["config"].get("partition") == "shards":
        above = AE_DPFL_SHARDS_REASON
      self.claim(f"{where}Ours − {LABELS[other]}", paper["blur+lus"][0] - paper[other][0],
                 [ours, key], why=ours, above=above)

  def gain(self, table, model, alpha, eps):
    """The runs of Ours and DP-FedAvg at one setting (their difference is Ours' gain).

    Args:
      table: the table of the runs.
      model: the model's name.
      alpha: the Dirichlet alpha (None: the scale's partition).
      eps: the target epsilon.

    Returns:
      ``[key of Ours, key of DP-FedAvg]`` (None where missing).
    """
    return [self.find(table, model, alpha, "blur+lus", eps),
            self.find(table, model, alpha, "dp_fedavg", eps)]

  def table1(self):
    """Table 1 against the paper's CNN-2-layers, the gain larger at the smaller epsilon, and
    Table 3 (BLUR alone, LUS at each c)."""
    settings, find = self.settings, self.find
    (model, alpha), epsilons = settings["runs"][0], settings["epsilons"]
    for eps in epsilons:
      if eps in PAPER_TABLE1["cnn2"]:
        self.versus(f"epsilon {eps:g}: ", PAPER_TABLE1["cnn2"][eps], "table1", model, alpha, eps)
    lo, hi = min(epsilons), max(epsilons)
    if lo < hi and {lo, hi} <= set(PAPER_TABLE1["cnn2"]):
      p = {e: PAPER_TABLE1["cnn2"][e] for e in (lo, hi)}
      self.claim(f"Ours − DP-FedAvg larger at epsilon {lo:g} than at {hi:g}",
                 (p[lo]["blur+lus"][0] - p[lo]["dp_fedavg"][0]) -
                 (p[hi]["blur+lus"][0] - p[hi]["dp_fedavg"][0]),
                 self.gain("table1", model, alpha, lo) + self.gain("table1", model, alpha, hi),
                 _change_of_difference)
    if settings["sparsities"]:
      ae, t3 = settings["ablation_epsilon"], PAPER_TABLE3
      base, blur = (find("table1", model, alpha, m, ae) for m in ("dp_fedavg", "dp_fedavg+blur"))
      self.claim(f"epsilon {ae:g}: DP-FedAvg+BLUR − DP-FedAvg (Table 3, c = 0)",
                 t3["blur+lus"][0.0] - t3["dp_fedavg+lus"][0.0], [blur, base], why=blur)
      for c in settings["sparsities"]:
        if c in t3["dp_fedavg+lus"]:
          self.claim(f"epsilon {ae:g}: DP-FedAvg+LUS − DP-FedAvg at c = {c:g} (Table 3)",
                     t3["dp_fedavg+lus"][c] - t3["dp_fedavg+lus"][0.0],
                     [find("table3", model, alpha, "dp_fedavg+lus", ae, c), base])

  def table2(self):
    """Table 2 at each model, alpha and epsilon, and the gain larger at the smaller alpha."""
    settings = self.settings
    for model, alpha in settings["runs"]:
      for eps in settings["epsilons"]:
        if alpha in PAPER_TABLE2.get(model, {}):
          self.versus(f"{model}, alpha {alpha:g}, epsilon {eps:g}: ", PAPER_TABLE2[model][alpha],
                      "table2", model, alpha, eps)
    for model in dict.fromkeys(m for m, _ in settings["runs"]):
      alphas = [a for m, a in settings["runs"] if m == model and a in PAPER_TABLE2.get(model, {})]
      if len(alphas) < 2:
        continue
      lo, hi = min(alphas), max(alphas)
      p = {a: PAPER_TABLE2[model][a] for a in (lo, hi)}
      for eps in settings["epsilons"]:
        self.claim(
            f"{model}, epsilon {eps:g}: Ours − DP-FedAvg larger at alpha {lo:g} than at {hi:g}",
            (p[lo]["blur+lus"][0] - p[lo]["dp_fedavg"][0]) -
            (p[hi]["blur+lus"][0] - p[hi]["dp_fedavg"][0]),
            self.gain("table2", model, lo, eps) + self.gain("table2", model, hi, eps),
            _change_of_difference)

  def figures(self, figures: dict):
    """The figures' directions: Ours above DP-FedAvg at every Q and p, DP-FedAvg losing from
    Q = 30 to Q = 40 where Ours holds, Ours varying less over p."""
    m, a, e = figures["model"], figures["alpha"], figures["epsilon"]

    def at(fig, method, **axis):
      return self.find(fig, m, a, method, e, **axis)

    qs, ps = figures["local_steps"], figures["sampling_prob"]
    for q in qs:
      self.claim(f"Fig. 3, Q = {q}: Ours − DP-FedAvg", 1.0,
                 [at("fig3", "blur+lus", local_steps=q), at("fig3", "dp_fedavg", local_steps=q)],
                 why=at("fig3", "blur+lus", local_steps=q), sign_only=True)
    hi = 40 if 40 in qs else max(qs)
    if any(q < hi for q in qs):
      lo = max(q for q in qs if q < hi)
      ours, dp = ([at("fig3", k, local_steps=q) for q in (hi, lo)]
                  for k in ("blur+lus", "dp_fedavg"))
      self.claim(f"Fig. 3: DP-FedAvg loses accuracy from Q = {lo} to Q = {hi}", -1.0, dp,
                 sign_only=True)
      self.claim(f"Fig. 3: Ours loses less than DP-FedAvg from Q = {lo} to Q = {hi}", 1.0,
                 ours + dp, _change_of_difference, why=ours[0], sign_only=True)
    for p in ps:
      self.claim(f"Fig. 4, p = {p:g}: Ours − DP-FedAvg", 1.0,
                 [at("fig4", "blur+lus", sampling_prob=p),
                  at("fig4", "dp_fedavg", sampling_prob=p)],
                 why=at("fig4", "blur+lus", sampling_prob=p), sign_only=True)
    if len(ps) >= 2:
      n = len(ps)
      self.claim("Fig. 4: Ours varies less over p than DP-FedAvg (range over p, DP-FedAvg's "
                 "minus Ours')", 1.0,
                 [at("fig4", k, sampling_prob=p) for k in ("blur+lus", "dp_fedavg") for p in ps],
                 lambda v: np.ptp(v[n:]) - np.ptp(v[:n]), sign_only=True)


def claims(rows: list, runs: list, settings: dict) -> list:
  """The paper's claims that this scale measures, each a :class:`Claim` beside our paired
  difference: Ours (BLUR+LUS) minus each baseline at each epsilon (Table 1, against the paper's
  CNN-2-layers) or at each model, alpha and epsilon (Table 2; its epsilon is not stated), the
  gain larger at the smaller epsilon or alpha, BLUR alone and LUS at each c (Table 3), and the
  figures' directions (Ours above DP-FedAvg at every Q and p, DP-FedAvg losing from Q = 30 to
  Q = 40 where Ours holds, Ours varying less over p).

  Args:
    rows: the rows of ``results.json`` (one per setting, mean and std over seeds).
    runs: the run records (:func:`fedjax_dp.reproduce.runner.read_records`), each with its seed.
    settings: ``results.json``'s ``settings`` (:func:`_small_settings`), its ``runs`` as
      ``(model, alpha)`` tuples.

  Returns:
    The :class:`fedjax_dp.reproduce.tables.Claim` s, in order.
  """
  c = _Claims(rows, runs, settings)
  if settings["table"] == "table1":
    c.table1()
  else:
    c.table2()
  if settings.get("figures"):
    c.figures(settings["figures"])
  return c.out


def plot(rows: list, runs: list, settings: dict, out_dir: pathlib.Path) -> list:
  """Fig. 2 (pre-clip update norms per round, the first model and alpha), accuracy-versus-round
  curves (one panel per model, alpha and curve epsilon) and, with figures, Figs. 3 and 4
  (:func:`_figure_plots`).

  Args:
    rows: the rows of ``results.json`` (one per setting, mean and std over seeds).
    runs: the run records (:func:`fedjax_dp.reproduce.runner.read_records`), each with its seed.
    settings: ``results.json``'s ``settings`` (:func:`_small_settings`), its ``runs`` as
      ``(model, alpha)`` tuples.
    out_dir: the folder the PNGs are written to.

  Returns:
    The paths of the PNGs written.
  """
  eps_fig, table = settings["figure_epsilon"], settings["table"]

  def select(model, alpha, m, eps):
    """The table's run records of one method at one setting.

    Args:
      model: the model's name.
      alpha: the Dirichlet alpha (None: the scale's partition).
      m: the method (FedAvg's records at any epsilon).
      eps: the target epsilon.
    """
    return [r for r in runs if r["table"] == table and r["model"] == model and
            r["alpha"] == alpha and r["method"] == m and (r["target_epsilon"] == eps or m == "fedavg")]

  norms = []
  for m in ("dp_fedavg", "blur+lus"):
    rs = select(*settings["runs"][0], m, eps_fig)
    if rs:
      h = rs[0]["history"]
      norms.append((f"{LABELS[m]} (eps={eps_fig:g}, seed {rs[0]['seed']})", [x["round"] for x in h],
                    {k: [x["diagnostics"]["update_norm"][k] for x in h] for k in ("q10", "q50", "q90")}))
  paths = [plot_quantiles(norms, out_dir / "cheng2022_update_norms.png", clip=settings["clip"],
                          ylabel="||Delta|| before LUS and clip")]
  panels = []
  for model, alpha in settings["runs"]:
    for eps in settings["curve_epsilons"]:
      curves = []
      for m in COLUMNS[table] + ("fedavg",):
        rs = select(model, alpha, m, eps)
        if rs:
          xs = [x["round"] for x in rs[0]["history"] if "test_accuracy" in x]
          ys = np.mean([[x["test_accuracy"] for x in r["history"] if "test_accuracy" in x]
                        for r in rs], 0)
          curves.append(Curve(LABELS[m], xs, ys, style=":" if m == "fedavg" else "-"))
      where = "" if alpha is None else f"{model}, alpha = {alpha:g}, "
      panels.append((f"{where}epsilon = {eps:g} (mean of {settings['seeds']} seeds)", curves))
  paths.append(plot_curves(panels, out_dir / "cheng2022_accuracy.png", xlabel="round",
                           layout=Layout(legend_outside=True)))
  return paths + _figure_plots(rows, settings, out_dir)


def _figure_plots(rows: list, settings: dict, out_dir: pathlib.Path) -> list:
  """Figs. 3 and 4 (accuracy against Q and p, error bars: std over seeds), written to
  ``out_dir``; their paths (none for a scale without figures)."""
  figures, paths = settings.get("figures"), []
  by = {_key(r): r for r in rows}
  find = _finder(by, settings)
  for fig, field in FIGURE_AXES.items() if figures else ():
    m, a, e = figures["model"], figures["alpha"], figures["epsilon"]
    curves = []
    for k in FIGURE_METHODS:
      found = [(v, by[key]) for v in figures[field]
               for key in [find(fig, m, a, k, None if k == "fedavg" else e, **{field: v})] if key]
      if found:
        curves.append(Curve(LABELS[k], [v for v, _ in found],
                            [r["accuracy_mean"] for _, r in found],
                            err=[r["accuracy_std"] for _, r in found],
                            style=":" if k == "fedavg" else "-"))
    title = f"Fig. {fig[-1]}: {m}, alpha {a:g}, eps {e:g}, {settings['seeds']} seeds"
    paths.append(plot_curves([(title, curves)], out_dir / f"cheng2022_{fig}.png",
                             xlabel=_AXIS_NAMES[field]))
  return paths


def _with_defaults(record: dict, settings: dict) -> dict:
  """A row or run record with the scale's Q and p where it has none (written before Figs. 3 and
  4 were added)."""
  return {"local_steps": settings["config"]["local_steps"],
          "sampling_prob": settings["config"]["sampling_prob"], **record}


def render(output_dir: str, log=print) -> int:
  """Writes ``results.md`` and the figures of a reproduction in ``output_dir`` from its
  ``results.json`` (settings, rows) and ``runs.jsonl`` (each run's seed, accuracy and history),
  running nothing, and logs the files written (:func:`~fedjax_dp.reproduce.runner.wrote`).
  Reads the files of earlier versions of this module too (no ``figures`` in the settings, no Q
  or p in the records: the scale's)."""
  log(wrote(_render(output_dir)))
  return 0


def saved_claims(output_dir) -> list:
  """The claims (:func:`claims`) of the reproduction in ``output_dir``, as its ``results.md``
  shows them: from its ``results.json`` and ``runs.jsonl`` (:func:`_saved`)."""
  return claims(*_saved(output_dir))


def _saved(output_dir) -> tuple:
  """``(rows, runs, settings)`` of the reproduction in ``output_dir``, as :func:`markdown` and
  :func:`claims` take them, from its ``results.json`` and ``runs.jsonl``; a results.json without
  settings (the paper scale's) is refused, naming ``--output-dir``."""
  out = pathlib.Path(output_dir)
  results = json.loads((out / "results.json").read_text())
  check("settings" in results, "--output-dir", output_dir,
        "holds a results.json without settings (the paper scale's run list): nothing to render")
  settings = dict(results["settings"], runs=[tuple(r) for r in results["settings"]["runs"]])
  rows = [_with_defaults(r, settings) for r in results["rows"]]
  return rows, read_records(out, rows, ROW_KEYS, lambda r: _with_defaults(r, settings)), settings


def _render(output_dir) -> list:
  """:func:`render`'s files, written; their paths (results.md, then the figures)."""
  out = pathlib.Path(output_dir)
  rows, runs, settings = _saved(out)
  write_text_atomic(out / "results.md", markdown(rows, runs, settings))
  return [out / "results.md"] + plot(rows, runs, settings, out)


PRIVACY = (
    "user-level (epsilon, delta)-DP, RDP accountant of dp_accounting, each method's noise "
    "multiplier calibrated by the ledger to the target epsilon. DP-FedAvg, +BLUR, +LUS, "
    "BLUR+LUS and AE-DPFL: add/remove one client under Poisson sampling at rate p (BLUR and "
    "LUS have exactly DP-FedAvg's epsilon at the same noise; AE-DPFL's population excludes the "
    "clients holding its public set). DDGauss: replace one client, fixed cohorts of M = round(p N) "
    "(the only sampling its accounting covers), so its epsilon is under a different neighbouring "
    "relation and needs a larger z than DP-FedAvg (replacing a client moves the sum by up to "
    "2 S; 2.2 to 2.7 times at the tiny and cifar-small scales), and its column is not an "
    "equal-epsilon comparison under add/remove. Pre-clip update norms in the metrics (and the "
    "rows' fraction_clipped_mean and update_norm_median_last, quoted in the verdicts' reasons) "
    "and hyper-parameters chosen on test accuracy are not covered.")
# Table 1's privacy note on its control column (:data:`FIXED_CONTROL`).
CONTROL_PRIVACY = (" The column \"DP-FedAvg (DDGauss's fixed M)\" is DP-FedAvg under DDGauss's "
                   "fixed cohorts and replace-one accounting: the comparison at equal epsilon and "
                   "relation.")
# The rows' raw statistics (runner.release).
RAW = {"fraction_clipped_mean, update_norm_median_last":
       "the fraction of pre-clip client updates above S and their last-round median norm"}


def _models(spec: dict, base: dict) -> tuple:
  """The models a scale runs (the ``cifar`` scales' configuration names none)."""
  return tuple(spec["models"]) if "models" in spec else (base["model"],)


def _small_jobs(spec: dict, base: dict, n_seeds: int) -> list:
  """The jobs of a scale's settings ``spec`` on its configuration ``base``: :func:`plan`'s,
  then :func:`figure_plan`'s."""
  epsilons, figures = spec["epsilons"], spec.get("figures")
  runs_of = [(m, a) for m in _models(spec, base) for a in spec.get("alphas", (None,))]
  planned = plan(epsilons, spec.get("sparsities", ()), spec.get("ablation_epsilon", epsilons[-1]),
                 n_seeds, min(n_seeds, spec.get("ablation_seeds", n_seeds)),
                 spec.get("table", "table1"), runs_of)
  if figures:
    planned += figure_plan(figures, base, n_seeds, runs_of, epsilons)
  return [_job(base, r, ae_options=spec.get("ae_dpfl")) for r in planned]


def _small_settings(scale: str, spec: dict, base: dict, n_seeds: int, wall: float) -> dict:
  """``results.json``'s ``settings`` of a scale that ran in ``wall`` seconds."""
  table, models = spec.get("table", "table1"), _models(spec, base)
  epsilons, sparsities = spec["epsilons"], spec.get("sparsities", ())
  ae = spec.get("ablation_epsilon", epsilons[-1])
  ae_dpfl = spec.get("ae_dpfl") or AE_DPFL_OPTIONS
  n, p = base["num_clients"], base["sampling_prob"]
  split = (f"dirichlet alpha in {{{', '.join(f'{a:g}' for a in spec['alphas'])}}}"
           if table == "table2" else f"shards, {base['shards_per_client']} shards each")
  subset = (f", {base['max_train']} training / {base['max_test']} test examples"
            if base.get("max_train") else "")
  return {
      "scale": scale, "table": table, "seeds": n_seeds, "epsilons": list(epsilons),
      "runs": [(m, a) for m in models for a in spec.get("alphas", (None,))],
      "sparsities": list(sparsities), "ablation_epsilon": ae,
      "sparsity_default": DEFAULTS["sparsity"], "lambda": DEFAULTS["lambda"],
      "lus_batches": DEFAULTS["lus_batches"], "clip": base["clip"], "config": base,
      "ae_dpfl": dict(ae_dpfl), "num_clients": n,
      "figure_epsilon": ae if ae in epsilons else epsilons[-1],
      "curve_epsilons": sorted({epsilons[0], epsilons[-1]}), "wall_seconds": wall,
      "figures": spec.get("figures"),
      "description": (f"{base['dataset']}, {n} clients ({split}{subset}), "
                      f"model {' then '.join(models)}, "
                      f"T={base['rounds']} rounds, Poisson p={p:g} (~{n * p:.0f} clients/round; "
                      f"DDGauss: fixed cohorts of M={int(round(p * n))}), Q={base['local_steps']} "
                      f"local SGD steps of batch {base['batch_size']} at lr {base['client_lr']:g}, "
                      f"S={base['clip']:g}, eta_g={base['server_lr']:g}, lambda={DEFAULTS['lambda']}, "
                      f"c={DEFAULTS['sparsity']}, lus_batches={DEFAULTS['lus_batches']}; AE-DPFL: "
                      f"{', '.join(f'{k}={v}' for k, v in ae_dpfl.items())}"
                      f", server lr {base['client_lr']:g}"),
      "privacy": PRIVACY + (CONTROL_PRIVACY if FIXED_CONTROL in COLUMNS[table] else ""),
  }


def run_small(scale: str, output_dir: str, data_dir=None, seeds: Optional[int] = None,
              data=None, spec: Optional[dict] = None,
              execution: Execution = Execution()) -> dict:
  """Runs a CPU-or-accelerator scale of :data:`SCALES` (every one but "paper") and writes its
  files; ``data`` (a loaded data set) serves the scales with one data set (every alpha too);
  ``spec``: settings in place of the scale's (a variant of it: ``benchmarks/gpu.py`` times
  Table 2 at a few rounds).

  Args:
    scale: a key of :data:`SCALES` other than "paper".
    output_dir: the folder written (``results.json``, ``results.md``, ``runs.jsonl``, figures).
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each setting (None: the scale's).
    data: a loaded data set to run on (None: loaded per alpha).
    spec: the scale's settings to use instead of ``SCALES[scale]``.
    execution: the threads, where the progress lines and the results go (``log``), and whether
      to continue the reproduction in ``output_dir`` (only the runs its ``runs.jsonl`` has no
      record of run), as :class:`~fedjax_dp.reproduce.runner.Execution` says.

  Returns:
    ``{"rows", "settings", "runs"}``: what ``results.json`` holds and the run records.
  """
  spec = SCALES[scale] if spec is None else spec
  base = dict(spec["config"], data_dir=data_dir)
  n_seeds = num_seeds(seeds, spec["seeds"])
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  jobs = _small_jobs(spec, base, n_seeds)

  def load(alpha):  # the partition's seed is 0 for every run
    return data if data is not None else load_data(make_config(
        dict(base, **({} if alpha is None else {"dirichlet_alpha": alpha}))))

  runs = run_jobs(jobs, _record, load_data=load, runs_path=out / "runs.jsonl",
                  kept=Kept(("update_norm", "train_loss", "fraction_clipped")),
                  execution=execution)
  rows = _summarize(runs)
  settings = _small_settings(scale, spec, base, n_seeds, wall_seconds(runs))
  write_text_atomic(out / "results.json", json.dumps(
      {"paper": "Cheng et al., Differentially Private Federated Learning with Local Regularization "
                "and Sparsification, CVPR 2022", "settings": settings, "rows": rows,
       "paper_table1": {m: {str(k): v for k, v in t.items()} for m, t in PAPER_TABLE1.items()},
       "paper_table2": {m: {str(k): v for k, v in t.items()} for m, t in PAPER_TABLE2.items()},
       "paper_table3": {m: {str(k): v for k, v in t.items()} for m, t in PAPER_TABLE3.items()},
       "release": release(RAW), **identity("cheng2022")},
      indent=2) + "\n")
  written = _render(out)
  execution.log((out / "results.md").read_text())
  execution.log(wrote([out / "results.json", out / "runs.jsonl"] + written,
                      settings["wall_seconds"]))
  return {"rows": rows, "settings": settings, "runs": runs}


def run_paper(output_dir: str, data_dir=None, seeds: Optional[int] = None, presets=None,
              execution: Execution = Execution()) -> int:
  """The paper's Table 1 presets (federated EMNIST; accelerator only), every column of
  :data:`COLUMNS` ``["table1"]`` at each epsilon, configured by :func:`method_config`.

  Writes ``results.json`` (``runs``: preset, method, target and ledger epsilon, seed, accuracy;
  ``release``: the accuracies are raw, on the writers' own held-out examples), ``runs.jsonl``
  and each run's metrics under ``DIR/PRESET/``.

  Args:
    output_dir: the folder written (``DIR``).
    data_dir: the folder holding TFF's federated EMNIST files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each setting (None: the scale's).
    presets: names of :data:`PAPER_PRESETS` to run (None: all).
    execution: the threads, where the progress lines go (``log``), and whether to continue the
      reproduction in ``output_dir`` (only the runs its ``runs.jsonl`` has no record of run), as
      :class:`~fedjax_dp.reproduce.runner.Execution` says.

  Returns:
    0.

  Raises:
    ConfigError: an unknown preset, a bad ``seeds``, missing data files, or as the runs.
  """
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  n_seeds = num_seeds(seeds, SCALES["paper"]["seeds"])
  # Where `--dataset federated_emnist` finds them: --data-dir, else $FEDJAX_DP_DATA.
  train, test = tff.paths(specs.get("federated_emnist"), resolve_data_dir(data_dir))
  names = presets or PAPER_PRESETS
  for name in names:
    check_choice("preset", name, sorted(PAPER_PRESETS))
  data = load_federated_emnist(train, test)
  runs = []
  for i, name in enumerate(names):
    preset = dict(PAPER_PRESETS[name], num_clients=data.num_clients, data_dir=data_dir)
    jobs = [Job(make_config(dict(method_config(preset, m, eps), seed=seed)),
                {"preset": name, "method": m, "target_epsilon": eps, "seed": seed},
                output_dir=str(out / name / f"{m}_eps{eps:g}_seed{seed}"))
            for eps in EPSILONS for m in COLUMNS["table1"] for seed in range(n_seeds)]
    runs += run_jobs(jobs, lambda job, res: {"epsilon": res.summary.get("epsilon"),
                                             "sampling": job.config.sampling,
                                             "accuracy": res.summary["final_accuracy"]},
                     load_data=lambda _: data, runs_path=out / "runs.jsonl", append=i > 0,
                     execution=execution)
  # The sampling tells the Poisson (add/remove) runs from the fixed-cohort (replace-one) ones.
  keys = ("preset", "method", "target_epsilon", "seed", "epsilon", "sampling", "accuracy")
  # Federated EMNIST's natural partition: the test file holds the same writers' examples.
  write_text_atomic(out / "results.json", json.dumps(
      {"runs": [{k: r[k] for k in keys} for r in runs],
       "release": release({}, test_from_clients=data.test_from_clients),
       **identity("cheng2022")}, indent=2) + "\n")
  execution.log(wrote([out / "results.json", out / "runs.jsonl"], time.perf_counter() - t0))
  return 0


def run(scale: str, output_dir: str, data_dir=None, seeds=None, threads=None,
        resume: bool = False) -> int:
  """Entry point of ``fedjax-dp reproduce cheng2022``: :func:`run_paper` at the "paper" scale,
  else :func:`run_small`.

  Args:
    scale: a key of :data:`SCALES`.
    output_dir: the folder written.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each setting (None: the scale's).
    threads: compiled programs run at once (None: automatic).
    resume: continue the reproduction in ``output_dir``: only the runs that its ``runs.jsonl``
      has no record of run (:func:`fedjax_dp.reproduce.runner.run_jobs`).

  Returns:
    0.

  Raises:
    ConfigError: an unknown scale, or as the runs.
  """
  check_choice("scale", scale, sorted(SCALES))
  execution = Execution(threads=threads, resume=resume)
  if scale == "paper":
    return run_paper(output_dir, data_dir, seeds, execution=execution)
  run_small(scale, output_dir, data_dir, seeds, execution=execution)
  return 0
