"""Strict JSON output: non-finite floats are written as null with the reason beside them."""

import json
import math

import numpy as np
import pytest

from fedjax_dp import jsonio


def _strict_loads(s):
  """json.loads that refuses NaN, Infinity and -Infinity (as strict JSON parsers do)."""
  return json.loads(s, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_strict_parser_refuses_python_json_constants():
  with pytest.raises(ValueError):
    _strict_loads(json.dumps({"epsilon": math.inf}))


def test_scalars_in_dicts_become_null_with_a_reason():
  obj = {"epsilon": math.inf, "low": -math.inf, "loss": math.nan, "delta": 1e-5, "name": "x",
         "nested": {"acc": float("nan"), "ok": 0.5}}
  out = _strict_loads(jsonio.dumps(obj))
  assert out == {"epsilon": None, "epsilon_nonfinite": "Infinity",
                 "low": None, "low_nonfinite": "-Infinity",
                 "loss": None, "loss_nonfinite": "NaN",
                 "delta": 1e-5, "name": "x",
                 "nested": {"acc": None, "acc_nonfinite": "NaN", "ok": 0.5}}
  assert obj["epsilon"] == math.inf  # the input is not modified


def test_lists_hold_null_and_the_dict_says_so():
  obj = {"history": [1.0, math.nan, [math.inf, 2.0]], "clean": [1.0, 2.0],
         "rows": [{"a": math.inf}, {"a": 1.0}], "pair": (math.nan, 1)}
  out = _strict_loads(jsonio.dumps(obj))
  assert out["history"] == [1.0, None, [None, 2.0]]
  assert out["history_nonfinite"] == "list holds NaN/Infinity values written as null"
  assert out["clean"] == [1.0, 2.0] and "clean_nonfinite" not in out
  assert out["rows"] == [{"a": None, "a_nonfinite": "Infinity"}, {"a": 1.0}]
  assert "rows_nonfinite" not in out  # each inner dict carries its own reason
  assert out["pair"] == [None, 1] and "pair_nonfinite" in out
  assert _strict_loads(jsonio.dumps([math.nan, {"b": -math.inf}])) == [None, {"b": None, "b_nonfinite": "-Infinity"}]
  assert _strict_loads(jsonio.dumps(math.inf)) is None


def test_numpy_values_become_python_values():
  obj = {"f32": np.float32(0.25), "f64nan": np.float64("nan"), "f32inf": np.float32("inf"),
         "i": np.int64(3), "b": np.bool_(True), "arr": np.array([1.0, np.nan, np.inf]),
         "iarr": np.arange(3, dtype=np.int32), "zero_d": np.array(2.5), np.int64(7): "int key"}
  s = jsonio.dumps(obj)
  out = _strict_loads(s)
  assert out["f32"] == 0.25 and out["i"] == 3 and out["b"] is True and out["iarr"] == [0, 1, 2]
  assert out["f64nan"] is None and out["f64nan_nonfinite"] == "NaN"
  assert out["f32inf"] is None and out["f32inf_nonfinite"] == "Infinity"
  assert out["arr"] == [1.0, None, None] and "arr_nonfinite" in out
  assert out["zero_d"] == 2.5 and out["7"] == "int key"
  clean = jsonio.sanitize(obj)
  assert type(clean["f32"]) is float and type(clean["i"]) is int and type(clean["b"]) is bool


def test_dumps_passes_indent_and_default_and_never_allows_nan():
  class Thing:
    pass

  s = jsonio.dumps({"a": 1, "t": Thing()}, indent=2, default=lambda o: "thing")
  assert s.startswith("{\n  ") and _strict_loads(s) == {"a": 1, "t": "thing"}
  s = jsonio.dumps({"t": Thing()}, default=lambda o: math.nan)  # what default returns is cleaned too
  assert _strict_loads(s) == {"t": None}
  with pytest.raises(TypeError):
    jsonio.dumps({"t": Thing()})
  assert _strict_loads(jsonio.dumps({"x": math.inf}, allow_nan=True)) == {"x": None, "x_nonfinite": "Infinity"}
