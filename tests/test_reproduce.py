"""The reproductions' shared runner, seed statistics, Markdown tables and plots."""

import functools
import json
import math
import types

import pytest

from fedjax_dp.errors import ConfigError
from fedjax_dp.plots import Curve, plot_curves, plot_quantiles
from fedjax_dp.reproduce.runner import (Execution, Job, Kept, group_by, history, num_seeds,
                                        read_records, run_jobs, wall_seconds)
from fedjax_dp.reproduce.tables import (Claim, markdown_table, mean_std, seed_difference, verdict,
                                       verdict_table)
from fedjax_dp.stats import seed_stats


def test_seed_stats_sample_std():
  s = seed_stats([0.5, 0.7, 0.9])
  assert s == {"accuracy_mean": pytest.approx(0.7), "accuracy_std": pytest.approx(0.2),
               "seeds": 3}
  assert seed_stats([0.25], name="loss") == {"loss_mean": 0.25, "loss_std": None, "seeds": 1}  # undefined, not 0
  nan = seed_stats([0.5, None])  # a diverged seed is not dropped
  assert math.isnan(nan["accuracy_mean"]) and math.isnan(nan["accuracy_std"])
  assert nan["seeds"] == 2


def test_num_seeds():
  from fedjax_dp.sweep import MAX_EXPERIMENTS
  assert num_seeds(None, 3) == 3 and num_seeds(2, 3) == 2
  assert num_seeds(MAX_EXPERIMENTS, 3) == MAX_EXPERIMENTS
  with pytest.raises(ConfigError):
    num_seeds(-1, 3)


@pytest.mark.parametrize("seeds,words", [
    (100_000_001, "at most 100000"),  # would plan GBs of runs before the first one ran
    (5_000_000_000, "at most 100000"),  # past the largest seed, 2**32 - 1, too
    (2.5, "integer"), (True, "integer"), ("3", "integer"),
])
def test_num_seeds_refuses_what_no_run_can_use(seeds, words):
  with pytest.raises(ConfigError, match="invalid seeds=") as e:
    num_seeds(seeds, 3)
  assert words in str(e.value)


