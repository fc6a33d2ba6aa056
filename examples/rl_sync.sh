#!/usr/bin/env bash
# A training loop that pushes fresh weights into a running vLLM (through vllmd) after every
# step, with vllmctl. Run it against a dev-mode vllmd:
#
#   vllmd --dev-mode &                      # embedded reference engine on 127.0.0.1:8000
#   examples/rl_sync.sh 3                   # three training steps, three syncs
#
# Settings (environment): VLLMCTL_SERVER, VLLMCTL_TOKEN / VLLMCTL_TOKEN_FILE (read by vllmctl),
# VLLMCTL (the binary, default: vllmctl on PATH), MAX_ATTEMPTS (per call, default 5),
# RETRY_DELAY (first backoff in seconds, default 2; doubled per retry), TIMEOUT (seconds per
# call, default 300: NCCL updates block until the broadcast is done).
#
# The trainer here is a stub that writes each step's update_info to a file. A real one writes
# what its weight-transfer backend needs (IPC: pickled CUDA IPC handles; NCCL: tensor names,
# dtypes and shapes, then broadcasts while vllmctl waits on /update_weights).
set -euo pipefail

steps=${1:-3}
vllmctl=${VLLMCTL:-vllmctl}
max_attempts=${MAX_ATTEMPTS:-5}
retry_delay=${RETRY_DELAY:-2}
timeout=${TIMEOUT:-300}

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

log() { echo "rl_sync: $*" >&2; }

# init_info: the backend's rendezvous parameters (NCCL here: trainer is rank 0, vLLM's workers
# follow at rank_offset; world_size = vllmctl world-size + 1).
write_init_info() {
  local world_size
  world_size=$("$vllmctl" world-size)
  cat >"$workdir/init.json" <<JSON
{"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
 "world_size": $((world_size + 1))}
JSON
}

# One training step; leaves the step's update_info in update-<step>.json.
train_step() {
  local step=$1
  cat >"$workdir/update-$step.json" <<JSON
{"names": ["model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"],
 "dtype_names": ["bfloat16", "bfloat16"],
 "shapes": [[151936, 4096], [4096, 11008]]}
JSON
}

# Runs `vllmctl ARGS...`, retrying what is worth retrying. Exit codes (vllmctl --help): 69
# (daemon or engine unavailable) and 75 (timeout) may pass; 64/65/66/70/77/78 will not (a bad
# payload, a failed engine call or a bad configuration fails the same way again). A failed
# `weights sync` has already resumed generation and left the version uncommitted.
with_retries() {
  local what=$1 attempt=1 delay=$retry_delay code
  shift
  while :; do
    code=0
    "$vllmctl" --timeout "$timeout" "$@" || code=$?
    case $code in
      0) return 0 ;;
      69 | 75)
        if ((attempt >= max_attempts)); then
          log "$what: exit code $code after $attempt attempts; giving up"
          return "$code"
        fi
        log "$what: exit code $code (attempt $attempt of $max_attempts); retrying in $delay s"
        sleep "$delay"
        attempt=$((attempt + 1))
        delay=$(awk -v d="$delay" 'BEGIN { print d * 2 }')
        ;;
      *)
        log "$what: exit code $code; stopping"
        return "$code"
        ;;
    esac
  done
}

with_retries "health check" -q health || exit $?
write_init_info
# Once per job: with NCCL every init is a rendezvous the trainer has to join.
with_retries "init" weights init --info "$workdir/init.json" || exit $?
for ((step = 1; step <= steps; step++)); do
  train_step "$step"
  with_retries "step $step: sync" weights sync \
    --update "$workdir/update-$step.json" --version "step-$step" || exit $?
  log "step $step: weights synced; serving $("$vllmctl" weights info)"
done
