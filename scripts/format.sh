#!/usr/bin/env bash
# The house style (.clang-format) over every C++ file git tracks: `--check` lists each
# difference and fails (.ci/run runs it), otherwise the files are fixed in place.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp')
if [ "${1:-}" = "--check" ]; then
  clang-format-14 --dry-run -Werror "${files[@]}"
  echo "format: ${#files[@]} files match .clang-format"
else
  clang-format-14 -i "${files[@]}"
fi
