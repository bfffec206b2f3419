"""Sweeps: one compiled program per group of experiments, each equal to its single run."""

import csv
import json
import os

import dp_accounting
from dp_accounting import rdp
import jax
import numpy as np
import pytest

from fedjax_dp.config import make_config
from fedjax_dp.engine import RunOptions
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import simulate
from fedjax_dp.sweep import Programs, SweepResult, parse_grid, plan, seeds_composed, sweep


def _base(**kw):
  base = dict(num_clients=60, sampling_prob=0.2, rounds=3, local_steps=2, batch_size=4, model="mlp",
              clip=0.5, target_epsilon=None, noise_multiplier=1.0, eval_every=1, max_test=200)
  base.update(kw)
  return make_config(**base)


def _close(a, b):
  np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=2e-4, atol=2e-5)


def _compare_to_single_runs(result, data_of):
  for e in result.experiments:
    cfg = next(p.config for p in result.points if p.seed == e["seed"] and p.values == e["values"])
    alone = simulate(cfg, data_of(cfg))
    got = e["result"]
    assert [h["round"] for h in got.history] == [h["round"] for h in alone.history]
    _close(got.metrics["test_accuracy"], alone.metrics["test_accuracy"])
    _close(got.metrics["test_loss"], alone.metrics["test_loss"])
    _close(got.metrics["update_norm.q50"], alone.metrics["update_norm.q50"])
    assert got.summary["epsilon"] == pytest.approx(alone.summary["epsilon"], rel=1e-9)
    for a, b in zip(jax.tree_util.tree_leaves(got.state.params),
                    jax.tree_util.tree_leaves(alone.state.params)):
      np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_each_experiment_equals_its_single_run_and_the_grid_is_one_program(tmp_path):
  from fedjax_dp.experiment import load_data
  loaded = {}

  def load(cfg):
    loaded.setdefault(cfg.seed, load_data(cfg))
    return loaded[cfg.seed]

  # clip and noise are numbers (one group); two seeds partition the data differently (stacked).
  result = sweep(_base(), {"clip": ["0.2", "1.0"], "noise_multiplier": [0.5]}, seeds=2,
                 run_options=RunOptions(output_dir=str(tmp_path)), load=load,
                   programs=Programs(threads=1),
                 vary_split=True)
  assert len(result.experiments) == 4 and len(result.groups) == 1
  assert [(e["values"]["clip"], e["seed"]) for e in result.experiments] == [
      (0.2, 0), (0.2, 1), (1.0, 0), (1.0, 1)]
  _compare_to_single_runs(result, load)
  # The rows: one per grid point, seed statistics of the final accuracies.
  assert [r["clip"] for r in result.rows] == [0.2, 1.0]
  assert result.rows[1]["grid"] == {"clip": 1.0, "noise_multiplier": 0.5}
  for row, block in zip(result.rows, (result.experiments[:2], result.experiments[2:])):
    accs = [e["result"].summary["final_accuracy"] for e in block]
    assert row["accuracy_mean"] == pytest.approx(np.mean(accs))
    assert row["accuracy_std"] == pytest.approx(np.std(accs, ddof=1))
    assert row["seeds"] == 2 and row["epsilon"] == pytest.approx(
        max(e["result"].summary["epsilon"] for e in block))
    # The two seeds split the data into different clients: no client is common to both runs, and
    # an example, in one client of each, is covered by group privacy for 2 composed over them.
    eps, delta = row["epsilon"], block[0]["result"].summary["delta"]
    assert row["seeds_composition"] == "basic, group of 2"
    assert row["seeds_privacy_unit"].startswith("one example")
    assert row["epsilon_seeds_composed"] == pytest.approx(2 * 2 * eps)
    assert row["delta_seeds_composed"] == pytest.approx(2 * (1 + np.exp(eps)) * delta)
  written = json.loads((tmp_path / "results.json").read_text())
  assert set(written) == {"rows", "experiments", "groups", "seconds", "threads", "release"}
  assert any("groups" in d for d in written["release"]["diagnostics"])
  assert [r["clip"] for r in written["rows"]] == [0.2, 1.0]
  assert written["experiments"][3]["metrics"][-1]["round"] == 3
  assert (tmp_path / written["experiments"][3]["output_dir"] / "metrics.jsonl").exists()
  summary = json.loads((tmp_path / "experiments/001/summary.json").read_text())
  assert summary["config"]["run"]["seed"] == 1 and summary["config"]["algorithm"]["clip"] == 0.2


