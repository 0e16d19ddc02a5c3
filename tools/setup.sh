#!/usr/bin/env bash
# Installs moesim's build and test dependencies from Debian's packages when they are
# missing. Idempotent: on a machine that has them it does nothing and needs no network.
# Runs as root (or through sudo when available). Debian 12 (bookworm) or newer.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libboost-graph-dev nlohmann-json3-dev libfmt-dev catch2 libcli11-dev
  pybind11-dev python3-dev python3-numpy python3-pytest python3-nbclient python3-ipykernel python3-matplotlib
  chromium
  openmpi-bin libopenmpi-dev python3-distributed
  clang
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# libFuzzer's runtime (tools/fuzz.sh) is in the runtime package of the installed clang's version.
clang_rt() { command -v clang >/dev/null 2>&1 && echo "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
rt=$(clang_rt || true)
if [ -n "$rt" ] && ! installed "$rt"; then missing+=("$rt"); fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "tools/setup.sh: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
else
  SUDO=
fi

echo "tools/setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
rt=$(clang_rt || true)
if [ -n "$rt" ] && ! installed "$rt"; then
  $SUDO apt-get install -y -q --no-install-recommends "$rt"
fi
