#!/usr/bin/env bash
# The CUDA path's check on one GPU (under 8 minutes): see scripts/gpu_check.py. A GPU machine may reach no package
# registry and may carry another torch release, so tessel is installed without its dependencies and runs with the
# machine's own torch. Usage: bash scripts/gpu_check.sh [--wiring]
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || python -m pip install -q --no-deps -e .
exec python scripts/gpu_check.py "$@"
