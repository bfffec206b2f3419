"""Bad input to the Python API and config files: a ConfigError naming the field, the value and
what is allowed, before any data set loads or anything compiles (never a Python traceback)."""

import numpy as np
import pytest

from fedjax_dp.client import DPSGDSteps, dp_sgd
from fedjax_dp.config import RunConfig, load_config_file, make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.sweep import Programs, plan, sweep


def _no_loading(cfg):
  pytest.fail(f"loaded data for a refused sweep ({cfg})")


def _base(**kw):
  return make_config(**{"num_clients": 20, "rounds": 1, "model": "mlp", "target_epsilon": None,
                        "noise_multiplier": 1.0, **kw})


@pytest.mark.parametrize("base", [[1, 2], "abc", [], 0, ("rounds", 1)])
def test_make_config_refuses_a_base_that_is_not_a_mapping(base):
  with pytest.raises(ConfigError) as e:
    make_config(base)
  assert e.value.field == "base" and e.value.value == base
  assert "mapping" in str(e.value)


def test_make_config_refuses_a_run_config_as_base_pointing_to_replace():
  with pytest.raises(ConfigError, match=r"invalid base=RunConfig\(.*\.replace") as e:
    make_config(RunConfig(), rounds=2)
  assert e.value.field == "base"


def test_make_config_still_takes_a_mapping_or_nothing():
  assert make_config({"rounds": 3}, clip=0.2).rounds == 3
  assert make_config(None).rounds == RunConfig().rounds
  assert make_config().clip == RunConfig().clip


@pytest.mark.parametrize("values", [0.1, "0.1", "0.1,0.3", {0.1, 0.3}, b"0.1", None,
                                    np.array([[0.1, 0.3]])])
def test_a_grid_axis_whose_values_are_not_a_list_or_tuple_is_refused(values):
  with pytest.raises(ConfigError) as e:
    sweep(_base(), {"clip": values}, load=_no_loading)
  assert e.value.field == "grid['clip']"
  assert e.value.value is values
  assert "list or tuple" in str(e.value)
  with pytest.raises(ConfigError, match=r"invalid grid\['clip'\]="):
    plan(_base(), {"clip": values})


def test_a_grid_that_is_not_a_mapping_is_refused():
  with pytest.raises(ConfigError, match="invalid grid=.*must be a mapping"):
    sweep(_base(), [("clip", [0.1])], load=_no_loading)


def test_grid_values_as_list_tuple_range_or_1d_array_are_taken():
  assert [p.config.clip for p in plan(_base(), {"clip": [0.1, 0.3]})] == [0.1, 0.3]
  assert [p.config.clip for p in plan(_base(), {"clip": ("0.1", "0.3")})] == [0.1, 0.3]
  assert [p.config.local_steps for p in plan(_base(), {"local_steps": range(1, 3)})] == [1, 2]
  assert [p.config.clip for p in plan(_base(), {"clip": np.array([0.1, 0.3])})] == [0.1, 0.3]


@pytest.mark.parametrize("group_size", [1.5, "2", True, 0, -1, 2.0])
def test_sweep_refuses_a_group_size_that_is_not_an_integer_at_least_one(group_size):
  with pytest.raises(ConfigError) as e:
    sweep(_base(), {"clip": [0.1]}, programs=Programs(group_size=group_size), load=_no_loading)
  assert e.value.field == "group_size" and e.value.value is group_size
  assert "integer >= 1" in str(e.value)


def test_a_numpy_integer_group_size_is_an_integer():
  from fedjax_dp.sweep import programs_at_once
  assert programs_at_once(np.int64(2), 1, [None]) == 1


@pytest.mark.parametrize("config", [{"rounds": 1}, "digits", 3])
def test_sweep_refuses_a_config_that_is_not_a_run_config(config):
  with pytest.raises(ConfigError, match=r"make_config\(\*\*") as e:
    sweep(config=config, grid={"clip": [0.1]}, load=_no_loading)
  assert e.value.field == "config" and e.value.value is config
  with pytest.raises(ConfigError, match="invalid config="):
    plan(config, {"clip": [0.1]})


def test_too_few_labels_per_client_names_the_min_labels_per_client_setting():
  from fedjax_dp.experiment import load_data
  # 20 shards of ~72 digits sorted by label: fewer than 10 shards straddle two labels, so no
  # deal gives each of the 10 clients 4 labels.
  cfg = make_config(num_clients=10, partition="shards", shards_per_client=2,
                    min_labels_per_client=4)
  with pytest.raises(ConfigError, match=r"^invalid min_labels_per_client=4: no deal") as e:
    load_data(cfg)
  assert e.value.field == "min_labels_per_client"


