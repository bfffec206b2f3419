"""The run loop's observers: one interface for every output, and the release policy over it."""

import csv
import json
import shutil

import numpy as np
import pytest

from fedjax_dp import cli
from fedjax_dp.cli import main
from fedjax_dp.engine import RunOptions
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import simulate
from fedjax_dp.jsonio import dumps
from fedjax_dp.observers import (MetricsTable, Observer, ProgressLines, Record, ReleasePolicy,
                                 Start, is_released, leaves)

RUN = dict(num_clients=40, rounds=3, local_steps=2, model="mlp", max_test=100, eval_every=2)


class Recorder(Observer):
  """Keeps every call it receives, in order."""

  def __init__(self, sees_diagnostics=True):
    self.sees_diagnostics = sees_diagnostics
    self.calls, self.records = [], []

  def start(self, start):
    self.calls.append(("start", start))

  def round(self, record):
    self.calls.append(("round", record.round))
    self.records.append(record)

  def finish(self, result):
    self.calls.append(("finish", result))

  def close(self):
    self.calls.append(("close",))


def test_a_user_observer_receives_every_rounds_record_then_the_result(tmp_path):
  mine = Recorder()
  result = simulate(**RUN, observers=[mine], output_dir=str(tmp_path))
  kinds = [c[0] for c in mine.calls]
  assert kinds == ["start", "round", "round", "round", "finish", "close"]
  assert mine.calls[0][1] == Start(rounds=3)
  assert [c[1] for c in mine.calls[1:4]] == [1, 2, 3]
  assert mine.calls[4][1] is result
  # The same records the run returns and writes, diagnostics included under release "all".
  assert [r.row for r in mine.records] == result.history
  written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r.row for r in mine.records] == written
  assert all("diagnostics" in r.row and r.rounds == 3 for r in mine.records)
  assert [("test_accuracy" in r.row) for r in mine.records] == [False, True, True]
  # The clients' raw norms, as norms.npz holds them, and the state after each round.
  norms = np.load(tmp_path / "norms.npz")
  np.testing.assert_array_equal(np.concatenate([r.norms for r in mine.records]), norms["norms"])
  assert mine.records[-1].state is result.state


def test_on_round_is_an_observer_of_the_rows():
  rows = []
  result = simulate(**RUN, on_round=rows.append)
  assert rows == result.history and len(rows) == 3


def test_the_release_policy_hides_diagnostics_from_an_observer_not_allowed_them():
  allowed, refused = Recorder(), Recorder(sees_diagnostics=False)
  result = simulate(**RUN, observers=[allowed, refused])
  assert [r.row for r in allowed.records] == result.history
  for r in refused.records:
    assert "diagnostics" not in r.row and r.norms is None and r.state is None
  # Everything else of the row is the same, in the same order.
  assert [r.row for r in refused.records] == [
      {k: v for k, v in row.items() if k != "diagnostics"} for row in result.history]


def test_a_private_release_shows_no_observer_the_diagnostics(tmp_path):
  mine = Recorder()
  result = simulate(**RUN, observers=[mine], release="private", output_dir=str(tmp_path))
  assert len(mine.records) == 3
  for r in mine.records:
    assert "diagnostics" not in r.row and r.norms is None and r.state is None
  assert [r.row for r in mine.records] == result.history
  assert "diagnostics" not in result.summary and not (tmp_path / "norms.npz").exists()


def test_release_policy_view():
  row = {"round": 2, "epsilon": 1.5, "diagnostics": {"cohort_size": 7}}
  record = Record(2, 5, row, np.ones(3), state="the state")
  seeing, blind = Recorder(), Recorder(sees_diagnostics=False)
  assert ReleasePolicy("all").view(record, seeing) is record
  for policy, observer in ((ReleasePolicy("all"), blind), (ReleasePolicy("private"), seeing)):
    assert not policy.shows_diagnostics(observer)
    assert policy.view(record, observer) == Record(2, 5, {"round": 2, "epsilon": 1.5})
  assert record.row == row  # the run's own record is left as it was


def test_released_metrics_are_named_or_prefixed():
  assert is_released("aggregate_norm", ("aggregate_norm",))
  assert is_released("clip_bound.layer1", ("clip_bound*",))
  assert not is_released("aggregate_norm_raw", ("aggregate_norm",))
  assert not is_released("update_norm", ())


