"""The DP-RSA reproduction (fedjax_dp.reproduce.zhu2022): the non-iid split, the verdicts on the
paper's Fig. 1 claims and render (results.md and the figures from saved results)."""

import json

import numpy as np
import pytest

from fedjax_dp.errors import ConfigError
from fedjax_dp.reproduce import zhu2022

CURVE_ROUNDS = (10, 20)


def test_half_spread_groups_puts_each_digits_other_half_on_its_group():
  labels = np.repeat(np.arange(10), 60)
  parts = zhu2022.half_spread_groups(labels, 30, 3, np.random.default_rng(0))
  assert sorted(np.concatenate(parts).tolist()) == list(range(600))
  for c in range(10):
    counts = [int(np.sum(labels[p] == c)) for p in parts]
    group = {3 * c, 3 * c + 1, 3 * c + 2}
    assert all(n == 1 for k, n in enumerate(counts) if k not in group)  # 30 of 60 spread
    assert all(n == 1 + 10 for k, n in enumerate(counts) if k in group)
  assert [int(np.sum(labels[parts[k]] == 9)) for k in (27, 28, 29)] == [11, 11, 11]  # Byzantine


def test_non_iid_groups_hold_a_tenth_of_the_workers_whatever_the_byzantine_count():
  # 20 workers, 1 Byzantine: groups of 2 (the paper's K / 10), not of b = 1.
  scale = dict(zhu2022.SCALES["tiny"], dataset="digits", num_clients=20, byzantine=1,
               max_train=None, max_test=None)
  data = zhu2022.load_data(scale, "noniid", data_dir=None)
  for c in range(10):
    counts = np.array([int(np.sum(data.y[k, :data.counts[k]] == c)) for k in range(20)])
    group = [2 * c, 2 * c + 1]
    assert counts[group].min() > 2 * np.delete(counts, group).max(), (c, counts)
  with pytest.raises(ConfigError, match="num_clients"):  # fewer workers than classes
    zhu2022.load_data(dict(scale, num_clients=8), "noniid", data_dir=None)


def _record(partition, attack, method, eps, seed, acc):
  return {"partition": partition, "attack": attack, "method": method, "epsilon": eps,
          "seed": seed, "accuracy": acc, "epsilon_composed": None if eps is None else 1e5,
          "delta": None if eps is None else 1e-5, "formal_guarantee": eps is not None or None,
          "guarantee_note": None, "seconds": 1.0,
          "history": [{"round": r, "test_accuracy": acc * r / CURVE_ROUNDS[-1], "diagnostics": {}}
                      for r in CURVE_ROUNDS]}


ACCURACIES = {"sgd": 0.10, "signsgd": 0.90, "gm": 0.80, "rsa": 0.80, ("dp-rsa-f", 0.2): 0.70,
              ("dp-rsa-g", 0.2): 0.74, ("dp-rsa-f", 1.38): 0.79, ("dp-rsa-g", 1.38): 0.78}


def _records(seeds=1, settings=(("iid", "gaussian"),)):
  out = []
  for partition, attack in settings:
    for key, acc in ACCURACIES.items():
      method, eps = key if isinstance(key, tuple) else (key, None)
      out += [_record(partition, attack, method, eps, s, acc + 0.01 * s) for s in range(seeds)]
  return out


def test_claims_are_signed_differences_of_the_rows():
  rows, _ = zhu2022._results(_records(), 1)
  cs = {c.claim: c for c in zhu2022.claims(rows)}
  assert len(cs) == 6  # one setting's claims
  sgd = next(c for t, c in cs.items() if t.startswith("SGD fails"))
  assert sgd.paper_gain == -50.0 and sgd.measured == pytest.approx(-70.0) and sgd.spread is None
  f_vs_sign = next(c for t, c in cs.items() if "DP-RSA(F) eps 1.38 - SignSGD" in t)
  assert f_vs_sign.paper_gain == 5.0 and f_vs_sign.measured == pytest.approx(-11.0)
  g_vs_f = next(c for t, c in cs.items() if "DP-RSA(G) - DP-RSA(F)" in t)
  assert g_vs_f.measured == pytest.approx(4.0)
  # Without GM's row its claims are not measured; the others still are.
  rows = [r for r in rows if r["method"] != "gm"]
  measured = {c.claim: c.measured for c in zhu2022.claims(rows)}
  assert [t for t, m in measured.items() if m is None] == [t for t in cs if " - GM " in t]


def test_vote_margin_is_the_attackers_votes_over_the_regular_workers_expected_net_vote():
  from fedjax_dp.privacy.randomized_response import keep_prob_for_epsilon
  for eps in (0.2, 0.25, 0.4, 1.38):
    gamma = keep_prob_for_epsilon(eps)  # Sign-Flipping's keep probability (Theorem 1)
    assert zhu2022.vote_margin(30, 3, eps) == pytest.approx(3 - 27 * (2 * gamma - 1))
  # The paper's setting: the 3 attackers outvote 27 agreeing regular workers at eps 0.2 only.
  assert zhu2022.vote_margin(30, 3, 0.2) == pytest.approx(0.309, abs=1e-3)
  assert zhu2022.vote_margin(30, 3, 0.25) < 0 and zhu2022.vote_margin(30, 2, 0.2) < 0
  assert zhu2022.vote_margin(30, 0, 0.2) < 0


