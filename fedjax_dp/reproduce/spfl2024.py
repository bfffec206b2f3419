"""Reproduction of Wu and Li 2024 (SP-FL), Figs. 3-5 and Table 2, at reduced scale.

``fedjax-dp reproduce spfl2024 --scale small --output-dir DIR`` runs, on real
MNIST and Fashion-MNIST, 100 clients partitioned by label shards (5 shards
per client: the paper's 500 shards, Sec. 3.1), the paper's CNN
(``spfl_cnn``) and compares ``spfl`` (as published), ``spfl-sound``,
``adp-fl``, ``dp-fl`` and ``nodp-fl``:

* accuracy versus the privacy budget epsilon (Fig. 3);
* accuracy versus the number of clients per round (Fig. 4);
* accuracy versus the number of local iterations (Fig. 5);
* training error of every method at the base setting (Table 2).

It writes ``DIR/results.json`` (``rows``: method, dataset, setting, value,
accuracy_mean, accuracy_std (sample std over seeds), seeds, epsilon per class
(the worst seed's: :func:`worst_epsilon`) or null, formal_guarantee, train_error_mean, train_loss_mean, seconds;
``gains``: ours beside the paper's claimed +2.25% over ADP-FL and +4.41% over
DP-FL, with the spread over seeds), ``DIR/runs.jsonl`` (every run's record, with each
round's diagnostics that the reasons read: :data:`HISTORY_KEPT`), ``DIR/results_partial.json``
(the rows done so far,
rewritten as runs end) and each run's ``metrics.jsonl`` and ``summary.json``
under ``DIR/runs/``; then :func:`render` writes ``DIR/results.md`` (the rows
and a verdict per claim of the paper, :data:`CLAIMS`) and
``DIR/spfl2024_fig{3,4,5}.png`` from ``results.json`` and ``runs.jsonl``
(``fedjax-dp reproduce spfl2024 --render --output-dir DIR`` redoes only that).

Privacy: example-level, the privacy unit is one example of one client (local
to each client), not a whole client. The noise multiplier of every DP method
is calibrated so that a client taking part in every round meets the target
epsilon; ``spfl`` (as published) runs with the same sigma but has no formal
guarantee, so its rows carry ``epsilon: null`` and the target only as
``nominal_epsilon``.

Deviations from the paper (the paper gives neither rounds, learning rates,
batch sizes, betas nor clip bounds): far fewer rounds and clients per
round; at ``small`` scale fixed-size per-step batches (replace-one
accounting) instead of Poisson sampling, to fit 2 CPU cores (Poisson batches
are padded to a tail capacity, several times the work at L = 16); one seed by default
(the paper averages 15 runs); MNIST and Fashion-MNIST only: the paper's third
data set, CIFAR-10, is not run at any scale.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import time
from typing import Optional, Sequence

import numpy as np

# This module's own make_config builds a run's configuration from a method and a scale.
from fedjax_dp.config import make_config as run_config
from fedjax_dp.engine import make_evaluator
from fedjax_dp.errors import check_choice
from fedjax_dp.experiment import load_data
from fedjax_dp.outputs import write_text_atomic
from fedjax_dp.plots import Curve, Layout, plot_curves
from fedjax_dp.reproduce.runner import (Execution, Job, Kept, group_by, identity, num_seeds,
                                        read_records, release, run_jobs, simulate_jobs,
                                        wall_seconds, wrote)
from fedjax_dp.reproduce.tables import (Claim, markdown_table, mean_std, seed_difference,
                                       verdict_table)
from fedjax_dp.stats import seed_stats

METHODS = ("spfl", "spfl-sound", "adp-fl", "dp-fl", "nodp-fl")
PAPER_GAINS = {"adp-fl": 2.25, "dp-fl": 4.41}  # accuracy points, SP-FL over the baseline (abstract)
DATASETS = ("mnist", "fashion_mnist")

_BASE = dict(model="spfl_cnn", partition="shards", num_clients=100, shards_per_client=5,
             min_labels_per_client=3,
             sampling="fixed", weighting="examples", client_optimizer="sgd",
             server_optimizer="sgd", server_lr=1.0, delta=1e-5)

SCALES = {
    # For the tests: a 3,000-example subset, 2 rounds, one sweep point (Fig. 3).
    "tiny": dict(datasets=("mnist",), max_train=3000, max_test=500, rounds=2, cohort=4,
                 local_steps=2, batch_size=4, lr=0.1, clip=2.0, example_sampling="fixed",
                 epsilon=4.0, epsilons=(1.0, 4.0), cohorts=(4,), steps=(2,), seeds=1,
                 sweep_datasets=("mnist",), train_eval=500),
    # 2 CPU cores: both data sets' base runs, the sweeps on MNIST only.
    "small": dict(datasets=DATASETS, max_train=None, max_test=2000, rounds=20, cohort=5,
                  local_steps=2, batch_size=16, lr=0.1, clip=2.0, example_sampling="fixed",
                  epsilon=4.0, epsilons=(1.0, 4.0, 16.0), cohorts=(2, 5, 10), steps=(1, 2, 4),
                  seeds=1, sweep_datasets=("mnist",), train_eval=2000),
    # An accelerator: Poisson per-step sampling, more rounds, both data sets everywhere, 2 seeds.
    "medium": dict(datasets=DATASETS, max_train=None, max_test=None, rounds=40, cohort=10,
                   local_steps=4, batch_size=32, lr=0.1, clip=2.0, example_sampling="poisson",
                   epsilon=4.0, epsilons=(1.0, 4.0, 16.0), cohorts=(5, 10, 20), steps=(1, 4, 8),
                   seeds=2, sweep_datasets=DATASETS, train_eval=10000),
}

# SP-FL's class settings (not given in the paper; ours): beta = 0.2 puts the bounds in force
# near the DP-FL bound (clip = 2; per-example norms start near 10 on MNIST). With beta = 1 the
# published rule diverged (NaN by round 4 of the small MNIST base run): the noise sigma * C grows
# with the norms it inflates.
SPFL_OPTIONS = {"high_fraction": 0.5, "beta_high": 0.2, "beta_low": 0.2}


def make_config(method: str, dataset: str, p: dict, *, epsilon: float, cohort: int, steps: int,
                seed: int, data_dir=None):
  """The run configuration of ``method`` on ``dataset`` at scale ``p``: :data:`_BASE` with the
  scale's sizes, the clients' optimizer settings and (for the DP methods) a target epsilon; PLD
  accounting with Poisson per-step batches, RDP with fixed-size ones.

  Args:
    method: one of :data:`METHODS` ("nodp-fl": non-private, no target epsilon).
    dataset: one of :data:`DATASETS`.
    p: the scale's settings (a value of :data:`SCALES`).
    epsilon: the target epsilon (example-level).
    cohort: clients per round (fixed-size sampling).
    steps: local steps per round.
    seed: the run's seed.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``).

  Returns:
    The :class:`fedjax_dp.config.RunConfig`.
  """
  opts = {"example_sampling": p["example_sampling"]}
  if method.startswith("spfl"):
    opts.update(SPFL_OPTIONS)
  # Poisson per-step batches are accounted under replace-one, which only the PLD accountant has.
  accountant = "pld" if p["example_sampling"] == "poisson" else "rdp"
  return run_config(dict(_BASE, accountant=accountant), algorithm=method, dataset=dataset,
                    data_dir=data_dir, max_train=p["max_train"], max_test=p["max_test"],
                    rounds=p["rounds"], cohort_size=cohort, local_steps=steps,
                    batch_size=p["batch_size"], client_lr=p["lr"], clip=p["clip"],
                    noise_multiplier=None,
                    target_epsilon=None if method == "nodp-fl" else epsilon, seed=seed,
                    eval_every=p["rounds"], options=opts)


def _train_error(model, params, data, n: int):
  """Error and loss of the final model on ``n`` pooled training examples (Table 2)."""
  mask = np.arange(data.x.shape[1])[None, :] < data.counts[:, None]
  x, y = data.x[mask], data.y[mask]
  idx = np.random.default_rng(0).permutation(len(y))[:n]
  acc, loss = make_evaluator(model, x[idx], y[idx])(params)
  return 1.0 - float(acc), float(loss)


def _execute(jobs, data, done, train_eval: int, threads=None):
  """Runs ``jobs`` as sweeps do (:func:`simulate_jobs`) and adds each final model's train error
  and loss and its noise multiplier to its summary (also to its ``summary.json``)."""

  def finish(indices, results, setups, seconds):
    """Adds the group's train errors and noise multipliers, then calls ``done``.

    Args:
      indices: indices into ``jobs`` of the group that ended.
      results: their :class:`fedjax_dp.engine.RunResult` s.
      setups: their :class:`fedjax_dp.algorithms.Setup` s.
      seconds: the group's wall time.
    """
    for job, res, setup in zip([jobs[i] for i in indices], results, setups):
      err, loss = _train_error(setup.program.model, setup.program.eval_params(res.state), data,
                               train_eval)
      # sigma: the DP methods' calibrated multiplier (nominal for published spfl); none for nodp-fl.
      sigma = setup.hparams.get("sigma")
      # The error and loss on the clients' own examples are raw statistics of private data.
      res.summary.setdefault("diagnostics", {}).update(train_error=err, train_loss=loss)
      res.summary.update(noise_multiplier=None if sigma is None else float(sigma))
      write_text_atomic(pathlib.Path(job.output_dir) / "summary.json",
          json.dumps(res.summary, indent=2, default=str) + "\n")
    done(indices, results, setups, seconds)

  simulate_jobs(jobs, data, finish, threads=threads)


# The rows' raw statistics (runner.release).
RAW = {"train_error_mean, train_loss_mean (Table 2's train error)":
       "the final models' error and loss on the clients' pooled training examples, unnoised",
       "trace (each seed's run; the verdicts' reasons quote it)":
       "the first round whose mean local train loss is not finite or above 10 times round 1's "
       "(runaway_round), the medians over the rounds before it of the noise std added to the "
       "aggregate (a function of the data-dependent bounds of spfl and adp-fl) and of the "
       "clients' median update norm before noise, and the last round's train loss, unnoised"}


def _class_eps(summary):
  if summary.get("classes") is None:
    return None
  out = {}
  for name, c in summary["classes"].items():
    out[name] = (None if not c["formal_guarantee"] else
                 {"max": c["epsilon_max"], "median": c["epsilon_median"]})
  return None if all(v is None for v in out.values()) else out


def _record(job, res) -> dict:
  """The fields of a run's record after its labels."""
  s = res.summary
  return {
      "accuracy": s["final_accuracy"], "formal_guarantee": bool(s.get("formal_guarantee")),
      "epsilon": _class_eps(s),
      "no_guarantee_reasons": {k: c.get("reason") for k, c in (s.get("classes") or {}).items()
                               if not c["formal_guarantee"]} or None,
      "noise_multiplier": s.get("noise_multiplier"),
      "train_error": s["diagnostics"]["train_error"], "train_loss": s["diagnostics"]["train_loss"],
  }


