#!/usr/bin/env bash
# The GPU check: runs statevar from this checkout, on the Python at hand (no install), and
# writes one report. See tools/gpu_check.py for the steps and their options.
#
#   tools/gpu_check.sh                    # on a GPU machine; the report goes to ./gpu_check/
#   tools/gpu_check.sh --out DIR          # elsewhere
#   tools/gpu_check.sh --cpu-only ...     # the CPU path alone (the test suite runs it so)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec "${PYTHON:-python3}" "$root/tools/gpu_check.py" "$@"
