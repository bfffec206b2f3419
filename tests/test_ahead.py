"""A PLD run's epsilons computed ahead by worker processes (fedjax_dp.privacy.ahead)."""

import subprocess
import sys

import dp_accounting
import pytest

from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import simulate
from fedjax_dp.privacy import ahead, ledger

EVENT = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.2))
RUN = dict(rounds=4, eval_every=4, accountant="pld", noise_multiplier=1.2, target_epsilon=None,
           num_clients=40, sampling_prob=0.05, local_steps=1, max_test=100)


def _refuse_to_compute(*args):
  raise AssertionError(f"the run's own process computed an epsilon: {args[1:]}")


def test_the_workers_module_imports_no_jax():
  """A worker imports the ledger and dp_accounting only: the privacy package reads its sign
  mechanisms (which import JAX) on first use."""
  code = "import sys, fedjax_dp.privacy.ahead; print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_a_run_reports_the_workers_epsilons_which_are_its_own(monkeypatch):
  """Every epsilon of a run with workers equals the one its process computes without; with
  workers its process computes none (the function it would call raises)."""
  alone = simulate(**RUN, accounting_workers=0)
  monkeypatch.setattr(ledger, "_composed_epsilon", _refuse_to_compute)
  helped = simulate(**RUN, accounting_workers=2)
  assert [r["epsilon"] for r in helped.history] == [r["epsilon"] for r in alone.history]
  assert helped.summary["epsilon"] == alone.summary["epsilon"] > 0
  assert helped.summary["diagnostics"]["accounting_workers"] == 2
  assert helped.summary["diagnostics"]["epsilons_from_accounting_workers"] == RUN["rounds"]
  assert "accounting_workers" not in alone.summary["diagnostics"]
  assert not ledger.AHEAD  # the futures are taken back when the run ends


def test_each_epsilon_is_computed_once_and_a_stopped_worker_changes_nothing():
  """Keys asked twice (a sweep's seeds) are computed once; after the workers are stopped the
  ledger computes what they left, the same values."""
  first, second = (ledger.PrivacyLedger(1e-5, "pld") for _ in range(2))
  keys = first.upcoming(EVENT, 3)
  assert keys == second.upcoming(EVENT, 3) and len(set(keys)) == 3
  with ahead.Ahead(1) as workers:
    workers.submit(keys)
    workers.submit(second.upcoming(EVENT, 3))
    helped = []
    for _ in range(3):
      first.compose(EVENT)
      second.compose(EVENT)
      helped.append(first.epsilon())
      assert second.epsilon() == helped[-1]
    assert workers.computed == 3
  assert not ledger.AHEAD
  stopped = ahead.Ahead(1)
  later = ledger.PrivacyLedger(1e-5, "pld")
  stopped.submit(later.upcoming(EVENT, 3))
  stopped.close()  # before any answer: nothing left to take
  own = []
  for _ in range(3):
    later.compose(EVENT)
    own.append(later.epsilon())
  assert own == helped


def test_workers_are_automatic_off_a_cpu_only():
  assert ahead.workers_for(None, "cpu") == 0
  assert 0 <= ahead.workers_for(None, "gpu") <= ahead.MAX_AUTO_WORKERS
  assert ahead.workers_for(3, "cpu") == 3
  with pytest.raises(ConfigError, match="invalid accounting_workers=-1"):
    simulate(**RUN, accounting_workers=-1)


def test_an_example_level_run_gives_the_workers_its_clients_epsilons(monkeypatch):
  """DP-SGD clients with Poisson batches (a ledger per client, following the cohorts): the
  same per-class epsilons with workers, none computed by the run's process."""
  run = dict(algorithm="dp-fl", accountant="pld", options={"example_sampling": "poisson"},
             rounds=2, eval_every=2, num_clients=40, sampling="fixed", cohort_size=4,
             batch_size=2, local_steps=1, noise_multiplier=1.0, target_epsilon=None,
             max_test=100)
  alone = simulate(**run, accounting_workers=0)
  monkeypatch.setattr(ledger, "_composed_epsilon", _refuse_to_compute)
  helped = simulate(**run, accounting_workers=2)
  eps = [{k: v for k, v in r.items() if k.startswith("epsilon")} for r in helped.history]
  assert eps == [{k: v for k, v in r.items() if k.startswith("epsilon")} for r in alone.history]
  assert eps[-1]["epsilon"] > 0 and helped.summary["diagnostics"]["accounting_workers"] == 2


@pytest.mark.slow  # three runs of the CLI, about 18 s: `make test-slow`
def test_an_interrupted_run_resumes_with_its_workers_and_equals_the_run_alone(
    tmp_path, monkeypatch, capsys, interrupt_at_round):
  """Ctrl-C in round 3 of a run checkpointed every 2 rounds, then resumed: the workers take up
  the rounds left (the ledger restored from the checkpoint) and every record equals the run's
  without workers."""
  import json

  from fedjax_dp.cli import main
  args = ["--num-clients", "40", "--rounds", "4", "--local-steps", "1", "--model", "mlp",
          "--eval-every", "2", "--accountant", "pld", "--noise-multiplier", "1.2",
          "--sampling-prob", "0.05", "--max-test", "100", "--no-progress"]
  alone, helped = tmp_path / "alone", tmp_path / "helped"
  assert main(["run", *args, "--accounting-workers", "0", "--output-dir", str(alone)]) == 0
  interrupt_at_round(3)
  assert main(["run", *args, "--accounting-workers", "1", "--checkpoint-every", "2",
               "--output-dir", str(helped)]) == 130
  monkeypatch.undo()
  monkeypatch.setattr(ledger, "_composed_epsilon", _refuse_to_compute)
  assert main(["run", "--resume", str(helped), "--no-progress"]) == 0
  capsys.readouterr()

  def rows(out):
    return [{k: v for k, v in json.loads(line).items() if k != "diagnostics"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert rows(helped) == rows(alone) and len(rows(alone)) == 4
  summary = json.loads((helped / "summary.json").read_text())
  assert summary["diagnostics"]["epsilons_from_accounting_workers"] == 2  # rounds 3 and 4
