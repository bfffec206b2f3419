"""``fedjax-dp reproduce PAPER --compare DIR DIR ...``: a paper's verdicts at several scales side
by side (fedjax_dp.reproduce.compare_reproductions, tables.comparison_table), from finished
reproductions' folders written by the papers' own test fixtures (nothing trains)."""

import json
import pathlib
import shutil

import pytest

from fedjax_dp.cli import main
from fedjax_dp.errors import ConfigError
from fedjax_dp.reproduce import compare_reproductions, zhu2022
from fedjax_dp.reproduce.tables import Claim, accuracy_comparison_table, comparison_table
from test_reproduce import _fake_reproduction
from test_zhu2022 import _records, _saved_run

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _finished(out: pathlib.Path, paper: str, scale: str, seeds: int = 1, finished=True):
  """Records in ``out`` the arguments of a reproduction that ran there (reproduction.json)."""
  (out / "reproduction.json").write_text(json.dumps(
      {"paper": paper, "scale": scale, "seeds": seeds, "data_dir": None, "finished": finished}))


def _zhu_folder(out: pathlib.Path, settings, scale="tiny", **accuracies) -> pathlib.Path:
  """A finished zhu2022 reproduction in ``out`` (one seed) of ``settings``, each method at the
  test fixture's accuracy but those given (method -> accuracy)."""
  out.mkdir()
  records = [dict(r, accuracy=accuracies.get(r["method"], r["accuracy"]))
             for r in _records(settings=settings)]
  _saved_run(out, records)
  doc = json.loads((out / "results.json").read_text())
  (out / "results.json").write_text(json.dumps(dict(doc, scale=scale)))
  _finished(out, "zhu2022", scale)
  return out


def _rows(text: str) -> dict:
  """The verdicts' rows of ``compare_reproductions``'s text: claim -> its cells after the claim."""
  verdicts = text.split("\nAccuracy of each setting side by side")[0]
  return {cells[0]: cells[1:] for line in verdicts.splitlines() if line.startswith("| ")
          for cells in [[c.strip() for c in line.strip("|").split(" | ")]]}


def _accuracies(text: str) -> list:
  """The accuracy table's lines of ``compare_reproductions``'s text, each as its cells."""
  table = text.split("\nAccuracy of each setting side by side (mean ± std over seeds):\n")[1]
  return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()
          if line.startswith("| ")]


def test_accuracy_comparison_table_puts_each_settings_accuracy_side_by_side():
  small = [{"method": "a", "eps": None, "accuracy_mean": 0.5, "accuracy_std": 0.01},
           {"method": "b", "eps": 1.0, "accuracy_mean": 0.25, "accuracy_std": None}]
  paper = [{"method": "b", "eps": 1.0, "accuracy_mean": 0.75, "accuracy_std": 0.02},
           {"method": "c", "eps": 2.0, "accuracy_mean": 0.9, "accuracy_std": 0.0}]
  assert accuracy_comparison_table(("method", "eps"), [("small", small), ("paper", paper)]) == [
      "| method | eps | small: accuracy (%) | paper: accuracy (%) | change (first → last, points) |",
      "|---|---|---|---|---|",
      "| a |  | 50.00 ± 1.00 |  |  |",
      "| b | 1.0 | 25.00 | 75.00 ± 2.00 | +50.00 |",
      "| c | 2.0 |  | 90.00 ± 0.00 |  |"]


def test_comparison_table_matches_claims_by_text_and_says_what_changed():
  small = [Claim("A beats B", 5.0, 1.0), Claim("C beats D", 2.0, 3.0, spread=0.5),
           Claim("only small", 1.0, 2.0)]
  paper = [Claim("C beats D", 2.0, 0.5, spread=1.0), Claim("A beats B", 5.0, 4.0, spread=0.5),
           Claim("only paper", -1.0, -0.5, sign_only=True)]
  lines = comparison_table([("small, 3 seeds", small), ("paper, 3 seeds", paper)])
  assert lines[0] == ("| claim | paper (points) | small, 3 seeds: ours (points) | small, 3 seeds: "
                      "verdict | paper, 3 seeds: ours (points) | paper, 3 seeds: verdict | "
                      "verdict changed (first → last) |")
  assert lines[2:] == [
      "| A beats B | +5.00 | +1.00 | partly | +4.00 ± 0.50 | reproduced | yes: partly → reproduced |",
      "| C beats D | +2.00 | +3.00 ± 0.50 | reproduced | +0.50 ± 1.00 | partly | yes: reproduced → "
      "partly |",
      "| only small | +1.00 | +2.00 | reproduced |  |  |  |",
      "| only paper | - (sign only) |  |  | -0.50 | reproduced |  |"]
  # Three scales: the change is the first's verdict against the last's; the middle one is shown.
  lines = comparison_table([("a", small), ("b", paper), ("c", small)])
  assert lines[2].endswith("| +1.00 | partly | +4.00 ± 0.50 | reproduced | +1.00 | partly | no |")