def test_seeds_on_the_same_clients_are_composed_by_their_accountant():
  # data_seed keeps the split into clients: the mean over both runs is covered, per client, by
  # all 2 x 3 rounds through the runs' RDP accountant, at the runs' delta.
  result = sweep(_base(data_seed=5), {"clip": ["0.5"], "noise_multiplier": [0.5]}, seeds=2,
                 programs=Programs(threads=1))
  row = result.rows[0]
  assert len(result.groups) == 1
  delta = result.experiments[0]["result"].summary["delta"]
  direct = rdp.RdpAccountant()
  direct.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(0.5)), 6)
  assert row["seeds_composition"] == "rdp" and row["delta_seeds_composed"] == delta
  assert row["seeds_privacy_unit"] == "the runs' own"
  assert row["epsilon_seeds_composed"] == pytest.approx(direct.get_epsilon(delta), rel=1e-6)
  assert row["epsilon"] < row["epsilon_seeds_composed"] < 2 * row["epsilon"]
  params = [e["result"].state.params for e in result.experiments]
  assert not all(np.array_equal(a, b) for a, b in zip(*map(jax.tree_util.tree_leaves, params)))
  # The same seeds on the shards partition (a split by labels), each on its own split: no bound.
  shards = sweep(_base(partition="shards", rounds=1), {"clip": ["0.5"]}, seeds=2,
                 programs=Programs(threads=8),
                 vary_split=True)
  assert shards.rows[0]["epsilon"] > 0 and shards.rows[0]["epsilon_seeds_composed"] is None
  assert shards.threads == 2  # two experiments: two programs at once, not eight
  assert shards.rows[0]["seeds_composition"].startswith("none: ")


def test_a_sweeps_seeds_share_one_split_unless_asked_otherwise():
  # By default a grid point's seeds train on the same clients (the base seed's split, recorded as
  # each experiment's data_seed), so a row's composed epsilon is for the runs' own unit.
  base = _base(seed=3, rounds=1)
  points = plan(base, {"clip": [0.5]}, seeds=3)
  assert [(p.seed, p.config.data_seed, p.config.split_seed) for p in points] == [
      (3, 3, 3), (4, 3, 3), (5, 3, 3)]
  assert [p.config.data_seed for p in plan(base.replace(data_seed=9), {"clip": [0.5]}, 2)] == [9, 9]
  varied = plan(base, {"clip": [0.5]}, seeds=3, vary_split=True)
  assert [(p.config.data_seed, p.config.split_seed) for p in varied] == [
      (None, 3), (None, 4), (None, 5)]
  with pytest.raises(ConfigError, match=r"vary_split=True: gives each seed its own split.*"
                     "data_seed=9 fixes one"):
    plan(base.replace(data_seed=9), {"clip": [0.5]}, seeds=2, vary_split=True)
  # A split by labels, shared: its seeds compose by the runs' accountant, for their own unit.
  from fedjax_dp.experiment import load_data
  loads = []
  shards = sweep(_base(partition="shards", rounds=1), {"clip": ["0.5"]}, seeds=2,
                 programs=Programs(threads=1),
                 load=lambda cfg: loads.append(cfg.split_seed) or load_data(cfg))
  row = shards.rows[0]
  assert loads == [0]  # one data set for both seeds
  assert row["seeds_privacy_unit"] == "the runs' own" and row["seeds_composition"] == "rdp"
  assert row["epsilon"] < row["epsilon_seeds_composed"] < 2 * row["epsilon"]
  summaries = [e["result"].summary for e in shards.experiments]
  assert [s["config"]["run"]["seed"] for s in summaries] == [0, 1]
  assert [s["config"]["run"]["data_seed"] for s in summaries] == [0, 0]


