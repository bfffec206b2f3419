"""Every notebook runs top to bottom at a tiny size (FEDJAX_DP_TINY=1)."""

import os
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  monkeypatch.setenv("FEDJAX_DP_TINY", "1")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(path.parent)}})
  client.execute()
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