# What a run's record keeps of its history: every round's diagnostics that _trace reads, so that a
# reproduction's runs.jsonl can be kept beside its results.
HISTORY_KEPT = Kept(diagnostics=("train_loss", "noise_std", "update_norm"))


def _trace(history) -> dict:
  """A run's raw noise and loss trajectory (its per-round diagnostics), which the verdicts'
  reasons quote: see :data:`RAW`."""
  loss = [h["diagnostics"]["train_loss"] for h in history]
  runaway = next((h["round"] for h, l in zip(history, loss)
                  if not math.isfinite(l) or l > 10 * loss[0]), None)
  diag = [h["diagnostics"] for h in history if runaway is None or h["round"] < runaway]

  def median(key, get=lambda v: v):
    vals = [get(d[key]) for d in diag if key in d and math.isfinite(get(d[key]))]
    return float(np.median(vals)) if vals else None

  return {"noise_std_median": median("noise_std"),
          "update_norm_median": median("update_norm", lambda v: v["q50"]),
          "train_loss_last": loss[-1], "runaway_round": runaway}


# What tells the rows apart.
ROW_KEYS = ("dataset", "setting", "value", "method")


def worst_epsilon(per_seed: Sequence) -> Optional[dict]:
  """The epsilon a row of several seeds reports: for each privacy class, the largest over the
  seeds of the max over its clients and the largest of the median over its clients.

  Each seed is a run of its own, whose cohort draws set its clients' ledgers, so the seeds' epsilons
  differ; the row reports the worst seed's, not one seed's. (The seeds' runs together, on the same
  data, compose: this is each run's guarantee, not theirs together.)

  Args:
    per_seed: each seed's run record's ``epsilon``: class -> {"max", "median"} (None for a class
      without a guarantee), or None for a run without one (published ``spfl``, ``nodp-fl``); the
      same classes in every seed.

  Returns:
    class -> {"max", "median"} or None, as each record; None where the runs have no guarantee.
  """
  first = per_seed[0]
  if first is None:
    return None
  return {name: None if cls is None else
          {stat: max(e[name][stat] for e in per_seed) for stat in ("max", "median")}
          for name, cls in first.items()}


