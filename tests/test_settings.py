"""Settings that follow the algorithm: a configuration nests as run settings plus the
algorithm's, which nest its aggregator's and attack's (fedjax_dp.config.nest / unnest)."""

import json

import pytest

from fedjax_dp import components
from fedjax_dp.config import (ALGORITHM, RUN, block, load_config_file, make_config, nest,
                              unnest)
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import recorded_config


def _byzantine(name):
  return ({"byzantine": 3, "attack": "sign_flip"}
          if components.get("algorithm", name)["byzantine"] else {})


@pytest.mark.parametrize("name", components.names("algorithm"))
def test_every_algorithms_recorded_configuration_nests_and_loads_back(name):
  config = make_config(algorithm=name, **_byzantine(name))
  recorded = recorded_config(config)
  assert set(recorded) == {RUN, ALGORITHM, "not_used"}
  reads = components.get("algorithm", name)["reads"]
  # The algorithm's block holds what it reads; nothing it leaves unread is anywhere.
  assert {k for k in recorded[ALGORITHM] if k in reads} == reads - set(recorded["not_used"])
  assert not set(recorded[RUN]) & set(recorded["not_used"])
  again = make_config({k: v for k, v in recorded.items() if k != "not_used"})
  assert dict(again.to_dict(), model=None) == dict(config.to_dict(), model=None)
  assert again.model_name == config.model_name


def test_each_option_sits_with_the_component_that_declares_it():
  config = make_config(algorithm="trimmed_mean", byzantine=2, attack="alie",
                       options={"trim_beta": 0.2, "alie_z": 1.5})
  nested = recorded_config(config)[ALGORITHM]
  assert nested["aggregator"] == {"name": None, "trim_beta": 0.2}  # the algorithm's own
  assert nested["attack"] == {"name": "alie", "byzantine": 2, "alie_z": 1.5}
  lus = recorded_config(make_config(algorithm="blur+lus", options={"lambda": 0.3}))[ALGORITHM]
  assert lus["name"] == "blur+lus" and lus["lambda"] == 0.3 and lus["clip"] == 0.5
  assert nest({"algorithm": "fedavg"}) == {ALGORITHM: {"name": "fedavg"}}


def test_a_setting_in_another_block_is_refused_naming_its_own(tmp_path):
  with pytest.raises(ConfigError, match=r"run\.clip.*belongs in algorithm"):
    unnest({"run": {"clip": 1.0}})
  with pytest.raises(ConfigError, match=r"algorithm\.rounds.*belongs in run"):
    unnest({"algorithm": {"rounds": 3}})
  with pytest.raises(ConfigError, match=r"algorithm\.byzantine.*belongs in algorithm\.attack"):
    unnest({"algorithm": {"byzantine": 3}})
  with pytest.raises(ConfigError, match=r"run\.lambda.*must be a setting of the run"):
    unnest({"run": {"lambda": 0.3}})
  with pytest.raises(ConfigError, match="give each option once"):
    unnest({"algorithm": {"alie_z": 1.0, "attack": {"alie_z": 2.0}}})
  with pytest.raises(ConfigError, match="'run' or 'algorithm'"):
    unnest({"run": {}, "data": {}})
  with pytest.raises(ConfigError, match="must be a JSON object"):
    unnest({"run": [1]})
  assert block("local_steps") == ALGORITHM and block("seed") == RUN
  assert block("attacker_knowledge") == "algorithm.attack"


def test_config_files_load_nested_or_flat(tmp_path):
  nested = tmp_path / "nested.json"
  nested.write_text(json.dumps({"run": {"rounds": 3}, "algorithm": {
      "name": "median", "attack": {"name": "ipm", "byzantine": 2, "ipm_epsilon": 0.5}},
      "not_used": ["clip"]}))
  flat = tmp_path / "flat.json"
  flat.write_text(json.dumps({"rounds": 3, "algorithm": "median", "attack": "ipm",
                              "byzantine": 2, "options": {"ipm_epsilon": 0.5}}))
  assert load_config_file(str(nested)) == load_config_file(str(flat))
  assert make_config(load_config_file(str(nested))) == make_config(load_config_file(str(flat)))


def test_a_natural_partition_defaults_to_its_data_sets_clients():
  config = make_config(dataset="shakespeare", partition="natural")
  assert config.num_clients == 715  # TFF's training file's clients, not the field's 700
  assert make_config(dataset="shakespeare", partition="natural", num_clients=50).num_clients == 50
  assert make_config(dataset="shakespeare").num_clients == 700  # iid: the field's default
  # A change of partition resolves again what was not given (a sweep's grid point).
  assert make_config(dataset="shakespeare").replace(partition="natural").num_clients == 715
