#!/usr/bin/env bash
# Installs the Debian 12 packages vllmd needs to build and test. Idempotent: it only calls
# apt-get when something is missing, so the README commands stay fast on a prepared machine.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build
  # Every build compiles through it (cmake/ccache.cmake): rebuilds and CI's next run reuse work.
  ccache
  libcli11-dev libpoco-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libboost-dev
  doctest-dev libtomlplusplus-dev libsystemd-dev libexpected-dev libssl-dev
  python3 python3-zmq python3-msgpack python3-requests
  # The trainer-side Llama (examples/llama_numpy.py): the model-alignment and RL-loop tests.
  python3-numpy
  # The completion tests run the generated scripts in each shell.
  zsh fish
  curl
  # HTTPS tests make their certificates.
  openssl
  # Engine-link tests cut TCP connections (ss -K) and stand in for hosts (ip netns).
  iproute2
  # Man pages (mandoc -T lint) and the Debian package test: cpack's dpkg-shlibdeps, man -w,
  # systemd-analyze verify, lintian on the .deb.
  mandoc dpkg-dev man-db systemd lintian
  # The house style, enforced by .ci/run (scripts/format.sh --check, scripts/tidy.sh).
  clang-format-14 clang-tidy-14
  # The libFuzzer targets in tests/fuzz (.ci/run's bounded fuzz step, -DVLLMD_FUZZ=ON).
  clang-14 libclang-rt-14-dev lld-14
  # Benchmarks (tests/bench): the simdjson floor, the FastAPI + uvicorn baseline, wrk load.
  libsimdjson-dev python3-fastapi python3-uvicorn python3-uvloop python3-httptools wrk
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages: ${missing[*]} (run as root or install them)" >&2
  exit 1
fi

echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
