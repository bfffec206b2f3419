"""Paper reproductions, by name: ``fedjax-dp reproduce NAME --scale small --output-dir DIR``.

Each entry is ``"module:function"``; the function takes
``(scale, output_dir, data_dir, seeds)`` and returns an exit status.
"""

from __future__ import annotations

import importlib

from fedjax_dp.errors import check_choice

REPRODUCTIONS: dict = {
    "cheng2022": "fedjax_dp.reproduce.cheng2022:run",
    "spfl2024": "fedjax_dp.reproduce.spfl2024:run",
    "zhu2022": "fedjax_dp.reproduce.zhu2022:run",
}


def run_reproduction(paper: str, scale: str, output_dir: str, data_dir=None, seeds=None) -> int:
  check_choice("paper", paper, sorted(REPRODUCTIONS))
  module, fn = REPRODUCTIONS[paper].split(":")
  return getattr(importlib.import_module(module), fn)(
      scale=scale, output_dir=output_dir, data_dir=data_dir, seeds=seeds)