def test_each_scale_shows_its_own_reasons_and_says_where_they_come_from():
  rows, _ = zhu2022._results(_records(settings=zhu2022.SETTINGS), 1)
  for scale, source in (("small", "small"), ("paper", "paper"), ("tiny", "small"),
                        ("paper-b1", "paper-b1")):
    assert zhu2022.reasons_scale(scale) == source
    reasons = {c.reason for c in zhu2022.claims(rows, scale)}
    assert reasons <= set(zhu2022.REASONS[source].values())
    assert zhu2022.REASON_SOURCES[source] in zhu2022._markdown(rows, scale)
  # Every claim has a reason at every scale that has its own.
  kinds = {(spec[4], attack) for partition, attack in zhu2022.SETTINGS
           for spec in zhu2022.claim_specs(partition, attack)}
  assert all(kinds <= set(reasons) for reasons in zhu2022.REASONS.values())
  paper = {c.claim: c.reason for c in zhu2022.claims(rows, "paper")}
  assert "vote margin +0.31" in next(r for t, r in paper.items()
                                     if t.startswith("sign-flip attack") and "SignSGD" in t)


def test_claims_spread_over_seeds_and_non_iid_sizes():
  recs = _records(seeds=2, settings=(("noniid", "sample-duplication"),))
  recs[2]["accuracy"] = 0.95  # signsgd seed 0: the per-seed differences now differ
  rows, _ = zhu2022._results(recs, 2)
  c = next(c for c in zhu2022.claims(rows) if "DP-RSA(F) eps 1.38 - SignSGD" in c.claim)
  assert c.paper_gain == 50.0  # "nearly fails" non-iid
  assert c.measured == pytest.approx(100 * (0.795 - 0.93))
  assert c.spread == pytest.approx(np.std([100 * (0.79 - 0.95), 100 * (0.80 - 0.91)], ddof=1))


def _saved_run(out, records):
  zhu2022._write(out, "tiny", zhu2022.SCALES["tiny"], records, 1)
  (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_render_writes_table_verdicts_and_figures_from_saved_results(tmp_path):
  _saved_run(tmp_path, _records(settings=zhu2022.SETTINGS))
  assert zhu2022.render(tmp_path) == 0
  md = (tmp_path / "results.md").read_text()
  assert "| iid | gaussian | signsgd |  | 90.00 |" in md  # one seed: no spread
  assert ("| SGD fails, Gaussian attack (Fig. 1a): SGD - RSA (nominal -50: no defense) | -50.00 | "
          "-70.00 | -20.00 | reproduced | the mean takes the attackers' N(0, 1e4^2) rows |") in md
  assert "nearly fail) | +50.00 | -11.00 | -61.00 | not reproduced |" in md
  assert "* noniid, sample-duplication: dp-rsa-f eps=1.38: -1.00, dp-rsa-g eps=0.2: -6.00" in md
  for partition, attack in zhu2022.SETTINGS:
    assert (tmp_path / f"zhu2022_{partition}_{attack}.png").stat().st_size > 1000
  # A runs.jsonl that lost its last record no longer matches results.json's rows: refused,
  # and results.md stays as it was.
  lines = (tmp_path / "runs.jsonl").read_text().splitlines(keepends=True)
  (tmp_path / "runs.jsonl").write_text("".join(lines[:-1]))
  with pytest.raises(ConfigError, match=r"--output-dir.*0 record\(s\) of the row .*says 1 "
                     r"seed\(s\): runs.jsonl is truncated"):
    zhu2022.render(tmp_path)
  assert (tmp_path / "results.md").read_text() == md


@pytest.mark.slow
def test_tiny_run_then_render_rewrites_the_same_outputs(shared_data_dir, tmp_path, monkeypatch):
  """Runs the tiny scale on one setting, deletes results.md and the figure, rewrites them with
  ``fedjax-dp reproduce zhu2022 --render`` (nothing may run) and compares."""
  from fedjax_dp.cli import main
  if not (shared_data_dir / "mnist").is_dir():
    pytest.skip(f"MNIST not found under {shared_data_dir}")
  setting = (("iid", "gaussian"),)
  assert zhu2022.reproduce("tiny", str(tmp_path), data_dir=str(shared_data_dir),
                           settings=setting, progress=False) == 0
  md = (tmp_path / "results.md").read_text()
  figure = tmp_path / "zhu2022_iid_gaussian.png"
  assert figure.stat().st_size > 1000 and "| SGD fails, Gaussian attack" in md
  # each record keeps its curve, the evaluated rounds with their loss and update norms
  for line in (tmp_path / "runs.jsonl").read_text().splitlines():
    kept = json.loads(line)["history"]
    assert [h["round"] for h in kept] == [10, 20, 30]
    assert all(set(h["diagnostics"]) == {"train_loss", "update_norm"} for h in kept)
  (tmp_path / "results.md").unlink()
  figure.unlink()

  def no_running(*args, **kwargs):
    raise AssertionError("render ran something")

  monkeypatch.setattr(zhu2022, "run_jobs", no_running)
  assert main(["reproduce", "zhu2022", "--render", "--output-dir", str(tmp_path)]) == 0
  assert (tmp_path / "results.md").read_text() == md
  assert figure.stat().st_size > 1000


def test_results_record_the_seeds_that_ran_not_the_scales_default(tmp_path, monkeypatch):
  """``--seeds 2`` at a scale whose default is one seed: results.json's settings say 2."""

  def fake_run_jobs(jobs, record, *, runs_path, on_record, **kwargs):
    recs = [_record(j.labels["partition"], j.labels["attack"], j.labels["method"],
                    j.labels["epsilon"], j.labels["seed"], 0.5) for j in jobs]
    runs_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs

  monkeypatch.setattr(zhu2022, "run_jobs", fake_run_jobs)
  assert zhu2022.SCALES["tiny"]["seeds"] == 1
  assert zhu2022.reproduce("tiny", str(tmp_path), seeds=2, settings=(("iid", "gaussian"),),
                           progress=False) == 0
  doc = json.loads((tmp_path / "results.json").read_text())
  assert doc["settings"]["seeds"] == 2 and {r["seeds"] for r in doc["rows"]} == {2}