def _rows(runs, settings, n_seeds):
  """One row per setting and method whose ``n_seeds`` runs are all done; ``settings``: the
  settings (epsilon, clients_per_round, local_steps) of each (dataset, setting, value)."""
  rows = []
  for (ds, setting, value, method), rs in group_by(runs, ROW_KEYS).items():
    if len(rs) < n_seeds:
      continue
    last, s = rs[-1], settings[(ds, setting, value)]
    rows.append({
        "method": method, "dataset": ds, "setting": setting, "value": value,
        **seed_stats([r["accuracy"] for r in rs]), "formal_guarantee": last["formal_guarantee"],
        "epsilon": worst_epsilon([r["epsilon"] for r in rs]),
        "nominal_epsilon": None if method == "nodp-fl" else s["epsilon"],
        "no_guarantee_reasons": last["no_guarantee_reasons"],
        "noise_multiplier": last["noise_multiplier"],
        "train_error_mean": float(np.mean([r["train_error"] for r in rs])),
        "train_loss_mean": float(np.mean([r["train_loss"] for r in rs])),
        "seconds": float(np.sum([r["seconds"] for r in rs])),
        "trace": [_trace(r["history"]) if r.get("history") else None for r in rs],
        "base_value": dict(s),
    })
  return rows


# The paper's claims: the abstract's mean gains of SP-FL (accuracy points), and the directions
# that the text of Figs. 3-5 and Table 2 states in words (no values given). Each: the claim, our
# method, the baseline, the settings compared (None: every setting; a figure's sweep with its base
# point; "base": Table 2's base runs of both data sets), the field, the paper's gain, sign only.
CLAIMS = (
    ("SP-FL over ADP-FL, mean of all settings (abstract)", "spfl", "adp-fl", None, "accuracy",
     PAPER_GAINS["adp-fl"], False),
    ("SP-FL over DP-FL, mean of all settings (abstract)", "spfl", "dp-fl", None, "accuracy",
     PAPER_GAINS["dp-fl"], False),
    ("spfl-sound (ours, formal DP) over ADP-FL, the abstract's claim", "spfl-sound", "adp-fl", None,
     "accuracy", PAPER_GAINS["adp-fl"], False),
    ("spfl-sound (ours, formal DP) over DP-FL, the abstract's claim", "spfl-sound", "dp-fl", None,
     "accuracy", PAPER_GAINS["dp-fl"], False),
    ("Fig. 3: SP-FL above ADP-FL over epsilon (mean of its points)", "spfl", "adp-fl", "epsilon",
     "accuracy", 1.0, True),
    ("Fig. 3: SP-FL above DP-FL over epsilon (mean of its points)", "spfl", "dp-fl", "epsilon",
     "accuracy", 1.0, True),
    ("Fig. 4: SP-FL above ADP-FL over clients per round (mean of its points)", "spfl", "adp-fl",
     "clients_per_round", "accuracy", 1.0, True),
    ("Fig. 4: SP-FL above DP-FL over clients per round (mean of its points)", "spfl", "dp-fl",
     "clients_per_round", "accuracy", 1.0, True),
    ("Fig. 5: SP-FL above ADP-FL over local iterations (mean of its points)", "spfl", "adp-fl",
     "local_steps", "accuracy", 1.0, True),
    ("Fig. 5: SP-FL above DP-FL over local iterations (mean of its points)", "spfl", "dp-fl",
     "local_steps", "accuracy", 1.0, True),
    ("Table 2: SP-FL's training error below ADP-FL's (base runs)", "spfl", "adp-fl", "base",
     "train_error", -1.0, True),
    ("Table 2: SP-FL's training error below DP-FL's (base runs)", "spfl", "dp-fl", "base",
     "train_error", -1.0, True),
)

