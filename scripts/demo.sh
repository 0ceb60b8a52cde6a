#!/usr/bin/env bash
# The main job: set up, build cpkit-demo, and run it on its embedded default batch.
# Extra arguments go to cpkit-demo (scripts/demo.sh --help; --impl optimized runs the
# LibTorch path in real rank processes and compares it with the reference).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" >/dev/null
if [[ ! -f "$root/build/build.ninja" ]]; then
  cmake -S "$root" -B "$root/build" -G Ninja >/dev/null
fi
cmake --build "$root/build" --target cpkit-demo --parallel "$(nproc)" >/dev/null
exec "$root/build/harness/demo/cpkit-demo" "$@"
