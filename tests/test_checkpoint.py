"""Checkpoint and resume (fedjax_dp.checkpoint, fedjax-dp run --checkpoint-every / --resume) and
determinism: a run killed with kill -9 and resumed ends bit-identical to an uninterrupted one."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from fedjax_dp.checkpoint import params_sha256
from fedjax_dp.cli import main
from fedjax_dp.errors import ConfigError

TINY = ["--num-clients", "60", "--rounds", "8", "--local-steps", "2", "--model", "mlp",
        "--eval-every", "3", "--no-progress"]


def _rows(out):
  """``metrics.jsonl``'s rows without their timings (the only field that may differ)."""
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  for row in rows:
    row["diagnostics"].pop("seconds")
  return rows


def _same_norms(out, reference):
  """``norms.npz`` (every client's norm of every round) is the same as the reference run's."""
  with np.load(out / "norms.npz") as a, np.load(reference / "norms.npz") as b:
    return sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k], equal_nan=True)
                                                      for k in a.files)


def _summary(out):
  return json.loads((out / "summary.json").read_text())


def _steps(out):
  """The rounds of the complete checkpoints (orbax's temporary folders have other names)."""
  folder = out / "checkpoints"
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run without checkpoints."""
  out = tmp_path_factory.mktemp("reference") / "run"
  assert main(["run", *TINY, "--output-dir", str(out)]) == 0
  return out


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
  """The same run with --checkpoint-every 3 (checkpoints at rounds 3, 6 and the last, 8)."""
  out = tmp_path_factory.mktemp("checkpointed") / "run"
  assert main(["run", *TINY, "--checkpoint-every", "3", "--output-dir", str(out)]) == 0
  return out


@pytest.fixture(scope="module")
def four_rounds(tmp_path_factory):
  """A 4-round run with --checkpoint-every 2 and --tensorboard (checkpoints at rounds 2 and 4)."""
  out = tmp_path_factory.mktemp("four_rounds") / "run"
  at = TINY.index("--rounds")
  assert main(["run", *TINY[:at], *TINY[at + 2:], "--rounds", "4", "--checkpoint-every", "2", "--tensorboard",
               "--output-dir", str(out)]) == 0
  return out


def _killed_before_its_last_checkpoint(run, tmp_path, name="run"):
  """A copy of ``run`` (:func:`four_rounds`) as a run killed after writing its last row but
  before saving its last checkpoint leaves it: ``--resume`` recomputes rounds 3 and 4."""
  out = tmp_path / name
  shutil.copytree(run, out)
  shutil.rmtree(out / "checkpoints" / "4")
  (out / "summary.json").unlink()
  return out


def test_a_run_is_deterministic_and_checkpointing_changes_nothing(reference, checkpointed):
  s = _summary(reference)
  assert len(s["params_sha256"]) == 64
  assert [r["round"] for r in _rows(reference)] == list(range(1, 9))
  # Two runs in one process, one of them saving checkpoints: the same rows and parameters.
  assert _rows(checkpointed) == _rows(reference)
  assert _summary(checkpointed)["params_sha256"] == s["params_sha256"]
  assert _steps(checkpointed) == [6, 8]  # every 3 rounds and after the last; the last 2 kept
  # The release block says what the checkpoints hold (raw), only where there are some.
  assert "raw, not covered" in _summary(checkpointed)["release"]["checkpoints"]
  assert "checkpoints" not in s["release"]


def test_the_same_run_in_another_process_is_identical(reference, tmp_path):
  out = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", *TINY,
                         "--output-dir", str(out)], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert _rows(out) == _rows(reference)
  assert _summary(out)["params_sha256"] == _summary(reference)["params_sha256"]


# Runs the command line with every round slowed by 0.3 s (the results are unchanged), so that
# the test can kill it between two checkpoints.
SLOW_CLI = """
import sys, time
import fedjax_dp.engine as engine
real = engine.summarize_round
def slow(*args, **kwargs):
  time.sleep(0.3)
  return real(*args, **kwargs)