def _fmt(v) -> str:
  return "-" if v is None else f"{v:.3g}"


def reason(rows, ours, base, setting) -> str:
  """A claim's likely reason as this run measured it: for the settings the claim compares (a
  figure's: each point of its sweep), both methods' noise std and update norm (medians over
  rounds before a runaway, then over runs), their last-round train loss (median over the runs
  that did not run away) and the runs that ran away (see :data:`RAW`); why these move as they do
  is analysed in docs/spfl2024.md.

  Args:
    rows: the rows of ``results.json`` (with their runs' ``trace``).
    ours: our method's name.
    base: the baseline's name.
    setting: the settings compared: None (all), "base" (Table 2's base runs) or a figure's
      swept field.

  Returns:
    The reason in words; "" when no setting has both methods.
  """
  by = {(r["method"], r["dataset"], r["setting"], r["value"]): r for r in rows}
  keys = sorted((k for k in _settings_of(rows, setting)
                 if (ours,) + k in by and (base,) + k in by), key=str)
  if not keys:
    return ""
  if any(None in (by[(m,) + k].get("trace") or [None]) for m in (ours, base) for k in keys):
    return "not measured: rows without the runs' traces (a results.json written before them)"
  groups = {}  # a figure's point (its setting's value), or None: the keys compared there
  for k in keys:
    point = None if setting in (None, "base") else by[(base,) + k]["base_value"][setting]
    groups.setdefault(point, []).append(k)
  parts = []
  for point, ks in sorted(groups.items(), key=lambda g: g[0] or 0):
    label = "" if point is None else f"{setting} {point:g}: "
    traces = {m: [t for k in ks for t in by[(m,) + k]["trace"]] for m in (ours, base)}

    def med(m, field):
      vals = [t[field] for t in traces[m] if t[field] is not None
              and (field != "train_loss_last" or t["runaway_round"] is None)]
      return float(np.median(vals)) if vals else None

    noise = {m: med(m, "noise_std_median") for m in traces}
    ratio = (f" ({noise[ours] / noise[base]:.2g}x)" if noise[ours] is not None and noise[base]
             else "")
    text = (f"{label}noise std {ours} {_fmt(noise[ours])} vs {base} {_fmt(noise[base])}{ratio}, "
            f"update norm {_fmt(med(ours, 'update_norm_median'))} vs "
            f"{_fmt(med(base, 'update_norm_median'))}, last train loss "
            f"{_fmt(med(ours, 'train_loss_last'))} vs {_fmt(med(base, 'train_loss_last'))}")
    for m, ts in traces.items():
      ran = sorted(t["runaway_round"] for t in ts if t["runaway_round"] is not None)
      if ran:
        when = f"round {ran[0]}" if ran[0] == ran[-1] else f"rounds {ran[0]}-{ran[-1]}"
        text += f"; {m} ran away in {len(ran)} of {len(ts)} runs ({when})"
    parts.append(text)
  return ". ".join(parts)


