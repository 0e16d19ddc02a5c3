#!/usr/bin/env bash
# Validation entry: runs `moesim validate` on the calibration cases (a copy of
# ../shared/reference/calibration_cases.json) and writes report.md and report.json here.
#   bench/validation/run.sh [CASES.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
cases=${1:-bench/validation/calibration_cases.json}
build/bin/moesim validate "$cases" --out bench/validation/report.md --json bench/validation/report.json --progress
# Supplementary published runs (not in the calibration file; nothing is fitted on them).
build/bin/moesim validate bench/validation/supplementary_cases.json --out bench/validation/supplementary_report.md \
  --json bench/validation/supplementary_report.json
