"""The component registry: declarations, look-ups, option parsing and the static key."""

import pytest

from fedjax_dp import components
from fedjax_dp.components import Component, Option
from fedjax_dp.errors import ConfigError


@pytest.fixture
def registry(monkeypatch):
  """An empty registry whose kinds count as loaded (no built-in module is imported)."""
  monkeypatch.setattr(components, "_REGISTRY", {kind: {} for kind in components.KINDS})
  monkeypatch.setattr(components, "_LOADED", set(components.KINDS) | {"entry points"})
  return components._REGISTRY


def test_a_declared_component_is_found_by_kind_and_name(registry):
  @components.declare("aggregator", "halve", reference="a note", about="half the mean",
                      options=(Option("factor", 0.5, "the factor", low=0),), linear=True)
  def halve(factor):
    return factor

  c = components.get("aggregator", "halve")
  assert c.build is halve and c.module == __name__ and c["linear"] is True
  assert components.names("aggregator") == ("halve",)
  assert c.defaults == {"factor": 0.5}
  with pytest.raises(TypeError):
    c.traits["linear"] = False  # declared facts are read-only


def test_an_unknown_name_or_kind_is_refused_naming_the_declared_ones(registry):
  components.register(Component("attack", "loud", lambda: None))
  with pytest.raises(ConfigError, match=r"invalid attack='quiet': must be one of \['loud'\]"):
    components.get("attack", "quiet")
  with pytest.raises(ConfigError, match="component kind"):
    components.get("optimizer", "sgd")
  with pytest.raises(ConfigError, match=r"\['loud'\] \(did you mean 'loud'\?\)$"):
    components.get("attack", "lound")


def test_a_name_taken_by_another_module_is_refused(registry):
  components.register(Component("attack", "loud", lambda: None, module="one"))
  components.register(Component("attack", "loud", lambda: None, module="one"))  # a reload
  with pytest.raises(ConfigError, match="already declared by one"):
    components.register(Component("attack", "loud", lambda: None, module="two"))


def test_an_option_name_with_two_meanings_across_kinds_is_refused(registry):
  components.register(Component("attack", "a", None, options=(Option("scale", 1.0, "x"),)))
  # The same declaration in another kind is fine, and so are two meanings within one kind.
  components.register(Component("aggregator", "c", None, options=(Option("scale", 1.0, "x"),)))
  components.register(Component("aggregator", "d", None, options=(Option("tau", 1.0, "x"),)))
  components.register(Component("aggregator", "e", None, options=(Option("tau", 2.0, "y"),)))
  with pytest.raises(ConfigError, match="already an option of aggregator c"):
    components.register(Component("attack", "b", None, options=(Option("scale", 3.0, "z"),)))


def test_values_parse_python_values_and_default_the_others():
  c = Component("aggregator", "x", None, options=(
      Option("tau", 1.0, "radius", low=0, low_open=True),
      Option("iters", 1, "loop count", kind="int", low=1, static=True),
      Option("norm", "l2", "which norm", kind="choice", choices=("l2", "linf"))))
  # Numeric options are read from the first mapping, static ones from the second.
  assert c.values({"other": 5}, {"iters": 3.0}) == {"tau": 1.0, "iters": 3, "norm": "l2"}
  assert isinstance(c.values({}, {"iters": 3.0})["iters"], int)
  with pytest.raises(ConfigError, match=r"invalid option tau=0.0: must be a finite number > 0"):
    c.values({"tau": 0.0}, {})
  with pytest.raises(ConfigError, match="must be a finite number"):
    c.values({"tau": "inf"}, {})
  with pytest.raises(ConfigError, match=r"one of \['l2', 'linf'\]"):
    c.values({}, {"norm": "l1"})
  # The static options (a choice always is) make the key.
  values = {"iters": 2, "tau": 0.3}
  assert c.static_key(values) == ("aggregator", "x", (("iters", 2), ("norm", "l2")))
  hash(c.static_key(values))


def test_plugins_are_imported_by_name_and_a_missing_one_is_refused(registry, tmp_path,
                                                                    monkeypatch):
  (tmp_path / "my_plugin_mod.py").write_text(
      "from fedjax_dp import components\n"
      "components.register(components.Component('attack', 'mine', None))\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  components.load_plugins(["my_plugin_mod"])
  assert components.names("attack") == ("mine",)
  with pytest.raises(ConfigError, match="invalid plugin='no_such_module_here'"):
    components.load_plugins(["no_such_module_here"])

