"""Reproduction of Zhu and Ling, IJCAI 2022 (DP-RSA), Fig. 1 (MNIST) and the CIFAR-10 preset.

``fedjax-dp reproduce zhu2022 --scale small --output-dir DIR`` runs, on real
MNIST, K=30 workers of which the last b=3 are Byzantine, the paper's MLP
(784-50-50-10, tanh), lambda=0.01, alpha=0.01, f_0 = 0.002 ||x||^2:

* iid (60,000 examples evenly) under the Gaussian and the sign-flipping attack;
* non-iid (for each digit, half its examples spread evenly over all workers,
  the other half to one group of K / 10 = 3 workers) under sample duplication;

for SGD (mean), SignSGD, GM, RSA, DP-RSA(F) and DP-RSA(G) at per-coordinate
epsilon in {0.2, 0.4, 1.38}. It writes ``DIR/results.json`` (``rows``: method,
partition, attack, epsilon, accuracy_mean, accuracy_std (sample std over
seeds), seeds, plus the composed whole-run epsilon; rewritten as runs end),
``DIR/runs.jsonl`` (every run's record, with its accuracy curve: :data:`HISTORY_KEPT`),
``DIR/results.md`` (the rows as a table and the verdicts on the paper's Fig. 1 claims,
:func:`claims`) and
``DIR/zhu2022_<partition>_<attack>.png`` (accuracy versus iteration). The last
two are written by :func:`render` from ``results.json`` and ``runs.jsonl``, which
``fedjax-dp reproduce zhu2022 --render --output-dir DIR`` calls on an earlier
run without running anything.

Deviations from the paper (stated in the results): fewer iterations than the
paper's 5,000 and minibatches of ``batch_size`` examples per worker per
iteration (the paper states no batch size; its 2.5 MNIST epochs over 5,000
iterations of 30 workers mean one example per worker per iteration, what ``--scale paper-b1``
runs; ``--scale paper`` keeps the small scale's 32); DP-RSA(G) clips
each coordinate of ``x_0 - x_k`` to ``[-sign_clip, sign_clip]`` so that its
epsilon is a real guarantee, and calibrates sigma to the per-coordinate
epsilon. The CIFAR-10 preset ``cifar-small`` trains on a 10,000-image subset
(2,000 test images) for 200 iterations of 16-image minibatches, one seed, at
two epsilons; the paper trains on all 50,000 images for 80 epochs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time

import numpy as np

from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData, load_central, partition_indices
from fedjax_dp.errors import check, check_choice
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.plots import Curve, Layout, plot_curves
from fedjax_dp.reproduce.runner import (Execution, Job, Kept, group_by, identity, num_seeds,
                                        read_records, release, run_jobs, wall_seconds, wrote)
from fedjax_dp.reproduce.tables import (Claim, markdown_table, mean_std, seed_difference,
                                       verdict_table)
from fedjax_dp.stats import seed_stats

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
    # The paper's text: 2.5 MNIST epochs over 5,000 iterations of 30 workers, one example per
    # worker per iteration.
    "paper-b1": dict(dataset="mnist", num_clients=30, byzantine=3, model="rsa_mlp", rounds=5000,
                     batch_size=1, lr=0.01, lam=0.01, l2=0.004, eval_every=250, seeds=3,
                     max_train=None, max_test=None, sign_clip=0.002, epsilons=EPSILONS),
    # CIFAR-10 preset (Fig. 2): 20 workers, b=2, the ~368k-parameter CNN, lambda=0.002; a
    # 10,000-image subset and 200 iterations (the paper: 50,000 images, 80 epochs).
    "cifar-small": dict(dataset="cifar10", num_clients=20, byzantine=2, model="rsa_cifar_cnn",
                        rounds=200, batch_size=16, lr=0.01, lam=0.002, l2=0.004, eval_every=50,
                        seeds=1, max_train=10000, max_test=2000, sign_clip=0.002,
                        epsilons=(0.2, 1.38)),
}


def half_spread_groups(labels: np.ndarray, num_clients: int, group_size: int,
                       rng: np.random.Generator) -> list:
  """The paper's non-iid split: for each class c, half of its examples are spread
  evenly over all workers, the other half evenly over the group of ``group_size``
  workers ``c * group_size, ...`` (mod ``num_clients``).

  Args:
    labels: ``[N]`` integer labels of the training set.
    num_clients: the workers ``K``.
    group_size: the workers of each class's group, ``>= 1``.
    rng: the generator of the examples' order within each class.

  Returns:
    ``num_clients`` sorted index arrays into ``labels``, one per worker.
  """
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
  """The scale's data set split over its workers.

  Args:
    scale: a value of :data:`SCALES` (``dataset``, ``num_clients``, ``max_train``,
      ``max_test`` are read).
    partition: "iid", or "noniid" (:func:`half_spread_groups` with groups of
      ``num_clients // classes`` workers).
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seed: the seed of the subsets and of the split.

  Returns:
    The :class:`fedjax_dp.data.FederatedData`.

  Raises:
    ConfigError: the non-iid split with fewer workers than classes, or as the loader.
  """
  central = load_central(scale["dataset"], data_dir=data_dir, max_train=scale["max_train"],
                         max_test=scale["max_test"], seed=seed)
  rng = np.random.default_rng([seed, 2022])
  k = scale["num_clients"]
  if partition == "iid":
    parts = partition_indices(central.train_y, k, "iid", rng)
  else:
    # The paper's groups (and its authors' code): K / 10 workers per class.
    check(k >= central.num_classes, "num_clients", k, f"must be >= the {central.num_classes} "
          "classes for the non-iid split (groups of num_clients // classes workers)")
    parts = half_spread_groups(central.train_y, k, k // central.num_classes, rng)
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


# What tells the rows apart.
ROW_KEYS = ("partition", "attack", "method", "epsilon")
# What a run's record keeps of its history: the curve (the evaluated rounds) and those rounds'
# training loss and update norms, a few kilobytes for 5,000 iterations, so that a reproduction's
# runs.jsonl can be kept beside its results.
HISTORY_KEPT = Kept(diagnostics=("train_loss", "update_norm"), evaluated_only=True)


def _results(runs, n_seeds):
  """The rows and the accuracy curves (mean over seeds, by setting then label) of the settings
  and methods whose ``n_seeds`` runs are all done."""
  rows, curves = [], {}
  for (partition, attack, method, eps), rs in group_by(runs, ROW_KEYS).items():
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


# The paper's Fig. 1 (MNIST, b=3) draws DP-RSA(G) at epsilon 0.2 and DP-RSA(F) at 1.38; its
# panels are (a) iid, Gaussian attack and (b) non-iid, sample duplication (the text lists the
# sign-flip attack as the other iid attack; its curves are not in Fig. 1). The text gives no
# numbers, so each claim's size is nominal: "beats" +5 points, "nearly fails" / "no defense"
# 50 points (near chance against DP-RSA near 0.8 on the figure's axis), "Sign-Gaussian at small
# epsilon is like Sign-Flipping at large epsilon" +3 points for G over F at the same epsilon.
DP_F, DP_G = ("dp-rsa-f", 1.38), ("dp-rsa-g", 0.2)


def vote_margin(num_clients: int, byzantine: int, epsilon: float) -> float:
  """How far ``byzantine`` attackers outvote the regular workers on a coordinate where every
  regular worker sends the same exact sign: ``b - (K - b) tanh(epsilon / 2)``.

  The master moves each coordinate by ``alpha lambda`` times the sum of the messages' signs
  (Zhu and Ling, Eq. 11). Sign-Flipping keeps a sign with probability
  ``gamma = e^eps / (1 + e^eps)`` (Eq. 8, Theorem 1), so a regular worker's message has
  expectation ``(2 gamma - 1) = tanh(eps / 2)`` times its exact sign, and ``K - b`` agreeing
  workers move the master by at most ``(K - b) tanh(eps / 2)`` votes on average; an attacker's
  message is not perturbed, one full vote. Sign-Gaussian with the clip that makes its epsilon
  formal flips no less often (:data:`_G_VS_F`), so its margin is at least this. A positive
  margin means the attackers win every coordinate on average, however the regular workers
  agree.

  Args:
    num_clients: ``K``, every worker.
    byzantine: ``b``, the attackers (each sends one unperturbed sign per coordinate).
    epsilon: the per-coordinate per-iteration epsilon of Sign-Flipping (> 0).

  Returns:
    ``b - (K - b) tanh(epsilon / 2)`` in votes.
  """
  return byzantine - (num_clients - byzantine) * math.tanh(epsilon / 2.0)


# Why a claim is or is not reproduced, by the scale whose runs measured it, then by (kind of
# claim, attack); a scale without its own reasons shows the small scale's (REASON_SOURCES says
# which). The small scale's: runs beside the reproduction (docs/papers/zhu2022.md, "Why SignSGD
# beats DP-RSA and RSA").
_STEP = ("step size, not robustness: at alpha 0.01 SignSGD moves every coordinate by alpha per "
         "iteration (L2 distance from the initial model after 400: 93) while RSA's model moves "
         "at SGD's pace alpha g (2.1); RSA with alpha x3.3: 0.89; SignSGD with the paper's one "
         "example per worker per iteration: 0.80 (RSA 0.80)")
_GM = ("GM of iid gradients is about their mean: GM and RSA both move at SGD's pace at alpha "
       "0.01 (distance 2.14 vs 2.10, accuracy 0.807 vs 0.807); GM at alpha 0.1: 0.91")
_G_VS_F = ("with the clip c that makes G's epsilon formal, G flips a sign with probability "
           "Phi(-min(|u_i|, c) / sigma), never below F's 1 - gamma at the same epsilon")
_SGD_FLIP = ("3 of 30 rows are -5 g: the mean is (27 - 15) / 30 g = 0.4 g, still downhill, so SGD "
             "only slows")
_SMALL = {
    ("sgd", "gaussian"): "the mean takes the attackers' N(0, 1e4^2) rows",
    ("sgd", "sign-flip"): _SGD_FLIP,
    ("sgd", "sample-duplication"): ("the attackers copy a regular worker's message: the mean "
                                    "stays a mean of honest gradients"),
    ("vs-signsgd", "gaussian"): _STEP,
    ("vs-signsgd", "sign-flip"): _STEP + "; with 9 of 30 sign-flippers SignSGD still reaches 0.92",
    ("vs-signsgd", "sample-duplication"): (
        "SignSGD keeps digit 9 (0.87) though the attackers hold its concentrated half; RSA "
        "(0.09) and GM (0.00) lose it: at SGD's pace the under-represented digit comes last; "
        "and the iid claims' step size"),
    ("vs-gm", "gaussian"): _GM,
    ("vs-gm", "sign-flip"): _GM,
    ("vs-gm", "sample-duplication"): ("GM and RSA both lose digit 9 (0.00 and 0.09), whose "
                                      "concentrated half is on the attackers: 0.732 vs 0.732"),
    ("g-vs-f", "gaussian"): _G_VS_F,
    ("g-vs-f", "sign-flip"): _G_VS_F,
    ("g-vs-f", "sample-duplication"): _G_VS_F,
}


# The paper scale's: its own curves and accuracies (docs/results/zhu2022_paper) and the runs of
# benchmarks/zhu2022_votes.py (2,000 iterations, seed 0; docs/papers/zhu2022.md, "At the paper's
# length").
_COLLAPSE = ("DP-RSA at eps 0.2 collapses, F and G alike: the 3 attackers' unperturbed signs, "
             "sign(x_0 + 5 x_j) = sign(x_j) once the models are close, outvote the 27 regular "
             "workers' net 27 tanh(eps/2) = 2.69 at most (vote margin +0.31 for F, no smaller "
             "for G), which pushes the master through zero to an anti-model: mean test accuracy "
             "0.015 or less from 1,000 to 3,000 iterations; F at 0.2 over 2,000 iterations gives "
             "the true class the lowest logit on 0.59 of the test images, and does not collapse "
             "with b = 2 (margin -0.79: 0.73) or at eps 0.25 (-0.36: 0.65), but does with the "
             "factor -1.5 instead of -5 (0.001)")
# The reasons that hold at every length and batch: the mean under the Gaussian attack and
# sample duplication, and Sign-Gaussian's flips against Sign-Flipping's where neither collapses.
_ANY_SCALE = {key: _SMALL[key] for key in (
    ("sgd", "gaussian"), ("sgd", "sample-duplication"), ("g-vs-f", "gaussian"),
    ("g-vs-f", "sample-duplication"))}
_PAPER = {
    **_ANY_SCALE,
    ("sgd", "sign-flip"): _SGD_FLIP + ": 89.2 at 5,000 iterations (72.2 at 400), RSA 90.6",
    ("vs-signsgd", "gaussian"): (
        "SignSGD's lead is its step (every coordinate alpha per iteration), which the length "
        "mostly makes up: SignSGD is flat from 1,000 iterations (93.2 to 93.8) while RSA's "
        "master, at SGD's pace, rises all along (87.6 to 92.3); the gap falls from 11.4 points "
        "at 400 iterations to 1.5"),
    ("vs-signsgd", "sign-flip"): (
        _COLLAPSE + "; F at 1.38 (margin -13.2) is 1.0 below RSA, which levels off at 90.5 from "
        "3,500 iterations under the attackers' 3 votes while SignSGD's majority of gradient "
        "signs reaches 93.9"),
    ("vs-signsgd", "sample-duplication"): (
        "SignSGD does not nearly fail: 92.8, its step keeps a 1.3-point lead over DP-RSA(F) at "
        "1.38 (91.5); GM and RSA rise 15-17 points from 400 to 5,000 iterations, to within "
        "0.8 of their iid accuracy"),
    ("vs-gm", "gaussian"): (
        "GM of iid gradients is about their mean and RSA's master follows workers taking SGD "
        "steps: level along the whole curve (91.9 and 92.3 at 5,000; 81.4 and 81.2 at 400), "
        "DP-RSA(F) at 1.38 costs nothing against RSA (-0.02), DP-RSA(G) at 0.2 costs 1.2"),
    ("vs-gm", "sign-flip"): (
        _COLLAPSE + "; GM climbs to 91.6 while RSA levels off at 90.5 from 3,500 iterations "
        "under the attackers' 3 votes, and F at 1.38 is 1.0 below RSA"),
    ("vs-gm", "sample-duplication"): (
        "GM does not nearly fail at 5,000 iterations: 91.2, level with RSA (91.5), 17 and 15 "
        "points above their accuracy at 400 iterations and within 0.8 of their iid accuracy"),
    ("g-vs-f", "sign-flip"): (
        "both collapse at eps 0.2 (F's vote margin +0.31, G's no smaller): 22.2 ± 15.4 and "
        "15.8 ± 8.9, seeds further apart than the two; and " + _G_VS_F),
}


# The text's reading, one example per worker per iteration: its own curves and accuracies
# (docs/results/zhu2022_paper_b1) and the runs of `benchmarks/zhu2022_votes.py --study batch`
# (5,000 iterations, seed 0; docs/papers/zhu2022.md, "One example per worker per iteration").
_SIGN_B1 = ("with one example per worker SignSGD's vote moves every coordinate by alpha at every "
            "iteration on 27 one-example gradient signs: in the 6 iid runs it peaks at 0.83-0.84 "
            "by 500-2,500 iterations and falls to 0.71-0.77 by 5,000, overconfident (seed 0: "
            "parameter norm 975 against 414 with 32 examples, test loss 4.11 against 0.33, mean "
            "top probability 0.96)")
_GM_B1 = ("GM of 30 one-example gradients learns slowly: 0.79 at 5,000 iterations (seed 0; 0.92 "
          "with 32 examples), parameter norm 10.3 against RSA's 12.8, test loss 0.62 against "
          "0.28, while RSA's workers take SGD steps whose one-example noise alpha averages out "
          "over iterations (0.922 against 0.924 with 32 examples)")
_COLLAPSE_B1 = ("DP-RSA at eps 0.2 collapses as with 32 examples, F and G alike: the attackers' "
                "3 unperturbed votes against the regular workers' net 27 tanh(eps/2) = 2.69 at "
                "most (vote margin +0.31); every seed is at 0.54-0.63 at 500 iterations and "
                "0.002 or less at 1,250, and climbs back to 0.14-0.32 by 5,000")
_PAPER_B1 = {
    **_ANY_SCALE,
    ("sgd", "sign-flip"): _SGD_FLIP + ": 88.3 at 5,000 iterations, RSA 90.3",
    ("vs-signsgd", "gaussian"): _SIGN_B1 + "; DP-RSA ends within 0.7 of RSA (92.0)",
    ("vs-signsgd", "sign-flip"): (_COLLAPSE_B1 + "; at 1.38 F is 1.1 below RSA and 15.4 above "
                                  "SignSGD: " + _SIGN_B1),
    ("vs-signsgd", "sample-duplication"): (
        "SignSGD at 74.2 (seeds 67.5-81.0) is 1.1 below its iid accuracy under the Gaussian "
        "attack (75.3): not the split but the one-example vote: " + _SIGN_B1),
    ("vs-gm", "gaussian"): _GM_B1,
    ("vs-gm", "sign-flip"): _COLLAPSE_B1 + "; at 1.38 F is 9.0 above GM: " + _GM_B1,
    ("vs-gm", "sample-duplication"): (
        "GM loses 7.4 points to the split (73.0 against 80.4 iid under the Gaussian attack; RSA "
        "0.7: 91.4 against 92.0), on top of one example's slow learning: " + _GM_B1),
    ("g-vs-f", "sign-flip"): "both collapse at eps 0.2: " + _COLLAPSE_B1,
}
REASONS = {"small": _SMALL, "paper": _PAPER, "paper-b1": _PAPER_B1}
# Where each scale's reasons come from, as results.md says it.
REASON_SOURCES = {
    "small": ("measured at the small scale, 400 iterations, by runs beside the reproduction, one "
              "seed each (docs/papers/zhu2022.md, \"Why SignSGD beats DP-RSA and RSA\"), not "
              "read from this run"),
    "paper": ("read from this reproduction's curves and accuracies and measured by the runs of "
              "benchmarks/zhu2022_votes.py, 2,000 iterations of the iid sign-flip setting, seed 0 "
              "(docs/papers/zhu2022.md, \"At the paper's length\")"),
    "paper-b1": ("read from this reproduction's curves and accuracies and measured by the runs of "
                 "benchmarks/zhu2022_votes.py --study batch, 5,000 iterations of the iid Gaussian "
                 "setting at 1 and 32 examples, seed 0 (docs/papers/zhu2022.md, \"One example per "
                 "worker per iteration\")"),
}


def reasons_scale(scale_name: str) -> str:
  """The scale whose reasons (:data:`REASONS`) a reproduction at ``scale_name`` shows: its own
  where it has them, else the small scale's."""
  return scale_name if scale_name in REASONS else "small"


def claim_specs(partition: str, attack: str) -> list:
  """``(text, first, second, paper_gain, reason kind)`` of each claim on one setting: the claim
  is ``accuracy(first) - accuracy(second)`` in points, ``first``/``second`` a ``(method,
  epsilon)``."""
  where = {"gaussian": "Gaussian attack (Fig. 1a)",
           "sign-flip": "sign-flip attack (text's attack (ii); not in Fig. 1)",
           "sample-duplication": "non-iid, sample duplication (Fig. 1b)"}[attack]
  fails = partition != "iid"  # SignSGD and GM "nearly fail" non-iid; DP-RSA "beats" them iid
  gain, word = (50.0, "nominal +50: they nearly fail") if fails else (5.0, "nominal +5: beats")
  specs = [(f"SGD fails, {where}: SGD - RSA (nominal -50: no defense)", ("sgd", None),
            ("rsa", None), -50.0, "sgd")]
  for dp in (DP_F, DP_G):
    name = f"DP-RSA({dp[0][-1].upper()}) eps {dp[1]}"
    specs.append((f"{where}: {name} - SignSGD ({word})", dp, ("signsgd", None), gain,
                  "vs-signsgd"))
    specs.append((f"{where}: {name} - GM ({word})", dp, ("gm", None), gain, "vs-gm"))
  specs.append((f"Sign-Gaussian beats Sign-Flipping at the same eps 0.2, {where}: DP-RSA(G) - "
                "DP-RSA(F) (nominal +3: G at 0.2 performs like F at 1.38)", ("dp-rsa-g", 0.2),
                ("dp-rsa-f", 0.2), 3.0, "g-vs-f"))
  return specs


def claims(rows, scale_name: str = "small") -> list:
  """The paper's Fig. 1 claims (:func:`claim_specs`) on every setting of ``rows`` as
  :class:`fedjax_dp.reproduce.tables.Claim` s: ours is the difference of the two methods'
  mean accuracies in points (None when either is missing), its spread the sample std over
  seeds of the per-seed differences (None with one seed); the reasons are those of
  :func:`reasons_scale` ``(scale_name)``, the scale the rows ran at."""
  by_key, out = _by_key(rows), []
  reasons = REASONS[reasons_scale(scale_name)]
  for partition, attack in dict.fromkeys((r["partition"], r["attack"]) for r in rows):
    for text, first, second, paper_gain, reason in claim_specs(partition, attack):
      a, b = by_key.get((partition, attack) + first), by_key.get((partition, attack) + second)
      measured = spread = None
      if a is not None and b is not None:
        measured, spread = seed_difference(
            100.0 * (np.array(a["accuracies"]) - np.array(b["accuracies"])))
      out.append(Claim(text, paper_gain, measured, spread, reasons[(reason, attack)]))
  return out


def _by_key(rows) -> dict:
  """``{(partition, attack, method, epsilon): row}``."""
  return {(r["partition"], r["attack"], r["method"], r["epsilon"]): r for r in rows}


def _close_to_rsa(rows) -> list:
  """Lines on the paper's "DP-RSA performs similarly to RSA" (not a signed claim, so not in the
  verdict table): DP-RSA minus RSA in points for Fig. 1's two DP-RSA curves."""
  by_key, lines = _by_key(rows), []
  for partition, attack in dict.fromkeys((r["partition"], r["attack"]) for r in rows):
    rsa = by_key.get((partition, attack, "rsa", None))
    dps = [(dp, by_key.get((partition, attack) + dp)) for dp in (DP_F, DP_G)]
    parts = [f"{_label(*dp)}: {100.0 * (r['accuracy_mean'] - rsa['accuracy_mean']):+.2f}"
             for dp, r in dps if rsa is not None and r is not None]
    if parts:
      lines.append(f"* {partition}, {attack}: " + ", ".join(parts))
  return lines


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
  lines += ["", "Verdicts on the paper's Fig. 1 claims (accuracy differences in points; the paper "
            "gives no numbers in its text, so each claimed size is nominal and says so; "
            f"reproduced: the claimed sign and at least half the claimed size; the reasons were "
            f"{REASON_SOURCES[reasons_scale(scale_name)]}):", ""]
  lines += verdict_table(claims(rows, scale_name))
  close = _close_to_rsa(rows)
  if close:
    lines += ["", "The paper's \"DP-RSA performs similarly to RSA\" (not a signed claim): DP-RSA "
              "minus RSA, points:", ""] + close
  return "\n".join(lines) + "\n"


def reproduce(scale: str = "small", output_dir: str = "runs/zhu2022", data_dir=None, seeds=None,
              settings=SETTINGS, methods=METHODS, progress: bool = True,
              execution: Execution = Execution()) -> int:
  """Runs the experiments of ``scale``, writes results.json (as runs end) and runs.jsonl, then
  results.md and the plots as :func:`render` does, and ends with the line naming them.

  Args:
    scale: a key of :data:`SCALES`.
    output_dir: the folder written.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each run (None: the scale's).
    settings: the ``(partition, attack)`` pairs run (:data:`SETTINGS`).
    methods: the methods run, a subset of :data:`METHODS`.
    progress: print the progress lines (prefixed ``[zhu2022]``, in place of ``execution.log``)
      and the closing line.
    execution: the threads, and whether to continue the reproduction in ``output_dir`` (only
      the runs its ``runs.jsonl`` has no record of run), as
      :class:`~fedjax_dp.reproduce.runner.Execution` says.

  Returns:
    0.

  Raises:
    ConfigError: an unknown scale or method, a bad ``seeds``, or as the runs.
  """
  check_choice("scale", scale, sorted(SCALES))
  n_seeds = num_seeds(seeds, SCALES[scale]["seeds"])
  sc = dict(SCALES[scale], seeds=n_seeds)  # results.json's settings: the seeds this run used
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
                     runs_path=out / "runs.jsonl", kept=HISTORY_KEPT,
                     on_record=lambda rs: _write(out, scale, sc, rs, n_seeds),
                     execution=dataclasses.replace(execution, log=log))
  _write(out, scale, sc, records, n_seeds)
  written = _render(out)
  if progress:  # the command's result, as --render's: no [zhu2022] prefix
    print(wrote([out / "results.json", out / "runs.jsonl"] + written,
                time.perf_counter() - t_start), flush=True)
  return 0


