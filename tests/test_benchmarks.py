"""The benchmark scripts run at a tiny size (their numbers are measured outside the tests)."""

import importlib.util
import json
import os
import pathlib

import pytest
import sys

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
  spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_round_speed_measures_engine_loop_and_centralized_at_a_tiny_size():
  r = _load("round_speed").measure("mlp", clients=3, local_steps=2, batch=4, examples=8, repeats=1,
                                   conv_impl="im2col")
  for key in ("engine_s_per_round", "loop_s_per_round", "centralized_s_per_round"):
    assert r[key] > 0
  assert r["loop_over_engine"] > 0 and r["client_steps_per_s"] > 0


@pytest.mark.slow  # about 11 s of compilation: `make test-slow`
def test_sampler_compile_compares_the_final_buffers_at_a_tiny_size(capsys):
  _load("sampler_compile").main(["--sizes", "10000", "--repeats", "1"])
  (r,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert r["n"] == 10000 and r["default"]["buffers"] < r["baseline"]["buffers"]
  assert min(r[c][k] for c in ("baseline", "default") for k in ("compile_s", "ms_per_call")) > 0
  assert r["compile_ratio"] > 0 and r["time_ratio"] > 0


@pytest.mark.slow  # about 27 s of compilation: `make test-slow`
def test_conv_speed_times_every_implementation_at_a_tiny_size(capsys):
  _load("conv_speed").main(["--tiny", "--impls", "im2col,winograd", "--repeats", "1"])
  records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["padding"] for r in records] == ["SAME", "VALID"]
  assert all(r["im2col_ms"] > 0 and r["winograd_ms"] > 0 and r["im2col_over_winograd"] > 0
             for r in records)
  with pytest.raises(SystemExit):
    _load("conv_speed").main(["--impls", "fft"])