def test_every_observer_is_closed_when_one_fails():
  class Failing(Observer):
    def round(self, record):
      raise RuntimeError("this observer failed")

  after = Recorder()
  with pytest.raises(RuntimeError, match="this observer failed"):
    simulate(**RUN, observers=[Failing(), after])
  assert [c[0] for c in after.calls] == ["start", "close"]


@pytest.mark.parametrize("options,field", [
    (dict(eval_every=0), "eval_every"),
    (dict(release="public"), "release"),
    (dict(placement="cloud"), "placement"),
    (dict(client_chunk=0), "client_chunk"),
    (dict(accounting_workers=-1), "accounting_workers"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(checkpoint_every=2, release="private"), "checkpoint_every"),
])
def test_run_options_are_checked_when_made(options, field):
  with pytest.raises(ConfigError, match=field):
    RunOptions(**options)


def test_simulate_takes_run_options_and_refuses_what_the_configuration_sets(tmp_path):
  rows = []
  simulate(**RUN, run_options=RunOptions(output_dir=str(tmp_path)), on_round=rows.append)
  assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(rows) == 3
  with pytest.raises(ConfigError, match="run_options.eval_every.*setting of the configuration"):
    simulate(**RUN, run_options=RunOptions(eval_every=5))


def test_progress_lines_come_every_period():
  now, lines = [0.0], []
  lines_of = ProgressLines(10.0, experiments=2, write=lines.append, clock=lambda: now[0])
  lines_of.start(Start(5))
  for r, t, row in ((1, 4.0, {"test_accuracy": 0.5, "epsilon": 1.0}), (2, 8.0, {}),
                    (3, 12.0, {"epsilon": 1.5}), (4, 15.0, {}), (5, 16.0, {"epsilon": 2.0})):
    now[0] = t
    lines_of.round(Record(r, 5, row))
  assert lines == ["round 3/5 (2 experiments): test accuracy 0.5000, epsilon 1.500, 12.0 s"]


def test_a_sweeps_progress_lines_count_every_programs_rounds():
  from fedjax_dp.observers import SweepProgress
  now, lines, said = [0.0], [], []
  progress = SweepProgress(12, 2, every=10.0, write=lines.append, clock=lambda: now[0])
  first, second = progress.observer(2), progress.observer(4)  # programs of 2 and 4 experiments
  for t, part in ((4.0, first), (8.0, second), (12.0, first), (13.0, second)):
    now[0] = t
    part.round(Record(1, 2, {}))
  progress.program_done(said.append, "[group 1/2] done")
  assert lines == ["sweep: 8/12 experiment rounds, 0/2 programs done, 12.0 s"]
  assert said == ["[group 1/2] done"] and progress.ended == 1 and progress.done == 12
  private = SweepProgress(1, 1, every=1.0, private=True, write=lines.append,
                          clock=iter([0.0, 5.0]).__next__)
  private.observer(1).round(Record(1, 1, {}))
  assert lines[-1] == "sweep: 1/1 experiment rounds, 0/1 programs done"