def test_compare_zhu2022_scales_row_per_claim_and_the_changed_verdicts(tmp_path, capsys):
  # The smaller scale ran one setting, the larger all three, where SignSGD falls behind.
  small = _zhu_folder(tmp_path / "small", (("iid", "gaussian"),))
  large = _zhu_folder(tmp_path / "paper", zhu2022.SETTINGS, scale="paper", signsgd=0.5)
  text = compare_reproductions("zhu2022", [str(small), str(large)])
  assert text.splitlines()[0] == (f"Verdicts of zhu2022's reproductions side by side (differences "
                                  f"in points); columns: tiny, 1 seed: {small}; paper, 1 seed: "
                                  f"{large}")
  assert "| tiny, 1 seed: ours (points) | tiny, 1 seed: verdict | paper, 1 seed: ours" in text
  rows = _rows(text)
  assert len(rows) == 1 + 3 * 6  # the header, and each setting's six claims
  sign = "Gaussian attack (Fig. 1a): DP-RSA(F) eps 1.38 - SignSGD (nominal +5: beats)"
  assert rows[sign] == ["+5.00", "-11.00", "not reproduced", "+29.00", "reproduced",
                        "yes: not reproduced → reproduced"]
  sgd = "SGD fails, Gaussian attack (Fig. 1a): SGD - RSA (nominal -50: no defense)"
  assert rows[sgd] == ["-50.00", "-70.00", "reproduced", "-70.00", "reproduced", "no"]
  # A claim the smaller scale did not measure: empty cells there, and no change said.
  noniid = next(t for t in rows if t.startswith("SGD fails, non-iid"))
  assert rows[noniid][1:3] == ["", ""] and rows[noniid][3:] == ["-70.00", "reproduced", ""]
  # Each setting's accuracy at both scales: SignSGD's fell from the fixture's 0.9 to 0.5.
  accuracies = _accuracies(text)
  assert accuracies[0] == ["partition", "attack", "method", "epsilon", "tiny, 1 seed: accuracy (%)",
                           "paper, 1 seed: accuracy (%)", "change (first → last, points)"]
  assert ["iid", "gaussian", "signsgd", "", "90.00", "50.00", "-40.00"] in accuracies
  assert ["noniid", "sample-duplication", "signsgd", "", "", "50.00", ""] in accuracies
  assert len(accuracies) == 1 + 3 * 8  # the header, each setting's 8 runs (2 epsilons)
  # The verdicts are the ones the folder's results.md shows (its text, without the figures).
  md = zhu2022._markdown(json.loads((large / "results.json").read_text())["rows"], "paper")
  assert f"| {sign} | +5.00 | +29.00 | +24.00 | reproduced |" in md
  # The command line prints the same text.
  capsys.readouterr()
  assert main(["reproduce", "zhu2022", "--compare", str(small), str(large)]) == 0
  assert capsys.readouterr().out == text


