#!/usr/bin/env bash
# Installs every system package cpkit builds or tests with. Idempotent: packages already
# present are skipped, so a second run only asks dpkg and returns in well under a second.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config clang-format
  libeigen3-dev       # reference/: the Eigen oracle
  librapidcheck-dev   # harness/: property tests
  libgtest-dev        # tests/ and harness/
  libbenchmark-dev    # bench/
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root for apt-get install ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: system packages present"