def _settings_of(rows, setting):
  """The (dataset, setting, value) keys a claim compares: all (None), Table 2's base runs
  ("base"), or a figure's sweep with its base point on each data set swept."""
  keys = {(r["dataset"], r["setting"], r["value"]) for r in rows}
  if setting is None:
    return keys
  if setting == "base":
    return {k for k in keys if k[1] == "base"}
  swept = {k[0] for k in keys if k[1] == setting}
  return {k for k in keys if k[0] in swept and k[1] in (setting, "base")}


def difference(rows, records, ours, base, setting, field="accuracy"):
  """Our method's mean difference over the baseline in points (``field`` times 100), over the
  settings where both have a complete row: ``(mean, spread, settings)``. With per-seed
  ``records`` (``runs.jsonl``) each seed's mean difference over the settings is taken first
  (seeds paired), ``mean`` is their mean and ``spread`` their sample std (None with one seed).
  ``mean`` is None when no setting has both.

  Args:
    rows: the rows of ``results.json``.
    records: the per-seed run records (``runs.jsonl``, or one per row with seed 0).
    ours: our method's name.
    base: the baseline's name.
    setting: the settings compared, as :func:`reason`'s.
    field: the record's field compared (a fraction: "accuracy" or "train_error").

  Returns:
    ``(mean, spread, settings)``: ``settings`` the number of settings compared.
  """
  have = {(r["method"], r["dataset"], r["setting"], r["value"]) for r in rows}
  keys = sorted((k for k in _settings_of(rows, setting)
                 if (ours,) + k in have and (base,) + k in have), key=str)
  if not keys:
    return None, None, 0
  by = {(r["method"], r["dataset"], r["setting"], r["value"], r["seed"]): r[field]
        for r in records}
  seeds = sorted({r["seed"] for r in records})
  per_seed = [float(np.mean([100 * (by[(ours,) + k + (s,)] - by[(base,) + k + (s,)])
                             for k in keys])) for s in seeds]
  return (*seed_difference(per_seed), len(keys))


