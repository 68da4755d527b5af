#!/usr/bin/env bash
# The compiler's output for a fixed set of inputs, into one folder, so that a refactoring of
# the lowering can show that it changed nothing: run it before and after, then `diff -r`.
#   tools/kernel_snapshot.sh OUT_DIR [build-dir]
# Every convert-ep-to-comm test input (the IR after convert-ep-to-comm) and the PTX + launch
# metadata of the GPU tests' kernels, the DeepEP V3 entries and the fused GEMM kernels
# (backend=virtual); and for the kernel requests of test/Tools/Inputs/requests (what the runtime
# asks for: every kind and variant), the entry IR the compiler builds (pretty and generic), the
# IR after fusion and convert-ep-to-comm, and the PTX + metadata.
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
for f in test/Tools/Inputs/requests/*.json; do
  name="$out/request-$(basename "$f" .json)"
  "$build/bin/epic-compile" --request="$f" --print-entry-ir > "$name.entry.mlir"
  "$build/bin/epic-compile" --request="$f" --print-entry-ir --mlir-print-op-generic > "$name.generic.mlir"
  "$build/bin/epic-opt" "$name.entry.mlir" --ep-fuse-dispatch-gemm --ep-fuse-gemm-combine --convert-ep-to-comm \
    > "$name.expand" 2>/dev/null
  "$build/bin/epic-compile" --request="$f" --backend=virtual --no-cubin -o "$name"
done
echo "kernel snapshot in $out ($(ls "$out" | wc -l) files)"
