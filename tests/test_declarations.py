"""Algorithms declared once: their defaults of run settings, and the compile cache keyed by the
declarations."""

import json

import pytest

from fedjax_dp import components
from fedjax_dp.algorithms import unused_fields
from fedjax_dp.cli import main
from fedjax_dp.config import make_config, unnest

# Settings that make a run small, given where the algorithm declares no default of its own for
# them (the population stays where its cohort needs it).
SMALL = {"num_clients": "20", "max_test": "50", "eval_every": "1", "model": "mlp",
         "local_steps": "1"}


@pytest.mark.parametrize("name", components.names("algorithm"))
def test_every_algorithm_runs_one_round_with_its_own_defaults(name, tmp_path, capsys):
  own = components.get("algorithm", name)["defaults"]
  unread = set(unused_fields(make_config(algorithm=name)))
  small = {k: v for k, v in SMALL.items() if k not in own and k not in unread
           and not (k == "num_clients" and "cohort_size" in own)}
  flags = [x for k, v in small.items() for x in (f"--{k.replace('_', '-')}", v)]
  out = tmp_path / "run"
  assert main(["run", "--algorithm", name, "--rounds", "1", "--no-progress", "--output-dir",
               str(out), *flags]) == 0, capsys.readouterr().err
  recorded = json.loads((out / "summary.json").read_text())["config"]
  recorded = unnest({k: v for k, v in recorded.items() if k != "not_used"})
  for field, value in own.items():  # the run ran with them, and its record says so
    assert recorded[field] == value


def test_the_algorithms_defaults_apply_where_the_user_gave_nothing(tmp_path):
  assert (make_config(algorithm="ddgauss").sampling, make_config(algorithm="ddgauss").cohort_size
          ) == ("fixed", 70)
  given = make_config(algorithm="ddgauss", sampling="poisson", noise_multiplier=1.0,
                      target_epsilon=None)
  assert given.sampling == "poisson"  # what the user gives wins
  from fedjax_dp.experiment import recorded_config
  assert "cohort_size" in recorded_config(given)["not_used"]  # a default it does not read
  assert make_config().sampling == "poisson"  # another algorithm keeps the field's default
  # A change of algorithm resolves again what was not given (a sweep's grid point, simulate's
  # keywords on a configuration); what was given stays.
  moved = make_config(rounds=3).replace(algorithm="ddgauss")
  assert (moved.sampling, moved.cohort_size, moved.rounds) == ("fixed", 70, 3)
  back = moved.replace(algorithm="dp_fedavg")
  assert (back.sampling, back.cohort_size) == ("poisson", None)
  kept = make_config(sampling="fixed", cohort_size=7).replace(algorithm="ddgauss")
  assert kept.cohort_size == 7
  from fedjax_dp.sweep import plan
  points = plan(make_config(rounds=1), {"algorithm": ["dp_fedavg", "ddgauss"]})
  assert [p.config.sampling for p in points] == ["poisson", "fixed"]


def test_a_recorded_configuration_holds_the_resolved_values_and_runs_again(tmp_path):
  from fedjax_dp.experiment import recorded_config
  recorded = recorded_config(make_config(algorithm="ddgauss", rounds=1))
  assert (recorded["run"]["sampling"], recorded["run"]["cohort_size"]) == ("fixed", 70)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(recorded))
  from fedjax_dp.config import load_config_file
  again = make_config(load_config_file(str(path)))
  assert again == make_config(algorithm="ddgauss", rounds=1, model=recorded["run"]["model"])


def _setup(digits, algorithm, **options):
  from fedjax_dp.algorithms import build
  config = make_config(algorithm=algorithm, num_clients=digits.num_clients, model="mlp",
                       rounds=1, sampling="fixed", cohort_size=4, options=options)
  return build(config, digits)


@pytest.fixture(scope="module")
def digits():
  from fedjax_dp.data import Split, load_federated
  return load_federated("digits", Split(10), seed=0)


def test_runs_that_differ_in_a_static_option_get_their_own_round(digits):
  one = _setup(digits, "blur+lus", lus_batches=1, **{"lambda": 0.1})
  # Numbers go into the hyper-parameters: the same round, hence the same compiled step.
  assert _setup(digits, "blur+lus", lus_batches=1, **{"lambda": 0.2}).program is one.program
  assert _setup(digits, "blur+lus", lus_batches=2).program is not one.program
  # So do the static options of the aggregator and the attack the run takes.
  gm = _setup(digits, "gm", gm_tol=1e-3)
  assert _setup(digits, "gm", gm_tol=1e-4).program is gm.program
  assert _setup(digits, "gm", gm_max_iter=3).program is not gm.program
  # And another algorithm over the same pieces is another round.
  assert _setup(digits, "dp_fedavg+lus").program is not one.program


def test_the_round_cache_keeps_the_most_recently_used(monkeypatch):
  from fedjax_dp.algorithms import base
  monkeypatch.setattr(base, "_ROUNDS", type(base._ROUNDS)())
  monkeypatch.setattr(base, "MAX_ROUNDS", 2)
  made = []
  make = lambda key: base.cached_round(key, lambda: made.append(key) or object())
  a = make("a")
  make("b")
  assert make("a") is a  # used again: now the most recent
  make("c")  # the least recently used, "b", goes
  assert list(base._ROUNDS) == ["a", "c"] and made == ["a", "b", "c"]
  make("b")
  assert made[-1] == "b" and len(base._ROUNDS) == 2
