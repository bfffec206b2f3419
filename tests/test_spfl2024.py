"""Wu and Li 2024 (SP-FL) reproduction: the claims' differences with their seed spread, and
render, which rewrites results.md and the figures from a saved run."""

import json

import pytest

from fedjax_dp.errors import ConfigError
from fedjax_dp.reproduce import spfl2024


def _row(method, dataset, setting, value, acc, err):
  return {"method": method, "dataset": dataset, "setting": setting, "value": value,
          "accuracy_mean": acc, "accuracy_std": 0.0, "seeds": 2, "train_error_mean": err,
          "base_value": {"epsilon": 4.0 if value is None else value}}


def _record(method, dataset, setting, value, seed, acc, err):
  return {"method": method, "dataset": dataset, "setting": setting, "value": value,
          "seed": seed, "accuracy": acc, "train_error": err}


def test_difference_pairs_seeds_and_selects_each_claims_settings():
  # spfl minus dp-fl: base +10 and +20 points (seeds 0, 1), epsilon=1: -10 and 0.
  acc = {("spfl", None): (0.5, 0.6), ("dp-fl", None): (0.4, 0.4),
         ("spfl", 1.0): (0.1, 0.2), ("dp-fl", 1.0): (0.2, 0.2)}
  records = [_record(m, "mnist", "base" if v is None else "epsilon", v, s, a[s], 1 - a[s])
             for (m, v), a in acc.items() for s in (0, 1)]
  rows = [_row(m, "mnist", "base" if v is None else "epsilon", v, sum(a) / 2, 1 - sum(a) / 2)
          for (m, v), a in acc.items()]
  # a Fashion-MNIST base row without the baseline is not matched
  rows.append(_row("spfl", "fashion_mnist", "base", None, 0.9, 0.1))
  mean, spread, n = spfl2024.difference(rows, records, "spfl", "dp-fl", None)
  # per seed: mean(+10, -10) = 0 and mean(+20, 0) = +10
  assert (mean, spread, n) == pytest.approx((5.0, 7.0710678, 2))
  assert spfl2024.difference(rows, records, "spfl", "dp-fl", "base") == pytest.approx(
      (15.0, 7.0710678, 1))
  # Fig. 3's points are its sweep and the base point; Fig. 4 is not swept here
  assert spfl2024.difference(rows, records, "spfl", "dp-fl", "epsilon")[2] == 2
  assert spfl2024.difference(rows, records, "spfl", "dp-fl", "clients_per_round") == (None, None, 0)
  # training error (Table 2): lower is the claimed direction
  assert spfl2024.difference(rows, records, "spfl", "dp-fl", "base", "train_error")[0] == \
      pytest.approx(-15.0)
  # one seed: no spread
  assert spfl2024.difference(rows, [r for r in records if r["seed"] == 0], "spfl", "dp-fl",
                             None)[1] is None
  verdicts = {c.claim: c for c in spfl2024.claims(rows, records)}
  assert set(verdicts) == {c[0] for c in spfl2024.CLAIMS}
  t2 = verdicts["Table 2: SP-FL's training error below DP-FL's (base runs)"]
  assert t2.sign_only and t2.paper_gain < 0 and t2.measured == pytest.approx(-15.0)
  assert verdicts["SP-FL over ADP-FL, mean of all settings (abstract)"].measured is None
  # rows without the runs' traces (a results.json written before them) give no measured reason
  assert verdicts["Fig. 3: SP-FL above DP-FL over epsilon (mean of its points)"].reason \
      .startswith("not measured")


def test_a_rows_epsilon_is_the_worst_seeds_per_class():
  """Seeds draw different cohorts, so their clients' epsilons differ: a row reports each class's
  largest max and largest median over its seeds, whichever seed comes last."""
  seeds = [{"high": {"max": 1.98, "median": 1.19}, "low": {"max": 1.5, "median": 1.3}},
           {"high": {"max": 1.78, "median": 1.25}, "low": {"max": 1.7, "median": 1.1}}]
  worst = {"high": {"max": 1.98, "median": 1.25}, "low": {"max": 1.7, "median": 1.3}}
  assert spfl2024.worst_epsilon(seeds) == worst == spfl2024.worst_epsilon(seeds[::-1])
  assert spfl2024.worst_epsilon([None, None]) is None  # published spfl, nodp-fl
  assert spfl2024.worst_epsilon([{"all": None}, {"all": None}]) == {"all": None}
  records = [{"dataset": "mnist", "setting": "base", "value": None, "method": "spfl-sound",
              "seed": i, "accuracy": 0.5, "formal_guarantee": True, "epsilon": e,
              "no_guarantee_reasons": None, "noise_multiplier": 1.0, "train_error": 0.5,
              "train_loss": 1.0, "seconds": 1.0} for i, e in enumerate(seeds)]
  settings = {("mnist", "base", None): {"epsilon": 4.0, "clients_per_round": 10, "local_steps": 4}}
  (row,) = spfl2024._rows(records, settings, 2)
  assert row["epsilon"] == worst


def _history(noise, norm, loss):
  return [{"round": i + 1, "diagnostics": {"noise_std": n, "update_norm": {"q50": u},
                                           "train_loss": l}}
          for i, (n, u, l) in enumerate(zip(noise, norm, loss))]


