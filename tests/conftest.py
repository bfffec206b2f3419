"""Shared pytest fixtures."""

import os
import pathlib

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data_dir() -> pathlib.Path:
  """The offline copies of real data sets (``$FEDJAX_DP_DATA``).

  Defaults to ``<repo>/../shared/data``; tests using it are skipped when the
  directory is absent.
  """
  d = pathlib.Path(os.environ.get("FEDJAX_DP_DATA") or
                   _REPO.parent / "shared" / "data")
  if not d.is_dir():
    pytest.skip(f"real data sets not found at {d} (set FEDJAX_DP_DATA)")
  return d
