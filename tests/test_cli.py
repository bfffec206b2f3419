"""The command line: run, privacy, and clear one-line errors with exit status 2."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from fedjax_dp.cli import main
from fedjax_dp.config import RunConfig
from fedjax_dp.errors import ConfigError

TINY = ["--num-clients", "40", "--rounds", "2", "--local-steps", "2", "--model", "mlp", "--no-progress"]


@pytest.mark.parametrize("args,field", [
    (["run", "--clip", "-1"], "clip"),
    (["run", "--clip", "0"], "clip"),
    (["run", "--sampling-prob", "1.5"], "sampling_prob"),
    (["run", "--sampling-prob", "0"], "sampling_prob"),
    (["run", "--delta", "1"], "delta"),
    (["run", "--dataset", "imagenet"], "dataset"),
    (["run", "--model", "transformer"], "model"),
    (["run", "--sampling", "fixed", "--cohort-size", "800", "--num-clients", "700"], "cohort_size"),
    (["run", "--rounds", "ten"], "rounds"),
    (["run", "--dataset", "mnist", "--data-dir", "/nonexistent/dir"], "data_dir"),
    (["run", "--data-dir", "/some/dir"], "data_dir='/some/dir': is not used: dataset 'digits'"),
    (["run", "--download", "true"], "download=True: is not used: dataset 'digits' has no "),
    (["run", "--algorithm", "fedsgd"], "algorithm"),
    (["run", "--release", "private", "--checkpoint-every", "1"], "checkpoint_every"),
    (["run", "--clip", "1e308"], "clip"),          # finite, but inf in float32
    (["run", "--aggregator", "krum", "--target-epsilon", "2"], "target_epsilon"),  # no noise
    (["run", "--attack", "gaussian"], "attack"),    # no Byzantine clients to send it
    (["run", "--client-lr", "1e39"], "client_lr"),
    (["run", "--noise-multiplier", "1e-300"], "noise_multiplier"),  # 0 in float32: no noise
    (["run", "--clip", "1e-40"], "clip"),                           # a float32 denormal
    (["run", "--cpu-devices", "0"], "cpu_devices"),
    # sigma**2 underflows inside dp_accounting's RDP (ZeroDivisionError there)
    (["privacy", "--sampling-prob", "0.1", "--noise-multiplier", "1e-300", "--rounds", "10",
      "--delta", "1e-5", "--accountant", "rdp"], "accountant"),
    (["privacy", "--sampling-prob", "2", "--noise-multiplier", "1", "--rounds", "10", "--delta", "1e-5"], "sampling_prob"),
    (["privacy", "--sampling-prob", "0.1", "--noise-multiplier", "1", "--rounds", "10", "--delta", "0"], "delta"),
    # 1e20 rounds: the calibrated noise would be 1.6e7, above the noise multiplier's bound.
    (["privacy", "--sampling-prob", "0.1", "--target-epsilon", "8", "--rounds", "1" + "0" * 20,
      "--delta", "1e-5"], "target_epsilon"),
])
def test_bad_input_exits_2_with_one_line(args, field, capsys, tmp_path):
  out_dir = tmp_path / "out"
  if args[0] == "run":
    args = args + ["--output-dir", str(out_dir)]
  assert main(args) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err
  assert not out_dir.exists()  # nothing written before validation


def test_accounting_failure_is_refused_before_training(monkeypatch, capsys, tmp_path):
  """A setting dp_accounting cannot compute (here: its PLD needing more memory than the
  machine has, as a noise multiplier of 1e-3 does) stops the run before any round, by name."""
  from fedjax_dp.privacy import ledger

  def out_of_memory(event, relation):
    raise MemoryError("Unable to allocate 38.0 GiB")

  def trains(*args, **kwargs):
    raise AssertionError("the run started training")

  monkeypatch.setattr(ledger, "_event_pld", out_of_memory)
  monkeypatch.setattr("fedjax_dp.engine.run", trains)
  out = tmp_path / "o"
  # A given noise multiplier: calibrating one to the target epsilon by PLD takes seconds.
  assert main(["run", *TINY, "--accountant", "pld", "--noise-multiplier", "1",
               "--output-dir", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("fedjax-dp: error: invalid accountant='pld': dp_accounting cannot "
                        "account this setting (MemoryError"), err
  assert len(err.splitlines()) == 1 and not out.exists()


def test_unknown_algorithm_option_is_rejected(capsys, tmp_path):
  assert main(["run", *TINY, "--set", "lamda=0.4", "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "option" in err and "lamda" in err and "dp_fedavg" in err
  assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_a_misspelt_flag_is_answered_with_the_closest_known_one(capsys, tmp_path):
  assert main(["run", "--algoritm", "fedavg", "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--algoritm: did you mean --algorithm?" in err
  assert main(["sweep", "--grid", "clip=0.1", "--threds", "2", "--output-dir",
               str(tmp_path / "s")]) == 2
  assert "--threds: did you mean --threads?" in capsys.readouterr().err  # the sweep's own flag
  assert main(["run", "--zzzzzz"]) == 2 and "did you mean" not in capsys.readouterr().err
  assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("flag, given, meant", [
    ("--algorithm", "dp_fedavgg", "dp_fedavg"), ("--dataset", "mnsit", "mnist"),
    ("--attack", "sign-flp", "sign_flip"), ("--aggregator", "trimed_mean", "trimmed_mean"),
    ("--model", "cnn_2", "cnn2")])
def test_a_misspelt_name_is_answered_with_the_closest_declared_one(flag, given, meant, capsys,
                                                                  tmp_path):
  assert main(["run", flag, given, "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  field = flag[2:]
  assert err.count("\n") == 1 and f"invalid {field}=" in err, err
  assert err.rstrip().endswith(f"] (did you mean {meant!r}?)"), err
  assert not (tmp_path / "o").exists()
  assert main(["run", flag, "zzzzzz", "--output-dir", str(tmp_path / "o")]) == 2
  assert "did you mean" not in capsys.readouterr().err  # nothing close: the list alone


def test_error_from_a_real_process_has_no_traceback(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", "--clip", "-1", "--output-dir", str(tmp_path / "o")],
                        capture_output=True, text=True)
  assert proc.returncode == 2
  assert proc.stderr.strip() == "fedjax-dp: error: invalid clip=-1.0: must be > 0"


def test_run_writes_metrics_and_summary_and_protects_them(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", *TINY, "--output-dir", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "final test accuracy=" in printed and "epsilon=" in printed
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in rows] == [1, 2]
  for key in ("epsilon", "test_accuracy", "aggregate_norm"):
    assert key in rows[-1]
  for key in ("cohort_size", "train_loss", "update_norm", "fraction_clipped", "seconds"):
    assert key in rows[-1]["diagnostics"] and key not in rows[-1]
  summary = json.loads((out / "summary.json").read_text())
  for key in ("final_accuracy", "epsilon", "delta", "rounds", "config", "noise_multiplier", "release"):
    assert key in summary
  assert "capacity_grew" in summary["diagnostics"] and "capacity_grew" not in summary
  assert summary["config"]["run"]["num_clients"] == 40 and summary["rounds"] == 2
  before = (out / "metrics.jsonl").read_text()
  assert main(["run", *TINY, "--output-dir", str(out)]) == 2  # an earlier run is not overwritten
  assert "output_dir" in capsys.readouterr().err
  assert (out / "metrics.jsonl").read_text() == before


def test_release_private_writes_only_covered_and_public_fields(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(["run", *TINY, "--output-dir", str(out), "--release", "private"]) == 0
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  summary = json.loads((out / "summary.json").read_text())
  covered = set(summary["release"]["covered_by_guarantee"]["metrics_rows"])
  for r in rows:
    assert "diagnostics" not in r
    assert set(r) <= covered | {"round", "epsilon"}
  assert "diagnostics" not in summary and summary["release"]["mode"] == "private"
  # The model's hash is a function of the released model; provenance is public by design.
  assert "params_sha256" in summary["release"]["covered_by_guarantee"]["summary"]
  assert "provenance" in summary["release"]["public_by_design"]
  rows_text = (out / "metrics.jsonl").read_text()
  summary_text = json.dumps({k: v for k, v in summary.items() if k != "config"})
  for raw in ("cohort_size", "train_loss", "update_norm", "fraction_clipped", "seconds"):
    assert f'"{raw}"' not in rows_text
  for raw in ("capacity_grew", "cohort_capacity", "seconds_total"):
    assert f'"{raw}"' not in summary_text
  # nor in what it prints: the wall time follows the realized cohorts
  printed = capsys.readouterr().out
  assert "final test accuracy=" in printed and "seconds=" not in printed


def test_a_private_release_draws_its_noise_from_secret_entropy(tmp_path):
  """With release 'all' the recorded seed fixes the noise (two runs agree, and the block calls the
  seed secret); a private release's draws follow from no recorded number (two runs differ)."""
  sums = {}
  for release in ("all", "private"):
    for i in range(2):
      out = tmp_path / f"{release}{i}"
      assert main(["run", *TINY, "--output-dir", str(out), "--release", release]) == 0
      summary = json.loads((out / "summary.json").read_text())
      sums.setdefault(release, []).append(summary["params_sha256"])
      assert summary["config"]["run"]["seed"] == 0
      text = summary["release"]["randomness"]
      assert ("secret, not public" in text) if release == "all" else ("entropy" in text)
  assert sums["all"][0] == sums["all"][1]
  assert sums["private"][0] != sums["private"][1]


