"""fedjax-dp audit: the Clopper-Pearson test, every mechanism's bound against its ledger's claim,
mis-calibrated mechanisms caught, no-guarantee mechanisms growing with scale, and the command."""

import json
import math

import jax
from jax.flatten_util import ravel_pytree
import numpy as np
import pytest

from fedjax_dp import audit, audit_one_run, lower_bounds
from fedjax_dp.cli import main
from fedjax_dp.errors import ConfigError
from fedjax_dp.round import CohortBatch, step

TRIALS = 2000  # one compiled release program per audit serves both of its noise factors
SOUND = [k for k, a in audit.AUDITS.items() if a.formal]
UNSOUND = [k for k, a in audit.AUDITS.items() if not a.formal]


def test_lower_bound_of_randomized_response_is_below_its_epsilon_and_not_far():
  # One binary randomized response with keep probability 0.8: epsilon = ln 4 exactly.
  rng = np.random.default_rng(0)
  n = 20000
  r0 = (rng.random(n) > 0.8).astype(float)[:, None]   # world 0: bit 0 kept w.p. 0.8
  r1 = (rng.random(n) < 0.8).astype(float)[:, None]
  b = audit.epsilon_lower_bound(r0, r1, 1e-5, 0.95)
  assert 0.8 * math.log(4) < b["epsilon_lower_bound"] <= math.log(4)
  # Identical worlds: no test beats guessing.
  same = audit.epsilon_lower_bound(r0, r0[::-1], 1e-5, 0.95)
  assert same["epsilon_lower_bound"] < 0.3


@pytest.mark.parametrize("mechanism", SOUND)
def test_sound_mechanism_stays_below_its_claim_and_a_miscalibrated_one_is_caught(mechanism):
  ok = audit.audit(mechanism, trials=TRIALS, seed=1)
  assert ok["formal_guarantee"] and ok["epsilon_claimed"] > 0
  assert 0 <= ok["epsilon_lower_bound"] <= ok["epsilon_claimed"]
  assert 0 <= ok["epsilon_lower_bound_threshold"] <= ok["epsilon_claimed"]
  assert not audit.violations(ok)
  assert ok["tightness"] == pytest.approx(ok["epsilon_lower_bound"] / ok["epsilon_claimed"])
  assert ok["assumption"] == audit.AUDITS[mechanism].family.describe()
  assert ok["epsilon_lower_bound"] <= ok["epsilon_of_release"] <= ok["epsilon_claimed"] * 1.0001
  # The same release with a tenth of the noise (flip probability) while the ledger accounts the
  # nominal one: the audit must see the lie.
  broken = audit.audit(mechanism, trials=TRIALS, seed=1, noise_factor=0.1)
  assert broken["epsilon_claimed"] == ok["epsilon_claimed"]
  assert broken["epsilon_lower_bound"] > broken["epsilon_claimed"], broken
  assert [name for name, _ in audit.violations(broken)][0] == "the family's bound"


def test_fixed_batches_audit_sees_more_than_a_lone_canary_can_show():
  # Under batches drawn without replacement the slot a sampled-out canary leaves goes to another
  # example: with every other example an anti-canary, the release is the add/remove family with
  # twice the signal. The lone canary's pair (a mixture against a mixture, the audit's earlier
  # design) has a smaller exact epsilon than this audit's lower bound.
  rep = audit.audit("dp-sgd-fixed", trials=50_000)
  lone = lower_bounds.Family(48 / 64, replace=True).epsilon(1 / 3, audit.DELTA)  # noise 3 clips
  assert lone < rep["epsilon_lower_bound"] <= rep["epsilon_of_release"] <= rep["epsilon_claimed"]


@pytest.mark.parametrize("mechanism", UNSOUND)
def test_no_guarantee_mechanism_bound_grows_with_scale(mechanism):
  rep = audit.audit(mechanism, trials=TRIALS, scales=(1.0, 100.0))
  assert rep["epsilon_claimed"] is None and rep["formal_guarantee"] is False
  by = rep["lower_bound_by_scale"]
  assert by["100"] > by["1"] + 1.0


