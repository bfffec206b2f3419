"""Every notebook runs top to bottom at a tiny size (FEDJAX_DP_TINY=1).

Most notebooks use scikit-learn's digits at the tiny size and need no files.
A notebook that reads real data files even at the tiny size is listed in
:data:`NEEDS_DATA`: it runs with ``FEDJAX_DP_DATA`` set to the data folder (the
``shared_data_dir`` fixture) and is skipped, saying how to enable it, where that
folder is absent (a fresh clone). Every other notebook runs with
``FEDJAX_DP_DATA`` pointing at an empty folder, so one that starts to read real
files fails here on every machine, not only on those without the data.
"""

import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))

# notebook -> the sub-folders of the data folder it reads at the tiny size.
NEEDS_DATA = {"spfl": ("mnist",)}


def test_needs_data_names_existing_notebooks():
  assert set(NEEDS_DATA) <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, request, tmp_path):
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
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(path.parent)}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