@pytest.mark.parametrize("seeds", ["100000001", "5000000000"])
def test_reproduce_refuses_too_many_seeds_before_anything_runs(seeds, tmp_path, capsys):
  from fedjax_dp.cli import main
  out = tmp_path / "out"
  assert main(["reproduce", "zhu2022", "--seeds", seeds, "--output-dir", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"invalid seeds={seeds}" in err, err
  assert not out.exists()


def test_mean_std_and_table():
  assert mean_std(0.1234, 0.0056) == "12.34 ± 0.56"
  assert mean_std(0.5) == "50.00" and mean_std(None, 0.1) == "n/a"
  assert mean_std(74.48, 0.52, scale=1) == "74.48 ± 0.52"
  lines = markdown_table(["a", ("b", "B b")], [{"a": 1, "b": "x"}, {"a": None}])
  assert lines == ["| a | B b |", "|---|---|", "| 1 | x |", "| None |  |"]


def _fake_one(job, data):
  rounds = [{"round": r, "diagnostics": {"update_norm": {"q50": 0.1 * r}, "extra": r}}
            for r in (1, 2)]
  rounds[-1]["test_accuracy"] = data["acc"] + job.labels["seed"]
  return types.SimpleNamespace(history=rounds, summary={"final_accuracy": rounds[-1]["test_accuracy"]})


def _fake_run(jobs, data, done, threads=None):
  """Runs the jobs in two groups, the second half first (records keep the jobs' order)."""
  half = len(jobs) // 2
  for indices in (range(half, len(jobs)), range(half)):
    done(list(indices), [_fake_one(jobs[i], data) for i in indices])


def test_history_keeps_the_evaluated_rounds_and_the_named_diagnostics():
  rounds = _fake_one(Job(None, {"seed": 0}), {"acc": 0.5}).history
  assert history(rounds) == [{"round": 1, "diagnostics": {"update_norm": {"q50": 0.1}, "extra": 1}},
                             {"round": 2, "test_accuracy": 0.5,
                              "diagnostics": {"update_norm": {"q50": 0.2}, "extra": 2}}]
  curve = history(rounds, Kept(diagnostics=("extra", "absent"), evaluated_only=True))
  assert curve == [{"round": 2, "test_accuracy": 0.5, "diagnostics": {"extra": 2}}]
  assert history(curve, Kept(evaluated_only=True)) == curve  # a kept history thins no further


def test_verdict_rules():
  assert verdict(3.0, None) == "not measured"
  assert verdict(3.0, 2.0) == "reproduced"
  assert verdict(3.0, 2.0, spread=2.5) == "partly"  # within the seed spread
  assert verdict(3.0, 1.0) == "partly"  # the claimed sign, under half the claim
  assert verdict(3.0, 0.0) == "not reproduced"
  assert verdict(3.0, -0.5) == "not reproduced"
  assert verdict(-2.0, -1.5) == "reproduced"  # a claimed loss
  assert verdict(-2.0, 1.5) == "not reproduced"
  with pytest.raises(ValueError, match="paper_gain"):
    verdict(0.0, 1.0)
  # a figure's direction only: any size of the claimed sign, above the spread
  assert verdict(-1.0, -0.1, sign_only=True) == "reproduced"
  assert verdict(-1.0, -0.1, spread=0.2, sign_only=True) == "partly"
  assert verdict(1.0, -0.1, sign_only=True) == "not reproduced"


def test_seed_difference_is_the_mean_and_sample_std_of_paired_differences():
  assert seed_difference([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
  assert seed_difference([-4.5]) == (-4.5, None)  # one seed: no spread


def test_verdict_table():
  lines = verdict_table([Claim("A beats B", 4.41, -8.99, reason="noise feedback"),
                         Claim("C beats D", 2.0, 1.5, spread=0.25),
                         Claim("E beats F", 1.0, None),
                         Claim("G falls", -1.0, -0.25, spread=0.5, sign_only=True)])
  assert lines[0].startswith("| claim | paper (points) | ours (points) | gap | verdict")
  assert lines[2] == "| A beats B | +4.41 | -8.99 | -13.40 | not reproduced | noise feedback |"
  assert lines[3] == "| C beats D | +2.00 | +1.50 ± 0.25 | -0.50 | reproduced |  |"
  assert lines[4] == "| E beats F | +1.00 | n/a |  | not measured |  |"
  assert lines[5] == "| G falls | - (sign only) | -0.25 ± 0.50 |  | partly |  |"


def test_run_jobs(tmp_path):
  loaded, lines, partial = [], [], []

  def load(key):
    loaded.append(key)
    return {"acc": {"a": 0.25, "b": 0.5}[key]}

  jobs = [Job(None, {"method": m, "seed": s}, data=k) for k in "ab" for m in ("x", "y")
          for s in (0, 1)]
  runs_path = tmp_path / "runs.jsonl"
  runs_path.write_text("old\n")
  records = run_jobs(jobs, lambda job, res: {"accuracy": res.summary["final_accuracy"]},
                     load_data=load, runs_path=runs_path, kept=Kept(diagnostics=("update_norm",)),
                     on_record=lambda rs: partial.append(len(rs)),
                     execution=Execution(_fake_run, log=lines.append))
  assert loaded == ["a", "b"]  # one data set per key, loaded when the key changes
  assert partial == [2, 4, 6, 8]  # after each group of two
  written = [json.loads(line) for line in runs_path.read_text().splitlines()]
  assert sorted(written, key=records.index) == records  # in the order the groups ended
  assert [(r["method"], r["seed"]) for r in written[:2]] == [("y", 0), ("y", 1)]
  assert list(records[0]) == ["method", "seed", "accuracy", "seconds", "process", "history"]
  assert records[0]["history"][0] == {"round": 1, "diagnostics": {"update_norm": {"q50": 0.1}}}
  assert records[1]["history"][1]["test_accuracy"] == 1.25
  assert lines[0].startswith("[1/8] method=y seed=0: acc=0.2500 (group of 2:")
  groups = group_by(records, ("method",))
  assert list(groups) == [("x",), ("y",)] and len(groups[("x",)]) == 4
  # read back, the records come in the rows' order, each row's by seed (seeds pair by position)
  rows = [{"method": "x", "seeds": 4}, {"method": "y", "seeds": 4}]
  assert [(r["method"], r["seed"]) for r in read_records(tmp_path, rows, ("method",))] == [
      (m, s) for m in "xy" for s in (0, 0, 1, 1)]
  # a setting without a row comes last
  assert [r["method"] for r in read_records(tmp_path, rows[1:], ("method",))] == ["y"] * 4 + ["x"] * 4


def test_wall_seconds_sums_each_process_up_to_its_last_record():
  def rec(started, seconds):
    return {"seconds": 1.0, "process": {"started": started, "seconds": seconds}}

  first = [rec("2026-01-01T00:00:00.1+00:00", s) for s in (30.0, 10.0, 20.0)]
  assert wall_seconds(first + [rec("2026-01-01T01:00:00.2+00:00", 5.0), {"seconds": 9.0}]) == 35.0
  assert wall_seconds([]) == 0.0


def test_a_records_seconds_are_its_groups_own_when_the_programs_say_so():
  def execute(jobs, data, done, threads):
    done([1], [_fake_one(jobs[1], data)], None, 7.5)  # with several threads, groups overlap
    done([0], [_fake_one(jobs[0], data)])  # no time given: the time since the previous group

  records = run_jobs([Job(None, {"seed": s}) for s in (0, 1)],
                     lambda job, res: {"accuracy": res.summary["final_accuracy"]},
                     load_data=lambda _: {"acc": 0.5},
                     execution=Execution(execute, log=lambda line: None))
  assert records[1]["seconds"] == 7.5 and 0 <= records[0]["seconds"] < 7.5
  assert records[0]["process"]["started"] == records[1]["process"]["started"]
  assert wall_seconds(records) == records[0]["process"]["seconds"]


def test_run_jobs_hands_its_threads_to_the_programs():
  seen = []

  def execute(jobs, data, done, threads):
    seen.append(threads)
    _fake_run(jobs, data, done)

  jobs = [Job(None, {"seed": s}) for s in (0, 1)]
  records = run_jobs(jobs, lambda job, res: {"accuracy": res.summary["final_accuracy"]},
                     load_data=lambda _: {"acc": 0.5},
                     execution=Execution(execute, threads=3,
                                         log=lambda line: None))
  assert seen == [3] and [r["accuracy"] for r in records] == [0.5, 1.5]


def test_plots(tmp_path):
  curves = [Curve("m", [1, 2], [0.1, 0.2]), Curve("n", [1, 2], [0.2, 0.3], err=[0.01, 0.02])]
  path = plot_curves([("a", curves), ("b", curves[:1])], tmp_path / "c.png", xlabel="round",
                     logx=True, ylim=(0, 1))
  assert path.read_bytes()[:4] == b"\x89PNG"
  q = {"q10": [0.1, 0.2], "q50": [0.2, 0.3], "q90": [0.3, 0.4]}
  path = plot_quantiles([("a", [1, 2], q)], tmp_path / "q.png", clip=0.3, ylabel="norm")
  assert path.read_bytes()[:4] == b"\x89PNG"
  with pytest.raises(ConfigError):
    plot_curves([], tmp_path / "none.png", xlabel="round")


def _saved_reproduction(paper, out, monkeypatch):
  """Writes in ``out`` the files of an earlier ``paper`` reproduction from the paper's own test
  fixtures (nothing trains) and returns the figures its ``--render`` draws, in order."""
  out.mkdir()
  if paper == "cheng2022":
    from fedjax_dp.reproduce import cheng2022
    from test_cheng2022 import _SETTINGS, _fake_runs
    runs = _fake_runs()
    (out / "results.json").write_text(json.dumps(
        {"settings": _SETTINGS, "rows": cheng2022._summarize(runs)}))
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    return ["cheng2022_update_norms.png", "cheng2022_accuracy.png", "cheng2022_fig3.png",
            "cheng2022_fig4.png"]
  if paper == "zhu2022":
    from test_zhu2022 import _records, _saved_run
    _saved_run(out, _records())
    return ["zhu2022_iid_gaussian.png"]
  if paper == "cheng2022-norms":
    from fedjax_dp.reproduce import blur_norms
    from test_blur_norms import synthetic_results
    results = synthetic_results()
    (out / "results.json").write_text(json.dumps(results))
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results["runs"]))
    return [blur_norms.FIGURE]
  return _fake_reproduction(paper, out, monkeypatch)  # spfl2024: its run, with fake training


def _fake_reproduction(paper, out, monkeypatch):
  """``fedjax-dp reproduce PAPER --scale tiny`` into ``out`` with every run faked (accuracy
  0.5), writing its results.json, runs.jsonl, results.md and figures; the figures, in order."""
  from fedjax_dp.cli import main
  from fedjax_dp.reproduce import spfl2024, zhu2022

  def fake_run_jobs(jobs, record, *, runs_path, **kwargs):
    if paper == "zhu2022":
      from test_zhu2022 import _record
      recs = [_record(*(j.labels[k] for k in ("partition", "attack", "method", "epsilon", "seed")),
                      0.5) for j in jobs]
    else:
      recs = [{**j.labels, "accuracy": 0.5, "formal_guarantee": False, "epsilon": None,
               "no_guarantee_reasons": None, "noise_multiplier": 1.0, "train_error": 0.5,
               "train_loss": 1.0, "seconds": 1.0} for j in jobs]
    runs_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return recs

  monkeypatch.setattr({"zhu2022": zhu2022, "spfl2024": spfl2024}[paper], "run_jobs",
                      fake_run_jobs)
  assert main(["reproduce", paper, "--scale", "tiny", "--output-dir", str(out),
               "--overwrite"]) == 0
  if paper == "zhu2022":
    return [f"zhu2022_{p}_{a}.png" for p, a in zhu2022.SETTINGS]
  return ["spfl2024_fig3.png"]  # tiny sweeps epsilon only


@pytest.mark.parametrize("paper", ["cheng2022", "cheng2022-norms", "spfl2024", "zhu2022"])
def test_render_ends_with_one_line_naming_the_files_it_wrote(paper, tmp_path, capsys,
                                                             monkeypatch):
  """Every paper's ``--render`` says what it wrote alike: ``wrote A, B, C``, the paths of
  results.md and the figures in the order written (cheng2022 and zhu2022 said nothing; spfl2024
  printed a Python list)."""
  from fedjax_dp.cli import main
  out = tmp_path / "out"
  figures = _saved_reproduction(paper, out, monkeypatch)
  capsys.readouterr()
  assert main(["reproduce", paper, "--render", "--output-dir", str(out)]) == 0
  printed = capsys.readouterr().out.splitlines()
  wrote = [line for line in printed if line.startswith("wrote ")]
  assert wrote == ["wrote " + ", ".join(str(out / n) for n in ["results.md"] + figures)], printed
  assert printed[-1] == wrote[0]
  assert all((out / n).is_file() for n in figures)


@pytest.mark.parametrize("paper", ["spfl2024", "zhu2022"])
def test_a_reproduction_ends_with_one_line_naming_the_files_it_wrote(paper, tmp_path, capsys,
                                                                     monkeypatch):
  """A reproduction's last line is its --render's, with results.json, runs.jsonl and the wall
  time: ``wrote A, B, C in N s`` (no prefix, no Python list)."""
  import re
  out = tmp_path / "out"
  figures = _fake_reproduction(paper, out, monkeypatch)
  printed = capsys.readouterr().out.splitlines()
  names = ["results.json", "runs.jsonl", "results.md"] + figures
  assert re.fullmatch(re.escape("wrote " + ", ".join(str(out / n) for n in names)) + r" in \d+ s",
                      printed[-1]), printed[-1]
  assert [line for line in printed if "wrote" in line] == printed[-1:]


def test_an_interrupted_overwrite_leaves_no_figure_of_the_earlier_reproduction(tmp_path, capsys,
                                                                               monkeypatch):
  # The earlier reproduction's figures and results go with it once the new one has written a
  # run: the folder never shows them beside the new partial runs.jsonl.
  from fedjax_dp.cli import EXIT_INTERRUPTED, main
  from fedjax_dp.reproduce import zhu2022
  out = tmp_path / "out"
  figures = _fake_reproduction("zhu2022", out, monkeypatch)
  assert all((out / f).is_file() for f in figures)
  import fedjax_dp  # results.json says what ran it, as a run's summary.json does
  provenance = json.loads((out / "results.json").read_text())["provenance"]
  assert provenance["fedjax_dp"] == fedjax_dp.__version__ and "git" in provenance
  assert any(p.startswith("provenance") for p in json.loads((out / "results.json").read_text())[
      "release"]["public_by_design"])

  def interrupted(jobs, record, *, runs_path, finished=1, **kwargs):
    (runs_path.parent / "runs" / "a run").mkdir(parents=True)  # a run begun
    runs_path.write_text(json.dumps({"a run": 1}) + "\n" if finished else "")
    raise KeyboardInterrupt
  # Before the first run has finished: the earlier reproduction stays as it was.
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  monkeypatch.setattr(zhu2022, "run_jobs", functools.partial(interrupted, finished=0))
  capsys.readouterr()
  assert main(["reproduce", "zhu2022", "--scale", "tiny", "--output-dir", str(out),
               "--overwrite"]) == EXIT_INTERRUPTED
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before
  assert capsys.readouterr().err.strip() == (
      f"fedjax-dp: interrupted: no run finished: {out} is as it was")
  # Once one has: the earlier reproduction's files go, figures included.
  monkeypatch.setattr(zhu2022, "run_jobs", interrupted)
  assert main(["reproduce", "zhu2022", "--scale", "tiny", "--output-dir", str(out),
               "--overwrite"]) == EXIT_INTERRUPTED
  assert sorted(p.name for p in out.iterdir()) == ["reproduction.json", "runs", "runs.jsonl"]
  assert capsys.readouterr().err.strip() == (
      f"fedjax-dp: interrupted: 1 finished run kept in {out / 'runs.jsonl'}; continue the "
      f"reproduction with: fedjax-dp reproduce zhu2022 --resume {out}")


@pytest.mark.parametrize("flags", [["--scale", "paper"], ["--seeds", "7"], ["--threads", "3"],
                                   ["--data-dir", "x"], ["--overwrite"]])
def test_render_refuses_the_settings_of_a_run(flags, tmp_path, capsys):
  from fedjax_dp.cli import main
  assert main(["reproduce", "cheng2022", "--render", *flags, "--output-dir", str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "is not read by --render, which runs nothing" in err[0], err
