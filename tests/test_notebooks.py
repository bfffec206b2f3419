"""Every notebook runs top to bottom at a tiny size (FEDJAX_DP_TINY=1) and shows what it says.

Each notebook ends with a cell printing one JSON line of its key numbers; the
tests read it from that cell's output and check it, and check that the
notebook drew a figure (an ``image/png`` output: the kernel's inline backend,
``MPLBACKEND`` unset).

Most notebooks use scikit-learn's digits at the tiny size and need no files.
A notebook that reads real data files even at the tiny size is listed in
:data:`NEEDS_DATA`: it runs with ``FEDJAX_DP_DATA`` set to the data folder (the
``shared_data_dir`` fixture) and is skipped, saying how to enable it, where that
folder is absent (a fresh clone). Every other notebook runs with
``FEDJAX_DP_DATA`` pointing at an empty folder, so one that starts to read real
files fails here on every machine, not only on those without the data.
"""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

# notebook -> the sub-folders of the data folder it reads at the tiny size.
NEEDS_DATA = {"spfl": ("mnist",)}
CHANCE = 0.1  # ten classes in digits and MNIST


def test_needs_data_names_existing_notebooks():
  assert set(NEEDS_DATA) <= {p.stem for p in NOTEBOOKS}


def _execute(path, monkeypatch, request, tmp_path):
  """Runs the notebook at the tiny size; returns it with its outputs."""
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  if path.stem in NEEDS_DATA:
    data_dir = request.getfixturevalue("shared_data_dir")  # skips when absent
    for sub in NEEDS_DATA[path.stem]:
      if not (data_dir / sub).is_dir():
        pytest.skip(f"notebook {path.name} needs {data_dir / sub}: set FEDJAX_DP_DATA to a folder "
                    f"holding {sub}/ to run it")
  else:
    data_dir = tmp_path / "no-data"
    data_dir.mkdir()
  monkeypatch.setenv("FEDJAX_DP_DATA", str(data_dir))
  monkeypatch.setenv("FEDJAX_DP_TINY", "1")
  monkeypatch.delenv("MPLBACKEND", raising=False)
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(path.parent)}})
  client.execute()
  return nb


def _outputs(nb):
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _key_numbers(nb) -> dict:
  """The JSON line printed by the notebook's last code cell."""
  last = [c for c in nb.cells if c.cell_type == "code"][-1]
  text = "".join(o.get("text", "") for o in last.outputs if o.get("output_type") == "stream")
  return json.loads(text.strip().splitlines()[-1])


def _check_byzantine(k):
  acc = k["final_accuracy"]
  assert all(0 <= a <= 1 for a in acc.values())
  assert acc["rsa"] > CHANCE + 0.05 and acc["dp-rsa-f eps=1.38"] > CHANCE + 0.05
  # The composed epsilon grows with the per-coordinate epsilon and with the iterations.
  eps = {(e, t): v for e, t, v in k["composed_epsilon"]}
  assert eps[(0.2, 1)] < eps[(0.2, 10)] and eps[(0.2, 1)] < eps[(0.4, 1)] < eps[(1.38, 1)]
  assert eps[(0.2, 1)] > 100  # per coordinate 0.2 is no whole-model guarantee


def _check_blur_lus(k):
  acc = k["final_accuracy"]
  # 4 rounds of 60 clients under noise: the tiny size need not learn, only run.
  assert set(acc) == {"dp_fedavg", "blur+lus"} and all(0 <= a <= 1 for a in acc.values())
  assert k["epsilon"]["dp_fedavg"] == k["epsilon"]["blur+lus"] > 0
  norms = k["median_norm_by_lambda"]  # BLUR pulls the updates towards the ball
  assert norms["1.6"] < norms["0.0"]
  after = [k["norm_after_lus_by_c"][c] for c in ("0.0", "0.1", "0.3", "0.5", "0.7", "0.9")]
  assert all(a >= b for a, b in zip(after, after[1:])) and after[-1] < after[0]


def _check_spfl(k):
  assert set(k) == {"spfl", "spfl-sound", "dp-fl"}
  assert all(0 <= r["final_accuracy"] <= 1 for r in k.values())
  assert k["spfl"]["formal_guarantee"] is False and k["spfl"]["epsilon"] is None
  assert not any(c["formal_guarantee"] for c in k["spfl"]["classes"].values())
  for alg in ("spfl-sound", "dp-fl"):
    for c in k[alg]["classes"].values():
      assert c["formal_guarantee"] is True and 0 < c["epsilon_max"] <= 4.0 + 1e-6


def _check_privacy_utility(k):
  user = k["user"]
  assert len(user) == 8 and all(r["seeds"] == k["seeds"] for r in user)
  for alg in ("dp_fedavg", "blur+lus"):
    rows = sorted((r for r in user if r["algorithm"] == alg), key=lambda r: r["target_epsilon"])
    assert [r["target_epsilon"] for r in rows] == [1, 2, 4, 8]
    eps = [r["epsilon"] for r in rows]  # calibrated to each target, so increasing along the sweep
    assert eps == pytest.approx([1, 2, 4, 8], rel=1e-2) and eps == sorted(eps)
    assert all(0 <= r["accuracy_mean"] <= 1 for r in rows)
    # The sample std over seeds; undefined (None) with one seed.
    assert all(r["accuracy_std"] is None if r["seeds"] == 1 else r["accuracy_std"] >= 0
               for r in rows)
    assert rows[-1]["accuracy_mean"] > CHANCE + 0.1
  assert CHANCE + 0.1 < k["fedavg"]["accuracy_mean"] <= 1 and k["fedavg"]["epsilon"] is None
  dprsa = sorted(k["dp_rsa_f"], key=lambda r: r["keep_prob"])
  per_coordinate = [r["epsilon_per_coordinate"] for r in dprsa]
  assert per_coordinate == pytest.approx([0.2, 0.4, 1.38, 3.0], rel=1e-4)
  composed = [r["epsilon"] for r in dprsa]  # whole run: increasing, and far past any target
  assert composed == sorted(composed) and composed[0] > 100
  assert all(0 <= r["accuracy_mean"] <= 1 for r in dprsa)
  assert set(k["robust"]) == {"signsgd", "median"}
  for r in k["robust"].values():
    assert 0 <= r["accuracy_mean"] <= 1 and r["epsilon"] is None
  assert k["robust"]["median"]["accuracy_mean"] > CHANCE + 0.1


CHECKS = {"byzantine": _check_byzantine, "blur_lus": _check_blur_lus, "spfl": _check_spfl,
          "privacy_utility": _check_privacy_utility}


def test_every_notebook_is_checked():
  assert {p.stem for p in NOTEBOOKS} == set(CHECKS)


# Notebooks whose tiny size still compiles many programs (1-2 minutes each on 2 cores): run with
# `make test-slow`; `byzantine` stays in the suite, so a change that breaks notebooks' common
# pieces (simulate, the plots, the key-numbers cell) fails in CI.
SLOW = {"privacy_utility", "blur_lus", "spfl"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_shows_its_results(path, monkeypatch, request, tmp_path):
  nb = _execute(path, monkeypatch, request, tmp_path)
  outputs = _outputs(nb)
  assert not [o for o in outputs if o.get("output_type") == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"
  CHECKS[path.stem](_key_numbers(nb))
