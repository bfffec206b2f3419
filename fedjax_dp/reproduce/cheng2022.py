"""Reproduction of Cheng et al., CVPR 2022 (BLUR + LUS): Table 1, Table 3 and Fig. 2.

``fedjax-dp reproduce cheng2022 --scale small --output-dir DIR`` runs, on real
MNIST split among several hundred clients, DP-FedAvg, DP-FedAvg+BLUR,
DP-FedAvg+LUS and BLUR+LUS at epsilon in {2, 4, 6, 8} (delta = 1e-5, the noise
multiplier calibrated per epsilon by the ledger), non-private FedAvg, and the
sparsity ablation of Table 3 (c in {0.1, ..., 0.9} at epsilon = 6), each over
``seeds`` seeds. It writes

* ``DIR/results.json``: ``rows`` (``table``, ``method``, ``epsilon`` (the
  ledger's, at delta), ``target_epsilon``, ``noise_multiplier``, ``lambda``,
  ``sparsity``, ``accuracy_mean``, ``accuracy_std`` (sample std over seeds),
  ``seeds``, ...), the settings, and the paper's numbers;
* ``DIR/runs.jsonl``: every run's per-round history;
* ``DIR/results.md``: Table 1 (ours beside the paper's) and Table 3;
* ``DIR/cheng2022_update_norms.png`` (Fig. 2: per-round distribution of
  pre-clip update norms, DP-FedAvg vs BLUR+LUS) and
  ``DIR/cheng2022_accuracy.png`` (test accuracy versus round).

``--scale paper`` runs the paper's settings (EMNIST with TFF's HDF5 files in
``--data-dir``, or CIFAR-10 Dirichlet presets): sized for an accelerator,
never run on the project's CPUs.

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
from typing import Optional

import numpy as np

from fedjax_dp.errors import check, check_choice
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.plots import Curve, plot_curves, plot_quantiles
from fedjax_dp.reproduce.runner import Job, group_by, num_seeds, run_jobs, seed_stats
from fedjax_dp.reproduce.tables import markdown_table, mean_std

METHODS = ("dp_fedavg", "dp_fedavg+blur", "dp_fedavg+lus", "blur+lus")
LABELS = {"dp_fedavg": "DP-FedAvg", "dp_fedavg+blur": "DP-FedAvg+BLUR",
          "dp_fedavg+lus": "DP-FedAvg+LUS", "blur+lus": "BLUR+LUS", "fedavg": "FedAvg (non-private)"}
EPSILONS = (2.0, 4.0, 6.0, 8.0)
SPARSITIES = (0.1, 0.3, 0.5, 0.7, 0.9)
ABLATION_EPSILON = 6.0
DELTA = 1e-5

# Cheng et al. 2022, Table 1 (federated EMNIST): epsilon -> (DP-FedAvg mean, std, Ours mean, std).
# Read from the machine-translated text; all 16 pairs are legible (the AE-DPFL and
# DDGauss columns are omitted here). The text's "4.83% at eps=2, 2.73% at eps=8"
# for CNN-2-layers matches these numbers.
PAPER_TABLE1 = {
    "cnn2": {2.0: (69.65, 0.74, 74.48, 0.52), 4.0: (72.32, 0.81, 75.85, 0.61),
             6.0: (74.12, 0.75, 77.48, 0.54), 8.0: (75.36, 0.64, 78.09, 0.46)},
    "resnet18_gn": {2.0: (73.52, 0.53, 78.58, 0.39), 4.0: (75.51, 0.60, 80.29, 0.47),
                    6.0: (77.19, 0.55, 81.55, 0.46), 8.0: (78.06, 0.49, 82.12, 0.52)},
}
# Table 3 (EMNIST, ResNet-18, epsilon = 6): sparsity c -> accuracy (%). Legible:
# DP-FedAvg (c = 0), DP-FedAvg+LUS for every c, DP-FedAvg+BLUR (c = 0). The
# BLUR+LUS rows for c > 0 are lost in the extracted text.
PAPER_TABLE3 = {
    "dp_fedavg+lus": {0.0: 76.24, 0.1: 76.52, 0.3: 77.28, 0.5: 77.75, 0.7: 77.54, 0.9: 77.39},
    "blur+lus": {0.0: 78.28},
}

_SMALL = dict(
    dataset="mnist", partition="shards", shards_per_client=2, num_clients=600, model="rsa_mlp",
    rounds=40, sampling="poisson", sampling_prob=0.04, local_steps=15, batch_size=10,
    client_optimizer="sgd", client_lr=0.05, server_optimizer="sgd", server_lr=1.0,
    denominator="expected", clip=0.3, delta=DELTA, accountant="rdp", eval_every=5)

SCALES = {
    # For tests and the notebook: real scikit-learn digits, seconds.
    "tiny": dict(config=dict(_SMALL, dataset="digits", model="rsa_mlp", num_clients=60,
                             shards_per_client=2, rounds=4, sampling_prob=0.2, local_steps=4,
                             batch_size=8, eval_every=2),
                 epsilons=(2.0, 8.0), sparsities=(0.5,), ablation_epsilon=8.0, seeds=1),
    # CPU scale: ~10-12 minutes on two idle cores.
    "small": dict(config=_SMALL, epsilons=EPSILONS, sparsities=SPARSITIES,
                  ablation_epsilon=ABLATION_EPSILON, seeds=3, ablation_seeds=2),
}

# The paper's settings (Sec. 6): Q = 30 local steps, eta_g = 1, delta = 1e-5,
# lambda = 0.4, c = 0.7. Accelerator scale; not run on the project's CPUs.
_EMNIST = dict(dataset="emnist", model="cnn2", rounds=1000, sampling="poisson", sampling_prob=0.04,
               local_steps=30, batch_size=64, client_lr=0.03, server_lr=1.0, clip=0.03,
               denominator="expected", delta=DELTA, eval_every=50)
_CIFAR = dict(dataset="cifar10", model="resnet18_gn", partition="dirichlet", num_clients=500,
              rounds=300, sampling="poisson", sampling_prob=0.06, local_steps=30, batch_size=50,
              client_lr=0.1, server_lr=1.0, clip=0.3, denominator="expected", delta=DELTA,
              eval_every=20)
PAPER_PRESETS = {
    # Federated EMNIST (3,400 writers): needs TFF's fed_emnist_{train,test}.h5 in --data-dir.
    "emnist_cnn2": dict(_EMNIST),
    "emnist_resnet18": dict(_EMNIST, model="resnet18_gn"),
    **{f"cifar10_alpha{a:g}": dict(_CIFAR, dirichlet_alpha=a) for a in (0.1, 1.0, 10.0, 100.0)},
}
SCALES["paper"] = dict(presets=PAPER_PRESETS, epsilons=EPSILONS, sparsities=SPARSITIES,
                       ablation_epsilon=ABLATION_EPSILON, seeds=3)


def capacity_for(num_clients: int, prob: float) -> int:
  """Padded cohort size: expected size plus 3 standard deviations (grows if exceeded)."""
  mean = num_clients * prob
  return int(min(num_clients, math.ceil(mean + 3.0 * math.sqrt(mean * (1 - prob)) + 1)))


def plan(epsilons, sparsities, ablation_epsilon, seeds: int, ablation_seeds: int) -> list:
  """Every run: ``(table, method, target_epsilon or None, sparsity or None, seed)``."""
  jobs = []
  for seed in range(seeds):
    jobs.append(("table1", "fedavg", None, None, seed))
    for eps in epsilons:
      for m in METHODS:
        jobs.append(("table1", m, eps, None, seed))
    for c in sparsities if seed < ablation_seeds else ():
      if c == 0.7 and ablation_epsilon in epsilons:
        continue  # the default c: the Table 1 runs at this epsilon are reused
      for m in ("dp_fedavg+lus", "blur+lus"):
        jobs.append(("table3", m, ablation_epsilon, c, seed))
  return jobs


def _job(base, data, table, method, eps, sparsity, seed, noise_by_eps) -> Job:
  from fedjax_dp.algorithms.blur_lus import DEFAULTS
  from fedjax_dp.config import make_config
  options = {}
  if method in ("dp_fedavg+lus", "blur+lus") and sparsity is not None:
    options["sparsity"] = sparsity
  cfg = dict(base, algorithm=method, seed=seed, options=options, target_epsilon=None,
             capacity=capacity_for(data.num_clients, base["sampling_prob"]))
  # fedavg: unused by the non-private builder.
  cfg["noise_multiplier"] = 0.0 if method == "fedavg" else noise_by_eps[eps]
  labels = {"table": table, "method": method, "target_epsilon": eps, "seed": seed,
            "sparsity": (DEFAULTS["sparsity"] if sparsity is None else sparsity) if "lus" in method
            else None,
            "lambda": DEFAULTS["lambda"] if "blur" in method else None}
  return Job(make_config(cfg), labels, name=f"{table} {method} eps={eps} c={sparsity} seed={seed}")


def _record(job: Job, result) -> dict:
  """The fields of a run's record after its labels."""
  s, private = result.summary, job.labels["method"] != "fedavg"
  return {
      "epsilon": s.get("epsilon") if private else None, "delta": DELTA,
      "noise_multiplier": job.config.noise_multiplier if private else None,
      "accuracy": s["final_accuracy"],
      # Raw diagnostics of the runs (pre-clip norms, fraction clipped): not covered by epsilon.
      "fraction_clipped": (float(np.mean([h["diagnostics"].get("fraction_clipped", 0.0)
                                          for h in result.history])) if private else None),
      "update_norm_q50_last": result.history[-1]["diagnostics"]["update_norm"]["q50"],
  }


