#!/usr/bin/env bash
# Here (no GPU), after tools/device/prepare.sh (or with --fresh): adds variants of the compiler
# to build/device so that one device call can time them against the tree (tools/device/variants.sh
# there).
#   tools/device/prepare-variants.sh [--fresh] NAME=PATCH [NAME=PATCH ...] -- COMMAND...
# --fresh starts build/device anew with only what a timing call needs (the NCCL headers and the
# kernels COMMAND compiles): the whole GPU suite's cache and a few variants' do not fit the
# device call's 64 MiB.
# Each PATCH (a `git diff` against this tree, e.g. the kernel as it was, or an experiment) is
# applied in turn, the compiler rebuilt and COMMAND run with EPIC_CACHE_DIR set to the device
# cache: COMMAND compiles what the timing needs (e.g. `python3 bench/gemm_bench.py
# --compile-only --gemm-only`). The patched files and the variant's kernel-source hash go to
# build/device/variants/NAME/; the tree is restored after each. COMMAND runs for the tree too.
# The kernel cache keys hold the compiler sources' hash, so every variant's kernels sit side by
# side in one cache and each runtime finds its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build
out=$build/device
fresh=0
[[ ${1:-} == --fresh ]] && { fresh=1; shift; }
variants=()
while [[ $# -gt 0 && $1 != -- ]]; do variants+=("$1"); shift; done
[[ $# -gt 1 && ${#variants[@]} -gt 0 ]] || {
  echo "usage: $0 NAME=PATCH [NAME=PATCH ...] -- COMMAND..."; exit 2; }
shift
targets=(epic-compile epic-run epic_python_extension)
if (( fresh )); then
  cmake --build "$build" --target epic-device-shims > /dev/null
  rm -rf "$out" && mkdir -p "$out/cache"
  cp -r "$build/runtime/device/nccl-include" "$out/nccl-include"
  touch "$out/MANIFEST"
fi
[[ -f $out/MANIFEST ]] || { echo "prepare-variants: run tools/device/prepare.sh first (or pass --fresh)"; exit 2; }
compile() { EPIC_CACHE_DIR="$PWD/$out/cache" PYTHONPATH=python "$@" > /dev/null; }
for spec in "${variants[@]}"; do
  name=${spec%%=*} patch=${spec#*=}
  [[ $name =~ ^[A-Za-z0-9_-]+$ && $name != tree ]] || { echo "prepare-variants: bad name '$name'"; exit 2; }
  [[ -f $patch ]] || { echo "prepare-variants: $name: no patch file '$patch'"; exit 2; }
  git apply --check "$patch" || { echo "prepare-variants: $name: $patch does not apply to this tree"; exit 2; }
done
cmake --build "$build" --target "${targets[@]}" > /dev/null
compile "$@"
rm -rf "$out/variants"
for spec in "${variants[@]}"; do
  name=${spec%%=*} patch=${spec#*=}
  git apply "$patch"
  # Restored however this ends: the tree is never left patched.
  trap 'git apply -R "$patch"; cmake --build "$build" --target "${targets[@]}" > /dev/null' EXIT
  mapfile -t files < <(git apply --numstat "$patch" | cut -f3)
  for file in "${files[@]}"; do
    mkdir -p "$out/variants/$name/files/$(dirname "$file")" && cp "$file" "$out/variants/$name/files/$file"
  done
  cmake --build "$build" --target "${targets[@]}" > /dev/null
  cp "$build/runtime/generated/KernelSourceHash.h" "$out/variants/$name/"
  compile "$@"
  git apply -R "$patch"
  trap - EXIT
  echo "prepare-variants: $name (${#files[@]} files)"
done
cmake --build "$build" --target "${targets[@]}" > /dev/null
(cd "$out" && find . -type f | sort > MANIFEST)
echo "prepare-variants: $(du -sh "$out" | cut -f1) in $out; on the device: tools/device/variants.sh COMMAND"