def test_target_epsilon_axis_calibrates_each_experiment():
  result = sweep(_base(rounds=2), {"target_epsilon": ["2", "8"]}, seeds=1,
                 programs=Programs(threads=1))
  eps = [r["epsilon"] for r in result.rows]
  assert eps[0] == pytest.approx(2.0, rel=0.02) and eps[1] == pytest.approx(8.0, rel=0.02)
  noise = [e["result"].summary["noise_multiplier"] for e in result.experiments]
  assert noise[0] > noise[1]
  assert len(result.groups) == 1


def test_settings_that_change_shapes_start_new_groups_with_the_same_results():
  from fedjax_dp.experiment import load_data
  data = load_data(_base())
  result = sweep(_base(algorithm="blur+lus"), {"local_steps": ["1", "3"], "lambda": [0.1]}, seeds=1,
                 load=lambda cfg: data)
  assert len(result.groups) == 2 and result.rows[0]["local_steps"] == 1
  _compare_to_single_runs(result, lambda cfg: data)


def test_options_as_grid_axes_and_bad_axes_are_refused_before_running():
  base = _base(algorithm="blur+lus")
  points = plan(base, parse_grid("lambda=0.1,0.4 sparsity=0.5"), seeds=2)
  assert [(p.values["lambda"], p.seed) for p in points] == [(0.1, 0), (0.1, 1), (0.4, 0), (0.4, 1)]
  assert points[2].config.options["lambda"] == 0.4 and points[2].config.options["sparsity"] == 0.5
  with pytest.raises(ConfigError, match="grid"):
    parse_grid("clip")
  with pytest.raises(ConfigError, match="seeds"):
    plan(base, {"clip": [0.1]}, seeds=0)
  with pytest.raises(ConfigError, match="seed"):
    plan(base, {"seed": [1, 2]})
  with pytest.raises(ConfigError, match="clip"):
    plan(base, {"clip": ["abc"]})
  with pytest.raises(ConfigError, match="repeats a value"):  # equal once converted
    plan(base, {"clip": ["0.3", "0.30"]})
  with pytest.raises(ConfigError, match="more than one sweep runs"):
    plan(base, {"clip": [0.1, 0.2]}, seeds=10 ** 8)
  with pytest.raises(ConfigError, match="past the largest seed"):
    plan(base.replace(seed=2 ** 32 - 1), {"clip": [0.1]}, seeds=2)
  with pytest.raises(ConfigError, match="lambda"):  # an option out of range, refused by the build
    sweep(base, {"lambda": ["-1"]}, load=lambda cfg: pytest.fail("loaded data"))
  # A grid point with neither noise nor a target is refused by the build, which says where.
  with pytest.raises(ConfigError, match=r"noise_multiplier.*\(at the grid point "
                     r"target_epsilon=None, seed 0\)"):
    sweep(_base(), {"target_epsilon": ["none", "2"]})
  with pytest.raises(ConfigError, match="clip"):  # DP-RSA reads no clip
    sweep(_base(algorithm="dp-rsa-f"), {"clip": ["0.1"]})
  with pytest.raises(ConfigError, match=r"'clpi'.*neither a run setting.*nor an option of "
                     r"algorithm 'blur\+lus' \(one of \[.*'lambda'"):  # a misspelt axis
    sweep(base, {"clpi": ["0.1"]}, load=lambda cfg: pytest.fail("loaded data"))
  # An option axis beside an algorithm axis: read against every algorithm of the grid.
  with pytest.raises(ConfigError, match=r"grid='lambda': is not an option of 'dp_fedavg', "
                     r"'fedavg': its values would run the same experiment"):
    plan(base, {"algorithm": ["dp_fedavg", "fedavg", "blur+lus"], "lambda": [0.1, 0.4]})
  with pytest.raises(ConfigError, match=r"nor an option of the grid's algorithms 'fedavg', "
                     r"'dp-fl' \(one of \["):
    plan(base, {"algorithm": ["fedavg", "dp-fl"], "lambda": [0.1, 0.4]})
  assert len(plan(base, {"algorithm": ["dp_fedavg+blur", "blur+lus"], "lambda": [0.1, 0.4]})) == 4


