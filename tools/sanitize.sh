#!/usr/bin/env bash
# Builds moesim out of tree with sanitizers and runs its tests there.
#
#   tools/sanitize.sh [BUILD_DIR]            AddressSanitizer + UndefinedBehaviorSanitizer over the
#                                            whole suite (C++, CLI, Python with the runtimes
#                                            preloaded, the browser check; not the accuracy
#                                            guard of cross-validation); default build-asan.
#                                            About 8 minutes to build and 10-15 to test on 2 cores.
#   tools/sanitize.sh --thread [BUILD_DIR]   ThreadSanitizer over the code that runs threads: the
#                                            search's workers, cross-validation's pool, progress
#                                            lines, cancellation, the CLI's threaded search and
#                                            capacity plan; default build-tsan. About 6 minutes to
#                                            build and 5 to run.
#
# Neither is part of the README's test command; CI (.ci/run) runs both.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=address
if [ "${1:-}" = "--thread" ]; then
  mode=thread
  shift
fi

if [ "$mode" = address ]; then
  dir="${1:-build-asan}"
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 \
          -DMOESIM_BUILD_BENCH=OFF -DMOESIM_SANITIZE=address,undefined
  fi
  cmake --build "$dir" -j"$(nproc)"
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # The leave-one-source-out guard re-runs the same cross-validation code ([crossval] covers it)
  # over 185 cases and their grids: an accuracy check, about 25 minutes under ASan, so it is
  # left to the optimised build.
  ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" -E '^validation\.crossval_guard$'
  exit 0
fi

# ThreadSanitizer: only the C++ test binary and the CLI (the Python interpreter is not built
# with TSan, so the bindings' thread hand-off is covered by the ASan run instead).
dir="${1:-build-tsan}"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 \
        -DMOESIM_BUILD_BENCH=OFF -DMOESIM_MPI=OFF -DMOESIM_SANITIZE=thread
fi
cmake --build "$dir" -j"$(nproc)" --target moesim moesim_tests
# halt_on_error: the first race fails the run; second_deadlock_stack: both stacks of a lock
# inversion.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:history_size=4
export MOESIM_TEST_TIME_SCALE=20
"$dir/bin/moesim_tests" "[search],[progress],[crossval],[integrity],[capacity]"
cli="$dir/bin/moesim"
"$cli" search scenarios/pangu-ultra-moe-718b.json --threads 2 --top 4 --format json > /dev/null
"$cli" plan scenarios/pangu-ultra-moe-718b.json --tokens 10T --devices 4096,6144 --threads 2 > /dev/null
"$cli" search tests/scenarios/search_small_moe.json --threads 2 --top 8 --format csv > /dev/null
# The progress line's drawing thread, on a terminal.
script -qec "$cli search scenarios/pangu-ultra-moe-718b.json --threads 2 --top 2 --format json" /dev/null > /dev/null
echo "ThreadSanitizer: clean"
