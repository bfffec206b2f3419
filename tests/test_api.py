"""The public API: what ``fedjax_dp`` exports, importable from the package alone."""

import subprocess
import sys

import pytest

import fedjax_dp


@pytest.mark.parametrize("name", [n for n in fedjax_dp.__all__ if n != "__version__"])
def test_every_public_name_resolves_to_its_module_object(name):
  module, attribute = fedjax_dp._EXPORTS[name]
  value = getattr(fedjax_dp, name)
  target = sys.modules[module]
  assert value is (target if attribute is None else getattr(target, attribute))
  assert name in dir(fedjax_dp)


def test_an_unknown_name_is_an_attribute_error():
  with pytest.raises(AttributeError, match="no attribute 'simulte'"):
    fedjax_dp.simulte  # noqa: B018


def test_the_package_import_loads_no_jax():
  code = "import sys, fedjax_dp; print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_the_declaration_api_is_the_registry():
  from fedjax_dp import components
  assert fedjax_dp.declare is components.declare
  assert fedjax_dp.component("aggregator", "mean") is components.get("aggregator", "mean")
  assert "trimmed_mean" in fedjax_dp.component_names("aggregator")
