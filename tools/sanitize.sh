#!/usr/bin/env bash
# Builds moesim out of tree with AddressSanitizer + UndefinedBehaviorSanitizer and runs the whole
# test suite there (C++, CLI, Python with the runtimes preloaded, the browser check). About
# 8 minutes to build and 20-30 minutes to test on 2 cores, so it is not part of the README's
# test command; run it before landing changes to memory handling or arithmetic.
#   tools/sanitize.sh [BUILD_DIR]        (default: build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-asan}"
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=/usr/bin/python3 \
        -DMOESIM_BUILD_BENCH=OFF -DMOESIM_SANITIZE=address,undefined
fi
cmake --build "$dir" -j"$(nproc)"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
