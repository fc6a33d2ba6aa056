#!/usr/bin/env bash
# Load run: wrk against GET /weight_info of a fresh `vllmd --dev-mode` (embedded engine) on
# loopback, for a bounded time. Prints wrk's report and the daemon's RSS before and after;
# fails (exit 1) on any non-2xx response or socket error.
#
# Usage: tests/bench/load_weight_info.sh [BUILD_DIR] (default build)
#   DURATION=30s CONNECTIONS=64 THREADS=2 to change the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
duration=${DURATION:-30s}
connections=${CONNECTIONS:-64}
threads=${THREADS:-2}
vllmd=$build/daemon/vllmd
[ -x "$vllmd" ] || { echo "no $vllmd: build first (scripts/build.sh)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is not installed (scripts/deps.sh)" >&2; exit 1; }

work=$(mktemp -d)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

env -u VLLMD_CONFIG "$vllmd" --dev-mode --host 127.0.0.1 --port 0 --port-file "$work/port" \
  --log-level warning 2>"$work/log" &
daemon_pid=$!
for _ in $(seq 200); do [ -s "$work/port" ] && break; sleep 0.05; done
port=$(cat "$work/port")
url=http://127.0.0.1:$port
for _ in $(seq 200); do curl -sf "$url/health" >/dev/null && break; sleep 0.05; done
curl -sf "$url/weight_info" >/dev/null

rss() { awk -v key="$1:" '$1 == key { print $2 }' "/proc/$daemon_pid/status"; }
rss_start=$(rss VmRSS)
echo "wrk -t$threads -c$connections -d$duration --latency $url/weight_info"
wrk -t"$threads" -c"$connections" -d"$duration" --latency "$url/weight_info" | tee "$work/wrk"
rss_end=$(rss VmRSS)
rss_peak=$(rss VmHWM)
echo "daemon RSS: start ${rss_start} kB, end ${rss_end} kB, peak ${rss_peak} kB"

non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$work/wrk")
errors=$(grep -c "Socket errors" "$work/wrk" || true)
if [ -n "$non2xx" ] || [ "$errors" != 0 ]; then
  echo "FAILED: non-2xx responses: ${non2xx:-0}; socket errors reported: $errors" >&2
  exit 1
fi
echo "zero non-2xx responses, no socket errors"
