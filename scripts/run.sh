#!/usr/bin/env bash
# Installs what is missing, builds, and runs vllmd in dev mode with the embedded reference
# engine on 127.0.0.1:8000. Extra arguments go to vllmd.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec "${BUILD_DIR:-build}/daemon/vllmd" --dev-mode "$@"
