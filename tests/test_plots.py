"""TensorBoard event files, norms.npz and ``fedjax-dp plot`` (fedjax_dp.plots)."""

import json
import struct

import numpy as np
import pytest

from fedjax_dp import outputs, plots
from fedjax_dp.cli import main
from fedjax_dp.engine import RunResult
from fedjax_dp.errors import ConfigError
from fedjax_dp.stats import seed_stats
from fedjax_dp.sweep import SweepResult

TINY = ["--dataset", "digits", "--num-clients", "60", "--model", "mlp", "--rounds", "3",
        "--eval-every", "2", "--no-progress"]


def _values(folder) -> list:
  """``(Event, Summary.Value)`` of every value in the event files in ``folder``, read as
  TFRecords (length, its CRC, an ``Event`` protobuf, its CRC)."""
  from tensorboardX.proto import event_pb2
  files = sorted(folder.glob("events.out.tfevents.*"))
  assert files, f"no event file in {folder}"
  out = []
  for f in files:
    data, i = f.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      out += [(event, v) for v in event.summary.value]
  return out


def _hparams(folder) -> dict:
  """The hyper-parameters of the HParams plugin's session start in ``folder``'s events."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
  [start] = [v for _, v in _values(folder) if v.tag == "_hparams_/session_start_info"]
  data = HParamsPluginData.FromString(start.metadata.plugin_data.content)
  return {k: getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()}


def _events(folder) -> tuple:
  """``({tag: {step: value}}, {histogram tag: steps})`` of the event files in ``folder`` (the
  HParams plugin's summaries left out)."""
  scalars, histograms = {}, {}
  for event, v in _values(folder):
    if v.tag.startswith("_hparams_/"):
      continue
    if v.HasField("histo"):
      histograms.setdefault(v.tag, []).append(event.step)
    else:
      scalars.setdefault(v.tag, {})[event.step] = v.simple_value
  return scalars, histograms


def _rows(folder) -> list:
  return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two tiny DP-FedAvg runs with --tensorboard: release all and release private."""
  base = tmp_path_factory.mktemp("runs")
  out = {}
  for release in ("all", "private"):
    out[release] = base / release
    assert main(["run", *TINY, "--tensorboard", "--release", release,
                 "--output-dir", str(out[release])]) == 0
  return out


def test_tensorboard_holds_the_configuration_as_hyper_parameters(runs):
  summary = json.loads((runs["all"] / "summary.json").read_text())
  hparams = _hparams(runs["all"] / outputs.TENSORBOARD)
  assert hparams["algorithm/name"] == "dp_fedavg" and hparams["run/rounds"] == 3
  assert hparams["algorithm/clip"] == summary["config"]["algorithm"]["clip"]
  assert hparams["run/max_test"] == "none" and not any("not_used" in k for k in hparams)


def test_private_events_say_nothing_of_time(runs):
  assert {event.wall_time for event, _ in _values(runs["private"] / outputs.TENSORBOARD)} == {0.0}
  assert min(event.wall_time for event, _ in _values(runs["all"] / outputs.TENSORBOARD)) > 1e9


def test_tensorboard_holds_the_records(runs):
  rows = _rows(runs["all"])
  scalars, histograms = _events(runs["all"] / outputs.TENSORBOARD)
  evaluated = {r["round"]: r["test_accuracy"] for r in rows if "test_accuracy" in r}
  assert sorted(evaluated) == [2, 3]
  assert scalars["test_accuracy"] == pytest.approx(evaluated, rel=1e-6)
  assert scalars["epsilon"] == pytest.approx({r["round"]: r["epsilon"] for r in rows}, rel=1e-6)
  for name in ("train_loss", "fraction_clipped"):
    assert scalars[f"diagnostics/{name}"] == pytest.approx(
        {r["round"]: r["diagnostics"][name] for r in rows}, rel=1e-6)
  assert sorted(histograms["diagnostics/update_norm"]) == [1, 2, 3]


def test_private_release_writes_no_diagnostics(runs):
  folder = runs["private"]
  scalars, histograms = _events(folder / outputs.TENSORBOARD)
  assert not histograms
  assert not [t for t in scalars if t.startswith("diagnostics/")]
  assert set(scalars) >= {"test_accuracy", "test_loss", "epsilon", "aggregate_norm"}
  assert not (folder / outputs.NORMS).exists()
  assert all("diagnostics" not in r for r in _rows(folder))


def test_norms_npz_matches_the_rows_quantiles(runs):
  rows = _rows(runs["all"])
  z = plots.read_norms(runs["all"])
  assert list(z["round"]) == [r["round"] for r in rows]
  summary = json.loads((runs["all"] / "summary.json").read_text())
  assert z["clip"] == summary["config"]["algorithm"]["clip"]
  for norms, r in zip(z["norms"], rows):
    d = r["diagnostics"]
    assert norms.dtype == np.float32 and len(norms) == d["cohort_size"]
    q10, q50, q90 = (float(q) for q in np.quantile(norms, [0.1, 0.5, 0.9]))
    assert (q10, q50, q90) == tuple(d["update_norm"][k] for k in ("q10", "q50", "q90"))
    assert float(np.mean(norms > z["clip"])) == d["fraction_clipped"]


def test_overwrite_removes_the_earlier_norms_and_event_files(tmp_path):
  (tmp_path / outputs.TENSORBOARD).mkdir()
  (tmp_path / outputs.TENSORBOARD / "events.out.tfevents.1").write_bytes(b"old")
  (tmp_path / outputs.NORMS).write_bytes(b"old")
  with pytest.raises(ConfigError, match="norms.npz"):
    outputs.check_output_dir(tmp_path, overwrite=False)
  f = outputs.MetricsFile(tmp_path)
  f.write("{}\n")
  f.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_plot_runs_and_norms(runs, tmp_path, capsys):
  fig = plots.plot_runs([runs["all"], runs["private"]], tmp_path / "runs.png")
  assert (tmp_path / "runs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  accuracy, epsilon = fig.axes
  assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2]
  assert list(accuracy.get_lines()[0].get_xdata()) == [2, 3]
  assert list(epsilon.get_lines()[0].get_xdata()) == [1, 2, 3]
  assert accuracy.get_legend_handles_labels()[1] == ["all", "private"]

  fig = plots.plot_norms(runs["all"], tmp_path / "norms.png")
  (ax,) = fig.axes
  median, clip = ax.get_lines()
  assert list(median.get_ydata()) == [r["diagnostics"]["update_norm"]["q50"]
                                     for r in _rows(runs["all"])]
  assert list(clip.get_ydata()) == [0.5, 0.5] and len(ax.collections) == 1  # the 10-90% band

  for args, kind in (([str(runs["all"])], "norms"), ([str(runs["all"]), str(runs["private"])], "runs"),
                     ([str(runs["all"]), "--kind", "runs"], "runs")):
    out = tmp_path / f"cli-{kind}-{len(args)}.png"
    assert main(["plot", *args, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == f"wrote {out} ({kind})"


@pytest.fixture
def sweep_dir(tmp_path):
  """A sweep's results.json (SweepResult.to_json): clip 0.3 and 1 times target epsilon 4 and 8,
  two seeds each, of dp_fedavg."""
  rows, experiments = [], []
  for clip in (0.3, 1.0):
    for eps in (4.0, 8.0):
      values = {"target_epsilon": eps, "clip": clip}
      accs = [0.5 + eps / 100 + clip / 10 + s / 50 for s in (0, 1)]
      rows.append({**values, **seed_stats(accs), "epsilon": eps - 0.001})
      experiments += [{"values": values, "seed": s, "group": 0, "output_dir": None,
                       "result": RunResult([], {"final_accuracy": a,
                                                "config": {"algorithm": "dp_fedavg"}}, None)}
                      for s, a in enumerate(accs)]
  out = tmp_path / "sweep"
  out.mkdir()
  doc = SweepResult(rows, experiments, [], 0.0, [], 1).to_json()
  (out / "results.json").write_text(json.dumps(doc))
  return out


def test_frontier_of_a_sweep(sweep_dir, tmp_path, capsys):
  rows = json.loads((sweep_dir / "results.json").read_text())["rows"]
  assert main(["plot", str(sweep_dir), "--out", str(tmp_path / "f.png")]) == 0
  assert capsys.readouterr().out.strip().endswith("(frontier)")
  assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  fig = plots.plot_frontier([sweep_dir / "results.json"], tmp_path / "f2.png")
  (ax,) = fig.axes
  labels = ax.get_legend_handles_labels()[1]
  assert labels == ["dp_fedavg, clip=0.3", "dp_fedavg, clip=1.0"]
  assert len(ax.containers) == 2  # one errorbar line per clip bound
  for clip, bars in zip((0.3, 1.0), ax.containers):
    mine = sorted((r["epsilon"], r["accuracy_mean"], r["accuracy_std"]) for r in rows
                  if r["clip"] == clip)
    line, _, (bar,) = bars
    assert list(zip(line.get_xdata(), line.get_ydata())) == [m[:2] for m in mine]
    lengths = [seg[1, 1] - seg[0, 1] for seg in bar.get_segments()]
    assert lengths == pytest.approx([2 * m[2] for m in mine])  # +- one std over the seeds


def test_frontier_of_a_reproduction_and_several_files(sweep_dir, tmp_path):
  rows = [{"table": "table1", "method": "fedavg", "epsilon": None, "sparsity": None,
           "accuracy_mean": 0.9, "accuracy_std": 0.0, "seeds": 2}]
  rows += [{"table": "table1", "method": m, "epsilon": e, "sparsity": s, "accuracy_mean": a,
            "accuracy_std": 0.01, "seeds": 2}
           for m, s in (("dp_fedavg", None), ("blur+lus", 0.7)) for e, a in ((8.0, 0.8), (2.0, 0.5))]
  rows.append({"table": "table3", "method": "blur+lus", "epsilon": 8.0, "sparsity": 0.5,
               "accuracy_mean": 0.7, "accuracy_std": 0.02, "seeds": 2})
  repro = tmp_path / "cheng"
  repro.mkdir()
  (repro / "results.json").write_text(json.dumps({"paper": "Cheng et al.", "rows": rows}))
  fig = plots.plot_frontier([repro], tmp_path / "r.png")
  (ax,) = fig.axes
  assert ax.get_legend_handles_labels()[1] == [
      "fedavg, table=table1 (no DP)", "dp_fedavg, table=table1",
      "blur+lus, table=table1, sparsity=0.7", "blur+lus, table=table3, sparsity=0.5"]
  assert list(ax.containers[0].lines[0].get_xdata()) == [2.0, 8.0]  # sorted by epsilon
  assert list(ax.get_lines()[-1].get_ydata()) == [0.9, 0.9]  # the non-private baseline

  fig = plots.plot_frontier([repro / "results.json", sweep_dir], tmp_path / "both.png")
  labels = fig.axes[0].get_legend_handles_labels()[1]
  assert len(fig.axes[0].containers) == 5
  assert labels[1] == "cheng: dp_fedavg, table=table1"
  assert labels[4] == "sweep: dp_fedavg, clip=0.3"


def _refused(args, capsys, field, words):
  assert main(args) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and f"invalid {field}=" in err and words in err, err


def test_plot_refusals(runs, tmp_path, capsys):
  out = str(tmp_path / "x.png")
  empty = tmp_path / "empty"
  empty.mkdir()
  _refused(["plot", str(tmp_path / "missing"), "--out", out], capsys, "dir", "existing folder")
  _refused(["plot", str(empty), "--out", out], capsys, "dir", "holds no metrics.jsonl")
  _refused(["plot", str(runs["private"]), "--kind", "norms", "--out", out], capsys, "dir",
           "holds no norms.npz")
  _refused(["plot", str(runs["all"]), str(runs["private"]), "--kind", "norms", "--out", out],
           capsys, "dir", "one run folder")
  _refused(["plot", str(runs["all"]), "--kind", "frontier", "--out", out], capsys, "dir",
           "holds no results.json")
  _refused(["plot", str(runs["all"]), "--out", str(tmp_path / "x.txt")], capsys, "out", ".png")
  _refused(["plot", str(runs["all"]), "--out", str(tmp_path / "no" / "x.png")], capsys, "out",
           "must exist")
  _refused(["plot", str(runs["all"]), "--kind", "bars", "--out", out], capsys, "arguments",
           "invalid choice")
  (empty / "metrics.jsonl").write_text('{"round": 1}\n{"round"\n')
  _refused(["plot", str(empty), "--out", out], capsys, "dir", "line 2 of metrics.jsonl")
  (empty / "results.json").write_text(json.dumps({"rows": [
      {"method": "spfl", "epsilon": {"all": {"median": 3.0}}, "accuracy_mean": 0.5,
       "accuracy_std": 0.0}]}))  # per-class epsilons without their worst case
  _refused(["plot", str(empty), "--out", out], capsys, "dir", "no row with a numeric epsilon")
  (empty / "results.json").write_text(json.dumps({"rows": [{"method": "x", "epsilon": 1.0}]}))
  _refused(["plot", str(empty), "--out", out], capsys, "dir", "'accuracy_mean'")
  # binary files, and a format that needs LaTeX to write, are refused in one line too
  (empty / "results.json").write_bytes(b"\xff\xfe\x00binary")
  _refused(["plot", str(empty), "--kind", "frontier", "--out", out], capsys, "dir",
           "is not a JSON file")
  (empty / "metrics.jsonl").write_bytes(b"\xff\xfe\x00binary")
  _refused(["plot", str(empty), "--kind", "runs", "--out", out], capsys, "dir", "not UTF-8 text")
  _refused(["plot", str(runs["all"]), "--out", str(tmp_path / "x.pgf")], capsys, "out", ".png")
  assert not (tmp_path / "x.png").exists()


def test_tensorboard_needs_an_output_dir():
  from fedjax_dp.config import make_config
  from fedjax_dp.experiment import simulate
  with pytest.raises(ConfigError, match="tensorboard=True: needs an output_dir"):
    simulate(make_config(num_clients=60, model="mlp", rounds=1), tensorboard=True)


def test_plot_refuses_a_folder_as_out_and_a_corrupt_norms_file(tmp_path, capsys):
  from fedjax_dp.cli import main
  run = tmp_path / "run"
  run.mkdir()
  (run / "metrics.jsonl").write_text('{"round": 1, "test_accuracy": 0.5}\n')
  (run / "norms.npz").write_text("not an npz")
  (tmp_path / "a.png").mkdir()
  assert main(["plot", "--kind", "norms", "--out", str(tmp_path / "a.png"), str(run)]) == 2
  assert "is a folder" in capsys.readouterr().err
  assert main(["plot", "--kind", "norms", "--out", str(tmp_path / "b.png"), str(run)]) == 2
  assert "its norms.npz is not one a run writes" in capsys.readouterr().err


@pytest.mark.parametrize("line,message", [
    ('{"round": "x", "test_accuracy": "a", "epsilon": "b"}', "line 1 of metrics.jsonl is not a round"),
    ('{"round": 1}', "holds no evaluated round"),
])
def test_plot_refuses_metrics_it_cannot_draw(line, message, tmp_path, capsys):
  from fedjax_dp.cli import main
  run = tmp_path / "run"
  run.mkdir()
  (run / "metrics.jsonl").write_text(line + "\n")
  assert main(["plot", "--kind", "runs", "--out", str(tmp_path / "p.png"), str(run)]) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "p.png").exists()


_ROW = {"method": "a", "epsilon": 1.0, "accuracy_mean": 0.5, "accuracy_std": 0.1}


@pytest.mark.parametrize("doc,field,value", [
    ({"experiments": 5, "rows": [_ROW]}, "experiments", "5"),
    ({"experiments": [1], "rows": [_ROW]}, "experiments[0]", "1"),
    ({"experiments": [{"summary": 3}], "rows": [_ROW]}, "experiments[0].summary", "3"),
    ({"experiments": [{"summary": {"config": [1]}}], "rows": [_ROW]},
     "experiments[0].summary.config", "[1]"),
    ({"experiments": [{"summary": {"config": {"algorithm": 1}}}], "rows": [_ROW]},
     "experiments[0].summary.config.algorithm", "1"),
    ({"rows": [dict(_ROW, accuracy_mean="x")]}, "rows[0].accuracy_mean", "'x'"),
    ({"rows": [dict(_ROW, accuracy_mean=[1, 2])]}, "rows[0].accuracy_mean", "[1, 2]"),
    ({"rows": [_ROW, dict(_ROW, accuracy_std="a")]}, "rows[1].accuracy_std", "'a'"),
    ({"rows": [_ROW, dict(_ROW, epsilon=None, accuracy_mean="x")]}, "rows[1].accuracy_mean", "'x'"),
])
def test_plot_refuses_a_badly_typed_results_json(doc, field, value, tmp_path, capsys):
  (tmp_path / "results.json").write_text(json.dumps(doc))
  _refused(["plot", str(tmp_path), "--out", str(tmp_path / "f.png")], capsys,
            f"results.json {field}", f"={value}:")
  assert not (tmp_path / "f.png").exists()


def test_frontier_draws_a_diverged_point_on_its_methods_line(tmp_path):
  """A diverged grid point's accuracy is written as null beside ``accuracy_mean_nonfinite``
  (fedjax_dp.jsonio): drawn as NaN on its method's line, not refused or labelled apart."""
  rows = [{"clip": 0.1, "target_epsilon": 1.0, "accuracy_mean": None,
           "accuracy_mean_nonfinite": "NaN", "accuracy_std": None, "accuracy_std_nonfinite": "NaN",
           "seeds": 2, "epsilon": 1.0, "grid": {"clip": 0.1, "target_epsilon": 1.0}},
          {"clip": 0.1, "target_epsilon": 2.0, "accuracy_mean": 0.5, "accuracy_std": 0.1,
           "seeds": 2, "epsilon": 2.0, "grid": {"clip": 0.1, "target_epsilon": 2.0}}]
  exps = [{"summary": {"config": {"algorithm": "dp_fedavg"}}}] * 4
  f = tmp_path / "results.json"
  f.write_text(json.dumps({"rows": rows, "experiments": exps}))
  lines = plots._frontier_lines(f)
  assert list(lines) == ["dp_fedavg, clip=0.1"]
  (e0, m0, s0), point = lines["dp_fedavg, clip=0.1"]
  assert e0 == 1.0 and np.isnan(m0) and s0 is None and point == (2.0, 0.5, 0.1)
  plots.plot_frontier([f], tmp_path / "f.png")
  assert (tmp_path / "f.png").is_file()


def test_frontier_draws_per_class_epsilons_at_the_worst_case_client(tmp_path):
  # SP-FL's rows carry an epsilon per privacy class (max and median over its clients).
  rows = [{"method": "spfl-sound", "setting": "epsilon", "accuracy_mean": acc,
           "accuracy_std": 0.01, "epsilon": {"high": {"max": hi, "median": 0.5},
                                             "low": {"max": lo, "median": 0.5}}}
          for acc, hi, lo in ((0.2, 0.9, 1.1), (0.4, 4.2, 3.9))]
  rows.append({"method": "spfl", "setting": "epsilon", "accuracy_mean": 0.3, "accuracy_std": None,
               "epsilon": None})
  f = tmp_path / "results.json"
  f.write_text(json.dumps({"rows": rows}))
  lines = plots._frontier_lines(f)
  assert [p[0] for p in lines["spfl-sound"]] == [1.1, 4.2] and lines["spfl"][0][0] is None
  plots.plot_frontier([f], tmp_path / "f.png")


def test_a_curve_of_one_point_is_drawn_as_a_mark(tmp_path):
  # A short run evaluated once has one accuracy: a line alone would draw nothing.
  fig = plots.curves_figure([("t", [plots.Curve("one", [2], [0.2]),
                                    plots.Curve("two", [1, 2], [0.1, 0.3])])],
                            tmp_path / "c.png", xlabel="round")
  one, two = fig.axes[0].get_lines()
  assert one.get_marker() == "o" and two.get_marker() in ("None", "", None)


_NORMS = {"round": np.array([1, 2], np.int32), "offsets": np.array([0, 2, 4], np.int64),
          "norms": np.arange(4.0), "clip": np.float64(1.0)}


@pytest.mark.parametrize("name,bad,value", [
    ("clip", np.array([1.0, 2.0]), "[1.0, 2.0]"),
    ("clip", np.array("x"), "'x'"),
    ("offsets", np.array([0.0, 2.0, 4.0]), "[0.0, 2.0, 4.0]"),
    ("offsets", np.array([[0, 2, 4]]), "[[0, 2, 4]]"),
    ("offsets", np.array([0, 5, 4], np.uint64), "[0, 5, 4]"),  # unsigned: a fall must not wrap round
    ("offsets", np.array([0, 2, 5]), "[0, 2, 5]"),  # past the norms
    ("round", np.array([1, 2, 3, 4]), "[1, 2, 3, 4]"),  # longer than offsets
    ("round", np.array(["a", "b"]), "['a', 'b']"),
    ("norms", np.array(["a", "b", "c", "d"]), "['a', 'b', 'c', 'd']"),
    ("norms", np.zeros(20, bool), "'bool array of shape (20,)'"),
])
def test_plot_refuses_a_badly_typed_norms_file(name, bad, value, tmp_path, capsys):
  run = tmp_path / "run"
  run.mkdir()
  np.savez(run / "norms.npz", **dict(_NORMS, **{name: bad}))
  _refused(["plot", str(run), "--kind", "norms", "--out", str(tmp_path / "n.png")], capsys,
            f"norms.npz {name}", f"={value}:")
  assert not (tmp_path / "n.png").exists()
  np.savez(run / "norms.npz", **_NORMS)  # the same file, well typed, is drawn
  assert main(["plot", str(run), "--kind", "norms", "--out", str(tmp_path / "n.png")]) == 0