engine.summarize_round = slow
from fedjax_dp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_then_resume_equals_the_uninterrupted_run(reference, tmp_path, capsys):
  out = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "run", *TINY, "--checkpoint-every", "2",
                           "--output-dir", str(out)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  try:
    # Wait for a checkpoint and a complete row after it (a row that resuming must drop).
    while not (_steps(out) and (out / "metrics.jsonl").read_text().count("\n") > _steps(out)[-1]):
      assert proc.poll() is None, proc.stderr.read()
      assert time.monotonic() < deadline
      time.sleep(0.02)
  finally:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
  assert proc.returncode == -signal.SIGKILL
  saved = _steps(out)[-1]
  assert saved < 8 and not (out / "summary.json").exists()
  assert (out / "metrics.jsonl").read_text().count("\n") > saved
  # A kill while saving leaves orbax's temporary folder (here of a later round); a kill while
  # writing a row leaves half a line.
  partial = out / "checkpoints" / f"{saved + 2}.orbax-checkpoint-tmp-1700000000"
  (partial / "host").mkdir(parents=True)
  (partial / "host" / "metadata").write_text('{"round": ')
  with open(out / "metrics.jsonl", "a") as f:
    f.write('{"round": 9, "epsil')

  assert main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert "rounds=8" in capsys.readouterr().out
  assert not partial.exists()  # ignored, and removed when the folder was opened
  assert _rows(out) == _rows(reference)  # every round once, the dropped ones recomputed
  s, ref = _summary(out), _summary(reference)
  assert s["params_sha256"] == ref["params_sha256"]
  for key in ("final_accuracy", "final_test_loss", "epsilon", "rounds", "config"):
    assert s[key] == ref[key], key
  assert s["diagnostics"]["resumed_from_round"] == saved
  assert _same_norms(out, reference)
  assert _steps(out) == [6, 8]


