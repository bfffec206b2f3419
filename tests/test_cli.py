"""The command line: run, privacy, and clear one-line errors with exit status 2."""

import json
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting import rdp

from fedjax_dp.cli import main

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
    (["run", "--algorithm", "fedsgd"], "algorithm"),
    (["privacy", "--sampling-prob", "2", "--noise-multiplier", "1", "--rounds", "10", "--delta", "1e-5"], "sampling_prob"),
    (["privacy", "--sampling-prob", "0.1", "--noise-multiplier", "1", "--rounds", "10", "--delta", "0"], "delta"),
])
def test_bad_input_exits_2_with_one_line(args, field, capsys, tmp_path):
  out_dir = tmp_path / "out"
  if args[0] == "run":
    args = args + ["--output-dir", str(out_dir)]
  assert main(args) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and field in err and "Traceback" not in err
  assert not out_dir.exists()  # nothing written before validation


def test_unknown_algorithm_option_is_rejected(capsys, tmp_path):
  assert main(["run", *TINY, "--set", "lamda=0.4", "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "option" in err and "lamda" in err and "dp_fedavg" in err
  assert not (tmp_path / "o" / "metrics.jsonl").exists()


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
  for key in ("train_loss", "epsilon", "update_norm", "fraction_clipped", "seconds", "test_accuracy"):
    assert key in rows[-1]
  summary = json.loads((out / "summary.json").read_text())
  for key in ("final_accuracy", "epsilon", "delta", "rounds", "config", "noise_multiplier"):
    assert key in summary
  assert summary["config"]["num_clients"] == 40 and summary["rounds"] == 2
  before = (out / "metrics.jsonl").read_text()
  assert main(["run", *TINY, "--output-dir", str(out)]) == 2  # an earlier run is not overwritten
  assert "output_dir" in capsys.readouterr().err
  assert (out / "metrics.jsonl").read_text() == before


def test_run_with_config_file_and_noise_multiplier(tmp_path, capsys):
  cfg = tmp_path / "c.json"
  cfg.write_text(json.dumps({"num_clients": 40, "rounds": 2, "local_steps": 2, "model": "mlp", "noise_multiplier": 1.3}))
  assert main(["run", "--config", str(cfg), "--no-progress", "--output-dir", str(tmp_path / "o")]) == 0
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  assert summary["noise_multiplier"] == 1.3 and summary["config"]["target_epsilon"] is None
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
  assert main(["privacy", "--sampling-prob", "0.04", "--noise-multiplier", "1.1", "--rounds", "30",
               "--delta", "1e-5", "--accountant", "pld"]) == 0
  assert json.loads(capsys.readouterr().out)["accountant"] == "pld"