def _records(rows, runs_path):
  """Per-seed records: ``runs.jsonl`` where it exists, else one record per row (its means)."""
  path = pathlib.Path(runs_path)
  if path.is_file():
    return read_records(path.parent, rows, ROW_KEYS)
  return [{**r, "seed": 0, "accuracy": r["accuracy_mean"], "train_error": r["train_error_mean"]}
          for r in rows]


def _gains(rows, records):
  """The abstract's claims beside ours: spfl and spfl-sound over each baseline, mean difference
  in accuracy points over matched settings, with its spread over seeds."""
  out = {}
  for ours in ("spfl", "spfl-sound"):
    for base, claimed in PAPER_GAINS.items():
      mean, spread, n = difference(rows, records, ours, base, None)
      out[f"{ours}_over_{base}"] = {"ours_points": mean, "spread_points": spread, "settings": n,
                                    "paper_claim_points": claimed}
  return out


def claims(rows, records) -> list:
  """The paper's claims (:data:`CLAIMS`) as :class:`fedjax_dp.reproduce.tables.Claim` s, ours
  measured from ``rows`` and the per-seed ``records``, with the reasons (:func:`reason`) that
  the rows' traces give."""
  out = []
  for text, ours, base, setting, field, gain, sign_only in CLAIMS:
    mean, spread, _ = difference(rows, records, ours, base, setting, field)
    out.append(Claim(text, gain, mean, spread, reason(rows, ours, base, setting), sign_only))
  return out


def _plot(rows, setting, xlabel, path, logx=False):
  """Accuracy against ``setting`` (its sweep and the base setting), one panel per data set
  swept; none when no data set is."""
  sel = [r for r in rows if r["setting"] in (setting, "base")]
  panels = []
  for ds in sorted({r["dataset"] for r in sel if r["setting"] == setting}):
    curves = []
    for m in METHODS:
      pts = sorted({(r["base_value"][setting], r["accuracy_mean"], r["accuracy_std"])
                    for r in sel if r["dataset"] == ds and r["method"] == m},
                   key=lambda p: p[0])
      if pts:
        xs, ys, es = zip(*pts)
        curves.append(Curve(m + ("" if m != "spfl" else " (no DP guarantee)"), xs, ys, err=es,
                            style="--" if m in ("spfl", "nodp-fl") else "-"))
    panels.append((ds, curves))
  if not panels:
    return None
  return str(plot_curves(panels, path, xlabel=xlabel, logx=logx,
                         layout=Layout(size=(4.2, 3.2), sharey=False, legend_size=7)))


def _markdown(rows, verdicts, header):
  def eps(r):
    if r["epsilon"] is None:
      return "none (no guarantee)" if r["method"] != "nodp-fl" else "none (non-private)"
    return ", ".join(f"{k}: {v['max']:.2f}/{v['median']:.2f}" if v else f"{k}: none"
                     for k, v in r["epsilon"].items())

  lines = [header, ""] + markdown_table(
      ["dataset", "setting", "value", "method", "accuracy", ("train error", "train error (raw)"),
       "epsilon (per class max/median)", "formal DP"],
      [{"dataset": r["dataset"], "setting": r["setting"], "value": r["value"],
        "method": r["method"], "accuracy": mean_std(r["accuracy_mean"], r["accuracy_std"]),
        "train error": mean_std(r["train_error_mean"]),
        "epsilon (per class max/median)": eps(r), "formal DP": r["formal_guarantee"]}
       for r in rows])
  lines += ["", "Epsilon: each privacy class's largest over the seeds of the max and of the median "
            "over its clients (`fedjax_dp.reproduce.spfl2024.worst_epsilon`); each seed's run "
            "has its own guarantee.",
            "", "The paper's claims beside ours (points; ± the std over seeds of the paired "
            "difference; `spfl` has no formal DP guarantee, its epsilon is nominal"
            + ("; the likely reasons are this run's raw diagnostics, ours vs the baseline: "
               "the noise std and update norm (medians over the rounds before a runaway, then "
               "over runs), the last round's train loss (median over the runs that did not run "
               "away) and the runs whose loss ran away (above 10 times round 1's); "
               "docs/spfl2024.md analyses why"
               if any(v.reason for v in verdicts) else "") + "):", ""]
  return "\n".join(lines + verdict_table(verdicts)) + "\n"


