#!/usr/bin/env bash
# The CUDA path's check on one GPU (under 8 minutes): see scripts/gpu_check.py. A GPU machine may reach no package
# registry and may carry another torch release, so tessel runs from src/ with the machine's own torch and packages
# (nothing is installed). Usage: bash scripts/gpu_check.sh [--wiring]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec python3 scripts/gpu_check.py "$@"
