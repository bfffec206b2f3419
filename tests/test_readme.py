"""The README's Python examples run as written (at their stated, small sizes)."""

import math
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_block(heading: str) -> str:
  """The first ```python block after ``heading`` in the README."""
  text = README.read_text()
  start = text.index(heading)
  m = re.search(r"```python\n(.*?)```", text[start:], re.S)
  assert m, f"no python block after {heading!r}"
  return m.group(1)


def test_write_your_own_algorithm_example_runs_and_derives_its_privacy(capsys):
  scope = {}
  exec(compile(_python_block("### Write your own algorithm"), "README", "exec"), scope)
  s = scope["result"].summary
  assert s["formal_guarantee"] is True and 0 < s["epsilon"] < math.inf
  assert 0.0 <= s["final_accuracy"] <= 1.0 and s["rounds"] == 10
  assert s["noise_multiplier"] == pytest.approx(1.0)
  # The same round with a median: no piece adds noise, so no guarantee.
  import dataclasses
  import fedjax_dp
  median = dataclasses.replace(scope["rnd"], aggregator=lambda hp: fedjax_dp.aggregators.robust.get(
      "coordinate_median"))
  r = fedjax_dp.simulate(round=median, num_clients=200, rounds=1,
                         hparams={"mu": 0.1, "client_lr": 0.1, "clip": 0.5, "noise_multiplier": 1.0})
  assert r.summary["formal_guarantee"] is False and r.summary["epsilon"] is None


def test_python_api_example_runs_with_a_flax_module():
  pytest.importorskip("pandas")
  code = _python_block("### From Python").replace("rounds=20", "rounds=2")
  scope = {}
  exec(compile(code, "README", "exec"), scope)
  result = scope["result"]
  assert result.summary["model"]["name"] == "Net" and result.summary["config"]["model"] == "Net"
  assert result.summary["data"]["name"] == "digits"
  acc = result.metrics["test_accuracy"]
  assert acc.shape == (2,) and 0 <= acc[-1] <= 1
  df = result.to_dataframe()
  assert list(df.index) == [1, 2] and "epsilon" in df.columns and "train_loss" in df.columns