FIGURES = (("epsilon", "target epsilon (nominal for spfl)", "spfl2024_fig3.png", True),
           ("clients_per_round", "clients per round", "spfl2024_fig4.png", False),
           ("local_steps", "local iterations Q", "spfl2024_fig5.png", False))


def render(output_dir, log=print) -> int:
  """Rewrites ``results.md`` and the figures in ``output_dir`` from its ``results.json`` and
  ``runs.jsonl`` (the seeds' records; without it the rows' means, no spread), running nothing,
  and logs results.md and the files written (:func:`~fedjax_dp.reproduce.runner.wrote`);
  :func:`run` writes its outputs as this does. Returns 0."""
  md, written = _render(output_dir)
  log(md)
  log(wrote(written))
  return 0


def saved_claims(output_dir) -> list:
  """The claims (:func:`claims`) of the reproduction in ``output_dir``, as its ``results.md``
  shows them: from its ``results.json`` rows and ``runs.jsonl`` (the seeds' records; without it
  the rows' means, no spread)."""
  out = pathlib.Path(output_dir)
  rows = json.loads((out / "results.json").read_text())["rows"]
  return claims(rows, _records(rows, out / "runs.jsonl"))


def _render(output_dir) -> tuple:
  """:func:`render`'s files, written: results.md's text and the paths (results.md, then the
  figures drawn)."""
  out = pathlib.Path(output_dir)
  result = json.loads((out / "results.json").read_text())
  rows = result["rows"]
  plots = [_plot(rows, setting, xlabel, out / name, logx)
           for setting, xlabel, name, logx in FIGURES]
  verdicts = saved_claims(out)
  seeds = max((r["seeds"] for r in rows), default=0)
  md = _markdown(rows, verdicts, f"SP-FL reproduction, scale {result['scale']}, {seeds} seed(s), "
                 f"wall {result['wall_seconds']:.0f} s")
  write_text_atomic(out / "results.md", md)
  return md, [out / "results.md"] + [x for x in plots if x]


def _settings(p: dict) -> dict:
  """``(dataset, setting, value) -> {epsilon, clients_per_round, local_steps}`` in run order: each
  data set's base setting, then, on the swept data sets, one setting per other epsilon, cohort
  and number of local steps of the scale ``p``."""
  base = {"epsilon": p["epsilon"], "clients_per_round": p["cohort"], "local_steps": p["local_steps"]}
  settings = {}
  for ds in p["datasets"]:
    settings[(ds, "base", None)] = dict(base)
    if ds in p["sweep_datasets"]:
      settings.update({(ds, "epsilon", e): dict(base, epsilon=e) for e in p["epsilons"]
                       if e != p["epsilon"]})
      settings.update({(ds, "clients_per_round", c): dict(base, clients_per_round=c)
                       for c in p["cohorts"] if c != p["cohort"]})
      settings.update({(ds, "local_steps", q): dict(base, local_steps=q) for q in p["steps"]
                       if q != p["local_steps"]})
  return settings


def _load(ds: str, p: dict, data_dir):
  """The data set ``ds`` at the scale ``p``, its clients' sizes and labels logged."""
  data = load_data(make_config("dp-fl", ds, p, epsilon=p["epsilon"], cohort=p["cohort"],
                               steps=p["local_steps"], seed=0, data_dir=data_dir))
  labels = [len(np.unique(data.y[c, :data.counts[c]])) for c in range(data.num_clients)]
  # Example counts are public under example-level DP; the labels per client are not.
  print(f"[spfl2024] {ds}: {data.num_clients} clients, {int(data.counts.min())}-"
        f"{int(data.counts.max())} examples (public), labels per client min {min(labels)} "
        f"median {int(np.median(labels))} (raw diagnostic, not covered)", flush=True)
  return data


