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
# Every published run the project holds (calibration file, supplementary, the Ascend and GPU
# collections, the Pangu 718B), cross-validated by source: each publication predicted with the
# device parameters fitted on all the others. Writes crossval_report.* and the error bands the
# library embeds (models/presets/error_bands.json). About 3 minutes on 2 cores.
build/bin/moesim validate bench/validation/calibration_cases.json bench/validation/supplementary_cases.json \
  bench/validation/cases_ascend.json bench/validation/cases_gpu.json bench/validation/cases_pangu.json \
  --cross-validate source --threads "${THREADS:-2}" --out bench/validation/crossval_report.md \
  --json bench/validation/crossval_report.json --bands-out models/presets/error_bands.json
