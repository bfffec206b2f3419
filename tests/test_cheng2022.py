"""Cheng et al. 2022 reproduction: the AE-DPFL and DDGauss columns and the CIFAR-10 scales."""

import json
import math

import pytest

from fedjax_dp.reproduce import cheng2022


def test_plan_has_every_column_at_every_epsilon():
  jobs = cheng2022.plan((2.0, 8.0), (), 8.0, 1, 0, "table2", (("cnn2", 0.1), ("cnn2", 1.0)))
  for alpha in (0.1, 1.0):
    for eps in (2.0, 8.0):
      assert {j[3] for j in jobs if j[2] == alpha and j[4] == eps} == set(cheng2022.COLUMNS["table2"])
    assert [j for j in jobs if j[2] == alpha and j[3] == "fedavg"]
  assert set(cheng2022.COLUMNS["table2"]) == {"dp_fedavg", "ae-dpfl", "ddgauss", "blur+lus"}
  assert set(cheng2022.BASELINES) <= set(cheng2022.COLUMNS["table1"])


def test_method_configs():
  base = cheng2022.SCALES["cifar"]["config"]
  dd = cheng2022.method_config(base, "ddgauss", 4.0)
  assert (dd["sampling"], dd["cohort_size"], dd["capacity"]) == ("fixed", 30, None)
  assert dd["target_epsilon"] == 4.0 and dd["noise_multiplier"] is None
  ae = cheng2022.method_config(base, "ae-dpfl", 4.0)
  assert ae["sampling"] == "poisson" and ae["options"] == cheng2022.AE_DPFL_OPTIONS
  assert ae["server_lr"] == base["client_lr"]
  dp = cheng2022.method_config(base, "dp_fedavg", 4.0)
  assert dp["sampling"] == "poisson" and dp["target_epsilon"] == 4.0
  fa = cheng2022.method_config(base, "fedavg", None)
  assert fa["target_epsilon"] is None and fa["noise_multiplier"] == 0.0


@pytest.mark.slow
def test_tiny_cifar_all_columns(shared_data_dir, tmp_path):
  if not (shared_data_dir / "cifar10" / "train.tar.gz").is_file():
    pytest.skip(f"CIFAR-10 tarballs not found under {shared_data_dir / 'cifar10'}")
  out = cheng2022.run_small("tiny-cifar", str(tmp_path), data_dir=str(shared_data_dir),
                            log=lambda *a: None)
  rows = out["rows"]
  assert {r["method"] for r in rows} == set(cheng2022.COLUMNS["table2"]) | {"fedavg"}
  for r in rows:
    assert 0.0 <= r["accuracy_mean"] <= 1.0
    if r["method"] != "fedavg":
      assert math.isfinite(r["epsilon"]) and r["epsilon"] == pytest.approx(8.0, rel=0.02)
  dd = next(r for r in rows if r["method"] == "ddgauss")
  assert (dd["sampling"], dd["cohort_size"]) == ("fixed", 5)
  md = (tmp_path / "results.md").read_text()
  for label in ("DP-FedAvg", "AE-DPFL", "DDGauss", "BLUR+LUS", "Table 2"):
    assert label in md
  assert json.loads((tmp_path / "results.json").read_text())["settings"]["table"] == "table2"
  for name in ("cheng2022_update_norms.png", "cheng2022_accuracy.png"):
    assert (tmp_path / name).is_file()