def test_ctrl_c_says_how_to_resume_and_resuming_twice_is_the_same_run(reference, tmp_path,
                                                                     monkeypatch, capsys,
                                                                     interrupt_at_round):
  out = tmp_path / "run"
  interrupt_at_round(5)
  assert main(["run", *TINY, "--checkpoint-every", "2", "--output-dir", str(out)]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "4 rounds kept" in err[0] and "round 4" in err[0], err
  assert err[0].endswith(f"fedjax-dp run --resume {out}")
  # Interrupted again, in the resumed run's third round (7): rows 1-6 kept, checkpoint of round 6.
  monkeypatch.undo()
  interrupt_at_round(3)
  assert main(["run", "--resume", str(out), "--no-progress"]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "6 rounds kept" in err[0] and "round 6" in err[0], err
  monkeypatch.undo()
  assert main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert _rows(out) == _rows(reference) and _same_norms(out, reference)
  assert _summary(out)["params_sha256"] == _summary(reference)["params_sha256"]


def test_a_resumed_run_compiles_its_round_once(four_rounds, tmp_path, monkeypatch, capsys):
  import fedjax_dp.round
  out = _killed_before_its_last_checkpoint(four_rounds, tmp_path)
  real, steps = fedjax_dp.round.compiled_step, []

  def compiled_step(*args, **kwargs):
    steps.append(real(*args, **kwargs))
    return steps[-1]

  monkeypatch.setattr(fedjax_dp.round, "compiled_step", compiled_step)
  assert main(["run", "--resume", str(out), "--no-progress"]) == 0
  # Rounds 3 and 4 ran one compilation: the restored state is placed as a fresh run's initial
  # state is (replicated over the device mesh, where every round leaves it).
  assert len(steps) == 1 and steps[0]._cache_size() == 1
  assert _rows(out) == _rows(four_rounds)
  assert _summary(out)["params_sha256"] == _summary(four_rounds)["params_sha256"]


def _events(folder) -> list:
  """``(tag, step)`` of every value in the TensorBoard event files in ``folder``, read as
  TFRecords (a length, its CRC, an ``Event`` protobuf, its CRC), each file whole."""
  from tensorboardX.proto import event_pb2
  found = []
  for f in sorted(folder.glob("events.out.tfevents.*")):
    data, i = f.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      assert i + 16 + n <= len(data), f"{f} ends with a partial record"
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      found += [(v.tag, event.step) for v in event.summary.value
                if not v.tag.startswith("_hparams_/")]
      i += 16 + n
  return sorted(found)


def test_a_resumed_run_writes_each_tensorboard_step_once(four_rounds, tmp_path, capsys):
  out = _killed_before_its_last_checkpoint(four_rounds, tmp_path)
  [events] = (out / "tensorboard").glob("events.out.tfevents.*")
  with open(events, "ab") as f:  # killed while writing an event: a partial record
    f.write(struct.pack("<Q", 200) + b"\0" * 30)
  # The run wrote TensorBoard events, so its resume does (--tensorboard may be left out).
  assert main(["run", "--resume", str(out), "--no-progress"]) == 0
  steps = _events(out / "tensorboard")
  assert {step for _, step in steps} == {1, 2, 3, 4}
  assert steps == _events(four_rounds / "tensorboard")  # every value once
  assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2
  # The summary says which processes ran the rounds before the resume (here, the same code).
  resumed, now = _summary(out)["provenance"]["resumed"], _summary(out)["provenance"]
  assert resumed["from_round"] == 2 and len(resumed["earlier_processes"]) == 1
  assert resumed["earlier_processes"][0] == {k: now[k] for k in resumed["earlier_processes"][0]}


def test_a_resume_whose_tensorboard_folder_takes_no_file_is_refused(four_rounds, tmp_path,
                                                                    capsys, unwritable):
  # A traceback (PermissionError) before, once the resume had begun rewriting the folder.
  out = _killed_before_its_last_checkpoint(four_rounds, tmp_path)
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  unwritable(out / "tensorboard")
  assert main(["run", "--resume", str(out), "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(
      f"fedjax-dp: error: invalid resume='{out / 'tensorboard'}': no file can be written"), err
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_checkpoint_holds_the_tensorboard_events_of_its_rounds(tmp_path, monkeypatch, capsys):
  # The event writer is flushed before each save: a run killed after it has every step up to
  # the checkpoint on disk, which its resume does not write again.
  import fedjax_dp.checkpoint as checkpoint
  real, seen = checkpoint._manager, []

  def manager(folder, saves=True):
    m = real(folder, saves)
    save = m.save

    def recording(step, *args, **kwargs):
      seen.append((step, {s for _, s in _events(folder.parent / "tensorboard")}))
      return save(step, *args, **kwargs)
    m.save = recording
    return m

  monkeypatch.setattr(checkpoint, "_manager", manager)
  at = TINY.index("--rounds")
  assert main(["run", *TINY[:at], *TINY[at + 2:], "--rounds", "4", "--checkpoint-every", "2",
               "--tensorboard", "--output-dir", str(tmp_path / "run")]) == 0
  assert seen == [(2, {1, 2}), (4, {1, 2, 3, 4})]


def test_a_signal_during_a_save_takes_effect_when_it_has_finished():
  from fedjax_dp.checkpoint import _uninterrupted
  done = []
  before = signal.getsignal(signal.SIGINT)  # ignored where the suite runs as a background job
  with pytest.raises(KeyboardInterrupt):
    with _uninterrupted():
      os.kill(os.getpid(), signal.SIGINT)
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.1)
      done.append(True)  # reached: the save goes on to its end
  assert done and signal.getsignal(signal.SIGINT) is before
  with _uninterrupted():  # no signal: nothing raised
    done.append(True)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's: ignored, and stays so
  try:
    with _uninterrupted():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_rows_past_the_checkpoint_that_are_not_utf8_are_dropped_on_resume(four_rounds, tmp_path,
                                                                          capsys):
  out = _killed_before_its_last_checkpoint(four_rounds, tmp_path)
  rows = (out / "metrics.jsonl").read_bytes().split(b"\n")
  # Killed while writing round 4's row, inside a character of two bytes in UTF-8.
  (out / "metrics.jsonl").write_bytes(b"\n".join(rows[:3]) + b'\n{"round": 4, "x": "\xc3')
  assert main(["run", "--resume", str(out), "--no-progress"]) == 0
  assert _rows(out) == _rows(four_rounds)
  assert _summary(out)["params_sha256"] == _summary(four_rounds)["params_sha256"]
  # Bytes that are not UTF-8 in a row the checkpoint keeps: refused in one line, nothing changed.
  out = _killed_before_its_last_checkpoint(four_rounds, tmp_path, "damaged")
  damaged = b"\n".join([rows[0], rows[1][:-1] + b"\xff}", *rows[2:]])
  (out / "metrics.jsonl").write_bytes(damaged)
  capsys.readouterr()
  assert main(["run", "--resume", str(out), "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "holds 1 complete rows" in err[0] and "metrics.jsonl" in err[0], err
  assert (out / "metrics.jsonl").read_bytes() == damaged


def test_resuming_a_finished_run_recomputes_and_rewrites_nothing(checkpointed, reference, capsys):
  before = {p: p.read_bytes() for p in checkpointed.rglob("*") if p.is_file()}
  # Settings equal to the stored ones may be given.
  assert main(["run", "--resume", str(checkpointed), "--rounds", "8", "--model", "mlp",
               "--release", "all", "--no-progress"]) == 0
  out = capsys.readouterr().out
  assert "holds a finished run: nothing to resume" in out and "rounds=8" in out
  assert {p: p.read_bytes() for p in checkpointed.rglob("*") if p.is_file()} == before
  s = _summary(checkpointed)
  assert s["params_sha256"] == _summary(reference)["params_sha256"]
  assert s["final_accuracy"] == _summary(reference)["final_accuracy"]


def test_a_finished_run_whose_summary_is_damaged_is_refused_in_one_line(checkpointed, tmp_path,
                                                                        capsys):
  run = tmp_path / "run"
  shutil.copytree(checkpointed, run)
  for damaged in (b'{"final_accuracy": 0.5, "rou', b"\xff\xfe{}", b"[]", b'{"rounds": 8}'):
    (run / "summary.json").write_bytes(damaged)
    assert main(["run", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"invalid resume='{run / 'summary.json'}'" in err[0], err
    assert "remove it and run --resume again" in err[0]
  (run / "summary.json").unlink()  # as the message says: written again from the last checkpoint
  assert main(["run", "--resume", str(run), "--no-progress"]) == 0
  assert _summary(run)["params_sha256"] == _summary(checkpointed)["params_sha256"]
  assert _rows(run) == _rows(checkpointed)


def _tiny(rounds: int, *more: str) -> list:
  """:data:`TINY` with ``rounds`` rounds and the flags ``more``."""
  at = TINY.index("--rounds")
  return [*TINY[:at], *TINY[at + 2:], "--rounds", str(rounds), *more]


def test_a_finished_run_with_a_fixed_noise_multiplier_extends_as_if_run_whole(tmp_path, capsys):
  whole, run = tmp_path / "whole", tmp_path / "run"
  noise = ("--noise-multiplier", "1.0")
  assert main(["run", *_tiny(4, *noise), "--output-dir", str(whole)]) == 0
  assert main(["run", *_tiny(2, *noise), "--checkpoint-every", "1", "--output-dir", str(run)]) == 0
  capsys.readouterr()
  assert main(["run", "--resume", str(run), "--rounds", "4", "--no-progress"]) == 0
  assert "rounds=4" in capsys.readouterr().out
  s, w = _summary(run), _summary(whole)
  assert s["params_sha256"] == w["params_sha256"]  # bit for bit the 4-round run
  assert s["rounds"] == 4 and s["config"] == w["config"]  # the recorded configuration says 4
  assert s["epsilon"] == w["epsilon"] and s["final_accuracy"] == w["final_accuracy"]
  rows, whole_rows = _rows(run), _rows(whole)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]  # each round once
  assert rows[2:] == whole_rows[2:] and rows[0] == whole_rows[0]
  # Round 2 keeps what the 2-round run released: the evaluation after its last round.
  assert "test_accuracy" in rows[1] and "test_accuracy" not in whole_rows[1]
  assert {k: v for k, v in rows[1].items() if not k.startswith("test_")} == whole_rows[1]
  assert _same_norms(run, whole)
  assert len((run / "metrics.csv").read_text().splitlines()) == 5
  assert _steps(run) == [3, 4]
  # Extended, it is a finished 4-round run: fewer rounds are refused, the same are no conflict.
  assert main(["run", "--resume", str(run), "--rounds", "3"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "invalid rounds=3: is below the resumed run's rounds=4" in err[0], err
  assert main(["run", "--resume", str(run), "--rounds", "4", "--no-progress"]) == 0
  assert "holds a finished run: nothing to resume" in capsys.readouterr().out


def test_a_run_calibrated_for_a_target_epsilon_is_not_extended(checkpointed, capsys):
  rows = (checkpointed / "metrics.jsonl").read_text()
  assert main(["run", "--resume", str(checkpointed), "--rounds", "12"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("fedjax-dp: error: invalid rounds=12: cannot "
                                             "extend the resumed run"), err
  assert "calibrated for target_epsilon=8 over its 8 rounds" in err[0]
  # The Python API refuses it alike, before it rewrites anything.
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import simulate
  config = make_config(num_clients=60, rounds=12, local_steps=2, model="mlp", eval_every=3)
  with pytest.raises(ConfigError, match="calibrated for target_epsilon=8 over its 8 rounds"):
    simulate(config, output_dir=str(checkpointed), resume=True)
  assert (checkpointed / "metrics.jsonl").read_text() == rows


@pytest.mark.parametrize("args,field", [
    (["--rounds", "9"], "rounds"),
    (["--rounds", "7"], "rounds"),
    (["--clip", "0.3"], "clip"),
    (["--set", "lambda=0.1"], "lambda"),
    (["--release", "private"], "release"),
    (["--overwrite"], "overwrite"),
    (["--output-dir", "elsewhere"], "output_dir"),
    (["--checkpoint-every", "0"], "checkpoint_every"),
    (["--tensorboard"], "tensorboard"),  # it wrote none: its resume would lack the early steps
])
def test_a_resume_that_conflicts_with_the_stored_run_is_refused(checkpointed, args, field, capsys):
  rows = (checkpointed / "metrics.jsonl").read_text()
  assert main(["run", "--resume", str(checkpointed), *args]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"fedjax-dp: error: invalid {field}="), err
  assert (checkpointed / "metrics.jsonl").read_text() == rows


def test_a_resume_may_repeat_the_model_the_run_defaulted_to(checkpointed, monkeypatch):
  # A run without --model ran its data set's default, which summary.json's config names (and a
  # --config file from it repeats): no conflict with the checkpoint's unset model.
  from fedjax_dp import cli
  from fedjax_dp.cli import _resumed, build_parser
  read = cli.read_meta

  def unset_model(folder):
    meta = read(folder)
    return dict(meta, config=dict(meta["config"], model=None))
  monkeypatch.setattr(cli, "read_meta", unset_model)
  args = build_parser().parse_args(["run", "--resume", str(checkpointed), "--model", "digits_cnn"])
  config, _, _, done = _resumed(args)
  assert config.model is None and config.model_name == "digits_cnn" and done == 8
  args = build_parser().parse_args(["run", "--resume", str(checkpointed), "--model", "mlp"])
  with pytest.raises(ConfigError, match="conflicts with the resumed run's model='digits_cnn'"):
    _resumed(args)


def test_resume_refusals(checkpointed, reference, tmp_path, capsys):
  config = tmp_path / "c.json"
  config.write_text('{"seed": 1}')
  assert main(["run", "--resume", str(checkpointed), "--config", str(config)]) == 2
  assert "invalid seed=1: conflicts with the resumed run's seed=0" in capsys.readouterr().err
  assert main(["run", "--resume", str(reference)]) == 2  # no checkpoint there
  assert "holds no complete checkpoint" in capsys.readouterr().err
  assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
  assert "invalid resume=" in capsys.readouterr().err
  assert main(["run", "--resume", str(checkpointed), "--set", "foo=1"]) == 2
  assert "invalid foo=1: is not an option of the resumed run's algorithm" in capsys.readouterr().err
  assert main(["sweep", "--grid", "clip=0.1,0.2", "--checkpoint-every", "2",
               "--output-dir", str(tmp_path / "sweep")]) == 2
  assert "invalid checkpoint_every=2: a sweep is not checkpointed" in capsys.readouterr().err
  # The Python API compares the whole configuration with the checkpoint's.
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import simulate
  config = make_config(num_clients=60, rounds=8, local_steps=2, model="mlp", eval_every=3, seed=1)
  with pytest.raises(ConfigError, match=r"another configuration \(it differs in \['seed'\]\)"):
    simulate(config, output_dir=str(checkpointed), resume=True)


def test_a_new_run_never_meets_an_earlier_runs_checkpoints(checkpointed, tmp_path, capsys):
  out = tmp_path / "run"
  (out / "checkpoints").mkdir(parents=True)
  shutil.copytree(checkpointed / "checkpoints" / "8", out / "checkpoints" / "8")
  assert main(["run", *TINY, "--output-dir", str(out)]) == 2  # an earlier run's folder
  assert "already holds checkpoints" in capsys.readouterr().err
  assert main(["run", *TINY, "--rounds", "2", "--output-dir", str(out), "--overwrite"]) == 0
  assert not (out / "checkpoints").exists()


def test_accounting_and_sampler_states_continue_exactly():
  from fedjax_dp.privacy import GaussianSumMechanism
  from fedjax_dp.privacy.accounting import LedgerAccounting
  from fedjax_dp.privacy.example_level import (ExampleDPSGDMechanism, ExampleLevelAccounting,
                                               PrivacyClass)
  from fedjax_dp.sampling import PoissonSampler

  def resumed(make, feed):
    """``make()`` fed 3 rounds, its JSON state loaded into a fresh one; both fed 2 more."""
    a, b = make(), make()
    for r in range(3):
      feed(a, r)
    b.load_state(json.loads(json.dumps(a.state())))
    assert b.report() == a.report()
    for r in range(3, 5):
      feed(a, r)
      feed(b, r)
    assert b.report() == a.report()
    return a, b

  sampler = PoissonSampler(20, 0.2, seed=3, capacity=2)  # grows on its first draws
  cohorts = [sampler.sample() for _ in range(5)]
  ledger, resumed_ledger = resumed(
      lambda: LedgerAccounting(GaussianSumMechanism(1.0, 1.1, "poisson", 0.2), 1e-5),
      lambda acc, r: acc.on_round(cohorts[r]))
  assert resumed_ledger.ledger.rounds == 5 and ledger.report()["epsilon"] > 0
  classes = [PrivacyClass("high", tuple(range(10)), ExampleDPSGDMechanism(1.0, 4, 2)),
             PrivacyClass("low", tuple(range(10, 20)), ExampleDPSGDMechanism(2.0, 4, 3))]
  a, b = resumed(lambda: ExampleLevelAccounting(classes, [20 + i % 3 for i in range(20)], 1e-5),
                 lambda acc, r: acc.on_round(cohorts[r]))
  assert np.array_equal(a.participation, b.participation) and b.participation.sum() > 0
  # A checkpoint of other events (another noise multiplier) is refused, not reinterpreted.
  other = LedgerAccounting(GaussianSumMechanism(1.0, 1.2, "poisson", 0.2), 1e-5)
  with pytest.raises(ConfigError, match="invalid resume="):
    other.load_state(json.loads(json.dumps(ledger.state())))

  fresh = PoissonSampler(20, 0.2, seed=3, capacity=2)
  for _ in range(3):
    fresh.sample()
  state = json.loads(json.dumps(fresh.state()))
  assert state["capacity_grew"] >= 1
  restored = PoissonSampler(20, 0.2, seed=99)
  restored.load_state(state)
  for _ in range(2):
    x, y = fresh.sample(), restored.sample()
    assert np.array_equal(x.ids, y.ids) and np.array_equal(x.mask, y.mask)
  assert restored.capacity == fresh.capacity


def test_params_sha256_is_of_the_bytes_shapes_and_dtypes():
  params = {"b": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
            "a": np.zeros(3, np.float32)}
  h = params_sha256(params)
  assert h == params_sha256({"a": params["a"], "b": params["b"]})  # order of insertion
  bumped = params["b"]["kernel"].copy()
  bumped[1, 2] = np.nextafter(bumped[1, 2], np.float32(np.inf))
  assert params_sha256({**params, "b": {"kernel": bumped}}) != h  # one ulp
  assert params_sha256({**params, "b": {"kernel": params["b"]["kernel"].reshape(3, 2)}}) != h
  assert params_sha256({**params, "a": np.zeros(3, np.float64)}) != h
  big_endian = params["b"]["kernel"].astype(">f4")
  assert params_sha256({**params, "b": {"kernel": big_endian}}) == h


def test_a_checkpoint_older_than_a_new_field_resumes_with_its_settings_repeated(
    checkpointed, monkeypatch, capsys):
  """A configuration stored before a field existed (here data_seed) loads with the field's
  default; repeating one of its stored settings is not a conflict."""
  from fedjax_dp import checkpoint
  read = checkpoint.read_meta

  def older(folder):
    meta = read(folder)
    return dict(meta, config={k: v for k, v in meta["config"].items() if k != "data_seed"})

  monkeypatch.setattr(checkpoint, "read_meta", older)
  assert main(["run", "--resume", str(checkpointed), "--rounds", "8", "--num-clients", "60"]) == 0
  printed = capsys.readouterr().out
  assert "nothing to resume" in printed and "wrote" not in printed  # its files are as they were
  # another value of the field it lacks is refused in one line, naming the value it ran with
  assert main(["run", "--resume", str(checkpointed), "--data-seed", "5"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "invalid data_seed=5" in err[0] and "data_seed=None" in err[0]
  # an option the run left unset, given at its default, is what it ran with: no conflict
  assert main(["run", "--resume", str(checkpointed), "--set", "trim_beta=0.1"]) == 0
  assert "nothing to resume" in capsys.readouterr().out
  assert main(["run", "--resume", str(checkpointed), "--set", "trim_beta=0.2"]) == 2
  assert "resumed run's option trim_beta=0.1" in capsys.readouterr().err


def test_a_checkpoint_whose_state_does_not_match_its_hash_is_refused(checkpointed, tmp_path,
                                                                       capsys):
  """Each checkpoint saves the SHA-256 of its state; a state that no longer matches it (files
  changed or damaged where no codec notices) is refused, not resumed."""
  import re
  import shutil
  run = tmp_path / "run"
  shutil.copytree(checkpointed, run)
  (run / "summary.json").unlink()  # unfinished: --resume restores the state
  meta = next((run / "checkpoints" / "8" / "host").glob("metadata"))
  text = meta.read_text()
  digest = re.search(r'"sha256": "([0-9a-f]{64})"', text).group(1)
  meta.write_text(text.replace(digest, digest[::-1]))
  assert main(["run", "--resume", str(run), "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "SHA-256" in err[0] and "checkpoints/8" in err[0]


@pytest.mark.parametrize("damage,what", [
    (lambda host: host.pop("sampler"), "lacks ['sampler']"),
    (lambda host: host["log"].pop("diverged"), "lacks ['log.diverged']"),
    (lambda host: host.update(round="8"), "invalid ['round']"),
    (lambda host: host["sampler"].pop("bit_generator"), "does not match the SHA-256"),
    # Well-formed but changed: the privacy ledger's count of one event.
    (lambda host: host["accounting"]["ledger"][0].__setitem__(1, 1), "does not match the SHA-256"),
    # An older checkpoint, saved without the host item's digest.
    (lambda host: host.pop("host_sha256") and host["sampler"].pop("bit_generator"),
     "KeyError: 'bit_generator'"),
], ids=["no sampler", "no log.diverged", "round not a number", "no sampler bit_generator",
        "ledger count changed", "older, sampler state damaged"])
def test_a_checkpoint_whose_host_item_is_damaged_is_refused(checkpointed, tmp_path, capsys,
                                                            damage, what):
  """A checkpoint's ``host`` item (JSON) that lacks what resuming reads is refused in one line
  naming the checkpoint, by the command line and by the Python API, and nothing is changed."""
  run = tmp_path / "run"
  shutil.copytree(checkpointed, run)
  (run / "summary.json").unlink()  # unfinished: --resume restores the state
  meta = run / "checkpoints" / "8" / "host" / "metadata"
  host = json.loads(meta.read_text())
  damage(host)
  meta.write_text(json.dumps(host))
  rows = (run / "metrics.jsonl").read_bytes()
  assert main(["run", "--resume", str(run), "--no-progress"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "invalid resume=" in err[0] and "checkpoints/8" in err[0], err
  assert what in err[0] and "changed or damaged" in err[0]
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import simulate
  config = make_config(num_clients=60, rounds=8, local_steps=2, model="mlp", eval_every=3)
  with pytest.raises(ConfigError, match="checkpoints/8"):
    simulate(config, output_dir=str(run), resume=True)
  assert (run / "metrics.jsonl").read_bytes() == rows


def test_an_interrupt_that_python_swallowed_still_stops_the_run(tmp_path, monkeypatch, capsys):
  # A KeyboardInterrupt raised inside a finalizer or a garbage-collection callback is printed as
  # "Exception ignored" and lost; the signal is remembered, and the run stops after its round.
  import fedjax_dp.cli as cli
  import fedjax_dp.engine
  real, count = fedjax_dp.engine.summarize_round, [0]

  def summarize(*a, **k):
    count[0] += 1
    if count[0] == 3:
      cli._SIGNALLED.set()  # as _interrupt does before its KeyboardInterrupt is swallowed
    return real(*a, **k)

  monkeypatch.setattr(fedjax_dp.engine, "summarize_round", summarize)
  out = tmp_path / "run"
  assert main(["run", *TINY, "--output-dir", str(out)]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "3 rounds kept" in err[0], err
  assert not (out / "summary.json").exists()


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
  import os
  import signal
  import fedjax_dp.engine
  real, count = fedjax_dp.engine.summarize_round, [0]

  def summarize(*a, **k):  # a scheduler's SIGTERM while round 3 is summarized
    count[0] += 1
    if count[0] == 3:
      os.kill(os.getpid(), signal.SIGTERM)
    return real(*a, **k)

  monkeypatch.setattr(fedjax_dp.engine, "summarize_round", summarize)
  before = signal.getsignal(signal.SIGTERM)
  out = tmp_path / "run"
  assert main(["run", *TINY, "--checkpoint-every", "2", "--output-dir", str(out)]) == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "rounds kept" in err[0] and f"--resume {out}" in err[0], err
  assert signal.getsignal(signal.SIGTERM) == before  # the handler is main()'s only


def test_a_resume_on_another_device_split_is_refused(tmp_path):
  out = tmp_path / "run"
  assert main(["run", "--num-clients", "20", "--rounds", "2", "--model", "mlp", "--max-test", "50",
               "--checkpoint-every", "1", "--no-progress", "--output-dir", str(out)]) == 0
  (out / "summary.json").unlink()  # as a run killed after its last checkpoint
  before = (out / "metrics.jsonl").read_text()
  proc = subprocess.run([sys.executable, "-m", "fedjax_dp.cli", "run", "--resume", str(out),
                         "--cpu-devices", "2", "--no-progress"], capture_output=True, text=True,
                        timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "split its clients over 1 devices and this process over 2" in proc.stderr
  assert proc.stderr.count("\n") == 1 and (out / "metrics.jsonl").read_text() == before