def _summarize(runs: list) -> list:
  rows = []
  for (table, method, teps, c), rs in group_by(runs, ("table", "method", "target_epsilon",
                                                      "sparsity")).items():
    rows.append({
        "table": table, "method": method, "target_epsilon": teps,
        "epsilon": rs[0]["epsilon"], "delta": rs[0]["delta"],
        "noise_multiplier": rs[0]["noise_multiplier"], "lambda": rs[0]["lambda"],
        "sparsity": c,
        **seed_stats([r["accuracy"] for r in rs]),
        "fraction_clipped_mean": float(np.mean([r["fraction_clipped"] for r in rs]))
        if rs[0]["fraction_clipped"] is not None else None,
        "update_norm_median_last": float(np.mean([r["update_norm_q50_last"] for r in rs])),
    })
  return rows


def write_markdown(rows: list, settings: dict, path: pathlib.Path) -> str:
  """Table 1 (ours beside the paper's) and Table 3, as Markdown."""
  by = {(r["table"], r["method"], r["target_epsilon"], r["sparsity"]): r for r in rows}

  def get(table, method, eps, c=None):
    if method in ("dp_fedavg", "dp_fedavg+blur", "fedavg"):
      c = None
    elif c is None and table == "table1":
      c = settings["sparsity_default"]
    return by.get((table, method, eps, c))

  def acc(r):
    return mean_std(r["accuracy_mean"], r["accuracy_std"]) if r else "n/a"

  def paper(p, name):
    return {} if p is None else {f"{name}_dp": mean_std(p[0], p[1], scale=1),
                                 f"{name}_ours": mean_std(p[2], p[3], scale=1)}

  table1 = []
  for eps in settings["epsilons"]:
    r0 = get("table1", "dp_fedavg", eps)
    table1.append({
        "eps": f"{eps:g} ({r0['epsilon']:.3f})" if r0 and r0["epsilon"] is not None else f"{eps:g}",
        "z": f"{r0['noise_multiplier']:.3f}" if r0 else "",
        **{m: acc(get("table1", m, eps)) for m in METHODS},
        **paper(PAPER_TABLE1["cnn2"].get(eps), "cnn2"),
        **paper(PAPER_TABLE1["resnet18_gn"].get(eps), "resnet")})
  lines = [f"Setting: {settings['description']}", "",
           "### Table 1: test accuracy (%) by privacy budget, mean ± std over "
           f"{settings['seeds']} seeds (delta = {DELTA:g})", ""]
  lines += markdown_table(
      [("eps", "epsilon (ledger)"), "z", ("dp_fedavg", "DP-FedAvg"), ("dp_fedavg+blur", "+BLUR"),
       ("dp_fedavg+lus", "+LUS"), ("blur+lus", "BLUR+LUS"),
       ("cnn2_dp", "paper CNN-2: DP-FedAvg"), ("cnn2_ours", "paper CNN-2: Ours"),
       ("resnet_dp", "paper ResNet-18: DP-FedAvg"), ("resnet_ours", "paper ResNet-18: Ours")],
      table1)
  fa = get("table1", "fedavg", None)
  if fa:
    lines += ["", f"Non-private FedAvg: {acc(fa)} %."]
  ae = settings["ablation_epsilon"]
  base = {"dp_fedavg+lus": get("table1", "dp_fedavg", ae), "blur+lus": get("table1", "dp_fedavg+blur", ae)}
  table3 = []
  for c in (0.0,) + tuple(settings["sparsities"]):
    row = {"c": f"{c:g}" + (" (no LUS)" if c == 0 else "")}
    for m in ("dp_fedavg+lus", "blur+lus"):
      if c == 0.0:
        r = base[m]
      else:
        r = by.get(("table3", m, ae, c)) or (get("table1", m, ae, c) if c == settings["sparsity_default"] else None)
      row[m] = acc(r)
      row[f"paper_{m}"] = (f"{PAPER_TABLE3[m][c]:.2f}" if c in PAPER_TABLE3[m] else
                           "illegible" if m == "blur+lus" else "")
    table3.append(row)
  lines += ["", f"### Table 3: sparsity c of LUS at epsilon = {ae:g} (test accuracy %, mean ± std)", ""]
  lines += markdown_table(
      ["c", ("dp_fedavg+lus", "DP-FedAvg+LUS"), ("blur+lus", "BLUR+LUS"),
       ("paper_dp_fedavg+lus", "paper DP-FedAvg+LUS (ResNet-18)"), ("paper_blur+lus", "paper BLUR+LUS")],
      table3)
  text = "\n".join(lines) + "\n"
  path.write_text(text)
  return text