@pytest.mark.slow  # about 17 s, most of it the baseline search: `make test-slow`
def test_calibration_speed_compares_both_searches_at_a_tiny_size(capsys):
  _load("calibration_speed").main(["--tiny"])
  (r,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert r["epsilon"] <= r["target_epsilon"] < r["epsilon_at_minus_1e-4"]
  assert r["epsilon_ledger_grid_only"] <= r["target_epsilon"]
  assert abs(r["noise_multiplier"] - r["noise_multiplier_ledger_grid_only"]) < 3e-4
  assert r["library_s"] > 0 and r["ledger_grid_only_over_library"] > 0


@pytest.mark.slow  # about 40 s of compilation: `make test-slow`
def test_gpu_benchmark_runs_every_measurement_at_its_tiny_size(capsys):
  sys.path.insert(0, str(BENCH))  # gpu.py imports round_speed as its sibling
  try:
    _load("gpu").main(["--tiny"])
  finally:
    sys.path.remove(str(BENCH))
  records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  rounds = [r for r in records if r["kind"] == "round"]
  assert [(r["model"], r["compute_dtype"], r["conv_impl"]) for r in rounds] == [
      ("digits_cnn", "float32", "im2col"), ("digits_cnn", "bfloat16", "im2col"),
      ("digits_cnn", "float32", "winograd"), ("digits_cnn", "float32", "lax"),
      ("mlp", "float32", "im2col"),
      ("mlp", "bfloat16", "im2col")]
  assert all(r["client_steps_per_s"] > 0 for r in rounds)
  (swept,) = [r for r in records if r["kind"] == "sweep"]
  # one vmapped program on an accelerator; on one CPU device one per thread (a core each)
  from fedjax_dp.sweep import threads_for
  assert swept["experiments"] == 8 and swept["client_steps_per_s"] > 0
  assert swept["programs"] == threads_for(None, [None] * 8)
  padded = [r for r in records if r["kind"] == "padded"]
  assert [(r["clients"], r["live_clients"], r["chunk"]) for r in padded] == [(5, 2, None),
                                                                             (5, 2, 2)]
  assert all(r["client_steps_per_s"] > 0 for r in padded)
  (accounted,) = [r for r in records if r["kind"] == "accounting"]
  assert accounted["workers"]["accounting_workers"] >= 1
  assert accounted["workers"]["same_epsilons_as_baseline"]


@pytest.mark.slow  # five CIFAR-size reproduction runs, each compiling: `make test-slow`
def test_gpu_benchmark_times_table2_through_the_reproduction_at_its_tiny_size(capsys):
  """The table2 record runs the reproduction's own Table 2 plan at one epsilon (4 alphas x 5
  methods x 3 seeds = 60 runs at the accelerator size; at the tiny size 5) and extrapolates its
  300 rounds from the warm runs."""
  from fedjax_dp.reproduce import cheng2022
  cifar = cheng2022.SCALES["cifar"]
  assert len(cheng2022.plan(cifar["epsilons"][-1:], (), cifar["epsilons"][-1], 3, 3, "table2",
                            [("cnn2", a) for a in cifar["alphas"]])) == 60
  sys.path.insert(0, str(BENCH))
  try:
    _load("gpu").main(["--tiny", "--only-table2"])
  finally:
    sys.path.remove(str(BENCH))
  (r,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert r["kind"] == "table2" and r["runs"] == 5 and r["rounds"] == [1, 3]
  # timings, not asserted beyond being measured (a tiny round's difference is noise-sized)
  assert all(isinstance(r[k], float) for k in ("cold_s", "first_r2_s", "per_round_s",
                                                "per_evaluation_s", "extrapolated_300_rounds_s"))


@pytest.mark.slow  # three CLI processes, each compiling: about a minute, `make test-slow`
def test_sweep_speed_times_a_loop_of_run_processes_against_one_sweep_process():
  r = _load("sweep_speed").measure_cli(None, rounds=2, seeds=1, epsilons=(4.0, 8.0))
  assert r["cli_experiments"] == 2 and r["cli_loop_s"] > 0 and r["cli_sweep_s"] > 0
  assert r["cli_max_accuracy_difference"] < 1e-3  # each experiment equals its run


@pytest.mark.slow  # seven sides of two experiments, each compiling: `make test-slow`
def test_sweep_speed_times_sweeps_in_one_and_several_threads_against_single_runs():
  r = _load("sweep_speed").measure(None, rounds=2, seeds=1, epsilons=(4.0, 8.0), chunks=(None,))
  assert r["experiments"] == 2 and r["sweep_auto_threads"] == 1
  assert r["sweep_threads_auto_threads"] == min(2, len(os.sched_getaffinity(0)))
  for name in ("sweep_auto", "sweep_group4_auto", "sweep_threads_auto"):
    assert r[f"sequential_over_{name}"] > 0
    assert r[f"{name}_max_accuracy_difference"] < 1e-3  # each experiment equals its run


@pytest.mark.slow  # about 13 s: `make test-slow`
def test_accounting_speed_times_workers_against_none_at_a_tiny_size(capsys):
  _load("accounting_speed").main(["--rounds", "3", "--workers", "1"])
  base, helped = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert (base["accounting_workers"], helped["accounting_workers"]) == (0, 1)
  assert helped["same_epsilons_as_baseline"] and helped["final_epsilon"] == base["final_epsilon"]
  assert helped["baseline_over_this_total"] > 0


def test_audit_seeds_writes_one_line_per_audit_and_its_table(tmp_path, capsys):
  out = tmp_path / "seeds.jsonl"
  mod = _load("audit_seeds")
  assert mod.main(["--seeds", "2", "--trials", "400", "--mechanisms", "dp-rsa-f",
                   "--out", str(out)]) == 0
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["mechanism"], r["seed"]) for r in lines] == [("dp-rsa-f", 0), ("dp-rsa-f", 1)]
  assert all(r["epsilon_lower_bound"] <= r["epsilon_claimed"] and not r["violations"]
             for r in lines)
  capsys.readouterr()
  assert mod.main(["--table", str(out)]) == 0
  row = capsys.readouterr().out.strip().splitlines()[-1]
  assert row.startswith("| `dp-rsa-f` | 2 | 400 |") and row.endswith("| 0 |")


@pytest.mark.slow  # three CLI processes, two of them compiling: `make test-slow`
def test_first_round_times_the_quickstart_without_with_and_with_a_warm_cache(tmp_path, capsys):
  out = tmp_path / "first.jsonl"
  assert _load("first_round").main(["--repeats", "1", "--rounds", "2", "--out", str(out)]) == 0
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["case"] for r in lines] == ["no cache", "empty cache", "warm cache"]
  assert len({r["params_sha256"] for r in lines}) == 1  # the cache changes no result
  assert "| warm cache |" in capsys.readouterr().out