def render(output_dir, log=print) -> int:
  """Rewrites ``results.md`` and the plots in ``output_dir`` from its ``results.json`` (scale
  and settings) and ``runs.jsonl`` (every run's record), running nothing, and logs the files
  written (:func:`~fedjax_dp.reproduce.runner.wrote`); returns 0."""
  log(wrote(_render(output_dir)))
  return 0


def saved_claims(output_dir) -> list:
  """The claims (:func:`claims`) of the reproduction in ``output_dir``, as its ``results.md``
  shows them: from its ``results.json`` rows, which hold each seed's accuracy (``runs.jsonl``,
  which holds the curves, is not read)."""
  doc = json.loads((pathlib.Path(output_dir) / "results.json").read_text())
  return claims(doc["rows"], doc["scale"])


def _render(output_dir) -> list:
  """:func:`render`'s files, written; their paths (results.md, then the plots)."""
  out = pathlib.Path(output_dir)
  doc = json.loads((out / "results.json").read_text())
  records = read_records(out, doc["rows"], ROW_KEYS)
  n_seeds = max((r["seeds"] for r in doc["rows"]), default=1)
  rows, curves = _results(records, n_seeds)
  write_text_atomic(out / "results.md", _markdown(rows, doc["scale"]))
  sc = doc["settings"]
  dataset = {"mnist": "MNIST", "cifar10": "CIFAR-10"}[sc["dataset"]]
  written = [out / "results.md"]
  for setting, cs in curves.items():
    partition, attack = setting.split("/")
    title = (f"{dataset} {partition}, {attack} attack, K={sc['num_clients']}, "
             f"b={sc['byzantine']}")
    lines = [Curve(label, xs, ys, style="--" if label.startswith("dp-rsa-g") else
                   "-." if label.startswith("dp-rsa-f") else "-")
             for label, (xs, ys) in cs.items()]
    written.append(plot_curves([(title, lines)], out / f"zhu2022_{partition}_{attack}.png",
                               xlabel="iteration", ylim=(0, 1),
                               layout=Layout(size=(5.2, 3.6), legend_columns=2, legend_size=6)))
  return written