def plot(runs: list, settings: dict, out_dir: pathlib.Path) -> list:
  """Fig. 2 (pre-clip update norms per round) and accuracy-versus-round curves."""
  eps_fig = settings["figure_epsilon"]

  def table1(m, eps):
    return [r for r in runs if r["table"] == "table1" and r["method"] == m and
            (r["target_epsilon"] == eps or m == "fedavg")]

  norms = []
  for m in ("dp_fedavg", "blur+lus"):
    rs = table1(m, eps_fig)
    if rs:
      h = rs[0]["history"]
      norms.append((f"{LABELS[m]} (eps={eps_fig:g}, seed {rs[0]['seed']})", [x["round"] for x in h],
                    {k: [x["diagnostics"]["update_norm"][k] for x in h] for k in ("q10", "q50", "q90")}))
  paths = [plot_quantiles(norms, out_dir / "cheng2022_update_norms.png", clip=settings["clip"],
                          ylabel="||Delta|| before LUS and clip")]
  panels = []
  for eps in settings["curve_epsilons"]:
    curves = []
    for m in METHODS + ("fedavg",):
      rs = table1(m, eps)
      if rs:
        xs = [x["round"] for x in rs[0]["history"] if "test_accuracy" in x]
        ys = np.mean([[x["test_accuracy"] for x in r["history"] if "test_accuracy" in x] for r in rs], 0)
        curves.append(Curve(LABELS[m], xs, ys, style=":" if m == "fedavg" else "-"))
    panels.append((f"epsilon = {eps:g} (mean of {settings['seeds']} seeds)", curves))
  paths.append(plot_curves(panels, out_dir / "cheng2022_accuracy.png", xlabel="round"))
  return paths


