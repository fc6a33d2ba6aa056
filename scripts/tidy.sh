#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over every C++ file the build compiles, production and tests; any
# finding fails. Run after a build (BUILD_DIR, default build): it reads compile_commands.json
# and the generated headers.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD_DIR:-build}"
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy: $build/compile_commands.json is missing: build first (scripts/build.sh)" >&2
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# -Wno-unknown-warning-option: the compile commands carry g++-only warning flags.
if run-clang-tidy-14 -p "$build" -quiet -j "$(nproc)" -extra-arg=-Wno-unknown-warning-option \
     "$PWD/(common|daemon|cmd|tests)/" >"$log" 2>&1; then
  echo "tidy: $(grep -c '^clang-tidy' "$log" || true) files, no findings"
else
  # The findings without run-clang-tidy's per-file command lines and warning counts.
  grep -v -E '^(clang-tidy-14 |[0-9]+ warnings? (and [0-9]+ errors? )?generated|Suppressed |Use -header-filter)' \
    "$log" >&2 || true
  echo "tidy: findings above (.clang-tidy)" >&2
  exit 1
fi
