"""The Weights & Biases logger (fedjax_dp.observers.WandB, ``--wandb PROJECT``), in W&B's offline
mode: what a run logs, read back from the ``.wandb`` file W&B writes, and what a private
release keeps out of it. Needs the optional wandb (``pip install 'fedjax_dp[wandb]'``); the
refusals without it run everywhere."""

import importlib.util
import json
import struct

import pytest

from fedjax_dp import observers
from fedjax_dp.cli import main
from fedjax_dp.engine import RunOptions
from fedjax_dp.errors import ConfigError

TINY = ["--dataset", "digits", "--num-clients", "60", "--model", "mlp", "--rounds", "3",
        "--eval-every", "2", "--no-progress"]
NEEDS_WANDB = pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                                 reason="wandb is not installed: pip install 'fedjax_dp[wandb]'")


def _records(path) -> list:
  """``(kind, message)`` of every record in a ``.wandb`` file: W&B's 7-byte header, then a
  LevelDB log (32 KiB blocks of chunks: CRC, length, type 1 whole, 2 first, 3 middle, 4 last)
  of ``wandb_internal_pb2.Record`` protobufs."""
  from wandb.proto import wandb_internal_pb2
  data, pos, block, chunks, out = path.read_bytes(), 7, 32768, b"", []
  assert data[:4] == b":W&B"
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
      pos += block - pos % block
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:  # zero padding to the block's end
      pos += block - pos % block
      continue
    chunks += data[pos + 7:pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):
      record = wandb_internal_pb2.Record.FromString(chunks)
      which = record.WhichOneof("record_type")
      out.append((which, getattr(record, which)))
      chunks = b""
  return out


def _key(item) -> str:
  return "/".join(item.nested_key) if item.nested_key else item.key


def _logged(wandb_dir, project) -> dict:
  """What the one W&B run of ``project`` under ``wandb_dir`` logged: its ``config``,
  ``history`` (a dict per logged row), ``summary`` (the last value of each key), ``start_time``
  (seconds) and ``kinds`` (the kinds of its records)."""
  [records] = [r for r in map(_records, wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
               if any(kind == "run" and m.project == project for kind, m in r)]
  out = {"config": {}, "history": [], "summary": {}, "kinds": set()}
  for kind, message in records:
    out["kinds"].add(kind)
    if kind == "run":
      out["config"] = {_key(u): json.loads(u.value_json) for u in message.config.update}
      out["start_time"] = message.start_time.seconds + message.start_time.nanos / 1e9
    elif kind == "history":
      out["history"].append({_key(i): json.loads(i.value_json) for i in message.item})
    elif kind == "summary":
      out["summary"].update({_key(u): json.loads(u.value_json) for u in message.update})
  return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two tiny DP-FedAvg runs with --wandb in W&B's offline mode, release all and private, each
  in a W&B project of its own: ``{release: (run folder, what W&B logged)}``."""
  base = tmp_path_factory.mktemp("wandb")
  folders = {}
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DIR", str(base))  # read by W&B once per process
    for release in ("all", "private"):
      folders[release] = base / release
      assert main(["run", *TINY, "--wandb", f"tests-{release}", "--release", release,
                   "--output-dir", str(folders[release])]) == 0
  import wandb
  wandb.teardown()  # W&B's service writes a finished run's file after finish returns: this waits
  return {release: (folder, _logged(base, f"tests-{release}"))
          for release, folder in folders.items()}


def _rows(folder) -> list:
  return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@NEEDS_WANDB
@pytest.mark.parametrize("release", ["all", "private"])
def test_wandb_logs_the_configuration(runs, release):
  folder, logged = runs[release]
  config = json.loads((folder / "summary.json").read_text())["config"]
  assert logged["config"]["algorithm"] == config["algorithm"]
  assert logged["config"]["run"] == config["run"] and "not_used" not in logged["config"]


@NEEDS_WANDB
@pytest.mark.parametrize("release", ["all", "private"])
def test_wandb_logs_every_round_as_metrics_jsonl_holds_it(runs, release):
  folder, logged = runs[release]
  history = logged["history"]
  rows = _rows(folder)
  assert [h["_step"] for h in history] == [row["round"] for row in rows] == [1, 2, 3]
  for h, row in zip(history, rows):
    assert {k: v for k, v in h.items() if not k.startswith("_")} == observers.scalars(row)
  assert any("test_accuracy" in h for h in history) and all("epsilon" in h for h in history)
  if release == "all":  # the raw diagnostics, the round's seconds among them
    assert all("diagnostics/seconds" in h and "diagnostics/cohort_size" in h for h in history)
  summary = json.loads((folder / "summary.json").read_text())
  for key in ("final_accuracy", "epsilon", "privacy_unit"):
    assert logged["summary"][key] == summary[key]


@NEEDS_WANDB
def test_a_private_release_logs_no_timing(runs):
  folder, logged = runs["private"]
  ours = [k for h in logged["history"] for k in h if not k.startswith("_")] + list(logged["summary"])
  assert ours and not [k for k in ours if "diagnostics" in k or "seconds" in k]
  # No system metrics (timed samples) and no machine metadata, as the release "all" run has.
  for kind in ("stats", "environment"):
    assert kind not in logged["kinds"] and kind in runs["all"][1]["kinds"]
  # The W&B run began after the run's last round: W&B's own stamps (every row's wall time and
  # seconds since its start) say when the run ended, not how long a round took.
  assert logged["start_time"] >= (folder / "metrics.jsonl").stat().st_mtime - 1e-3


def test_wandb_without_the_package_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(ConfigError, match=r"invalid wandb='p': needs the wandb package: "
                     r"pip install 'fedjax_dp\[wandb\]'"):
    RunOptions(wandb="p")
  assert main(["run", *TINY, "--wandb", "p", "--output-dir", str(tmp_path / "run")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "needs the wandb package" in err[0], err
  assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("project", ["", "a/b", "x" * 129, 3])
def test_a_bad_wandb_project_is_refused(project):
  with pytest.raises(ConfigError, match="invalid wandb=.*must be a W&B project name"):
    RunOptions(wandb=project)