def run_small(scale: str, output_dir: str, data_dir=None, seeds: Optional[int] = None,
              data=None, log=print) -> dict:
  """Runs the CPU-scale reproduction (``scale`` "tiny" or "small") and writes its files."""
  from fedjax_dp.data import load_federated
  from fedjax_dp.privacy import calibrate_noise_multiplier
  from fedjax_dp.algorithms.blur_lus import DEFAULTS
  spec = SCALES[scale]
  base = dict(spec["config"])
  n_seeds = num_seeds(seeds, spec["seeds"])
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  if data is None:
    data = load_federated(base["dataset"], base["num_clients"], partition=base["partition"],
                          seed=0, data_dir=data_dir, shards_per_client=base["shards_per_client"])
  epsilons, sparsities, ae = spec["epsilons"], spec["sparsities"], spec["ablation_epsilon"]
  noise_by_eps = {eps: calibrate_noise_multiplier(eps, DELTA, base["rounds"], "poisson",
                                                  base["sampling_prob"]) for eps in sorted(set(epsilons) | {ae})}
  jobs = [_job(base, data, *j, noise_by_eps) for j in
          plan(epsilons, sparsities, ae, n_seeds, min(n_seeds, spec.get("ablation_seeds", n_seeds)))]
  runs = run_jobs(jobs, _record, data=data, runs_path=out / "runs.jsonl",
                  diagnostics=("update_norm", "train_loss", "fraction_clipped"), log=log)
  rows = _summarize(runs)
  wall = time.perf_counter() - t0
  settings = {
      "scale": scale, "seeds": n_seeds, "epsilons": list(epsilons), "sparsities": list(sparsities),
      "ablation_epsilon": ae, "sparsity_default": DEFAULTS["sparsity"], "lambda": DEFAULTS["lambda"],
      "lus_batches": DEFAULTS["lus_batches"], "clip": base["clip"], "config": base,
      "num_clients": data.num_clients, "figure_epsilon": ae if ae in epsilons else epsilons[-1],
      "curve_epsilons": [epsilons[0], epsilons[-1]], "wall_seconds": wall,
      "description": (f"{base['dataset']}, {data.num_clients} clients ({base['partition']}"
                      f"{', %d shards each' % base['shards_per_client'] if base['partition'] == 'shards' else ''}), "
                      f"model {base['model']}, T={base['rounds']} rounds, Poisson p={base['sampling_prob']:g} "
                      f"(~{data.num_clients * base['sampling_prob']:.0f} clients/round), Q={base['local_steps']} "
                      f"local SGD steps of batch {base['batch_size']} at lr {base['client_lr']:g}, S={base['clip']:g}, "
                      f"eta_g={base['server_lr']:g}, lambda={DEFAULTS['lambda']}, c={DEFAULTS['sparsity']}, "
                      f"lus_batches={DEFAULTS['lus_batches']}"),
      "privacy": ("user-level (epsilon, delta)-DP, add/remove one client under Poisson sampling, "
                  "RDP accountant of dp_accounting; BLUR and LUS have exactly DP-FedAvg's epsilon at the "
                  "same noise (LUS's data-dependent mask comes before the clip). Pre-clip update norms "
                  "in the metrics and the hyper-parameters chosen on test accuracy are not covered."),
  }
  md = write_markdown(rows, settings, out / "results.md")
  plots = plot(runs, settings, out)
  write_text_atomic(out / "results.json", json.dumps(
      {"paper": "Cheng et al., Differentially Private Federated Learning with Local Regularization "
                "and Sparsification, CVPR 2022", "settings": settings, "rows": rows,
       "paper_table1": {m: {str(k): v for k, v in t.items()} for m, t in PAPER_TABLE1.items()},
       "paper_table3": {m: {str(k): v for k, v in t.items()} for m, t in PAPER_TABLE3.items()},
       "plots": [p.name for p in plots]}, indent=2) + "\n")
  log(md)
  log(f"wrote {out / 'results.json'}, {out / 'results.md'}, {', '.join(str(p) for p in plots)} "
      f"in {wall:.0f}s")
  return {"rows": rows, "settings": settings, "runs": runs}


