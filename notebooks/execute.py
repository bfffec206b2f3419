"""Executes notebooks in place, with their outputs, at the size they commit:
``python notebooks/execute.py notebooks/NAME.ipynb [...] [--tiny]``.

Without ``--tiny`` a notebook runs at its small size (``FEDJAX_DP_TINY`` unset); with it, at
the tests' tiny size. Figures render inline (the kernel's own backend; ``MPLBACKEND`` unset).
Prints each notebook's wall time.
"""

import argparse
import os
import pathlib
import time

import nbclient
import nbformat

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("paths", nargs="+", type=pathlib.Path)
parser.add_argument("--tiny", action="store_true", help="run at the tests' tiny size")
args = parser.parse_args()
os.environ.pop("MPLBACKEND", None)
os.environ.pop("FEDJAX_DP_TINY", None)
if args.tiny:
  os.environ["FEDJAX_DP_TINY"] = "1"
for path in args.paths:
  nb = nbformat.read(path, as_version=4)
  t0 = time.perf_counter()
  nbclient.NotebookClient(nb, timeout=3600, kernel_name="python3",
                          resources={"metadata": {"path": str(path.resolve().parent)}}).execute()
  nbformat.write(nb, path)
  print(f"{path}: {time.perf_counter() - t0:.0f} s, {path.stat().st_size / 1e3:.0f} kB", flush=True)
