#!/usr/bin/env bash
# Fuzzes moesim's readers of outside input with libFuzzer (clang, AddressSanitizer + UBSan):
# the scenario loader, the Hugging Face config reader, megatron_args, validate's cases reader
# and the search-resume journal. Seeds: the repository's scenarios, presets and cases, plus the
# regression inputs in tests/fuzz/<harness>/ (every finding is kept there and replayed by the
# test suite). The corpus grows in BUILD_DIR/corpus across runs.
#
#   tools/fuzz.sh [SECONDS_PER_HARNESS] [BUILD_DIR]     (defaults: 60, build-fuzz)
#   JOBS=2 tools/fuzz.sh 3600                            (a long campaign, 2 processes each)
#   tools/fuzz.sh --runs N [BUILD_DIR]                   (CI: N inputs per harness from the seeds
#                                                         alone with a fixed random seed, so the
#                                                         same N gives the same inputs everywhere)
#
# Prints the executions per harness and the total; exits non-zero on a finding (the input is
# in BUILD_DIR/artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=""
if [ "${1:-}" = "--runs" ]; then
  runs="$2"
  shift 2
fi
seconds="${1:-60}"
dir="${2:-build-fuzz}"
jobs="${JOBS:-1}"
if [ ! -f "$dir/build.ninja" ]; then
  CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_FUZZ=ON >/dev/null
fi
harnesses=(scenario hf_config megatron_args cases resume)
cmake --build "$dir" -j"$(nproc)" --target $(printf 'moesim_fuzz_%s ' "${harnesses[@]}")

seeds="$dir/seeds"
rm -rf "$seeds" && mkdir -p "$seeds"/{scenario,hf_config,megatron_args,cases,resume} "$dir/artifacts"
cp scenarios/*.json tests/scenarios/*.json "$seeds/scenario/"
cp models/presets/models/*.json "$seeds/hf_config/"
# One case per file (the cases files hold a list, or {"cases": [...]}).
python3 - "$seeds/cases" bench/validation/calibration_cases.json bench/validation/supplementary_cases.json <<'PY'
import json, sys
out = sys.argv[1]
n = 0
for f in sys.argv[2:]:
    doc = json.load(open(f))
    for c in (doc["cases"] if isinstance(doc, dict) else doc)[:150]:
        n += 1
        json.dump(c, open("{}/case_{:04d}.json".format(out, n), "w"))
PY
for h in "${harnesses[@]}"; do
  if [ -d "tests/fuzz/$h" ]; then cp tests/fuzz/"$h"/* "$seeds/$h/" 2>/dev/null || true; fi
done

total=0
status=0
for h in "${harnesses[@]}"; do
  corpus="$dir/corpus/$h"
  limit=(-max_total_time="$seconds")
  # libFuzzer's -jobs runs that many processes, each logging to fuzz-N.log in the working folder.
  [ "$jobs" -gt 1 ] && limit+=(-jobs="$jobs" -workers="$jobs")
  if [ -n "$runs" ]; then  # reproducible: a fresh corpus, a fixed seed, a fixed count
    corpus="$dir/corpus-fixed/$h"
    rm -rf "$corpus"
    limit=(-runs="$runs" -seed=1)
  fi
  mkdir -p "$corpus"
  log="$dir/fuzz_$h.log"
  set +e
  "$dir/bin/moesim_fuzz_$h" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$dir/artifacts/$h-" -print_final_stats=1 "$corpus" "$seeds/$h" >"$log" 2>&1
  rc=$?
  set -e
  # Executions: "stat::number_of_executed_units: N" per process.
  logs=("$log")
  [ "$jobs" -gt 1 ] && [ -z "$runs" ] && logs+=(fuzz-*.log)
  executed=$( (grep -h "stat::number_of_executed_units" "${logs[@]}" 2>/dev/null || true) | awk '{s += $2} END {print s + 0}')
  [ "$jobs" -gt 1 ] && rm -f fuzz-*.log
  n=$(ls "$corpus" | wc -l)
  echo "$h: $executed executions, corpus $n inputs, exit $rc"
  total=$((total + executed))
  if [ $rc -ne 0 ]; then
    status=1
    echo "  finding: see $log and $dir/artifacts/$h-*" >&2
  fi
done
echo "total: $total executions"
# Campaigns add up: one line per run in BUILD_DIR/campaign.log (date, seconds, executions).
echo "$(date -u +%FT%TZ) ${runs:+runs=$runs}${runs:-${seconds}s}/harness $total" >> "$dir/campaign.log"
awk '{s += $3} END {print "all runs in " FILENAME ": " s " executions"}' "$dir/campaign.log"
exit $status