def test_shards_partitioner_names_min_labels_per_client_in_its_range_check():
  from fedjax_dp.data import partition
  labels = np.repeat(np.arange(10), 10)
  with pytest.raises(ConfigError, match=r"^invalid min_labels_per_client=5: must be in \[1, "):
    partition.shards(labels, 10, 2, np.random.default_rng(0), min_labels=5)


def test_a_config_file_key_given_twice_is_named_as_the_field_with_the_file(tmp_path):
  path = tmp_path / "c.json"
  path.write_text('{"rounds": 1, "clip": 0.2, "rounds": 3}')
  with pytest.raises(ConfigError) as e:
    load_config_file(str(path))
  assert e.value.field == "rounds" and e.value.value == 3
  message = str(e.value)
  assert message.startswith("invalid rounds=3: ") and str(path) in message
  assert "given twice" in message and "first 1" in message
  nested = tmp_path / "n.json"
  nested.write_text('{"options": {"lambda": 0.1, "lambda": 0.2}}')
  with pytest.raises(ConfigError, match=r"^invalid lambda=0\.2: .*given twice") as e:
    load_config_file(str(nested))
  assert str(nested) in str(e.value)


def test_a_config_file_key_given_twice_on_the_command_line(tmp_path, capsys):
  from fedjax_dp.cli import main
  path = tmp_path / "c.json"
  path.write_text('{"rounds": 1, "rounds": 3}')
  assert main(["run", "--config", str(path), "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "invalid rounds=3: " in err and str(path) in err and len(err.splitlines()) == 1
  assert not (tmp_path / "o").exists()


def test_an_empty_data_dir_is_refused_showing_the_empty_value(tmp_path, capsys, monkeypatch):
  from fedjax_dp.cli import main
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)
  with pytest.raises(ConfigError, match=r"^invalid data_dir='': ") as e:
    make_config(dataset="mnist", data_dir="")
  assert e.value.field == "data_dir" and e.value.value == ""
  assert main(["run", "--dataset", "mnist", "--data-dir", "", "--output-dir",
               str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err
  assert "invalid data_dir='': " in err and len(err.splitlines()) == 1
  assert not (tmp_path / "o").exists()


def test_the_loaders_show_the_data_dir_given_when_no_folder_results(monkeypatch):
  from fedjax_dp import data
  monkeypatch.delenv("FEDJAX_DP_DATA", raising=False)
  with pytest.raises(ConfigError, match=r"^invalid data_dir='': ") as e:
    data.load_central("mnist", data_dir="")
  assert e.value.value == ""
  with pytest.raises(ConfigError, match=r"^invalid data_dir=None: no data directory given"):
    data.load_central("mnist")


def test_accounting_workers_started_are_at_most_one_per_core_or_the_automatic_limit():
  # Each worker is a Python process: 1,000 of them hung a 2-core machine. The configuration keeps
  # the number asked for (a run stored on a larger machine resumes here); the run starts fewer.
  import os
  from fedjax_dp.privacy.ahead import MAX_AUTO_WORKERS, workers_for
  cap = max(MAX_AUTO_WORKERS, os.cpu_count() or 1)
  assert make_config(accountant="pld", accounting_workers=1000).accounting_workers == 1000
  assert workers_for(1000, "cpu") == cap and workers_for(1, "cpu") == 1
  assert workers_for(0, "gpu") == 0 and workers_for(None, "cpu") == 0


@pytest.mark.parametrize("kw, field", [
    (dict(local_steps=0), "local_steps"), (dict(batch_size=0), "batch_size"),
    (dict(sampling="uniform"), "example_sampling"), (dict(capacity=9), "capacity"),
    (dict(sampling="fixed", batch_size=9), "capacity")])
def test_dp_sgd_steps_refuse_numbers_out_of_range(kw, field):
  with pytest.raises(ConfigError, match=f"invalid {field}="):
    DPSGDSteps(**{"local_steps": 1, "batch_size": 2, "max_examples": 5, **kw})


def test_dp_sgd_refuses_an_unknown_statistic_before_tracing():
  with pytest.raises(ConfigError, match="invalid statistic='median'"):
    dp_sgd(lambda params, batch, anchor: 0.0, DPSGDSteps(1, 2, 5, statistic="median"))
