#!/usr/bin/env bash
# Launches a world of cpkit_launch_mapping processes the way a job would and requires every
# rank to report its CP group right (see launch_mapping.cpp).
#   launch_mapping.sh torchrun|slurm WORLD CP EXE TORCHRUN
set -euo pipefail
mode=$1 world=$2 cp=$3 exe=$4 torchrun=$5
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [[ $mode == torchrun ]]; then
  "$torchrun" --standalone --nproc_per_node="$world" --no-python "$exe" --cp "$cp" > "$log" 2>&1 \
    || { cat "$log"; exit 1; }
else
  # srun's variables, one process per task; MASTER_ADDR/PORT as a job script exports them.
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for ((r = 0; r < world; ++r)); do
    SLURM_PROCID=$r SLURM_NTASKS=$world SLURM_LOCALID=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$exe" --cp "$cp" >> "$log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if ((failed)); then cat "$log"; exit 1; fi
fi
cat "$log"
ok=$(grep -c ": ok$" "$log" || true)
[[ $ok == "$world" ]] || { echo "expected $world ranks reporting ok, got $ok"; exit 1; }
