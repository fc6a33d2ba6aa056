#!/usr/bin/env bash
# Validates vllmd against real vLLM engines on this GPU host (docs/real-engine.md).
#
# Every cell of the matrix (backend x tensor-parallel size) runs in two phases on the same
# GPUs, with the same engine flags and the same trainer weights:
#   1. vllm   vLLM's own API server (dev mode); the trainer syncs, the server generates.
#   2. vllmd  vllmd in external mode before a headless engine; the trainer syncs through it.
# validate_sync.py drives each phase; `validate_sync.py report` tabulates the results.
#
#   docs/real-engine/run.sh                          # every cell this host has GPUs for
#   CELLS="nccl-tp1 ipc-tp1" docs/real-engine/run.sh
#
# Settings (environment, defaults in brackets): MODEL [facebook/opt-125m],
# CELLS [nccl-tp1 nccl-tp2 ipc-tp1 ipc-tp2], OUT [./real-engine-results/<time>],
# VLLMD [<repo>/build/daemon/vllmd], VLLM [vllm], PYTHON [python3], TORCHRUN [torchrun],
# VLLM_PORT [8100], VLLMD_PORT [8000], HANDSHAKE_PORT [5570], READY_TIMEOUT [900] s,
# EXTRA_ENGINE_ARGS [] (appended to both phases' `vllm serve`), TRAINER_ARGS [] (appended
# to every validate_sync.py run).
#
# Exit status: that of the report (0 all passed, 1 a check failed, 2 a phase could not run).
set -uo pipefail  # no -e: one failing cell must not stop the others

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
MODEL=${MODEL:-facebook/opt-125m}
CELLS=${CELLS:-"nccl-tp1 nccl-tp2 ipc-tp1 ipc-tp2"}
OUT=${OUT:-$PWD/real-engine-results/$(date +%Y%m%d-%H%M%S)}
VLLMD=${VLLMD:-$repo/build/daemon/vllmd}
VLLM=${VLLM:-vllm}
PYTHON=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
VLLM_PORT=${VLLM_PORT:-8100}
VLLMD_PORT=${VLLMD_PORT:-8000}
HANDSHAKE_PORT=${HANDSHAKE_PORT:-5570}
READY_TIMEOUT=${READY_TIMEOUT:-900}
EXTRA_ENGINE_ARGS=${EXTRA_ENGINE_ARGS:-}
TRAINER_ARGS=${TRAINER_ARGS:-}
HOST=127.0.0.1
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # GPU numbers mean what nvidia-smi shows

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- processes this script starts, and only those --------------------------------------

pids=()

start() {  # LOGFILE COMMAND...: run in its own session, so its children can be stopped with it
  local logfile=$1
  shift
  setsid "$@" >"$logfile" 2>&1 &
  pids+=("$!")
  log "started pid $! ($1 ...), log $logfile"
}

stop_all() {  # SIGTERM each started process group, then SIGKILL what is left after 60 s
  local pid group i
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    group=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
    if [[ $group == "$pid" ]]; then kill -TERM -- "-$pid" 2>/dev/null; else kill -TERM "$pid" 2>/dev/null; fi
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 60; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid ignored SIGTERM for 60 s: SIGKILL"
      group=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
      if [[ $group == "$pid" ]]; then kill -KILL -- "-$pid" 2>/dev/null; else kill -KILL "$pid" 2>/dev/null; fi
    fi
    wait "$pid" 2>/dev/null
  done
  pids=()
}

trap 'stop_all' EXIT
trap 'stop_all; exit 130' INT TERM

wait_http() {  # URL CODES SECONDS: until the HTTP status matches CODES (a regex); fails when a
  local url=$1 codes=$2 deadline=$((SECONDS + $3)) code pid  # started process exits first
  while :; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url" || true)
    [[ $code =~ ^($codes)$ ]] && return 0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { log "pid $pid exited while waiting for $url"; return 1; }
    done
    if ((SECONDS > deadline)); then
      log "no HTTP $codes from $url within $3 s (last: $code)"
      return 1
    fi
    sleep 2
  done
}

phase_error() {  # FILE TARGET MESSAGE: a result file for a phase that could not run
  "$PYTHON" - "$@" <<'EOF'
import json, sys
path, target, message = sys.argv[1:4]
with open(path, "w") as out:
    json.dump({"target": target, "verdict": "ERROR", "error": message, "checks": [], "rounds": []}, out)
EOF
}

# --- prerequisites ------------------------------------------------------------------------

