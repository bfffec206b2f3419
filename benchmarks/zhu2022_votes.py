"""The sign votes behind DP-RSA's verdicts: the attackers' vote margin, and one example a worker.

  python benchmarks/zhu2022_votes.py --data-dir ../shared/data            # measure, then print
  python benchmarks/zhu2022_votes.py --table benchmarks/results/zhu2022_votes.jsonl  # print only
  python benchmarks/zhu2022_votes.py --study batch --data-dir ../shared/data
  python benchmarks/zhu2022_votes.py --study batch --table benchmarks/results/zhu2022_batch.jsonl

``--study votes`` (the default): why DP-RSA collapses under the sign-flip attack at epsilon
0.2. Each run is the paper scale's iid sign-flip setting of ``fedjax-dp reproduce zhu2022`` (MNIST,
K = 30 workers, the 784-50-50-10 MLP, alpha = lambda = 0.01, seed 0), shortened to ``--rounds``
iterations, with one setting changed: the method, the per-coordinate epsilon, the number of
attackers b, or the attack's factor. The master's step moves each coordinate by alpha lambda
times the sum of the K messages' signs (Eq. 11); an attacker's message ``sign(x_0 + 5 x_j)`` is
``sign(x_j)`` once the models are close, a full vote against the master's current side, whatever
the factor. A regular worker's perturbed sign has expectation ``(2 gamma - 1)`` times the exact
one, ``gamma = e^eps / (1 + e^eps)`` (:func:`fedjax_dp.reproduce.zhu2022.vote_margin`), so when
every regular worker agrees their net vote is at most ``(K - b) tanh(eps / 2)``: below ``b`` the
attackers outvote them on every coordinate. Each run's record: the accuracy curve with the
master's norm, then for the final models the test accuracy, the share of test images whose true
class gets the master's *lowest* logit (an anti-model scores near 1, a random one near 0.1), and
the norms of the master and of the regular workers' mean model.

``--study batch``: what one example per worker per iteration does to SignSGD, GM and RSA. Each
run is the iid Gaussian-attack setting of the paper scale (5,000 iterations, seed 0) with
``batch_size`` examples per worker per iteration: 32 (``--scale paper``) or 1 (``--scale
paper-b1``, the paper's 2.5 epochs). SignSGD's master moves every coordinate by alpha at every
iteration, the majority of the workers' gradient signs choosing the direction; GM moves by alpha
times the geometric median of the workers' gradients; RSA's master follows workers that take SGD
steps. Each run's record: the accuracy curve, then for the final model the test accuracy, the
test loss (mean cross-entropy over the test images), the mean largest softmax probability (how
confident the model is) and the norm of its parameters.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms.dp_fedavg import make_model
from fedjax_dp.experiment import simulate
from fedjax_dp.reproduce import zhu2022
from fedjax_dp.reproduce.tables import markdown_table
from fedjax_dp.transforms import global_norm

# --study votes: (method, per-coordinate epsilon, attackers b, the sign-flip factor), the
# paper's run first.
CASES = (("dp-rsa-f", 0.2, 3, -5.0), ("dp-rsa-f", 0.2, 3, -1.5), ("dp-rsa-f", 0.25, 3, -5.0),
         ("dp-rsa-f", 0.2, 2, -5.0), ("dp-rsa-f", 0.2, 0, -5.0), ("rsa", None, 3, -5.0))


def _run(config, data) -> tuple:
  """``(result, history, seconds, log_probs, labels)`` of one run of ``config`` on ``data``: the
  final model's log-softmax over the test images."""
  hist = []
  start = time.perf_counter()
  res = simulate(config, data, on_round=hist.append, progress=False)
  seconds = time.perf_counter() - start
  logits = make_model(config, data).apply(res.state.params, jnp.asarray(data.test_x))
  return res, hist, seconds, np.asarray(jax.nn.log_softmax(logits)), np.asarray(data.test_y)


def measure(case, rounds: int, data, scale: dict) -> dict:
  """One run of ``case`` (a :data:`CASES` entry) at ``rounds`` iterations: its record.

  Args:
    case: ``(method, epsilon, byzantine, attack_scale)``.
    rounds: the iterations.
    data: the iid split of :func:`fedjax_dp.reproduce.zhu2022.load_data` for ``scale``.
    scale: a :data:`fedjax_dp.reproduce.zhu2022.SCALES` value (its K, model, step sizes).

  Returns:
    The case's fields, ``margin`` (:func:`fedjax_dp.reproduce.zhu2022.vote_margin`; None for
    exact signs), the final ``accuracy``, ``true_class_lowest``, ``master_norm``,
    ``regular_mean_norm``, ``seconds`` and the ``curve`` (round, test accuracy, master norm).
  """
  method, eps, byz, factor = case
  opts = {"attack_scale": factor, **({} if eps is None else {"epsilon": eps})}
  sc = dict(scale, rounds=rounds, byzantine=byz)
  config = zhu2022._config(sc, method, opts, "sign-flip", None, 0)
  res, hist, seconds, log_probs, labels = _run(config, data)
  regular = jax.tree_util.tree_map(lambda r: r[: sc["num_clients"] - byz].mean(0), res.state.rows)
  return {"method": method, "epsilon": eps, "byzantine": byz, "attack_scale": factor,
          "rounds": rounds,
          "margin": None if eps is None else zhu2022.vote_margin(sc["num_clients"], byz, eps),
          "accuracy": float(np.mean(log_probs.argmax(1) == labels)),
          "true_class_lowest": float(np.mean(log_probs.argmin(1) == labels)),
          "master_norm": float(global_norm(res.state.params)),
          "regular_mean_norm": float(global_norm(regular)), "seconds": seconds,
          "curve": [{"round": h["round"], "test_accuracy": h["test_accuracy"],
                     "master_norm": h.get("master_norm")} for h in hist if "test_accuracy" in h]}


