#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit + integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 "$@"
