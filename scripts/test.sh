#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit + integration).
# The suites run side by side (CTEST_PARALLEL_LEVEL, default 8): the integration suites mostly
# wait on sockets and timers, each with its own ports, folders and processes. Extra arguments
# go to ctest (-j1 runs one at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j "${CTEST_PARALLEL_LEVEL:-8}" "$@"
