#!/usr/bin/env bash
# Builds benchmarks/peers/.venv (git-ignored) with the CPU build of PyTorch, for torch_round.py.
# It asks PyTorch's CPU index; where that cannot be reached pip still takes a CPU wheel
# (torch-X+cpu) from its configured find-links or extra indexes, if the machine has one.
# Usage: bash benchmarks/peers/setup.sh   (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")"
"${PYTHON:-python3}" -m venv .venv
.venv/bin/python -m pip install --retries 1 --timeout 15 \
  --index-url https://download.pytorch.org/whl/cpu torch
.venv/bin/python -c "import torch; print('torch', torch.__version__)"
