"""Components declared outside the package (tests/plugin_example.py) run from the command line,
from a sweep and from an installed package's entry point."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dp import components
from fedjax_dp.cli import main

HERE = pathlib.Path(__file__).resolve().parent
SMALL = ["--num-clients", "20", "--local-steps", "1", "--model", "mlp", "--no-progress",
         "--algorithm", "fedavg", "--byzantine", "2", "--aggregator", "shrunk_mean",
         "--attack", "constant_rows"]


@pytest.fixture
def plugin_path(monkeypatch):
  """The folder of plugin_example.py importable; the registry and the imported modules as they
  were after the test (the plugin's components do not leak into other tests)."""
  for kind in components.KINDS:  # the built-ins declared before the copy, so none is lost
    components.names(kind)
  monkeypatch.setattr(components, "_REGISTRY",
                      {k: dict(v) for k, v in components._REGISTRY.items()})
  monkeypatch.syspath_prepend(str(HERE))
  monkeypatch.delitem(sys.modules, "plugin_example", raising=False)
  yield HERE
  sys.modules.pop("plugin_example", None)


def test_a_plugin_aggregator_and_attack_run_from_the_command_line(tmp_path, plugin_path):
  out = tmp_path / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", "--plugin", "plugin_example",
                         *SMALL, "--rounds", "1", "--set", "shrink=0.25", "--set", "row_value=7",
                         "--output-dir", str(out)], capture_output=True, text=True, timeout=600,
                        env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.loads((out / "summary.json").read_text())
  config = summary["config"]
  assert config["run"]["plugins"] == ["plugin_example"]
  nested = config["algorithm"]  # each option sits with the component that declares it
  assert nested["aggregator"] == {"name": "shrunk_mean", "shrink": 0.25}
  assert nested["attack"] == {"name": "constant_rows", "byzantine": 2, "row_value": 7}
  # The recorded configuration is a valid --config: it loads the plugin itself.
  recorded = tmp_path / "recorded.json"
  recorded.write_text(json.dumps(config))
  again = tmp_path / "again"
  assert main(["run", "--config", str(recorded), "--no-progress", "--output-dir", str(again)]) == 0
  final = lambda folder: {k: json.loads((folder / "summary.json").read_text())[k]
                          for k in ("final_test_loss", "params_sha256")}
  assert final(again) == final(out)
  # The plugin's option is refused where its component does not run, like a built-in's.
  assert main(["run", "--plugin", "plugin_example", *SMALL[:8], "--rounds", "1",
               "--set", "shrink=0.5", "--output-dir", str(tmp_path / "no")]) == 2


def test_a_plugin_option_is_a_sweep_axis(tmp_path, plugin_path, capsys):
  out = tmp_path / "sweep"
  assert main(["sweep", "--plugin", "plugin_example", *SMALL, "--rounds", "1",
               "--threads", "1", "--grid", "shrink=0.1,0.9", "--output-dir", str(out)]) == 0
  results = json.loads((out / "results.json").read_text())
  rows = results["rows"]
  assert [r["grid"]["shrink"] for r in rows] == [0.1, 0.9]
  trained = [json.loads((out / "experiments" / f"{i:03d}" / "summary.json").read_text())
             ["params_sha256"] for i in range(2)]
  assert trained[0] != trained[1]
  assert "in 1 compiled programs" in capsys.readouterr().out  # a numeric option: one program


def test_algorithms_lists_a_plugins_components(plugin_path, capsys):
  assert main(["algorithms", "--plugin", "plugin_example"]) == 0
  text = capsys.readouterr().out
  assert "--aggregator shrunk_mean: the realized-weight mean times a factor" in text
  assert "--set shrink=VALUE  (default 0.5; a finite number in [0, 1])" in text
  assert "--attack constant_rows: every attacker sends a row of one value" in text
  assert "fedavg_in_tens" in text


def test_a_plugin_algorithms_defaults_apply_to_the_settings_not_given(plugin_path):
  from fedjax_dp.config import make_config
  config = make_config(algorithm="fedavg_in_tens", plugins=["plugin_example"])
  assert (config.sampling, config.cohort_size) == ("fixed", 10)
  assert make_config(algorithm="fedavg_in_tens", plugins=["plugin_example"],
                     cohort_size=12).cohort_size == 12


def test_a_bad_plugin_is_refused_in_one_line(tmp_path, capsys):
  assert main(["run", "--plugin", "no_such_plugin_module", "--rounds", "1",
               "--output-dir", str(tmp_path / "o")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "invalid plugin='no_such_plugin_module'" in err[0]
  assert not (tmp_path / "o").exists()


def test_a_plugin_attacks_static_option_reaches_the_round(plugin_path):
  from fedjax_dp.algorithms import build
  from fedjax_dp.config import make_config
  from fedjax_dp.data import Split, load_federated
  data = load_federated("digits", Split(10), seed=0)
  rows = {}
  for sign in ("plus", "minus"):
    config = make_config(algorithm="median", plugins=["plugin_example"], model="mlp",
                         byzantine=2, attack="constant_rows", num_clients=10,
                         options={"row_sign": sign, "row_value": 2.0})
    setup = build(config, data)
    assert dict(setup.program.attack_options) == {"row_sign": sign}
    attack = setup.program.build_attack(setup.hparams)
    rows[sign] = attack(np.zeros((3, 2), np.float32), np.array([0.0, 1.0, 1.0], np.float32),
                        None, mask=None, ids=None)
  np.testing.assert_array_equal(rows["plus"], [[0, 0], [2, 2], [2, 2]])
  np.testing.assert_array_equal(rows["minus"], -rows["plus"])


def test_an_installed_package_declares_its_components_through_the_entry_point_group(
    tmp_path, plugin_path, monkeypatch):
  dist = tmp_path / "plugin_example-1.0.dist-info"
  dist.mkdir()
  (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-example\nVersion: 1.0\n")
  (dist / "entry_points.txt").write_text(f"[{components.ENTRY_POINTS}]\nexample = plugin_example\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(components, "_LOADED", set())  # the next look-up reads the entry points
  assert "constant_rows" in components.names("attack")
  assert "shrunk_mean" in components.names("aggregator")


def test_an_option_two_aggregators_declare_is_read_as_the_running_one_declares_it(plugin_path):
  from fedjax_dp.algorithms import read_options
  from fedjax_dp.components import Option, declare
  from fedjax_dp.config import RunConfig
  from fedjax_dp.errors import ConfigError
  for name, high in (("narrow", 1.0), ("wide", 10.0)):
    declare("aggregator", name, options=(Option("spread", 0.5, "a bound", low=0, high=high),))(
        lambda spread: None)
  opts = read_options(RunConfig(algorithm="fedavg", aggregator="wide", options={"spread": 5.0}))
  assert opts["spread"] == 5.0
  with pytest.raises(ConfigError, match=r"invalid option spread=5.0: must be a finite number in "
                     r"\[0, 1\]"):
    read_options(RunConfig(algorithm="fedavg", aggregator="narrow", options={"spread": 5.0}))
