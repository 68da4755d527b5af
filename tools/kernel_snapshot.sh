#!/usr/bin/env bash
# The compiler's output for a fixed set of inputs, into one folder, so that a refactoring of
# the lowering can show that it changed nothing: run it before and after, then `diff -r`.
#   tools/kernel_snapshot.sh OUT_DIR [build-dir]
# Every convert-ep-to-comm test input (the IR after convert-ep-to-comm) and the PTX + launch metadata of the GPU
# tests' kernels, the DeepEP V3 entries and the fused GEMM kernels (backend=virtual).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/kernel_snapshot.sh OUT_DIR [build-dir]}
build=${2:-build}
mkdir -p "$out"
for f in test/gpu/ep_kernels.mlir test/gpu/ep_nccl.mlir test/Pipelines/*.mlir test/Conversion/EPToComm/*.mlir; do
  "$build/bin/epic-opt" "$f" --split-input-file --convert-ep-to-comm > "$out/$(basename "$f" .mlir).expand" 2>&1 || true
done
for f in test/gpu/ep_kernels.mlir test/Pipelines/ep-v3-to-ptx.mlir test/Pipelines/fused-gemm-to-ptx.mlir \
         test/Conversion/EPToComm/gemm-combine.mlir; do
  "$build/bin/epic-compile" "$f" --backend=virtual --no-cubin -o "$out/$(basename "$f" .mlir)"
done
echo "kernel snapshot in $out ($(ls "$out" | wc -l) files)"
