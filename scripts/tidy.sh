#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over every C++ file the build compiles, production and tests, in
# parallel; any finding fails. Run after a build (BUILD_DIR, default build): it reads
# compile_commands.json, the generated headers and the .d files. Files unchanged since they were
# found clean are skipped (scripts/tidy.py says how; --no-cache analyses all).
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/tidy.py "$@"