def test_sweep_command_writes_rows_and_protects_earlier_results(tmp_path, capsys):
  from fedjax_dp.cli import main
  out = tmp_path / "s"
  # --grid is repeatable: the axes of every --grid together.
  args = ["sweep", "--grid", "clip=0.3,0.6", "--seeds", "2", "--rounds", "2", "--num-clients", "60",
          "--max-test", "200", "--local-steps", "1", "--grid", "noise_multiplier=1.0",
          "--output-dir", str(out), "--no-progress", "--threads", "1"]
  assert main(args) == 0
  printed = capsys.readouterr().out
  assert "clip=0.3 noise_multiplier=1.0: accuracy=" in printed
  # The seeds share one split: the row's privacy over both is for the runs' own unit.
  assert "(all seeds: " in printed and ", rdp)" in printed and "per example" not in printed
  assert "4 experiments in 1 compiled programs (1 thread)" in printed
  assert f"wrote {out / 'results.json'} and {out / 'results.csv'}" in printed
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert [(r["clip"], r["seeds"]) for r in rows] == [(0.3, 2), (0.6, 2)]
  assert all(0 <= r["accuracy_mean"] <= 1 and r["epsilon"] > 0 for r in rows)
  with open(out / "results.csv", newline="") as f:  # the same rows, as a table
    table = list(csv.DictReader(f))
  assert [(float(t["clip"]), float(t["noise_multiplier"]), int(t["seeds"])) for t in table] == [
      (0.3, 1.0, 2), (0.6, 1.0, 2)]
  assert [float(t["accuracy_mean"]) for t in table] == [r["accuracy_mean"] for r in rows]
  assert [float(t["epsilon"]) for t in table] == [r["epsilon"] for r in rows]
  assert [t["accuracy_metric"] for t in table] == ["accuracy", "accuracy"]
  before = (out / "results.json").read_text()
  assert main(args) == 2  # an earlier sweep is kept
  assert "--overwrite" in capsys.readouterr().err and (out / "results.json").read_text() == before
  # An --overwrite sweep stopped part-way (here after its first program) leaves the earlier
  # sweep's files as they were, and none of its own.
  from fedjax_dp import sweep as sweep_lib

  def stop(line):
    raise KeyboardInterrupt

  files = sorted(p.relative_to(out) for p in out.rglob("*"))
  with pytest.raises(KeyboardInterrupt):
    sweep_lib.sweep(_base(), {"local_steps": ["1", "2"]}, seeds=1,
                    run_options=RunOptions(output_dir=str(out), overwrite=True), log=stop)
  assert sorted(p.relative_to(out) for p in out.rglob("*")) == files
  assert (out / "results.json").read_text() == before
  assert main(args[:2] + ["clip=0.3"] + args[3:] + ["--overwrite"]) == 0
  assert not (out / "experiments" / "002").exists()  # the old sweep's extra experiments went
  capsys.readouterr()
  assert main(["sweep", "--grid", "clip=0.3", "--algorithm", "dp-rsa-f", "--output-dir",
               str(tmp_path / "r")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "clip" in err and not (tmp_path / "r").exists()
  # An axis that cannot be one is refused as such, before the base configuration is read.
  assert main(["sweep", "--grid", "options=1", "--output-dir", str(tmp_path / "o")]) == 2
  assert "options': cannot be a grid axis" in capsys.readouterr().err
  assert main(["sweep", "--grid", "clip=0.1", "--grid", "clip=0.2", "--output-dir",
               str(tmp_path / "o")]) == 2  # not the last one silently
  assert "invalid grid='clip': names an axis twice" in capsys.readouterr().err


def test_vary_split_gives_each_seed_its_own_split(tmp_path, capsys):
  from fedjax_dp.cli import main
  args = ["sweep", "--grid", "clip=0.3", "--seeds", "2", "--rounds", "1", "--num-clients", "40",
          "--max-test", "100", "--local-steps", "1", "--noise-multiplier", "1.0", "--no-progress",
          "--threads", "1", "--vary-split"]
  assert main([*args, "--output-dir", str(tmp_path / "v")]) == 0
  assert "basic, group of 2, per example)" in capsys.readouterr().out
  summaries = [json.loads((tmp_path / f"v/experiments/00{i}/summary.json").read_text())
               for i in (0, 1)]
  assert [s["config"]["run"].get("data_seed") for s in summaries] == [None, None]
  assert main([*args, "--data-seed", "3", "--output-dir", str(tmp_path / "d")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "invalid vary_split=True" in err[0] and "data_seed=3" in err[0], err
  assert not (tmp_path / "d").exists()


def test_a_sweep_has_one_progress_display_for_all_its_programs(monkeypatch, capsys):
  """Programs running at once in threads report to one display: no program draws its own."""
  from fedjax_dp import engine, observers, sweep as sweep_module
  made = []

  class Counted(observers.SweepProgress):
    def __init__(self, *a, **kw):
      super().__init__(*a, **kw)
      made.append(self)

  def refused(*a, **kw):
    raise AssertionError("a program drew a display of its own")
  monkeypatch.setattr(sweep_module, "SweepProgress", Counted)
  monkeypatch.setattr(engine, "ProgressBar", refused)
  monkeypatch.setattr(engine, "ProgressLines", refused)
  lines = []
  result = sweep(_base(rounds=2), {"clip": ["0.3", "0.6"]}, seeds=2, programs=Programs(threads=2),
                 run_options=RunOptions(progress_every=1e-9), log=lines.append)
  assert len(result.groups) == 2 and len(made) == 1
  err = capsys.readouterr().err.splitlines()
  # Both programs' rounds in one count, a line at each (the period is tiny).
  assert len(err) == 4 and all(line.startswith("sweep: ") for line in err), err
  assert err[-1].startswith("sweep: 8/8 experiment rounds, ")
  assert sorted(line.split("]")[0] for line in lines) == ["[group 1/2", "[group 2/2"]
  assert made[0].ended == 2
  sweep(_base(rounds=1), {"clip": ["0.3", "0.6"]},
        programs=Programs(threads=2), run_options=RunOptions(progress=True))
  assert len(made) == 2 and made[1].done == 2 and made[1].bar is None  # closed


@pytest.mark.parametrize("command", ["run", "sweep", "reproduce"])
def test_files_a_killed_overwrite_set_aside_are_named_not_buried(command, tmp_path, capsys):
  from fedjax_dp.cli import main
  out = tmp_path / "s"
  aside = out / ".earlier-x1"  # what a sweep killed outright (SIGKILL) while replacing leaves
  aside.mkdir(parents=True)
  (aside / "results.json").write_text('{"rows": []}')
  args = {"run": ["run"], "sweep": ["sweep", "--grid", "clip=0.3"],
          "reproduce": ["reproduce", "cheng2022"]}[command]
  for overwrite in ([], ["--overwrite"]):
    assert main([*args, "--output-dir", str(out), *overwrite]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".earlier-x1/" in err and "move its files back" in err
  assert sorted(p.relative_to(out) for p in out.rglob("*")) == [
      aside.relative_to(out), (aside / "results.json").relative_to(out)]


def test_seeds_without_one_ledger_each_compose_by_basic_composition():
  """A run whose epsilon is not one ledger's (SP-FL's largest over clients): (k eps, k delta)."""
  assert seeds_composed(1.5, 1e-5, 3) == {"epsilon_seeds_composed": 4.5,
                                          "delta_seeds_composed": pytest.approx(3e-5),
                                          "seeds_composition": "basic",
                                          "seeds_privacy_unit": "the runs' own"}
  assert seeds_composed(1.5, 1e-5, 2, [None, None])["seeds_composition"] == "basic"
  assert seeds_composed(None, 1e-5, 3)["epsilon_seeds_composed"] is None
  # Different clients per seed: an example replaces one client's data in each run, the runs' own
  # neighbour under replace-one, two add/remove steps (group privacy) under add/remove.
  other = seeds_composed(1.5, 1e-5, 3, same_data=False, relation="replace_one")
  assert other["seeds_composition"] == "basic" and other["epsilon_seeds_composed"] == 4.5
  assert other["seeds_privacy_unit"].startswith("one example")
  # example-level runs (SP-FL): the example replaced is one example of one client in each run
  from fedjax_dp.privacy.example_level import REPORTED_RELATION
  example = seeds_composed(1.5, 1e-5, 3, same_data=False, relation=REPORTED_RELATION)
  assert example["seeds_composition"] == "basic" and example["epsilon_seeds_composed"] == 4.5
  # a split that reads the labels (shards, dirichlet, a class-balanced subset): no bound follows
  for relation in ("add_remove", "replace_one"):
    none = seeds_composed(1.5, 1e-5, 3, same_data=False, relation=relation,
                          split_reads_labels=True)
    assert none["epsilon_seeds_composed"] is None and none["delta_seeds_composed"] is None
    assert none["seeds_composition"].startswith("none: ") and "data_seed" in none["seeds_composition"]
  # on one split the labels do not matter
  assert seeds_composed(1.5, 1e-5, 3, split_reads_labels=True)["epsilon_seeds_composed"] == 4.5
  group = seeds_composed(1.5, 1e-5, 3, same_data=False, relation="add_remove")
  assert group["seeds_composition"] == "basic, group of 2"
  assert group["epsilon_seeds_composed"] == 9.0
  assert group["delta_seeds_composed"] == pytest.approx(3 * (1 + np.exp(1.5)) * 1e-5)


def test_experiments_in_blocks_of_clients_equal_their_single_runs():
  # Two seeds draw different cohorts: a block padded in one experiment holds real clients in the
  # other, so it runs for both and the padded experiment's slots must stay inert.
  from fedjax_dp.experiment import load_data
  loaded = {}

  def load(cfg):
    loaded.setdefault(cfg.seed, load_data(cfg))
    return loaded[cfg.seed]

  result = sweep(_base(client_chunk=3, rounds=2), {"clip": ["0.5"]}, seeds=2, load=load,
                 programs=Programs(threads=1))
  masks = [np.asarray(e["result"].metrics["cohort_size"]) for e in result.experiments]
  assert len(result.groups) == 1 and not np.array_equal(*masks), masks
  _compare_to_single_runs(result, load)


def test_experiments_run_in_sequence_on_one_cpu_and_side_by_side_elsewhere(monkeypatch):
  """On one CPU device a group's experiments run one after another inside its program
  (lax.map), elsewhere vmapped; either way each experiment equals its single run, and the
  seeds' distinct data sets are held once each (DataSets), not once per experiment."""
  from fedjax_dp import engine, round as round_lib
  from fedjax_dp.experiment import load_data
  held = set()  # (data sets held, which one each experiment reads) of every round
  compiled = round_lib.compiled_step

  def recording(*args, **kwargs):
    real = compiled(*args, **kwargs)

    def step(state, hp, arrays, *rest):
      if isinstance(arrays, round_lib.DataSets):
        held.add((arrays.arrays[0].shape[0], tuple(np.asarray(arrays.index).tolist())))
      return real(state, hp, arrays, *rest)
    return step

  monkeypatch.setattr(round_lib, "compiled_step", recording)
  cache = {}
  load = lambda cfg: cache.setdefault(cfg.seed, load_data(cfg))
  assert not engine.experiments_vmapped()
  grid = {"clip": ["0.3", "0.6"]}
  in_sequence = sweep(_base(rounds=2), grid, seeds=2, load=load,
                      programs=Programs(threads=1), vary_split=True)
  assert [g["side_by_side"] for g in in_sequence.groups] == [False]
  monkeypatch.setattr(engine, "experiments_vmapped", lambda: True)
  side_by_side = sweep(_base(rounds=2), grid, seeds=2, load=load,
                       programs=Programs(threads=1), vary_split=True)
  assert [g["side_by_side"] for g in side_by_side.groups] == [True]
  assert held == {(2, (0, 1, 0, 1))}  # two seeds' data sets for four experiments
  _compare_to_single_runs(in_sequence, load)
  _compare_to_single_runs(side_by_side, load)


def test_programs_run_at_once_in_threads_equal_their_single_runs(tmp_path):
  """With more threads than groups, a group runs in parts, one per thread, at the same time; each
  experiment still equals its single run, and every experiment's files are written."""
  from fedjax_dp.experiment import load_data
  cache = {}
  load = lambda cfg: cache.setdefault(cfg.seed, load_data(cfg))
  result = sweep(_base(rounds=2), {"clip": ["0.3", "0.6"]}, seeds=2, load=load,
                 programs=Programs(threads=2),
                 run_options=RunOptions(output_dir=str(tmp_path)))
  assert result.threads == 2
  assert sorted(g["experiments"] for g in result.groups) == [[0, 1], [2, 3]]
  assert [e["group"] for e in result.experiments] == [0, 0, 1, 1]
  _compare_to_single_runs(result, load)
  written = json.loads((tmp_path / "results.json").read_text())
  assert written["threads"] == 2 and len(written["groups"]) == 2
  for e in written["experiments"]:
    assert len((tmp_path / e["output_dir"] / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_failing_program_stops_the_others_and_its_error_is_raised(monkeypatch):
  import threading
  from fedjax_dp import engine
  real, stopped, started = engine.run_group, [], threading.Event()

  def run_group(program, experiments, rounds, **kw):
    if experiments[0].seed == 0:
      started.wait(60)  # the other program is running (not waiting in the queue)
      raise RuntimeError("this program failed")
    started.set()
    try:
      return real(program, experiments, rounds, **kw)
    except engine.Stopped:
      stopped.append(kw["stop"].is_set())
      raise

  monkeypatch.setattr(engine, "run_group", run_group)
  with pytest.raises(RuntimeError, match="this program failed"):
    sweep(_base(rounds=500), {"clip": ["0.3"]}, seeds=2, programs=Programs(threads=2))
  assert stopped == [True]  # the other program ended before its last round


def test_threads_are_one_per_core_on_one_cpu_device_and_checked(monkeypatch):
  from fedjax_dp import sweep as sweep_module
  from fedjax_dp.sweep import MAX_AUTO_THREADS, threads_for
  import os
  cores = len(os.sched_getaffinity(0))
  assert threads_for(None, [None] * 20) == min(cores, MAX_AUTO_THREADS)
  assert threads_for(None, [None]) == 1  # one experiment: one program
  assert threads_for(3, [None]) == 3
  monkeypatch.setattr(sweep_module, "one_cpu_device", lambda devices=None: False)
  assert threads_for(None, [None] * 20) == 1  # accelerators and several devices: one
  for bad in (0, -1, 1.5, True, "2"):
    with pytest.raises(ConfigError, match=r"threads.*integer >= 1"):
      sweep(_base(), {"clip": ["0.3"]},
            programs=Programs(threads=bad), load=lambda cfg: pytest.fail("loaded data"))


def test_one_thread_runs_the_programs_in_the_callers_thread(monkeypatch):
  """So they see the caller's thread-local JAX settings (a context manager's)."""
  import threading
  from fedjax_dp import engine
  real, seen = engine.run_group, []

  def run_group(*a, **kw):
    seen.append(threading.get_ident())
    return real(*a, **kw)

  monkeypatch.setattr(engine, "run_group", run_group)
  sweep(_base(rounds=1), {"clip": ["0.3", "0.6"]}, programs=Programs(threads=1))
  assert seen == [threading.get_ident()]
  sweep(_base(rounds=1), {"clip": ["0.3", "0.6"]}, programs=Programs(threads=2))
  assert len(seen) == 3 and threading.get_ident() not in seen[1:]


def test_programs_at_once_share_one_device_copy_of_their_data():
  import concurrent.futures
  import gc
  import weakref
  from fedjax_dp.engine import placed_arrays
  host = (np.arange(6.0).reshape(2, 3), np.array([1, 2], np.int32))
  with concurrent.futures.ThreadPoolExecutor(4) as pool:  # programs starting at once
    placed = list(pool.map(lambda _: placed_arrays(host), range(4)))
  assert all(p[0] is placed[0][0] and p[1] is placed[0][1] for p in placed)
  np.testing.assert_array_equal(placed[0][0], host[0])
  assert placed_arrays((host[0].copy(), host[1]))[0] is not placed[0][0]  # other host arrays
  ref = weakref.ref(placed[0][0])
  del placed
  gc.collect()
  assert ref() is None  # the last program holding the copy let it go: nothing else keeps it
  again = placed_arrays(host)
  np.testing.assert_array_equal(again[0], host[0])


@pytest.mark.parametrize("command", ["run", "sweep", "reproduce"])
def test_a_path_through_a_missing_folder_does_not_reach_an_earlier_result(command, tmp_path,
                                                                         capsys, monkeypatch):
  from fedjax_dp.cli import main
  monkeypatch.chdir(tmp_path)
  prior = tmp_path / "prior"
  prior.mkdir()
  marker = {"run": "summary.json", "sweep": "results.json", "reproduce": "results.json"}[command]
  (prior / marker).write_text('{"kept": true}')
  args = {"run": ["run", "--rounds", "1"], "sweep": ["sweep", "--grid", "clip=0.3"],
          "reproduce": ["reproduce", "cheng2022", "--scale", "tiny"]}[command]
  assert main([*args, "--output-dir", "missing/../prior", "--no-progress"]
              if command != "reproduce" else [*args, "--output-dir", "missing/../prior"]) == 2
  assert "already holds" in capsys.readouterr().err
  assert (prior / marker).read_text() == '{"kept": true}' and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", ["run", "resume", "sweep", "reproduce"])
def test_a_folder_another_process_writes_is_refused_naming_it(command, tmp_path, capsys):
  from fedjax_dp import outputs
  from fedjax_dp.cli import main
  out = tmp_path / "busy"
  args = {"run": ["run"], "resume": ["run", "--resume", str(out)],
          "sweep": ["sweep", "--grid", "clip=0.3"],
          "reproduce": ["reproduce", "cheng2022", "--scale", "tiny"]}[command]
  if command == "resume":  # a checkpointed run without its summary: one to resume
    assert main(["run", "--rounds", "1", "--num-clients", "20", "--checkpoint-every", "1",
                 "--no-progress", "--output-dir", str(out)]) == 0
    (out / "summary.json").unlink()
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  capsys.readouterr()
  with outputs.sole_writer(out):  # as another process writing it would hold it
    code = main([*args, *(["--output-dir", str(out)] if command != "resume" else [])])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert f"is being written by process {os.getpid()}" in err
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_csv_says_what_its_accuracy_columns_measure():
  # A multi-label model's rows hold its recall at 5 (accuracy_metric): results.csv says so on
  # each line, and "accuracy" on the lines of every other model.
  rows = [{"accuracy_mean": 0.4, "accuracy_std": None, "seeds": 1, "epsilon": None,
           "accuracy_metric": "recall_at_5", "grid": {"lr": 0.1}},
          {"accuracy_mean": 0.9, "accuracy_std": None, "seeds": 1, "epsilon": None,
           "grid": {"lr": 0.2}}]
  table = list(csv.DictReader(SweepResult(rows, [], [], 0.0, [], 1).to_csv().splitlines()))
  assert [(t["lr"], t["accuracy_mean"], t["accuracy_metric"]) for t in table] == [
      ("0.1", "0.4", "recall_at_5"), ("0.2", "0.9", "accuracy")]
