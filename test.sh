#!/usr/bin/env bash
# Builds what changed and runs the whole test suite (lit, GoogleTest, pytest).
# Usage: ./test.sh [--build-dir DIR]
set -euo pipefail
cd "$(dirname "$0")"
build_dir=build
if [[ "${1:-}" == "--build-dir" ]]; then build_dir=$2; fi
if [[ ! -f "$build_dir/build.ninja" ]]; then
  echo "error: $build_dir is not configured; run ./install.sh first" >&2
  exit 2
fi
cmake --build "$build_dir"
exec python3 tools/run_tests.py --build-dir "$build_dir"
