"""Resuming an interrupted reproduction (``fedjax-dp reproduce PAPER --resume DIR``): the runs
whose records ``runs.jsonl`` holds are not run again, the others run as the uninterrupted
reproduction ran them, and the results are written from every record."""

import dataclasses
import hashlib
import json
import types
import zlib

import numpy as np
import pytest

from fedjax_dp.cli import EXIT_INTERRUPTED, main
from fedjax_dp.errors import ConfigError
from fedjax_dp.reproduce import runner, zhu2022
from fedjax_dp.reproduce.runner import Execution, Job, run_jobs
from fedjax_dp.sweep import Task, run_configs


def _result(job):
  """A fake run's result: a function of the job alone."""
  acc = zlib.crc32(json.dumps(job.labels, sort_keys=True).encode()) % 1000 / 1000
  history = [{"round": r, "test_accuracy": acc * r / 2, "diagnostics": {"update_norm": r}}
             for r in (1, 2)]
  return types.SimpleNamespace(history=history, summary={
      "final_accuracy": acc, "epsilon": 1.0, "delta": 1e-5, "formal_guarantee": True,
      "guarantee_note": "fake"})


def _execute(stop_after=None):
  """An ``Execution.execute`` that fakes its jobs' runs in groups of three, and is interrupted
  (Ctrl-C: KeyboardInterrupt) once ``stop_after`` groups have ended, over all its calls; its
  ``ran`` lists the jobs it ran."""
  ended, ran = [0], []

  def execute(jobs, data, done, threads=None):
    del data, threads
    for k in range(0, len(jobs), 3):
      if ended[0] == stop_after:
        raise KeyboardInterrupt
      group = list(range(k, min(k + 3, len(jobs))))
      ran.extend(jobs[i].describe() for i in group)
      done(group, [_result(jobs[i]) for i in group])
      ended[0] += 1

  execute.ran = ran
  return execute


JOBS = [Job(None, {"data": k, "method": m, "seed": s}, data=k) for k in "ab" for m in "xy"
        for s in (0, 1)]


def _run(path, execute, resume=False, log=None, loaded=None, on_record=None):
  def load(key):
    if loaded is not None:
      loaded.append(key)
    return key
  return run_jobs(JOBS, lambda job, res: {"accuracy": res.summary["final_accuracy"]},
                  load_data=load, runs_path=path, on_record=on_record,
                  execution=Execution(execute, log=(log if log is not None else []).append,
                                      resume=resume))


def _timeless(records) -> list:
  """``records`` without their wall times (the run's ``seconds``, its process's and each
  round's), in a fixed order."""
  def timeless(value):
    if isinstance(value, dict):
      return {k: timeless(v) for k, v in value.items() if k not in ("seconds", "process")}
    return [timeless(v) for v in value] if isinstance(value, list) else value
  return sorted((timeless(r) for r in records), key=json.dumps)


def _file(path) -> list:
  return _timeless(json.loads(line) for line in path.read_text().splitlines())


def test_run_jobs_resumes_where_an_interrupted_call_stopped(tmp_path):
  whole = _run(tmp_path / "whole.jsonl", _execute())
  path = tmp_path / "runs.jsonl"
  with pytest.raises(KeyboardInterrupt):  # data set a's two groups end, b's first does not
    _run(path, _execute(stop_after=2))
  assert len(path.read_text().splitlines()) == 4
  execute, log, loaded, partial = _execute(), [], [], []
  resumed = _run(path, execute, resume=True, log=log, loaded=loaded,
                 on_record=lambda rs: partial.append(len(rs)))
  assert execute.ran == [j.describe() for j in JOBS[4:]] and loaded == ["b"]
  assert [(r["data"], r["method"], r["seed"]) for r in resumed] == [
      tuple(j.labels.values()) for j in JOBS]
  assert _timeless(resumed) == _timeless(whole)
  assert _file(path) == _file(tmp_path / "whole.jsonl")
  assert log[0] == "resumed: 4 of 8 runs were done, 4 to run"
  assert log[1].startswith("[5/8] data=b method=x seed=0: acc=")
  assert partial == [7, 8]  # the earlier records with the new ones
  # Every run done: nothing runs, nothing is written.
  execute, before = _execute(), path.read_bytes()
  assert _timeless(_run(path, execute, resume=True)) == _timeless(whole)
  assert execute.ran == [] and path.read_bytes() == before


def test_a_last_line_cut_short_is_dropped_and_its_run_runs_again(tmp_path):
  _run(tmp_path / "whole.jsonl", _execute())
  lines = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)
  path = tmp_path / "runs.jsonl"
  path.write_text("".join(lines[:3]) + lines[3][:40])  # killed while writing the fourth
  execute, log = _execute(), []
  _run(path, execute, resume=True, log=log)
  assert log[0] == (f"{path}: its last line was cut short (40 bytes: the reproduction was "
                    "stopped while writing it): dropped, its run runs again")
  assert log[1] == "resumed: 3 of 8 runs were done, 5 to run"
  assert len(execute.ran) == 5
  assert _file(path) == _file(tmp_path / "whole.jsonl")