def _jobs(p: dict, settings: dict, methods, data_dir, out: pathlib.Path) -> list:
  """The runs of scale ``p`` (its ``seeds`` of each method at each of ``settings``: the
  non-private method has no epsilon sweep), each writing its folder under ``out/runs/``."""
  return [Job(make_config(m, ds, p, epsilon=s["epsilon"], cohort=s["clients_per_round"],
                          steps=s["local_steps"], seed=seed, data_dir=data_dir),
              {"dataset": ds, "setting": setting, "value": value, "method": m, "seed": seed},
              name=f"{ds} {setting}={value} {m} seed={seed}", data=ds,
              output_dir=str(out / "runs" / f"{ds}_{setting}_{value}_{m}_s{seed}"))
          for (ds, setting, value), s in settings.items() for m in methods
          if not (m == "nodp-fl" and setting == "epsilon") for seed in range(p["seeds"])]


def run(scale: str = "small", output_dir: str = "runs/spfl2024", data_dir=None, seeds=None,
        methods=METHODS, threads=None, resume: bool = False) -> int:
  """Runs the reproduction at ``scale`` and writes ``results.json``, ``results.md``,
  ``runs.jsonl``, the figures and each run's folder under ``output_dir/runs/``.

  Args:
    scale: "tiny", "small" or "medium" (:data:`SCALES`).
    output_dir: the folder written.
    data_dir: the folder holding the data files (None: ``$FEDJAX_DP_DATA``, else the
      repository's sibling ``shared/data`` where it exists).
    seeds: the seeds of each setting (None: the scale's).
    methods: the methods run, a subset of :data:`METHODS`.
    threads: compiled programs run at once (None: automatic).
    resume: continue the reproduction in ``output_dir``: only the runs that its ``runs.jsonl``
      has no record of run (:func:`fedjax_dp.reproduce.runner.run_jobs`).

  Returns:
    0.

  Raises:
    ConfigError: an unknown scale or method, a bad ``seeds``, or as the runs.
  """
  check_choice("scale", scale, sorted(SCALES))
  for m in methods:
    check_choice("method", m, METHODS)
  n_seeds = num_seeds(seeds, SCALES[scale]["seeds"])
  p = dict(SCALES[scale], seeds=n_seeds)  # results.json's settings: the seeds this run used
  if data_dir is None and not os.environ.get("FEDJAX_DP_DATA"):
    shared = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"
    data_dir = str(shared) if shared.is_dir() else None
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  settings = _settings(p)
  jobs = _jobs(p, settings, methods, data_dir, out)

  def partial(runs):
    write_text_atomic(out / "results_partial.json",
        json.dumps({"rows": _rows(runs, settings, n_seeds)}, default=str) + "\n")

  runs = run_jobs(jobs, _record, load_data=lambda ds: _load(ds, p, data_dir),
                  runs_path=out / "runs.jsonl", kept=HISTORY_KEPT, on_record=partial,
                  execution=Execution(functools.partial(_execute, train_eval=p["train_eval"]),
                                      threads=threads,
                                      log=lambda line: print(f"[spfl2024] {line}", flush=True),
                                      resume=resume))
  rows = _rows(runs, settings, n_seeds)
  result = {"paper": "Wu and Li 2024, SP-FL", "scale": scale, "settings": p,
            "spfl_options": SPFL_OPTIONS, "privacy_unit":
            "one example of one client (example-level DP, local to each client)",
            "rows": rows, "gains": _gains(rows, runs), "paper_claims": PAPER_GAINS,
            "release": release(RAW), **identity("spfl2024"),
            "wall_seconds": wall_seconds(runs)}
  write_text_atomic(out / "results.json", json.dumps(result, indent=2, default=str) + "\n")
  md, written = _render(out)
  print(md)
  print(wrote([out / "results.json", out / "runs.jsonl"] + written, time.perf_counter() - t0))
  return 0
