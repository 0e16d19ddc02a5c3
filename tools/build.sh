#!/usr/bin/env bash
# Configures and builds moesim into build/ (Release, Ninja). Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=/usr/bin/python3
fi
cmake --build build -j"$(nproc)"