def test_command_json_and_exit_status(capsys):
  assert main(["audit", "--mechanism", "dp-rsa-f", "--trials", "200", "--json"]) == 0
  rep = json.loads(capsys.readouterr().out)
  for key in ("epsilon_lower_bound", "epsilon_lower_bound_threshold", "epsilon_claimed", "trials",
              "tightness", "assumption", "keep_prob_lower_bound"):
    assert key in rep
  assert rep["trials"] == 200
  assert main(["audit", "--mechanism", "dp-rsa-f", "--trials", "400", "--noise-factor", "0.1",
               "--json"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert 1 <= len(err) <= 2 and all("exceeds the claimed epsilon" in line for line in err)


def test_table_audits_each_mechanism_at_two_noise_factors(capsys, monkeypatch):
  monkeypatch.setattr(audit, "AUDITS", {"dp-rsa-f": audit.AUDITS["dp-rsa-f"]})
  assert main(["audit", "--table", "--trials", "400"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].startswith("| mechanism | claimed | exact (release) | lower bound |")
  assert len(lines) == 3
  cells = [c.strip() for c in lines[2].strip("|").split("|")]
  assert cells[0] == "`dp-rsa-f`" and cells[8] == "yes" and cells[9] == "400"
  claimed, exact, bound, low_exact, low_bound = (float(cells[i]) for i in (1, 2, 3, 6, 7))
  assert bound <= exact <= claimed * 1.0001 < low_bound <= low_exact


def test_list(capsys):
  assert main(["audit", "--list", "--json"]) == 0
  listing = json.loads(capsys.readouterr().out)
  assert set(listing) == set(audit.AUDITS)


@pytest.mark.parametrize("args,field", [
    (["--mechanism", "laplace"], "mechanism"),
    ([], "mechanism"),
    (["--mechanism", "dp-rsa-f", "--trials", "1"], "trials"),
    (["--mechanism", "dp-rsa-f", "--confidence", "1.5"], "confidence"),
    (["--mechanism", "dp-rsa-f", "--noise-factor", "0"], "noise_factor"),
    (["--mechanism", "dp-rsa-f", "--noise-factor", "nan"], "noise_factor"),
    # more flips than 1/2 is no longer Sign-Flipping: refused, not reported as a failed audit
    (["--mechanism", "dp-rsa-f", "--noise-factor", "2"], "noise_factor"),
    (["--mechanism", "dp-rsa-f-omniscient", "--noise-factor", "1.3"], "noise_factor"),
    (["--mechanism", "dp-rsa-f", "--scales", "1,10"], "scales"),
    (["--mechanism", "spfl", "--scales", "1,x"], "scales"),
    (["--mechanism", "spfl", "--scales", "1,-2"], "scales"),
    (["--mechanism", "spfl", "--scales", "1,1"], "scales"),  # one scale twice
    # --list audits nothing: an audit's settings beside it are refused
    (["--list", "--mechanism", "spfl"], "mechanism"),
    (["--list", "--trials", "5"], "trials"),
    (["--table", "--mechanism", "spfl"], "mechanism"),
    (["--table", "--noise-factor", "0.5"], "noise_factor"),
    (["--table", "--list"], "table"),
    # a canary past float32's range: refused, not reported as a meaningless bound of 0
    (["--mechanism", "dp-rsa-g-unclipped", "--scales", "1e308"], "scales"),
    (["--mechanism", "dp-rsa-f-omniscient", "--scales", "1,1e308"], "scales"),
    (["--mechanism", "spfl", "--scales", "1e308"], "scales"),
    # SP-FL's noise scales with the canary gradient's squared norm, which overflows past ~1.8e19
    (["--mechanism", "spfl", "--scales", "1e20"], "scales"),
])
def test_bad_input_exits_2_naming_the_field(args, field, capsys):
  assert main(["audit"] + args) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"invalid {field}=" in err


# A one-run audit small enough for a test: 100 canaries, 5 rounds sampling half the population
# (claim about 0.8 at delta 1e-5).
SMALL_RUN = dict(canaries=100, guesses=(10, 25), num_clients=20, rounds=5, sampling_prob=0.5,
                 noise_multiplier=6.0, local_steps=1)


def test_one_run_audit_within_the_claim_and_a_broken_run_caught():
  ok = audit_one_run.one_run_audit(**SMALL_RUN)
  assert ok["formal_guarantee"] and ok["neighbouring_relation"] == "add_remove"
  assert 0 < ok["epsilon_claimed"] < 1
  assert 0 <= ok["epsilon_lower_bound"] <= ok["epsilon_claimed"] and not audit.violations(ok)
  assert ok["m"] == 100 and ok["r"] in (20, 50) and 0 <= ok["v"] <= ok["r"]
  assert 20 < len(ok["included"]) < 80
  # A hundredth of the noise while the ledger accounts the nominal one.
  broken = audit_one_run.one_run_audit(**SMALL_RUN, noise_factor=0.01)
  assert broken["epsilon_claimed"] == ok["epsilon_claimed"]
  assert broken["epsilon_lower_bound"] > broken["epsilon_claimed"], broken
  assert [name for name, _ in audit.violations(broken)] == ["the one-run bound"]


def test_one_run_canaries_go_through_the_clip_and_an_excluded_one_sends_nothing():
  run = audit_one_run.canary_run(2, 0, canary_norm=10.0, num_clients=4, noise_multiplier=1.0)
  hp = dict(run.hparams, noise_multiplier=np.float32(0.0),
            canary=np.array([-1, -1, -1, -1, 10.0, 0.0], np.float32))  # canary 0 in, 1 out
  state = run.program.init(jax.random.PRNGKey(0), hp)
  ids = np.array([4, 5], np.int32)
  batch = CohortBatch(run.data.x[ids], run.data.y[ids], run.data.counts[ids], ids,
                      np.ones(2, np.float32))
  new, _ = jax.jit(step, static_argnums=0)(run.program, state, hp, batch, jax.random.PRNGKey(1))
  moved = np.asarray(ravel_pytree(new.params)[0] - ravel_pytree(state.params)[0])
  u = audit_one_run.canary_directions(state.params, 0, [4])[0]
  # The update 10 clip bounds long was clipped to the bound: the mean moves by clip / qN along u.
  assert np.linalg.norm(moved) == pytest.approx(float(hp["clip"] / hp["expected_size"]), rel=1e-4)
  assert moved @ u == pytest.approx(np.linalg.norm(moved), rel=1e-4)


def test_one_run_command_refuses_what_it_does_not_read(capsys):
  assert main(["audit", "--one-run", "--mechanism", "dp-rsa-f"]) == 2
  assert "invalid mechanism=" in capsys.readouterr().err
  assert main(["audit", "--mechanism", "dp-rsa-f", "--canaries", "10"]) == 2
  assert "invalid canaries=" in capsys.readouterr().err
  with pytest.raises(ConfigError, match="invalid settings="):
    audit_one_run.one_run_audit(canaries=100, algorithm="fedavg")
  with pytest.raises(ConfigError, match="invalid canaries="):
    audit_one_run.one_run_audit(canaries=10)