def test_compare_spfl2024_tiny_reproductions_through_the_command_line(tmp_path, capsys,
                                                                      monkeypatch):
  # A tiny reproduction run by the command line (its runs faked, accuracy 0.5 everywhere), and
  # a copy where SP-FL gains 10 points, standing for a larger scale.
  small = tmp_path / "small"
  _fake_reproduction("spfl2024", small, monkeypatch)
  large = tmp_path / "medium"
  shutil.copytree(small, large)
  records = [json.loads(line) for line in (large / "runs.jsonl").read_text().splitlines()]
  (large / "runs.jsonl").write_text("".join(
      json.dumps(dict(r, accuracy=0.6 if r["method"] == "spfl" else r["accuracy"])) + "\n"
      for r in records))
  doc = json.loads((large / "results.json").read_text())
  (large / "results.json").write_text(json.dumps(dict(doc, scale="medium")))
  capsys.readouterr()
  assert main(["reproduce", "spfl2024", "--compare", str(small), str(large)]) == 0
  rows = _rows(capsys.readouterr().out)
  assert rows["SP-FL over ADP-FL, mean of all settings (abstract)"] == [
      "+2.25", "+0.00", "not reproduced", "+10.00", "reproduced",
      "yes: not reproduced → reproduced"]
  assert rows["spfl-sound (ours, formal DP) over DP-FL, the abstract's claim"] == [
      "+4.41", "+0.00", "not reproduced", "+0.00", "not reproduced", "no"]
  assert len(rows) == 1 + 12


def test_compare_reads_the_committed_results_of_a_scale():
  """docs/results/ holds results.json and results.md, without reproduction.json: finished. The
  committed SP-FL results have no runs.jsonl, so their three seeds give no spread: said below
  the table."""
  folder = "docs/results/zhu2022_small"
  rows = _rows(compare_reproductions("zhu2022", [ROOT / folder, ROOT / folder]))
  sgd = "SGD fails, Gaussian attack (Fig. 1a): SGD - RSA (nominal -50: no defense)"
  assert sgd in (ROOT / folder / "results.md").read_text()
  assert rows[sgd][1:3] == ["-70.41 ± 1.05", "reproduced"] and rows[sgd][-1] == "no"
  folder = ROOT / "docs/results/spfl2024_small"
  text = compare_reproductions("spfl2024", [folder, folder])
  assert text.splitlines()[-1] == (
      f"* small, 3 seeds ({folder}): no spread over its 3 seeds: the folder holds no runs.jsonl "
      "(each seed's record), so its verdicts are on the means alone")


# paper, its page, the committed folders (first to last), the number of claims and settings, and
# the folders whose results.md shows what --compare reads (a folder without runs.jsonl gives the
# means alone: spfl2024_small) with the column of its value in --compare's rows.
_PAGES = [
    ("zhu2022", "docs/papers/zhu2022.md", ("zhu2022_small", "zhu2022_paper"), 18, 30,
     (("zhu2022_small", 1), ("zhu2022_paper", 3))),
    ("zhu2022", "docs/papers/zhu2022.md", ("zhu2022_small", "zhu2022_paper", "zhu2022_paper_b1"),
     18, 30, (("zhu2022_small", 1), ("zhu2022_paper", 3), ("zhu2022_paper_b1", 5))),
    ("spfl2024", "docs/papers/spfl2024.md", ("spfl2024_small", "spfl2024_medium"), 12, 81,
     (("spfl2024_medium", 3),)),
]


@pytest.mark.parametrize("paper, page, folders, n_claims, n_settings, shown_in", _PAGES,
                         ids=[f"{p[0]}-{len(p[2])}-scales" for p in _PAGES])
def test_the_paper_pages_show_the_committed_scales_side_by_side(paper, page, folders, n_claims,
                                                                n_settings, shown_in):
  """A paper page's two side-by-side tables are exactly what ``--compare`` prints for the
  committed scales, and every claim's value and verdict at a scale with its runs is the one that
  scale's results.md shows."""
  text = compare_reproductions(paper, [f"docs/results/{f}" for f in folders])
  tables = [line for line in text.splitlines() if line.startswith("|")]
  lines = (ROOT / page).read_text().splitlines()
  start = lines.index(tables[0])
  assert len(tables) == 2 * 2 + n_claims + n_settings  # two headers and separators
  assert [line for line in lines[start:] if line.startswith("|")][:len(tables)] == tables
  rows = {claim: cells for claim, cells in _rows(text).items() if claim != "claim"}
  assert len(rows) == n_claims and all(row[-1].startswith(("no", "yes")) for row in rows.values())
  for folder, ours in shown_in:
    shown = _rows((ROOT / "docs/results" / folder / "results.md").read_text())
    assert all(shown[claim][1] == cells[ours] and shown[claim][3] == cells[ours + 1]
               for claim, cells in rows.items())