def table(records) -> str:
  """The Markdown table of ``docs/papers/zhu2022.md`` from the runs' records."""
  rows = []
  for r in records:
    curve = r["curve"]
    at = {c["round"]: c["test_accuracy"] for c in curve}
    rows.append({
        "run": (f"{r['method']}, eps {r['epsilon']}" if r["epsilon"] is not None
                else r["method"]) + f", b = {r['byzantine']}"
               + (f", factor {r['attack_scale']:g}" if r["byzantine"] else ""),
        "b - (K - b) tanh(eps / 2)": "" if r["margin"] is None else f"{r['margin']:+.2f}",
        "accuracy at 500 / 1,000": f"{at.get(500, float('nan')):.3f} / "
                                   f"{at.get(1000, float('nan')):.3f}",
        f"accuracy at {r['rounds']:,}": f"{r['accuracy']:.3f}",
        "true class lowest": f"{r['true_class_lowest']:.3f}",
        f"master norm at {curve[0]['round']} / {r['rounds']:,}":
            f"{curve[0]['master_norm']:.2f} / {r['master_norm']:.2f}",
    })
  return "\n".join(markdown_table(list(rows[0]), rows))


# --study batch: (method, examples per worker per iteration).
BATCH_CASES = tuple((method, batch) for method in ("signsgd", "gm", "rsa") for batch in (32, 1))


def measure_batch(case, rounds: int, data, scale: dict) -> dict:
  """One run of ``case`` (a :data:`BATCH_CASES` entry) at ``rounds`` iterations: its record.

  Args:
    case: ``(method, batch_size)``.
    rounds: the iterations.
    data: the iid split of :func:`fedjax_dp.reproduce.zhu2022.load_data` for ``scale``.
    scale: a :data:`fedjax_dp.reproduce.zhu2022.SCALES` value (its K, model, step sizes).

  Returns:
    ``method``, ``batch_size``, ``rounds``, the final model's ``accuracy``, ``test_loss``,
    ``confidence`` and ``norm``, ``seconds`` and the ``curve`` (round, test accuracy).
  """
  method, batch = case
  config = zhu2022._config(dict(scale, rounds=rounds, batch_size=batch), method, {}, "gaussian",
                           None, 0)
  res, hist, seconds, log_probs, labels = _run(config, data)
  return {"method": method, "batch_size": batch, "rounds": rounds,
          "accuracy": float(np.mean(log_probs.argmax(1) == labels)),
          "test_loss": float(-np.mean(log_probs[np.arange(len(labels)), labels])),
          "confidence": float(np.mean(np.exp(log_probs.max(1)))),
          "norm": float(global_norm(res.state.params)), "seconds": seconds,
          "curve": [{"round": h["round"], "test_accuracy": h["test_accuracy"]}
                    for h in hist if "test_accuracy" in h]}


def batch_table(records) -> str:
  """The Markdown table of ``docs/papers/zhu2022.md`` from the batch study's records."""
  rows = []
  for r in records:
    at = {c["round"]: c["test_accuracy"] for c in r["curve"]}
    best = max(r["curve"], key=lambda c: c["test_accuracy"])
    rows.append({
        "run": f"{r['method']}, {r['batch_size']} example{'s' if r['batch_size'] > 1 else ''}",
        "accuracy at 1,000": f"{at.get(1000, float('nan')):.3f}",
        "best (iteration)": f"{best['test_accuracy']:.3f} ({best['round']:,})",
        f"accuracy at {r['rounds']:,}": f"{r['accuracy']:.3f}",
        "test loss": f"{r['test_loss']:.3f}",
        "confidence": f"{r['confidence']:.3f}",
        "parameter norm": f"{r['norm']:.1f}",
    })
  return "\n".join(markdown_table(list(rows[0]), rows))


# Each study: its cases, the run of one case, its table and the defaults.
STUDIES = {
    "votes": (CASES, measure, table, 2000, "benchmarks/results/zhu2022_votes.jsonl"),
    "batch": (BATCH_CASES, measure_batch, batch_table, 5000,
              "benchmarks/results/zhu2022_batch.jsonl"),
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--study", choices=sorted(STUDIES), default="votes",
                      help="the measurement: votes (the sign-flip collapse, the default) or batch")
  parser.add_argument("--rounds", type=int, help="iterations (default: votes 2,000, batch 5,000)")
  parser.add_argument("--data-dir", default=None, help="the data files (default: $FEDJAX_DP_DATA)")
  parser.add_argument("--scale", default="paper", help="the zhu2022 scale whose settings run")
  parser.add_argument("--cases", type=int, help="the first N cases only (default: all)")
  parser.add_argument("--out", help="the records (default: benchmarks/results/zhu2022_STUDY.jsonl)")
  parser.add_argument("--table", metavar="JSONL", help="print the table of these records only")
  args = parser.parse_args(argv)
  cases, run_case, render, rounds, default_out = STUDIES[args.study]
  if args.table:
    print(render([json.loads(line) for line in pathlib.Path(args.table).read_text().splitlines()]))
    return 0
  scale = zhu2022.SCALES[args.scale]
  data = zhu2022.load_data(scale, "iid", args.data_dir, seed=0)
  records = []
  out = pathlib.Path(args.out or default_out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("w") as f:
    for case in cases[:args.cases]:
      records.append(run_case(case, args.rounds or rounds, data, scale))
      f.write(json.dumps(records[-1]) + "\n")
      f.flush()
  print(render(records))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