def test_wor_claims_never_below_the_worst_case_and_its_table_is_the_documented_one(capsys):
  mod = _load("wor_claims")
  for m, n in mod.COHORTS:
    for z in mod.NOISES:
      assert mod.exact(n, m, z, 1e-5) <= mod.claim(n, m, z, 1e-5)
  assert mod.main([]) == 0
  rows = capsys.readouterr().out.strip().splitlines()
  doc = [line.strip() for line in (BENCH.parent / "docs" / "how-to" / "audits.md").read_text()
         .splitlines()]
  assert len(rows) == len(mod.COHORTS) + 2 and all(row in doc for row in rows)


def test_sort_rows_times_the_network_against_xla_sort_at_a_tiny_size(capsys):
  sys.path.insert(0, str(BENCH))  # sort_rows.py imports round_speed as its sibling
  try:
    _load("sort_rows").main(["--rows", "3,9", "--columns", "20", "--repeats", "1"])
  finally:
    sys.path.remove(str(BENCH))
  records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert [r["rows"] for r in records] == [3, 9]
  assert all(r[f"{name}_{sort}_ms"] > 0 and r[f"{name}_ratio"] > 0 for r in records
             for name in ("sort", "coordinate_median", "geometric_median")
             for sort in ("network", "xla_sort"))


@pytest.mark.parametrize("study", ["votes", "batch"])
def test_zhu2022_votes_tables_are_the_documented_ones(study, capsys):
  mod = _load("zhu2022_votes")
  cases, *_, results = mod.STUDIES[study]
  assert mod.main(["--study", study, "--table", str(BENCH.parent / results)]) == 0
  rows = capsys.readouterr().out.strip().splitlines()
  doc = (BENCH.parent / "docs" / "papers" / "zhu2022.md").read_text().splitlines()
  assert len(rows) == len(cases) + 2 and all(row in doc for row in rows)


@pytest.mark.slow  # two DP-RSA runs on real MNIST: `make test-slow`
def test_zhu2022_votes_measures_each_case_at_a_tiny_scale(shared_data_dir, tmp_path, capsys):
  if not (shared_data_dir / "mnist").is_dir():
    pytest.skip(f"MNIST not found under {shared_data_dir}")
  mod = _load("zhu2022_votes")
  out = tmp_path / "votes.jsonl"
  assert mod.main(["--scale", "tiny", "--rounds", "20", "--cases", "2", "--out", str(out),
                   "--data-dir", str(shared_data_dir)]) == 0
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["epsilon"], r["byzantine"], r["attack_scale"]) for r in records] == [
      c[1:] for c in mod.CASES[:2]]
  for r in records:
    assert r["margin"] == pytest.approx(0.309, abs=1e-3)  # eps 0.2, 3 of 30
    assert 0 <= r["accuracy"] <= 1 and 0 <= r["true_class_lowest"] <= 1
    assert [c["round"] for c in r["curve"]] == [10, 20] and r["master_norm"] > 0
    assert r["curve"][-1]["test_accuracy"] == pytest.approx(r["accuracy"])
    assert r["curve"][-1]["master_norm"] == pytest.approx(r["master_norm"])  # the round's own
  assert "| dp-rsa-f, eps 0.2, b = 3, factor -5 | +0.31 |" in capsys.readouterr().out


@pytest.mark.slow  # two SignSGD runs on real MNIST: `make test-slow`
def test_zhu2022_batch_measures_each_case_at_a_tiny_scale(shared_data_dir, tmp_path, capsys):
  if not (shared_data_dir / "mnist").is_dir():
    pytest.skip(f"MNIST not found under {shared_data_dir}")
  mod = _load("zhu2022_votes")
  out = tmp_path / "batch.jsonl"
  assert mod.main(["--study", "batch", "--scale", "tiny", "--rounds", "20", "--cases", "2",
                   "--out", str(out), "--data-dir", str(shared_data_dir)]) == 0
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["method"], r["batch_size"]) for r in records] == list(mod.BATCH_CASES[:2])
  for r in records:
    assert 0 <= r["accuracy"] <= 1 and r["test_loss"] > 0 and 0.1 <= r["confidence"] <= 1
    assert [c["round"] for c in r["curve"]] == [10, 20] and r["norm"] > 0
    assert r["curve"][-1]["test_accuracy"] == pytest.approx(r["accuracy"])
  assert "| signsgd, 1 example |" in capsys.readouterr().out
