#!/usr/bin/env bash
# Configures (once) and builds one build tree. Usage: scripts/build.sh [BUILD_DIR] [cmake args...]
# Re-running reuses the tree, so only changed files are rebuilt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-"$root/build"}
shift || true
# Configure on first use; re-configure an existing tree only when cache settings are passed.
if [[ ! -f "$build/build.ninja" || $# -gt 0 ]]; then
  cmake -S "$root" -B "$build" -G Ninja "$@"
fi
cmake --build "$build" --parallel "$(nproc)"