def _write(out, scale_name, sc, records, n_seeds):
  rows, curves = _results(records, n_seeds)
  doc = {"paper": "Zhu and Ling, Bridging Differential Privacy and Byzantine-Robustness via Model "
                  "Aggregation, IJCAI 2022", "scale": scale_name, "settings": sc, "rows": rows,
         "curves": {k: {lab: {"iteration": xs, "accuracy": ys} for lab, (xs, ys) in v.items()}
                    for k, v in curves.items()},
         "wall_seconds": wall_seconds(records),
         "notes": ["epsilon is per coordinate per iteration (the paper's quantity); epsilon_composed is "
                   "the whole-run value over d coordinates x rounds (dp_accounting RDP, replace-one, "
                   "worker-level) at delta",
                   "DP-RSA(G) clips each coordinate of x_0 - x_k to [-sign_clip, sign_clip] (formal "
                   "guarantee) and calibrates sigma to epsilon",
                   "Byzantine workers are the last b ids; their messages are not perturbed"],
         "release": release({}), **identity("zhu2022")}
  write_text_atomic(out / "results.json", json.dumps(doc, indent=1, default=str) + "\n")


def run(scale: str, output_dir: str, data_dir=None, seeds=None, threads=None,
        resume: bool = False) -> int:
  """Entry point of ``fedjax-dp reproduce zhu2022``: :func:`reproduce` with every setting and
  method.

  Args:
    scale: a key of :data:`SCALES`.
    output_dir: the folder written.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).
    seeds: the seeds of each run (None: the scale's).
    threads: compiled programs run at once (None: automatic).
    resume: continue the reproduction in ``output_dir``: only the runs that its ``runs.jsonl``
      has no record of run (:func:`fedjax_dp.reproduce.runner.run_jobs`).

  Returns:
    0.
  """
  return reproduce(scale=scale, output_dir=output_dir, data_dir=data_dir, seeds=seeds,
                   execution=Execution(threads=threads, resume=resume))
