"""What a run ran on: the library and its dependencies' versions, the devices and the source tree.

:func:`environment` is the ``provenance`` block of ``summary.json``;
:func:`partition` the public description of the data's split into clients
(the settings that made it, not the per-client counts, which are raw
diagnostics under user-level DP); :func:`data_dir` the folder the data files were looked for
in. None of them reads the clients' data.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import platform
import subprocess
from typing import Optional

import jax

from fedjax_dp._version import __version__
from fedjax_dp.data import specs
from fedjax_dp.data.sources.common import resolve_data_dir

# The distributions whose versions a run records (import name as pip knows it).
PACKAGES = ("jax", "jaxlib", "flax", "optax", "dp-accounting", "numpy")
# What partition's parameters each partition has (RunConfig fields).
PARTITION_FIELDS = {"dirichlet": ("dirichlet_alpha",),
                    "shards": ("shards_per_client", "min_labels_per_client")}


def _version(package: str) -> Optional[str]:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _git(*args: str) -> Optional[str]:
  """``git args`` run in the package's folder: its output, or None when git or a checkout is
  missing (a run never fails for want of git)."""
  here = pathlib.Path(__file__).resolve().parent
  try:
    done = subprocess.run(("git", *args), cwd=here, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return done.stdout if done.returncode == 0 else None


def git_revision() -> Optional[dict]:
  """``{"revision": HEAD's hash, "dirty": uncommitted changes in the tree}`` of the checkout the
  package is imported from, or None when it is not a git checkout (an installed wheel)."""
  head = _git("rev-parse", "HEAD")
  if head is None:
    return None
  status = _git("status", "--porcelain")
  return {"revision": head.strip(), "dirty": None if status is None else bool(status.strip())}


def environment() -> dict:
  """The ``provenance`` block: ``fedjax_dp`` (version), ``python``, ``packages`` (name ->
  version, None when missing), ``devices`` (``platform``, ``kind``, ``count``) and ``git``
  (:func:`git_revision`)."""
  devices = jax.devices()
  return {
      "fedjax_dp": __version__,
      "python": platform.python_version(),
      "packages": {p: _version(p) for p in PACKAGES},
      "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind,
                  "count": len(devices)},
      "git": git_revision(),
  }


def run_settings(config: Optional[dict]) -> Optional[dict]:
  """The run's own settings of a recorded configuration: its ``run`` block when nested
  (:func:`fedjax_dp.config.nest`), else the flat configuration itself."""
  return config.get("run", config) if config else config


def partition(config: Optional[dict]) -> Optional[dict]:
  """The partition a recorded configuration asked for: ``name``, ``clients`` and its parameters
  (dirichlet: ``dirichlet_alpha``; shards: ``shards_per_client``, ``min_labels_per_client``);
  None without a configuration (a run built by hand)."""
  config = run_settings(config)
  if not config or "partition" not in config:
    return None
  name = config["partition"]
  return {"name": name, "clients": config["num_clients"],
          **{k: config[k] for k in PARTITION_FIELDS.get(name, ())}}


def data_dir(config: Optional[dict]) -> Optional[str]:
  """The folder a recorded configuration's data files were looked for in: its ``data_dir``,
  else ``$FEDJAX_DP_DATA`` (which the configuration does not record); None for the bundled
  digits, without a configuration, or with neither set (tensorflow-datasets' own folder)."""
  config = run_settings(config)
  if not config or config.get("dataset") not in specs.BY_NAME:
    return None
  if specs.get(config["dataset"]).source == "digits":
    return None
  folder = resolve_data_dir(config.get("data_dir"))
  return None if folder is None else str(folder.resolve())