@pytest.mark.parametrize("line,words", [
    ("not json\n", "has a line 2 that is not JSON"),
    ('{"data": "a", "method": "x", "seed": 1}\n',
     "has a line 2 that is not a finished run's record"),
    (None, "holds two records of the run data=a method=x seed=0 (lines 1 and 2): it mixes runs"),
])
def test_a_damaged_or_doubled_runs_jsonl_is_refused(line, words, tmp_path):
  _run(tmp_path / "whole.jsonl", _execute())
  first = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)[0]
  path = tmp_path / "runs.jsonl"
  path.write_text(first + (first if line is None else line))
  execute = _execute()
  with pytest.raises(ConfigError, match=f"invalid resume='{path}'") as e:
    _run(path, execute, resume=True)
  assert words in str(e.value) and len(str(e.value).splitlines()) == 1
  assert execute.ran == []


def test_a_resumed_run_computes_bit_for_bit_what_the_uninterrupted_one_did(tmp_path):
  """Real runs: a job run again in another group (of other sizes, with other threads) than the
  uninterrupted reproduction's gives the same record, its final model bit for bit."""
  from jax.flatten_util import ravel_pytree

  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import load_data
  jobs = [Job(make_config(num_clients=20, rounds=2, local_steps=2, model="mlp", eval_every=1,
                          target_epsilon=None, noise_multiplier=1.0, clip=clip, seed=seed),
              {"clip": clip, "seed": seed}) for clip, seed in ((0.1, 0), (0.1, 1), (1.0, 0))]
  data = load_data(jobs[0].config)

  def record(job, res):
    flat = np.asarray(ravel_pytree(res.state.params)[0])
    return {"accuracy": res.summary["final_accuracy"],
            "params": hashlib.sha256(flat.tobytes()).hexdigest()}

  def grouped(jobs, data, done, threads=None):
    """The runs as one program, as an accelerator runs them (vmapped)."""
    run_configs([Task(j.config, data, j.output_dir) for j in jobs], on_group=done,
                threads=threads)

  def go(path, threads, resume=False, execute=runner.simulate_jobs, log=None):
    return run_jobs(jobs, record, load_data=lambda _: data, runs_path=path,
                    execution=Execution(execute, threads=threads, resume=resume,
                                        log=(log if log is not None else []).append))

  whole = go(tmp_path / "whole.jsonl", threads=1, execute=grouped)  # one group of three
  lines = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)
  path = tmp_path / "runs.jsonl"
  path.write_text(lines[0] + lines[1][:25])  # killed while writing the group's second record
  log = []
  resumed = go(path, threads=2, resume=True, log=log)
  # on a CPU each run is a group of its own, its record kept as it ends
  assert [line.split("(group of ")[1][:2] for line in log if line.startswith("[")] == ["1:", "1:"]
  assert _timeless(resumed) == _timeless(whole)
  assert _file(path) == _file(tmp_path / "whole.jsonl")


def _faked(monkeypatch, stop_after=None):
  """``zhu2022``'s runs faked (:func:`_execute`, no data set loaded) through the real
  :func:`run_jobs`, so that ``fedjax-dp reproduce zhu2022`` writes every file from them."""
  execute = _execute(stop_after)

  def run_jobs_faked(jobs, record, *, execution, **kwargs):
    return runner.run_jobs(jobs, record, **dict(kwargs, load_data=lambda key: key),
                           execution=dataclasses.replace(execution, execute=execute))
  monkeypatch.setattr(zhu2022, "run_jobs", run_jobs_faked)
  return execute


def _results(out) -> dict:
  """``results.json`` without its timings."""
  doc = json.loads((out / "results.json").read_text())
  del doc["wall_seconds"]
  for row in doc["rows"]:
    del row["seconds_per_run"]
  return doc


def _tree(folder) -> dict:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