def test_compare_cheng2022_reads_its_runs(tmp_path):
  from fedjax_dp.reproduce import cheng2022
  from test_cheng2022 import _SETTINGS, _fake_runs
  out = tmp_path / "cheng"
  out.mkdir()
  runs = _fake_runs()
  (out / "results.json").write_text(json.dumps(
      {"settings": _SETTINGS, "rows": cheng2022._summarize(runs), "reproduction": "cheng2022"}))
  (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
  _finished(out, "cheng2022", "fake", seeds=2)
  rows = _rows(compare_reproductions("cheng2022", [out, out]))
  claims = cheng2022.saved_claims(out)
  assert list(rows)[1:] == [c.claim for c in claims]
  assert {r[-1] for r in list(rows.values())[1:]} == {"no"}
  (out / "runs.jsonl").unlink()  # its verdicts pair the runs by seed: runs.jsonl is needed
  with pytest.raises(ConfigError, match=r"--compare=.*FileNotFoundError.*runs.jsonl"):
    compare_reproductions("cheng2022", [out, out])


def test_compare_refuses_what_is_not_two_finished_reproductions_of_the_paper(tmp_path, capsys):
  done = _zhu_folder(tmp_path / "done", (("iid", "gaussian"),))
  with pytest.raises(ConfigError, match=r"--compare=\[.*\]: needs two or more folders"):
    compare_reproductions("zhu2022", [done])
  with pytest.raises(ConfigError, match=r"invalid paper='cheng2022-norms'"):
    compare_reproductions("cheng2022-norms", [done, done])
  with pytest.raises(ConfigError, match=r"--compare=.*holds no results.json"):
    compare_reproductions("zhu2022", [done, tmp_path])
  # Another paper's folder, by its results.json and by its reproduction.json.
  with pytest.raises(ConfigError, match=r"--compare=.*holds the results of `fedjax-dp reproduce "
                     r"zhu2022`, not spfl2024"):
    compare_reproductions("spfl2024", [done, done])
  other = tmp_path / "other"
  shutil.copytree(done, other)
  _finished(other, "spfl2024", "tiny")
  with pytest.raises(ConfigError, match=r"holds a reproduction of spfl2024 \(reproduction.json\), "
                     r"not zhu2022"):
    compare_reproductions("zhu2022", [done, other])
  # A reproduction still running, or interrupted: its results.json holds the runs done so far.
  running = tmp_path / "running"
  shutil.copytree(done, running)
  _finished(running, "zhu2022", "paper", finished=False)
  with pytest.raises(ConfigError, match=r"--compare=.*running'.*has not finished "
                     r"\(reproduction.json: \"finished\": false\).*--resume"):
    compare_reproductions("zhu2022", [done, running])
  # Without reproduction.json, results.md says it finished; without either it is refused.
  (running / "reproduction.json").unlink()
  with pytest.raises(ConfigError, match="neither reproduction.json nor results.md"):
    compare_reproductions("zhu2022", [done, running])
  (running / "results.md").write_text("")
  assert compare_reproductions("zhu2022", [done, running])
  # A results.json that is not JSON, or has no rows: refused, naming the folder.
  doc = json.loads((running / "results.json").read_text())
  for damaged in ("{not json", json.dumps({k: v for k, v in doc.items() if k != "rows"})):
    (running / "results.json").write_text(damaged)
    with pytest.raises(ConfigError, match=r"--compare=.*running'.*without its scale's settings "
                       r"\(seeds\) or rows"):
      compare_reproductions("zhu2022", [done, running])
  # The command line: one line, exit 2; a run's settings are refused with --compare.
  capsys.readouterr()
  assert main(["reproduce", "zhu2022", "--compare", str(done), str(other)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("fedjax-dp: error: invalid --compare="), err
  for flags in (["--scale", "paper"], ["--render"], ["--output-dir", str(done)],
                ["--resume", str(done)]):
    assert main(["reproduce", "zhu2022", "--compare", str(done), str(done), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not read by --compare, which runs and writes nothing" in err[0]