def run_paper(output_dir: str, data_dir=None, seeds: Optional[int] = None, presets=None,
              log=print) -> int:
  """The paper-scale presets (accelerator only): Table 1 (EMNIST) and Table 2 (CIFAR-10).

  Writes ``results.json`` (``runs``: preset, method, target and ledger epsilon, seed, accuracy),
  ``runs.jsonl`` and each run's metrics under ``DIR/PRESET/``.
  """
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import load_data
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  n_seeds = num_seeds(seeds, SCALES["paper"]["seeds"])
  runs = []
  for i, name in enumerate(presets or PAPER_PRESETS):
    check_choice("preset", name, sorted(PAPER_PRESETS))
    preset = dict(PAPER_PRESETS[name])
    if preset["dataset"] == "emnist":
      from fedjax_dp.data import load_federated_emnist
      d = pathlib.Path(data_dir or ".")
      train, test = d / "fed_emnist_train.h5", d / "fed_emnist_test.h5"
      check(train.is_file() and test.is_file(), "data_dir", str(d),
            "must hold TFF's fed_emnist_train.h5 and fed_emnist_test.h5 for the EMNIST presets")
      data = load_federated_emnist(train, test)
      preset["num_clients"] = data.num_clients
    else:
      data = load_data(make_config(dict(preset, data_dir=data_dir)))
    jobs = [Job(make_config(dict(preset, data_dir=data_dir, algorithm=m, target_epsilon=eps,
                                 seed=seed)),
                {"preset": name, "method": m, "target_epsilon": eps, "seed": seed},
                output_dir=str(out / name / f"{m}_eps{eps:g}_seed{seed}"))
            for eps in EPSILONS for m in METHODS for seed in range(n_seeds)]
    runs += run_jobs(jobs, lambda job, res: {"epsilon": res.summary.get("epsilon"),
                                             "accuracy": res.summary["final_accuracy"]},
                     data=data, runs_path=out / "runs.jsonl", append=i > 0, log=log)
  keys = ("preset", "method", "target_epsilon", "seed", "epsilon", "accuracy")
  write_text_atomic(out / "results.json", json.dumps({"runs": [{k: r[k] for k in keys} for r in runs]},
                                               indent=2) + "\n")
  return 0


def run(scale: str, output_dir: str, data_dir=None, seeds=None) -> int:
  """Entry point of ``fedjax-dp reproduce cheng2022``."""
  check_choice("scale", scale, sorted(SCALES))
  if scale == "paper":
    return run_paper(output_dir, data_dir, seeds)
  run_small(scale, output_dir, data_dir, seeds)
  return 0
