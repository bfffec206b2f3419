"""Why DP-RSA collapses under the sign-flip attack at epsilon 0.2: the attackers' vote margin.

  python benchmarks/zhu2022_votes.py --data-dir ../shared/data            # measure, then print
  python benchmarks/zhu2022_votes.py --table benchmarks/results/zhu2022_votes.jsonl  # print only

Each run is the paper scale's iid sign-flip setting of ``fedjax-dp reproduce zhu2022`` (MNIST,
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

# (method, per-coordinate epsilon, attackers b, the sign-flip factor), the paper's run first.
CASES = (("dp-rsa-f", 0.2, 3, -5.0), ("dp-rsa-f", 0.2, 3, -1.5), ("dp-rsa-f", 0.25, 3, -5.0),
         ("dp-rsa-f", 0.2, 2, -5.0), ("dp-rsa-f", 0.2, 0, -5.0), ("rsa", None, 3, -5.0))


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
  hist = []
  start = time.perf_counter()
  res = simulate(config, data, on_round=hist.append, progress=False)
  seconds = time.perf_counter() - start
  logits = np.asarray(make_model(config, data).apply(res.state.params, jnp.asarray(data.test_x)))
  labels = np.asarray(data.test_y)
  regular = jax.tree_util.tree_map(lambda r: r[: sc["num_clients"] - byz].mean(0), res.state.rows)
  return {"method": method, "epsilon": eps, "byzantine": byz, "attack_scale": factor,
          "rounds": rounds,
          "margin": None if eps is None else zhu2022.vote_margin(sc["num_clients"], byz, eps),
          "accuracy": float(np.mean(logits.argmax(1) == labels)),
          "true_class_lowest": float(np.mean(logits.argmin(1) == labels)),
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2000)
  parser.add_argument("--data-dir", default=None, help="the data files (default: $FEDJAX_DP_DATA)")
  parser.add_argument("--scale", default="paper", help="the zhu2022 scale whose settings run")
  parser.add_argument("--cases", type=int, default=len(CASES), help="the first N cases only")
  parser.add_argument("--out", default="benchmarks/results/zhu2022_votes.jsonl")
  parser.add_argument("--table", metavar="JSONL", help="print the table of these records only")
  args = parser.parse_args(argv)
  if args.table:
    print(table([json.loads(line) for line in pathlib.Path(args.table).read_text().splitlines()]))
    return 0
  scale = zhu2022.SCALES[args.scale]
  data = zhu2022.load_data(scale, "iid", args.data_dir, seed=0)
  records = []
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("w") as f:
    for case in CASES[:args.cases]:
      records.append(measure(case, args.rounds, data, scale))
      f.write(json.dumps(records[-1]) + "\n")
      f.flush()
  print(table(records))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