def test_reasons_quote_each_runs_noise_norms_and_runaway():
  # spfl runs away in round 3 (loss above 10 x round 1's): its medians are over rounds 1-2 only
  spfl = spfl2024._trace(_history([4.0, 6.0, 0.0], [10.0, 14.0, 0.0], [2.0, 3.0, 25.0]))
  assert spfl == {"noise_std_median": 5.0, "update_norm_median": 12.0, "train_loss_last": 25.0,
                  "runaway_round": 3}
  assert spfl2024._trace(_history([1.0], [2.0], [float("nan")]))["runaway_round"] == 1
  dpfl = spfl2024._trace(_history([2.0, 2.0, 2.0], [7.0, 7.0, 7.0], [2.0, 1.5, 1.25]))
  assert dpfl["runaway_round"] is None and dpfl["train_loss_last"] == 1.25
  rows = [dict(_row(m, "mnist", s, v, 0.5, 0.5), trace=[t])
          for s, v in (("base", None), ("epsilon", 1.0))
          for m, t in (("spfl", spfl), ("dp-fl", dpfl))]
  text = spfl2024.reason(rows, "spfl", "dp-fl", "epsilon")
  # one part per point of the figure, in order of the setting's value
  assert text.split(". ")[0].startswith("epsilon 1: noise std spfl 5 vs dp-fl 2 (2.5x), "
                                        "update norm 12 vs 7, last train loss - vs 1.25; spfl "
                                        "ran away in 1 of 1 runs (round 3)")
  assert text.split(". ")[1].startswith("epsilon 4: ")
  whole = spfl2024.reason(rows, "spfl", "dp-fl", None)
  assert "spfl ran away in 2 of 2 runs (round 3)" in whole and ". " not in whole
  assert spfl2024.reason(rows, "spfl", "adp-fl", None) == ""  # no adp-fl rows


@pytest.mark.slow
def test_render_rewrites_the_runs_results_md_and_figures(shared_data_dir, tmp_path, capsys):
  if not (shared_data_dir / "mnist").is_dir():
    pytest.skip(f"MNIST not found under {shared_data_dir}")
  out = tmp_path / "r"
  assert spfl2024.run("tiny", str(out), data_dir=str(shared_data_dir)) == 0
  md = (out / "results.md").read_text()
  result = json.loads((out / "results.json").read_text())
  assert {r["setting"] for r in result["rows"]} == {"base", "epsilon"}
  assert "| claim | paper (points) | ours (points) |" in md
  assert "SP-FL over DP-FL, mean of all settings (abstract) | +4.41 |" in md
  # The train error is a raw statistic of the clients' data: labelled so wherever it appears.
  assert "train error (raw)" in md
  assert "train_error_mean, train_loss_mean (Table 2's train error)" in result["release"]["diagnostics"]
  # each row keeps its runs' traces, which the reasons quote (labelled raw)
  assert all(len(r["trace"]) == 1 and r["trace"][0]["noise_std_median"] is not None
             for r in result["rows"] if r["method"] != "nodp-fl")
  assert any(k.startswith("trace") for k in result["release"]["diagnostics"])
  # runs.jsonl keeps every round, with the diagnostics the traces read and no others
  for line in (out / "runs.jsonl").read_text().splitlines():
    kept = json.loads(line)["history"]
    assert len(kept) == spfl2024.SCALES["tiny"]["rounds"] and all(
        set(h["diagnostics"]) <= {"train_loss", "noise_std", "update_norm"} for h in kept)
  assert "| not reproduced | noise std spfl " in md or "| reproduced | noise std spfl " in md \
      or "| partly | noise std spfl " in md
  run_dir = next(d for d in (out / "runs").rglob("summary.json"))
  assert "train_error" in json.loads(run_dir.read_text())["diagnostics"]
  fig3 = (out / "spfl2024_fig3.png").read_bytes()
  assert not (out / "spfl2024_fig4.png").exists()  # tiny sweeps epsilon only
  for name in ("results.md", "spfl2024_fig3.png"):
    (out / name).unlink()
  capsys.readouterr()
  assert spfl2024.render(str(out)) == 0
  assert (out / "results.md").read_text() == md
  assert (out / "spfl2024_fig3.png").read_bytes() == fig3
  assert md in capsys.readouterr().out
  # a truncated runs.jsonl is refused (it would give verdicts that disagree with the rows)
  records = (out / "runs.jsonl").read_text().splitlines(keepends=True)
  (out / "runs.jsonl").write_text("".join(records[1:]))
  with pytest.raises(ConfigError, match="runs.jsonl is truncated"):
    spfl2024.render(str(out))
  assert (out / "results.md").read_text() == md
  # without runs.jsonl the rows' means give the same differences (one seed here), no spread
  (out / "runs.jsonl").unlink()
  assert spfl2024.render(str(out)) == 0
  assert (out / "results.md").read_text() == md


def test_results_record_the_seeds_that_ran_not_the_scales_default(tmp_path, monkeypatch):
  """``--seeds 2`` at a scale whose default is one seed: results.json's settings say 2."""

  def fake_run_jobs(jobs, record, *, runs_path, **kwargs):
    recs = [{**j.labels, "accuracy": 0.5, "formal_guarantee": False, "epsilon": None,
             "no_guarantee_reasons": None, "noise_multiplier": 1.0, "train_error": 0.5,
             "train_loss": 1.0, "seconds": 1.0} for j in jobs]
    runs_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs

  monkeypatch.setattr(spfl2024, "run_jobs", fake_run_jobs)
  assert spfl2024.SCALES["tiny"]["seeds"] == 1
  assert spfl2024.run("tiny", str(tmp_path), seeds=2) == 0
  doc = json.loads((tmp_path / "results.json").read_text())
  assert doc["settings"]["seeds"] == 2 and {r["seeds"] for r in doc["rows"]} == {2}