def test_run_with_config_file_and_noise_multiplier(tmp_path, capsys):
  cfg = tmp_path / "c.json"
  cfg.write_text(json.dumps({"num_clients": 40, "rounds": 2, "local_steps": 2, "model": "mlp", "noise_multiplier": 1.3}))
  assert main(["run", "--config", str(cfg), "--no-progress", "--output-dir", str(tmp_path / "o")]) == 0
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  # The ledger accounts the multiplier the compiled round uses: 1.3 as a float32 hyper-parameter.
  assert summary["noise_multiplier"] == float(np.float32(1.3))
  assert summary["config"]["algorithm"]["target_epsilon"] is None
  cfg.write_text(json.dumps({"clipp": 1}))
  assert main(["run", "--config", str(cfg), "--output-dir", str(tmp_path / "o2")]) == 2
  assert "clipp" in capsys.readouterr().err


def test_privacy_epsilon_matches_dp_accounting(capsys):
  assert main(["privacy", "--sampling-prob", "0.04", "--noise-multiplier", "1.1", "--rounds", "300", "--delta", "1e-5"]) == 0
  out = json.loads(capsys.readouterr().out)
  acc = rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(1.1)), 300)
  assert out["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_privacy_target_epsilon_and_fixed_sampling(capsys):
  assert main(["privacy", "--sampling-prob", "0.04", "--target-epsilon", "4", "--rounds", "300", "--delta", "1e-5"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["epsilon"] <= 4.0 + 1e-9 and out["noise_multiplier"] > 0
  assert main(["privacy", "--sampling", "fixed", "--num-clients", "1000", "--cohort-size", "40",
               "--noise-multiplier", "1.0", "--rounds", "100", "--delta", "1e-5"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["neighbouring_relation"] == "replace_one" and out["epsilon"] > 0
  # Byzantine clients: the run's accounting, cohorts sampled from the regular clients.
  assert main(["privacy", "--sampling", "fixed", "--num-clients", "1000", "--cohort-size", "40",
               "--byzantine", "10", "--noise-multiplier", "1.0", "--rounds", "100", "--delta",
               "1e-5"]) == 0
  byz = json.loads(capsys.readouterr().out)
  assert byz["epsilon"] > out["epsilon"] and "990 regular clients, M - K" in byz["dp_event"]
  assert main(["privacy", "--sampling-prob", "0.04", "--noise-multiplier", "1.1", "--rounds", "30",
               "--delta", "1e-5", "--accountant", "pld"]) == 0
  assert json.loads(capsys.readouterr().out)["accountant"] == "pld"


def _strict_loads(s):
  """json.loads that refuses NaN, Infinity and -Infinity (as strict JSON parsers do)."""
  return json.loads(s, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


PRIVACY = ["privacy", "--rounds", "10", "--delta", "1e-5"]
SIGN_FLIP = [*PRIVACY, "--mechanism", "sign-flip", "--keep-prob", "0.7", "--dimension", "10"]


@pytest.mark.parametrize("extra", [
    ["--sampling-prob", "0.1", "--noise-multiplier", "1"],
    SIGN_FLIP[len(PRIVACY):],
])
def test_privacy_unknown_accountant_is_refused_for_every_mechanism(extra, capsys):
  assert main([*PRIVACY, *extra, "--accountant", "moments"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "accountant" in err and "'moments'" in err
  assert "rdp" in err and "pld" in err


def test_privacy_sign_flip_refuses_pld(capsys):
  assert main([*SIGN_FLIP, "--accountant", "pld"]) == 2
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert captured.out == "" and len(err.splitlines()) == 1
  assert "accountant" in err and "'pld'" in err and "must be 'rdp'" in err
  assert "RandomizedResponseDpEvent only once" in err
  assert main([*SIGN_FLIP, "--accountant", "rdp"]) == 0
  out = _strict_loads(capsys.readouterr().out)
  assert out["accountant"] == "rdp" and out["formal_guarantee"] is True and math.isfinite(out["epsilon"])


def test_privacy_without_noise_is_strict_json_with_no_guarantee(capsys):
  assert main([*PRIVACY, "--sampling-prob", "0.1", "--noise-multiplier", "0"]) == 0
  out = _strict_loads(capsys.readouterr().out)
  assert out["epsilon"] is None and out["epsilon_nonfinite"] == "Infinity"
  assert out["formal_guarantee"] is False and "no differential privacy guarantee" in out["guarantee_note"]
  assert main([*PRIVACY, "--sampling-prob", "0.1", "--noise-multiplier", "1"]) == 0
  out = _strict_loads(capsys.readouterr().out)
  assert out["formal_guarantee"] is True and out["epsilon"] > 0 and "epsilon_nonfinite" not in out
  assert out["guarantee_note"]


@pytest.mark.parametrize("args,field", [
    ([*PRIVACY, "--sampling-prob", "0.1", "--noise-multiplier", "inf"], "noise_multiplier"),
    ([*PRIVACY, "--sampling-prob", "0.1", "--noise-multiplier=-inf"], "noise_multiplier"),
    ([*PRIVACY, "--sampling-prob", "0.1", "--target-epsilon", "inf"], "target_epsilon"),
    ([*PRIVACY, "--sampling-prob", "0.1", "--target-epsilon", "nan"], "target_epsilon"),
    (["privacy", "--rounds", "10", "--delta", "nan", "--sampling-prob", "0.1", "--noise-multiplier", "1"], "delta"),
    ([*PRIVACY, "--sampling-prob", "inf", "--noise-multiplier", "1"], "sampling_prob"),
    ([*PRIVACY, "--sampling-prob", "nan", "--target-epsilon", "2"], "sampling_prob"),
    ([*PRIVACY, "--mechanism", "sign-flip", "--keep-prob", "nan", "--dimension", "10"], "keep_prob"),
    ([*PRIVACY, "--mechanism", "sign-flip", "--keep-prob", "inf", "--dimension", "10"], "keep_prob"),
    (["privacy", "--rounds", "10", "--delta", "inf", *SIGN_FLIP[len(PRIVACY):]], "delta"),
])
def test_privacy_refuses_non_finite_numbers(args, field, capsys):
  assert main(args) == 2
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert captured.out == "" and len(err.splitlines()) == 1
  assert f"invalid {field}=" in err and "must be a finite number" in err and "Traceback" not in err


@pytest.mark.parametrize("extra,field", [
    (["--clip", "inf"], "clip"),
    (["--clip", "nan"], "clip"),
    (["--noise-multiplier", "inf", "--target-epsilon", "none"], "noise_multiplier"),
    (["--target-epsilon", "inf"], "target_epsilon"),
    (["--client-lr", "nan"], "client_lr"),
    (["--server-lr", "inf"], "server_lr"),
    (["--partition", "dirichlet", "--dirichlet-alpha", "inf"], "dirichlet_alpha"),
    (["--sampling-prob", "nan"], "sampling_prob"),
    (["--delta=-inf"], "delta"),
])
def test_run_refuses_non_finite_fields_before_writing(extra, field, capsys, tmp_path):
  out_dir = tmp_path / "x"
  assert main(["run", *TINY, *extra, "--output-dir", str(out_dir)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"invalid {field}=" in err and "must be a finite number" in err
  assert not out_dir.exists() or not any(out_dir.iterdir())


def test_run_config_file_with_non_finite_values_is_refused(capsys, tmp_path):
  cfg = tmp_path / "c.json"
  cfg.write_text('{"clip": Infinity, "rounds": 2}')  # Python's json reads these constants
  assert main(["run", "--config", str(cfg), "--no-progress", "--output-dir", str(tmp_path / "x")]) == 2
  assert "invalid clip=inf: must be a finite number" in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", "-Infinity", "NaN", "INF", "infinity"])
def test_run_refuses_non_finite_algorithm_options(value, capsys, tmp_path):
  out_dir = tmp_path / "x"
  assert main(["run", *TINY, "--algorithm", "blur+lus", "--set", f"lambda={value}",
               "--output-dir", str(out_dir)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "option lambda" in err and "must be a finite number" in err
  assert not out_dir.exists() or not any(out_dir.iterdir())


@pytest.mark.parametrize("field", ["clip", "noise_multiplier", "client_lr", "server_lr", "dirichlet_alpha",
                                   "sampling_prob", "delta", "target_epsilon"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_run_config_refuses_non_finite_numbers(field, value):
  changes = {field: value}
  if field == "noise_multiplier":
    changes["target_epsilon"] = None
  with pytest.raises(ConfigError) as e:
    RunConfig(**changes)
  assert e.value.field == field and e.value.allowed == "must be a finite number"


def test_run_config_refuses_non_finite_int_fields():
  with pytest.raises(ConfigError) as e:
    RunConfig(rounds=math.inf)
  assert e.value.field == "rounds" and "finite" in str(e.value)
  with pytest.raises(ConfigError) as e:
    RunConfig(max_train=math.nan)
  assert e.value.field == "max_train" and "finite" in str(e.value)


def test_read_options_refuses_non_finite_values_but_keeps_named_choices():
  from fedjax_dp.algorithms import read_options
  cfg = RunConfig(algorithm="blur+lus", options={"lambda": math.inf})
  with pytest.raises(ConfigError) as e:
    read_options(cfg)
  assert e.value.field == "option lambda" and "finite" in e.value.allowed
  cfg = RunConfig(algorithm="blur+lus", options={"sparsity": "NaN"})
  with pytest.raises(ConfigError, match="option sparsity"):
    read_options(cfg)
  cfg = RunConfig(algorithm="dp-rsa-f", options={"keep_prob": math.nan})
  with pytest.raises(ConfigError, match="option keep_prob"):
    read_options(cfg)
  # An option whose value is a name ("nan" picks the non-finite attack) is not a number.
  cfg = RunConfig(algorithm="sgd", attack="nonfinite", options={"nonfinite_value": "inf"})
  opts = read_options(cfg)
  assert opts["nonfinite_value"] == "inf"
  cfg = RunConfig(algorithm="sgd", options={"nonfinite_value": math.nan})
  with pytest.raises(ConfigError, match="option nonfinite_value"):
    read_options(cfg)


@pytest.mark.parametrize("algorithm,option,value", [
    ("trimmed_mean", "trim_beta", "abc"), ("gm", "gm_max_iter", 2.5), ("krum", "krum_m", "two"),
    ("blur+lus", "lus_batches", 1.5), ("blur+lus", "lambda", [0.4]), ("spfl", "high_fraction", "x"),
    ("adp-fl", "target_quantile", True), ("dp-rsa-f", "keep_prob", "0.7"),
    ("spfl", "example_sampling", "bernoulli"), ("dp-rsa-g", "sign_clip_norm", "l1")])
def test_wrong_typed_options_are_refused_in_one_line(algorithm, option, value, capsys, tmp_path):
  # These used to end in tracebacks (float("abc"), comparisons of str and float, ...).
  cfg = tmp_path / "c.json"
  cfg.write_text(json.dumps({"algorithm": algorithm, "num_clients": 20, "rounds": 1,
                             "options": {option: value}}))
  assert main(["run", "--config", str(cfg), "--output-dir", str(tmp_path / "o"), "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"option {option}" in err[0] and "must be" in err[0]
  assert not (tmp_path / "o").exists()


def test_algorithms_lists_every_algorithm_with_its_paper_unit_and_options(capsys):
  from fedjax_dp import components
  assert main(["algorithms", "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert list(out) == list(components.names("algorithm"))
  own = {o["name"] for o in out["blur+lus"]["options"]}
  assert {"lambda", "sparsity", "lus_batches", "trim_beta", "attack_sigma"} <= own
  assert "lambda" not in {o["name"] for o in out["dp_fedavg+lus"]["options"]}
  assert "example-level" in out["dp-fl"]["privacy_unit"] and "user-level" in out["dp_fedavg"]["privacy_unit"]
  keep = next(o for o in out["dp-rsa-f"]["options"] if o["name"] == "keep_prob")
  assert keep["default"] == 0.8 and "[0.5, 1]" in keep["allowed"]
  # Each lists its own defaults of run settings.
  assert out["ddgauss"]["defaults"] == {"sampling": "fixed", "cohort_size": 70}
  assert out["dp_fedavg"]["defaults"] == {} and out["sgd"]["paper"] == out["sgd"]["paper"].strip()
  # Every listed option is accepted by its algorithm's builder (and nothing else is).
  from fedjax_dp.algorithms import option_table
  assert [o.name for o in option_table("blur+lus")] == [o["name"] for o in out["blur+lus"]["options"]]
  assert main(["algorithms"]) == 0
  text = capsys.readouterr().out
  assert "--set sparsity=VALUE" in text and "every algorithm but ae-dpfl also takes" in text
  assert "its defaults: --sampling fixed --cohort-size 70" in text
  assert "(rsa, dp-rsa-f, dp-rsa-g also --attacker-knowledge released|omniscient)" in text


def test_an_option_of_another_variant_is_refused(tmp_path, capsys):
  assert main(["run", "--algorithm", "dp_fedavg+lus", "--set", "lambda=0.4",
               "--output-dir", str(tmp_path / "o"), "--no-progress"]) == 2
  assert "option='lambda'" in capsys.readouterr().err


@pytest.mark.parametrize("args,field", [
    (["--algorithm", "dp-rsa-f", "--clip", "0.3", "--set", "epsilon=1"], "clip"),
    (["--algorithm", "fedavg", "--target-epsilon", "4"], "target_epsilon"),
    (["--algorithm", "median", "--local-steps", "3"], "local_steps"),
    (["--algorithm", "dp-fl", "--denominator", "realized"], "denominator")])
def test_a_setting_the_algorithm_does_not_use_is_refused(args, field, capsys, tmp_path):
  out = tmp_path / "o"
  assert main(["run", *args, "--num-clients", "20", "--rounds", "1", "--output-dir", str(out),
               "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and f"invalid {field}=" in err[0] and "is not used by algorithm" in err[0]
  assert not out.exists()


def test_the_python_api_refuses_a_setting_the_algorithm_does_not_use_like_the_cli():
  import fedjax_dp
  for algorithm, field, value in (("dp-rsa-f", "clip", 0.3), ("fedavg", "target_epsilon", 4.0),
                                  ("median", "local_steps", 3)):
    with pytest.raises(ConfigError) as e:
      fedjax_dp.simulate(algorithm=algorithm, num_clients=20, rounds=1, **{field: value})
    assert e.value.field == field and "is not used by algorithm" in str(e.value)
  with pytest.raises(ConfigError) as e:  # overrides of a given configuration too
    fedjax_dp.simulate(RunConfig(algorithm="fedavg", target_epsilon=None), clip=0.3)
  assert e.value.field == "clip"


def test_cpu_devices_split_the_clients_over_the_cores(tmp_path, capsys):
  import jax
  jax.devices()  # JAX has started in this process (with one CPU device): too late for another
  assert main(["run", *TINY, "--cpu-devices", "2", "--output-dir", str(tmp_path / "in")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "cpu_devices" in err and "new process" in err
  assert not (tmp_path / "in").exists()
  out = tmp_path / "two"
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", *TINY, "--cpu-devices", "2",
                         "--output-dir", str(out)], capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  prov = json.loads((out / "summary.json").read_text())["provenance"]
  assert prov["devices"]["count"] == 2 and prov["client_block"] == 2  # CPU_BLOCK // 2 a device


def test_summary_records_the_model_name_partition_and_provenance(tmp_path, capsys):
  import subprocess
  import jax
  import fedjax_dp
  out = tmp_path / "run"
  tiny = [a for a in TINY if a not in ("--model", "mlp")]  # the data set's default model
  assert main(["run", *tiny, "--partition", "dirichlet", "--dirichlet-alpha", "0.3",
               "--output-dir", str(out)]) == 0
  text = (out / "summary.json").read_text()
  summary = json.loads(text)
  assert '"model": null' not in text and summary["config"]["run"]["model"] == "digits_cnn"
  assert summary["data"]["partition"] == {"name": "dirichlet", "clients": 40, "dirichlet_alpha": 0.3}
  assert summary["data"]["data_dir"] is None  # the bundled digits: no folder
  per_client = summary["diagnostics"]["data"]["examples_per_client"]  # raw: diagnostics only
  assert per_client["min"] <= per_client["median"] <= per_client["max"]
  prov = summary["provenance"]
  assert prov["fedjax_dp"] == fedjax_dp.__version__ and prov["packages"]["jax"] == jax.__version__
  assert prov["packages"]["dp-accounting"] and prov["packages"]["flax"]
  assert prov["devices"] == {"platform": jax.devices()[0].platform,
                             "kind": jax.devices()[0].device_kind, "count": len(jax.devices())}
  # conv_impl auto: digits_cnn's small layers run by im2col (as the compiled round traced them).
  assert prov["conv_layers"] == {"Conv_0": ["im2col"], "Conv_1": ["im2col"]}
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=pathlib.Path(fedjax_dp.__file__).parent,
                        capture_output=True, text=True)
  if head.returncode == 0:
    assert prov["git"]["revision"] == head.stdout.strip() and isinstance(prov["git"]["dirty"], bool)
  else:
    assert prov["git"] is None
  assert "provenance" in summary["release"]["public_by_design"]


def test_the_data_folder_is_recorded_when_the_environment_gives_it(monkeypatch, tmp_path):
  from fedjax_dp import provenance
  monkeypatch.setenv("FEDJAX_DP_DATA", str(tmp_path))
  assert provenance.data_dir({"dataset": "mnist", "data_dir": None}) == str(tmp_path.resolve())
  assert provenance.data_dir({"dataset": "mnist", "data_dir": "elsewhere"}) == str(
      pathlib.Path("elsewhere").resolve())
  assert provenance.data_dir({"dataset": "digits", "data_dir": None}) is None
  monkeypatch.delenv("FEDJAX_DP_DATA")
  assert provenance.data_dir({"dataset": "mnist", "data_dir": None}) is None


def test_provenance_without_git_is_none_not_an_error(monkeypatch):
  from fedjax_dp import provenance
  monkeypatch.setenv("PATH", "")  # no git executable
  assert provenance.git_revision() is None
  assert provenance.environment()["git"] is None


def test_simulate_takes_a_model_name():
  import fedjax_dp
  r = fedjax_dp.simulate(model="mlp", num_clients=20, rounds=1, local_steps=1, max_test=50)
  assert r.summary["model"]["name"] == "mlp" and r.summary["config"]["run"]["model"] == "mlp"
  with pytest.raises(ConfigError) as e:
    fedjax_dp.simulate(model="transformer", num_clients=20, rounds=1)
  assert e.value.field == "model"


def test_the_configuration_holds_the_canonical_attack_name():
  assert RunConfig(attack="sign-flip").attack == "sign_flip"
  assert RunConfig(attack="sample-duplication").to_dict()["attack"] == "sample_duplication"


def test_release_block_names_the_raw_norms_file(tmp_path):
  out = tmp_path / "run"
  assert main(["run", *TINY, "--output-dir", str(out)]) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert (out / "norms.npz").exists()
  assert "norms.npz holds every sampled client's pre-clip update norm" in (
      summary["release"]["diagnostics"])


def _tree(folder):
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


def test_a_refused_reproduce_overwrite_keeps_the_earlier_results(tmp_path, capsys):
  out = tmp_path / "rep"
  out.mkdir()
  for name, text in (("results.json", "{}"), ("results.md", "earlier"), ("runs.jsonl", "{}\n")):
    (out / name).write_text(text)
  before = _tree(out)
  empty = tmp_path / "no_data"
  empty.mkdir()
  for extra in (["--scale", "nope"], ["--seeds", "0"], ["--seeds", "-2"],
                ["--scale", "small", "--data-dir", str(empty)]):  # the last: MNIST is missing
    assert main(["reproduce", "cheng2022", "--overwrite", "--output-dir", str(out), *extra]) == 2
    assert _tree(out) == before, extra
  # A folder the refused command would have created is not left behind.
  new = tmp_path / "new"
  assert main(["reproduce", "cheng2022", "--scale", "small", "--data-dir", str(empty),
               "--output-dir", str(new)]) == 2
  assert not new.exists()
  err = capsys.readouterr().err
  assert "invalid scale='nope'" in err and "invalid seeds=0" in err


def test_commands_do_not_write_into_each_others_folders(tmp_path, capsys):
  run_dir = tmp_path / "run"
  assert main(["run", *TINY, "--output-dir", str(run_dir)]) == 0
  before = _tree(run_dir)
  for argv in (["sweep", *TINY, "--grid", "clip=0.1", "--output-dir", str(run_dir)],
               ["sweep", *TINY, "--grid", "clip=0.1", "--overwrite", "--output-dir", str(run_dir)],
               ["reproduce", "cheng2022", "--scale", "tiny", "--overwrite", "--output-dir",
                str(run_dir)]):
    assert main(argv) == 2
    assert _tree(run_dir) == before
  assert "holds metrics.jsonl of a run" in capsys.readouterr().err
  sweep_dir = tmp_path / "sweep"
  (sweep_dir / "experiments").mkdir(parents=True)
  (sweep_dir / "experiments" / "x").write_text("1")
  assert main(["run", *TINY, "--overwrite", "--output-dir", str(sweep_dir)]) == 2
  assert "holds experiments of a sweep" in capsys.readouterr().err


def test_krum_with_more_byzantine_clients_than_its_cohort_tolerates_is_refused(tmp_path, capsys):
  # f = 4 Byzantine clients need cohorts of more than 2f + 2 = 10 rows; with 10 each row would be
  # scored by one neighbour, and two identical attackers would win.
  assert main(["run", "--num-clients", "40", "--rounds", "1", "--model", "mlp", "--no-progress",
               "--algorithm", "krum", "--sampling", "fixed", "--cohort-size", "10",
               "--byzantine", "4", "--attack", "ipm", "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "invalid byzantine=4: is too many for Krum with cohorts of 10 clients" in err
  assert not (tmp_path / "o").exists()


def test_multi_krum_larger_than_the_cohort_is_refused(tmp_path, capsys):
  # krum_m rows out of a cohort of 3 would silently be the plain mean.
  assert main(["run", "--num-clients", "40", "--rounds", "1", "--model", "mlp", "--no-progress",
               "--algorithm", "krum", "--sampling", "fixed", "--cohort-size", "3",
               "--set", "krum_m=5", "--output-dir", str(tmp_path / "o")]) == 2
  assert "invalid option krum_m=5: must be <= cohort_size=3" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra,message", [
    (["--set", "trim_beta=0.2"], "invalid option trim_beta=0.2: is read by the trimmed_mean "
                                 "aggregator only, and this run's aggregator is"),
    (["--set", "attack_sigma=5"], "invalid option attack_sigma=5: is read by the gaussian attack "
                                  "only, and this run's attack is none"),
    (["--attacker-knowledge", "omniscient"], "invalid attacker_knowledge='omniscient': is not "
                                             "used: there is no attack"),
    (["--cohort-size", "5"], "invalid cohort_size=5: is not used: sampling is poisson"),
    (["--sampling", "fixed", "--cohort-size", "3", "--sampling-prob", "0.5"],
     "invalid sampling_prob=0.5: is not used: sampling is fixed"),
    (["--sampling", "fixed", "--cohort-size", "3", "--capacity", "2"],
     "invalid capacity=2: is not used: sampling is fixed"),
    (["--conv-impl", "winograd"], "invalid conv_impl='winograd': is not used: model 'mlp' has no "
                                  "convolution"),
    # Nothing is accounted in a run without a mechanism, or whose aggregator adds no noise.
    (["--algorithm", "fedavg", "--delta", "1e-6"], "invalid delta=1e-06: is not used: algorithm "
                                                   "'fedavg' has no privacy mechanism"),
    (["--algorithm", "nodp-fl", "--accountant", "pld"], "invalid accountant='pld': is not used: "
                                                         "algorithm 'nodp-fl' has no privacy"),
    (["--aggregator", "coordinate_median", "--delta", "1e-6"],
     "invalid delta=1e-06: is not used: the aggregator 'coordinate_median' adds no noise"),
    # Only the PLD accountant's epsilons go to workers.
    (["--accounting-workers", "2"], "invalid accounting_workers=2: is not used: the rdp "
                                    "accountant's epsilons take milliseconds"),
    # A partition's settings, under another partition.
    (["--partition", "dirichlet", "--min-labels-per-client", "3"],
     "invalid min_labels_per_client=3: is not used: partition is dirichlet (only shards reads it)"),
    (["--shards-per-client", "3"], "invalid shards_per_client=3: is not used: partition is iid"),
    (["--partition", "shards", "--dirichlet-alpha", "0.3"],
     "invalid dirichlet_alpha=0.3: is not used: partition is shards (only dirichlet reads it)"),
])
def test_settings_the_run_would_ignore_are_refused(extra, message, tmp_path, capsys):
  assert main(["run", *TINY, *extra, "--output-dir", str(tmp_path / "o")]) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def test_a_setting_given_twice_is_refused(tmp_path, capsys):
  out = str(tmp_path / "o")
  assert main(["run", *TINY, "--algorithm", "blur+lus", "--set", "lambda=0.1", "--set",
               "lambda=0.2", "--output-dir", out]) == 2
  assert "sets lambda a second time" in capsys.readouterr().err
  cfg = tmp_path / "c.json"
  cfg.write_text('{"rounds": 1, "rounds": 3}')
  assert main(["run", "--config", str(cfg), "--output-dir", out]) == 2
  err = capsys.readouterr().err
  assert "invalid rounds=3: is given twice" in err and str(cfg) in err
  assert main(["sweep", *TINY, "--grid", "clip=0.1,0.1", "--output-dir", out]) == 2
  assert "names a value twice" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


def test_a_private_sweep_keeps_timings_out_and_rows_show_their_grid_values(tmp_path, capsys):
  # DP-RSA's epsilon option as an axis: a row's "epsilon" is the run's whole-run epsilon, and the
  # printed row shows the grid's value. A private release prints and writes no timing.
  out = tmp_path / "s"
  assert main(["sweep", "--num-clients", "10", "--rounds", "2", "--model", "mlp", "--no-progress",
               "--algorithm", "dp-rsa-f", "--sampling", "fixed", "--cohort-size", "5",
               "--client-lr", "0.01", "--batch-size", "8", "--grid", "epsilon=0.5,1",
               "--release", "private", "--threads", "1", "--output-dir", str(out)]) == 0
  captured = capsys.readouterr()
  assert "epsilon=0.5: accuracy=" in captured.out and "epsilon=1: accuracy=" in captured.out
  assert "2 experiments in 1 compiled programs (1 thread); wrote" in captured.out
  assert "experiments of dp-rsa-f" in captured.err
  assert not re.search(r"\d\.\ds\b", captured.out + captured.err)  # no "12.3s" anywhere
  doc = json.loads((out / "results.json").read_text())
  assert "seconds" not in doc and all("seconds" not in g for g in doc["groups"])
  assert [r["grid"]["epsilon"] for r in doc["rows"]] == [0.5, 1.0]


def test_a_sweep_refuses_what_no_point_reads_whatever_the_grids_order(tmp_path, capsys):
  from fedjax_dp.cli import _config_from_args, build_parser
  from fedjax_dp.sweep import parse_grid

  def check(grid, *flags):
    args = build_parser().parse_args(["sweep", "--grid", grid, *flags, "--output-dir", "x"])
    return _config_from_args(args, parse_grid(grid))

  # a flag that some grid point reads is accepted in either order
  for grid in ("sampling=poisson,fixed", "sampling=fixed,poisson"):
    assert check(grid, "--cohort-size", "10").cohort_size == 10
  # one that no point reads is refused
  with pytest.raises(ConfigError, match="cohort_size"):
    check("clip=0.1,0.2", "--cohort-size", "10")
  # an axis that some points do not read would run their experiments twice: refused, either order
  for grid in ("aggregator=coordinate_median,mean noise_multiplier=1,2",
               "aggregator=mean,coordinate_median noise_multiplier=1,2"):
    with pytest.raises(ConfigError, match="grid point aggregator=coordinate_median") as e:
      check(grid)
    assert e.value.field == "grid" and e.value.value == "noise_multiplier"
  # a flag or --set beside an axis of the same name would be replaced by the axis: refused
  with pytest.raises(ConfigError, match="invalid clip=0.3: is also a grid axis"):
    check("clip=0.1", "--clip", "0.3")
  with pytest.raises(ConfigError, match="invalid lambda=0.9: is also a grid axis"):
    check("lambda=0.1,0.2", "--algorithm", "dp-rsa-f", "--set", "lambda=0.9")


def test_a_sweep_axis_may_give_a_field_the_base_run_needs(tmp_path, capsys):
  # cohort_size is needed with fixed sampling; the grid gives it (the base run used to be refused
  # with "invalid cohort_size=None").
  out = tmp_path / "s"
  assert main(["sweep", *TINY, "--sampling", "fixed", "--grid", "cohort_size=3,5",
               "--rounds", "1", "--output-dir", str(out)]) == 0
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert [r["cohort_size"] for r in rows] == [3, 5]


@pytest.mark.parametrize("extra,field", [
    (["--sampling", "fixed", "--num-clients", "10", "--cohort-size", "5", "--sampling-prob",
      "0.5", "--noise-multiplier", "1"], "sampling_prob"),
    (["--sampling-prob", "0.1", "--keep-prob", "0.7", "--noise-multiplier", "1"], "keep_prob"),
    (["--mechanism", "sign-flip", "--keep-prob", "0.7", "--dimension", "10",
      "--noise-multiplier", "3"], "noise_multiplier"),
    (["--mechanism", "sign-flip", "--keep-prob", "0.7", "--dimension", "10",
      "--sampling", "fixed"], "sampling"),  # every worker releases every round
    # a misspelt sampling is named itself, not the flag it would decide about
    (["--sampling", "Poisson", "--sampling-prob", "0.01", "--noise-multiplier", "1"], "sampling"),
])
def test_privacy_refuses_flags_its_mechanism_does_not_read(extra, field, capsys):
  assert main([*PRIVACY, *extra]) == 2
  assert f"invalid {field}=" in capsys.readouterr().err


def test_out_of_memory_is_one_line_with_what_to_lower(tmp_path, capsys):
  # Batches of 10^9 examples: XLA cannot allocate the round (terabytes).
  assert main(["run", *TINY, "--batch-size", "1000000000", "--output-dir", str(tmp_path / "o")]) == 4
  err = capsys.readouterr().err.strip()
  # One line for the batch larger than every client's data (a warning), one for the error.
  warning, error = err.splitlines()
  assert warning.startswith("fedjax-dp: warning: batch_size=1000000000 is above the largest")
  assert "out of memory" in error and "batch_size" in error and "Traceback" not in err


def test_ctrl_c_in_the_first_round_of_an_overwrite_says_what_it_removed(tmp_path, monkeypatch,
                                                                        capsys):
  import fedjax_dp.outputs
  out = tmp_path / "o"
  out.mkdir()
  (out / "metrics.jsonl").write_text('{"round": 1}\n')  # an earlier run's files
  (out / "summary.json").write_text("{}")
  real_remove = fedjax_dp.outputs.remove

  def remove(*args):  # Ctrl-C just after the first row's write removed the earlier run's files
    real_remove(*args)
    raise KeyboardInterrupt

  monkeypatch.setattr(fedjax_dp.outputs, "remove", remove)
  assert main(["run", *TINY, "--output-dir", str(out), "--overwrite"]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()
  assert len(err) == 1 and "as it was" not in err[0], err
  assert f"removing the earlier run's files from {out}" in err[0] and "no round kept" in err[0]
  # Ctrl-C after the first round's row was written, before the run was told of it: one row kept.
  monkeypatch.undo()
  real_flush = fedjax_dp.outputs.MetricsFile.flush

  def flush(self):
    real_flush(self)
    raise KeyboardInterrupt

  monkeypatch.setattr(fedjax_dp.outputs.MetricsFile, "flush", flush)
  assert main(["run", *TINY, "--output-dir", str(out), "--overwrite"]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "1 rounds kept" in err[0], err
  assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_ctrl_c_line_reads_interrupted_then_a_colon_then_what_was_kept(tmp_path, capsys,
                                                                       interrupt_at_round):
  out = tmp_path / "o"
  interrupt_at_round(3)
  assert main(["run", *TINY, "--rounds", "4", "--output-dir", str(out)]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"fedjax-dp: interrupted: 2 rounds kept in {out / 'metrics.jsonl'}, no "
                 "summary.json; rerun with --overwrite to start again"], err


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(monkeypatch, capsys):
  # `fedjax-dp algorithms | head -1`: the reader goes away; no traceback, and the status of a
  # process stopped by SIGPIPE (a run would have stopped half way: not success).
  class Closed:
    def write(self, text):
      raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
      pass

  monkeypatch.setattr(sys, "stdout", Closed())
  assert main(["algorithms"]) == 141


def test_an_interrupted_sweep_says_its_folder_is_as_it_was(tmp_path, monkeypatch, capsys):
  # An earlier sweep's files, then an --overwrite interrupted while its programs run.
  import fedjax_dp.sweep
  out = tmp_path / "s"
  (out / "experiments" / "000").mkdir(parents=True)
  (out / "experiments" / "000" / "summary.json").write_text("{}")
  (out / "results.json").write_text('{"rows": []}')
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

  def interrupted(*args, **kwargs):
    (out / "experiments" / "000").mkdir(parents=True)  # a program had begun writing
    raise KeyboardInterrupt
  monkeypatch.setattr(fedjax_dp.sweep, "run_configs", interrupted)
  assert main(["sweep", *TINY, "--grid", "clip=0.1,0.2", "--output-dir", str(out),
               "--overwrite"]) == 130
  assert capsys.readouterr().err.strip() == (
      f"fedjax-dp: interrupted: {out} is as it was (a sweep is written whole or not at all; run "
      "it again)")
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_sizes_nobody_means_are_refused_or_warned(tmp_path, capsys):
  too_many = tmp_path / "many.json"
  too_many.write_text(json.dumps({"rounds": 10**12}))
  for args in (["run", "--rounds", "２"], ["run", "--rounds", "1000000000000"],
               ["run", "--config", str(too_many)],
               ["sweep", "--grid", "rounds=2,1000000000000"]):
    assert main([*args, "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rounds" in err, (args, err)
  assert not (tmp_path / "o").exists()
  # A batch larger than every client's data runs, with one line saying what it costs.
  assert main(["run", *TINY, "--batch-size", "1000", "--output-dir", str(tmp_path / "b")]) == 0
  err = capsys.readouterr().err
  assert "warning: batch_size=1000 is above the largest client's" in err