[[ -x $VLLMD ]] || { log "no vllmd at $VLLMD: run ./scripts/build.sh, or set VLLMD"; exit 2; }
command -v "$VLLM" >/dev/null || { log "no '$VLLM' on PATH: install vLLM, or set VLLM"; exit 2; }
command -v curl >/dev/null || { log "curl is needed"; exit 2; }
"$PYTHON" -c 'from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, ModuleSource, WeightTransferTrainerFactory' ||
  { log "this vLLM lacks the trainer-side weight-transfer API (docs/real-engine.md, Install)"; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
((gpus > 0)) || { log "nvidia-smi lists no GPU"; exit 2; }
mkdir -p "$OUT"
log "results in $OUT; $gpus GPUs"

{
  echo "date: $(date -Is)"
  echo "vllmd: $("$VLLMD" --version 2>&1) at $VLLMD"
  echo "vllmd commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  "$PYTHON" -c 'import sys, vllm, torch, transformers; print("python:", sys.version.split()[0]); print("vllm:", vllm.__version__); print("torch:", torch.__version__, "cuda", torch.version.cuda); print("transformers:", transformers.__version__)'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  echo "model: $MODEL"
} >"$OUT/env.txt" 2>&1

# --- one cell -----------------------------------------------------------------------------

run_cell() {  # CELL: nccl-tp1, nccl-tp2, ipc-tp1 or ipc-tp2
  local cell=$1 backend=${1%-tp*} tp=${1##*-tp}
  local dir=$OUT/$cell need engine_gpus trainer_gpus
  mkdir -p "$dir"
  if [[ $backend == nccl ]]; then need=$((tp + 1)); else need=$tp; fi
  if ((gpus < need)); then
    echo "needs $need GPUs ($([[ $backend == nccl ]] && echo "$tp for the engine, 1 for the trainer" || echo "shared by engine and trainer")), host has $gpus" >"$dir/SKIPPED"
    log "$cell: skipped, $(cat "$dir/SKIPPED")"
    return
  fi
  engine_gpus=$(seq -s, 0 $((tp - 1)))
  if [[ $backend == nccl ]]; then trainer_gpus=$tp; else trainer_gpus=$engine_gpus; fi

  # Identical in both phases, so the workers' parameters are laid out alike.
  local engine_args=(--tensor-parallel-size "$tp" --dtype bfloat16 --load-format dummy --enforce-eager
    --generation-config vllm --no-enable-prefix-caching --gpu-memory-utilization 0.5
    --weight-transfer-config "{\"backend\":\"$backend\"}"
    --worker-extension-cls validate_sync.WeightProbe)
  # shellcheck disable=SC2206 # EXTRA_ENGINE_ARGS is a word list on purpose
  engine_args+=($EXTRA_ENGINE_ARGS)
  local engine_env=(CUDA_VISIBLE_DEVICES="$engine_gpus" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}")
  local trainer_env=(CUDA_VISIBLE_DEVICES="$trainer_gpus")
  if [[ $backend == ipc ]]; then
    engine_env+=(VLLM_ALLOW_INSECURE_SERIALIZATION=1)
    trainer_env+=(VLLM_ALLOW_INSECURE_SERIALIZATION=1)
  fi
  local trainer=("$PYTHON" "$here/validate_sync.py")
  if [[ $backend == ipc ]] && ((tp > 1)); then
    trainer=("$TORCHRUN" --standalone --nproc_per_node "$tp" "$here/validate_sync.py")
  fi
  # shellcheck disable=SC2206
  local common=(run --backend "$backend" --tp "$tp" --model "$MODEL" --require-probe $TRAINER_ARGS)

  log "$cell, phase 1: vLLM's API server on GPUs $engine_gpus, trainer on $trainer_gpus"
  mkdir -p "$dir/probe-vllm"
  start "$dir/vllm-server.log" env "${engine_env[@]}" VLLMD_PROBE_DIR="$dir/probe-vllm" VLLM_SERVER_DEV_MODE=1 \
    "$VLLM" serve "$MODEL" --host "$HOST" --port "$VLLM_PORT" "${engine_args[@]}"
  if wait_http "http://$HOST:$VLLM_PORT/health" 200 "$READY_TIMEOUT"; then
    env "${trainer_env[@]}" "${trainer[@]}" "${common[@]}" --target vllm --base-url "http://$HOST:$VLLM_PORT" \
      --probe-dir "$dir/probe-vllm" --out "$dir/vllm.json" 2>&1 | tee "$dir/trainer-vllm.log"
  else
    phase_error "$dir/vllm.json" vllm "vLLM's server did not become healthy; see vllm-server.log"
  fi
  stop_all

  log "$cell, phase 2: vllmd before a headless engine on GPUs $engine_gpus, trainer on $trainer_gpus"
  mkdir -p "$dir/probe-vllmd"
  start "$dir/vllmd.log" "$VLLMD" --dev-mode --engine external \
    --handshake-address "tcp://$HOST:$HANDSHAKE_PORT" --data-parallel-size 1 --host "$HOST" --port "$VLLMD_PORT"
  if wait_http "http://$HOST:$VLLMD_PORT/health" '200|503' 30; then
    start "$dir/engine.log" env "${engine_env[@]}" VLLMD_PROBE_DIR="$dir/probe-vllmd" \
      "$VLLM" serve "$MODEL" --headless --data-parallel-address "$HOST" \
      --data-parallel-rpc-port "$HANDSHAKE_PORT" "${engine_args[@]}"
  fi
  if ((${#pids[@]} == 2)) && wait_http "http://$HOST:$VLLMD_PORT/health" 200 "$READY_TIMEOUT"; then
    env "${trainer_env[@]}" "${trainer[@]}" "${common[@]}" --target vllmd --base-url "http://$HOST:$VLLMD_PORT" \
      --probe-dir "$dir/probe-vllmd" --reference "$dir/vllm.json" --out "$dir/vllmd.json" \
      2>&1 | tee "$dir/trainer-vllmd.log"
  else
    phase_error "$dir/vllmd.json" vllmd "vllmd or the headless engine did not become healthy; see vllmd.log, engine.log"
  fi
  stop_all
}

for cell in $CELLS; do
  case $cell in
    nccl-tp1 | nccl-tp2 | ipc-tp1 | ipc-tp2) run_cell "$cell" ;;
    *) log "unknown cell '$cell' (nccl-tp1 nccl-tp2 ipc-tp1 ipc-tp2)" ;;
  esac
done

"$PYTHON" "$here/validate_sync.py" report "$OUT" | tee "$OUT/summary.md"
status=${PIPESTATUS[0]}
log "summary: $OUT/summary.md"
exit "$status"