def test_a_run_without_a_bar_prints_progress_lines(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(cli, "PROGRESS_EVERY", 1e-9)  # a line at every round
  assert main(["run", "--rounds", "2", "--num-clients", "30", "--max-test", "50", "--no-progress",
               "--output-dir", str(tmp_path / "r")]) == 0
  err = capsys.readouterr().err.splitlines()
  assert [line.split(":")[0] for line in err] == ["round 1/2", "round 2/2"]
  assert err[-1].startswith("round 2/2: test accuracy ")


def test_private_progress_says_no_time():
  lines = []
  lines_of = ProgressLines(1.0, private=True, write=lines.append, clock=iter([0.0, 5.0]).__next__)
  lines_of.start(Start(1))
  lines_of.round(Record(1, 1, {"epsilon": 1.0}))
  assert lines[-1] == "round 1/1: epsilon 1.000"


# ------------------------------------------------------------------- metrics.csv


def _jsonl(folder) -> list:
  return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _table(folder) -> list:
  """``metrics.csv``'s lines, each a list of its cells."""
  with open(folder / "metrics.csv", newline="") as f:
    return list(csv.reader(f))


def _jsonl_as_table(folder) -> list:
  """``metrics.jsonl``'s rows as a table: a column per value of any row, nested names joined by
  '.', in the order they first appear; an empty cell for null or no value."""
  rows = [leaves(row) for row in _jsonl(folder)]
  columns = list(dict.fromkeys(c for row in rows for c in row))
  return [columns, *(["" if row.get(c) is None else str(row[c]) for c in columns]
                     for row in rows)]


def test_metrics_csv_holds_the_jsonl_rows_as_a_table(tmp_path):
  simulate(**RUN, output_dir=str(tmp_path), progress=False)
  table = _table(tmp_path)
  assert table == _jsonl_as_table(tmp_path) and len(table) == 1 + RUN["rounds"]
  assert {"round", "epsilon", "test_accuracy", "diagnostics.update_norm.q50"} <= set(table[0])
  assert table[1][table[0].index("test_accuracy")] == ""  # round 1 is not evaluated
  pd = pytest.importorskip("pandas")
  pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "metrics.csv"),
                                pd.json_normalize(_jsonl(tmp_path)), check_dtype=False)


def test_a_private_runs_metrics_csv_hides_what_its_jsonl_hides(tmp_path):
  simulate(**RUN, output_dir=str(tmp_path / "all"), progress=False)
  simulate(**RUN, output_dir=str(tmp_path / "private"), release="private", progress=False)
  everything, private = _table(tmp_path / "all")[0], _table(tmp_path / "private")
  assert private == _jsonl_as_table(tmp_path / "private")
  assert private[0] == [c for c in everything if not c.startswith("diagnostics.")]
  assert any(c.startswith("diagnostics.") for c in everything)


def _untimed(folder) -> list:
  """``metrics.csv`` without its timings' column (the only one that may differ)."""
  table = _table(folder)
  at = table[0].index("diagnostics.seconds")
  return [line[:at] + line[at + 1:] for line in table]


def test_a_resumed_runs_metrics_csv_is_the_uninterrupted_runs(tmp_path):
  run = dict(RUN, rounds=4, eval_every=3)  # test accuracy from round 3: a column after resuming
  whole, cut = tmp_path / "whole", tmp_path / "cut"
  simulate(**run, output_dir=str(whole), checkpoint_every=2, progress=False)
  # Killed after writing its last row, before its last checkpoint, in the middle of a line.
  shutil.copytree(whole, cut)
  shutil.rmtree(cut / "checkpoints" / "4")
  (cut / "summary.json").unlink()
  with open(cut / "metrics.csv", "a") as f:
    f.write("5,1.2")
  simulate(**run, output_dir=str(cut), checkpoint_every=2, resume=True, progress=False)
  assert _untimed(cut) == _untimed(whole)
  assert _table(cut) == _jsonl_as_table(cut) and len(_table(cut)) == 5


def test_metrics_table_writes_each_row_as_the_jsonl_holds_it_once(tmp_path):
  """A row that adds columns (a first evaluation, a non-finite value and its note) writes the
  table again under the wider header; a resumed table starts from the rows the JSONL keeps."""
  rows = [{"round": 1, "epsilon": 1.0, "diagnostics": {"n": 3}},
          {"round": 2, "epsilon": 2.0, "test_loss": float("nan"), "diverged": True,
           "diagnostics": {"n": 4}},
          {"round": 3, "epsilon": 3.0, "diagnostics": {"n": 5}}]
  expected = ("round,epsilon,diagnostics.n,test_loss,diverged,test_loss_nonfinite\n"
              "1,1.0,3,,,\n2,2.0,4,,True,NaN\n3,3.0,5,,,\n")
  for done in (0, 1, 2):
    table = MetricsTable(tmp_path)
    kept = tuple(json.loads(dumps(row)) for row in rows[:done])  # as metrics.jsonl keeps them
    table.start(Start(3, done, kept, log=None if done == 0 else {}))
    for row in rows[done:]:
      table.round(Record(row["round"], 3, row))
    table.close()
    assert (tmp_path / "metrics.csv").read_text() == expected, done