def test_an_interrupted_reproduction_resumed_writes_what_an_uninterrupted_one_does(
    tmp_path, monkeypatch, capsys):
  whole, out = tmp_path / "whole", tmp_path / "out"
  _faked(monkeypatch)
  assert main(["reproduce", "zhu2022", "--scale", "tiny", "--output-dir", str(whole)]) == 0
  _faked(monkeypatch, stop_after=3)
  assert main(["reproduce", "zhu2022", "--scale", "tiny", "--output-dir", str(out)]) == (
      EXIT_INTERRUPTED)
  assert capsys.readouterr().err.strip() == (
      f"fedjax-dp: interrupted: 9 finished runs kept in {out / 'runs.jsonl'}; continue the "
      f"reproduction with: fedjax-dp reproduce zhu2022 --resume {out}")
  with (out / "runs.jsonl").open("a") as f:  # and a record cut short, as SIGKILL leaves one
    f.write('{"partition": "iid", "attack": "sign-fl')
  execute = _faked(monkeypatch)
  assert main(["reproduce", "zhu2022", "--resume", str(out)]) == 0
  printed = capsys.readouterr().out.splitlines()
  assert len(execute.ran) == len((whole / "runs.jsonl").read_text().splitlines()) - 9
  assert printed[0] == (f"[zhu2022] {out / 'runs.jsonl'}: its last line was cut short (39 bytes: "
                        "the reproduction was stopped while writing it): dropped, its run runs "
                        "again")
  assert printed[1] == "[zhu2022] resumed: 9 of 24 runs were done, 15 to run"
  assert _results(out) == _results(whole)
  assert _file(out / "runs.jsonl") == _file(whole / "runs.jsonl")
  # its wall time is both processes', each up to its last record
  records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
  processes = {r["process"]["started"]: r["process"]["seconds"] for r in records}
  assert len(processes) == 2
  assert json.loads((out / "results.json").read_text())["wall_seconds"] == sum(processes.values())
  assert (out / "results.md").read_text() == (whole / "results.md").read_text()
  assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())
  assert (out / "reproduction.json").read_text() == (whole / "reproduction.json").read_text()
  assert json.loads((out / "reproduction.json").read_text()) == {
      "paper": "zhu2022", "scale": "tiny", "seeds": 1, "data_dir": None, "finished": True}
  # A finished reproduction resumed: nothing runs, nothing changes.
  before, execute = _tree(out), _faked(monkeypatch)
  assert main(["reproduce", "zhu2022", "--resume", str(out), "--scale", "tiny"]) == 0
  assert capsys.readouterr().out.strip() == (
      f"{out} holds a finished reproduction of zhu2022 (scale tiny, 1 seed(s)): nothing to "
      "resume, its files are as they were")
  assert execute.ran == [] and _tree(out) == before


def _interrupted(tmp_path, monkeypatch):
  """A zhu2022 tiny reproduction in ``tmp_path/out`` stopped by Ctrl-C after its first group of
  faked runs; returns the folder."""
  out = tmp_path / "out"
  _faked(monkeypatch, stop_after=1)
  assert main(["reproduce", "zhu2022", "--scale", "tiny", "--output-dir", str(out)]) == (
      EXIT_INTERRUPTED)
  return out


@pytest.mark.parametrize("argv,words", [
    (["--seeds", "2"], "invalid seeds=2: differs from the resumed reproduction's seeds=1"),
    (["--scale", "small"], "invalid scale='small': differs from the resumed reproduction's "
                           "scale='tiny'"),
    (["--data-dir", "elsewhere"], "invalid data_dir='elsewhere': differs from the resumed "
                                  "reproduction's data_dir=None"),
    (["--overwrite"], "invalid overwrite=True: cannot be combined with --resume"),
    (["--output-dir", "other"], "invalid output_dir='other': must be left out with --resume"),
    (["--render"], "invalid resume="),
])
def test_a_resume_that_differs_from_the_reproduction_is_refused(argv, words, tmp_path,
                                                                monkeypatch, capsys):
  out = _interrupted(tmp_path, monkeypatch)
  before, execute = _tree(out), _faked(monkeypatch)
  capsys.readouterr()
  assert main(["reproduce", "zhu2022", "--resume", str(out), *argv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and words in err[0], err
  assert execute.ran == [] and _tree(out) == before


def test_only_a_reproduction_that_recorded_its_arguments_is_resumed(tmp_path, monkeypatch, capsys):
  out = _interrupted(tmp_path, monkeypatch)
  capsys.readouterr()
  assert main(["reproduce", "spfl2024", "--resume", str(out)]) == 2
  assert "invalid paper='spfl2024': differs from the reproduction in" in capsys.readouterr().err
  (out / "reproduction.json").write_text("{")
  assert main(["reproduce", "zhu2022", "--resume", str(out)]) == 2
  assert "is not the arguments of a reproduction" in capsys.readouterr().err
  (out / "reproduction.json").unlink()  # an earlier version's reproduction, or none
  assert main(["reproduce", "zhu2022", "--resume", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"fedjax-dp: error: invalid resume='{out}': holds no reproduction.json (the "
                 "arguments a reproduction records as it begins): no reproduction to resume "
                 "there; start one with --output-dir (--overwrite to replace an earlier one's "
                 "files)")
  assert main(["reproduce", "zhu2022"]) == 2
  assert "invalid output_dir=None: is required" in capsys.readouterr().err


def test_a_resume_holds_the_folder_as_a_run_does(tmp_path, monkeypatch, capsys):
  from fedjax_dp.outputs import sole_writer
  out = _interrupted(tmp_path, monkeypatch)
  before, execute = _tree(out), _faked(monkeypatch)
  capsys.readouterr()
  with sole_writer(out):  # another process writing it
    assert main(["reproduce", "zhu2022", "--resume", str(out)]) == 2
  assert "is being written by process" in capsys.readouterr().err
  assert execute.ran == [] and _tree(out) == before
