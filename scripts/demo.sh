#!/usr/bin/env bash
# The main job: set up, build, and run cpkit-demo on its embedded default batch.
# Extra arguments go to cpkit-demo (see scripts/demo.sh --help).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build" >/dev/null
exec "$root/build/harness/demo/cpkit-demo" "$@"
