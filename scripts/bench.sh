#!/usr/bin/env bash
# The benchmark suite in one command: a Release build into ${BUILD_DIR:-build-release}, then
# tests/bench/run.py (vllmd vs the FastAPI baseline vs the simdjson floor; one table).
# Arguments go to run.py (--quick, --only ..., --json FILE; see docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-release}
BUILD_DIR=$build_dir bash scripts/build.sh -DCMAKE_BUILD_TYPE=Release >&2
exec /usr/bin/python3 tests/bench/run.py --build-dir "$build_dir" "$@"
