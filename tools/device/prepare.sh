#!/usr/bin/env bash
# Here (no GPU): builds epic and compiles what the GPU run needs into build/device/, the one
# folder a device run carries (the device machine has no LLVM/MLIR): the cubins of the GPU tests,
# the kernel cache (packed: cache.tar.xz), the NCCL headers they were compiled against, and a
# manifest.
#   tools/device/prepare.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out="$build/device"
cmake --build "$build" --target epic-compile epic-device-shims epic-prepare-gpu-kernels epic-run epic_python_ir \
  epic_python_extension
rm -rf "$out" && mkdir -p "$out/kernels"
for backend in virtual nccl; do
  "$build/bin/epic-compile" test/gpu/comm_kernels.mlir --backend=$backend -o "$out/kernels/comm_$backend"
done
"$build/bin/epic-compile" test/gpu/ep_kernels.mlir --backend=virtual -o "$out/kernels/ep_virtual"
# The same entries for worlds of 1, 2 and 4 ranks (8 experts per rank).
for ranks in 1 2 4; do
  sed "s/ranks = 8, experts = 64/ranks = $ranks, experts = $((8 * ranks))/" test/gpu/ep_kernels.mlir \
    > "$out/kernels/ep_kernels_r$ranks.mlir"
  "$build/bin/epic-compile" "$out/kernels/ep_kernels_r$ranks.mlir" --backend=virtual \
    -o "$out/kernels/ep_virtual_r$ranks"
done
"$build/bin/epic-compile" test/gpu/ep_nccl.mlir --backend=nccl -o "$out/kernels/ep_nccl"
"$build/bin/epic-compile" test/Pipelines/ep-v3-to-ptx.mlir --backend=virtual -o "$out/kernels/ep_v3_virtual"
# The kernel cache of the runtime's GPU test (the GPU machine has no compiler).
EPIC_CACHE_DIR="$out/cache" "$build/bin/epic-prepare-gpu-kernels"
# The run plans and kernels of the epic-run programs (examples/run, the whole MoE layer of
# examples/mlir/moe_layer.mlir, and programs of one NCCL rank).
for program in examples/run/*.mlir examples/mlir/moe_layer.mlir; do
  "$build/bin/epic-run" "$program" --compile-only --cache-dir="$out/cache" > /dev/null
done
for program in test/gpu/run_nccl_one_rank.mlir test/gpu/agrs_nccl_one_rank.mlir; do
  "$build/bin/epic-run" "$program" --backend=nccl --compile-only --cache-dir="$out/cache" > /dev/null
done
# The configurations the Python API's GPU tests use.
PYTHONPATH=python EPIC_CACHE_DIR="$out/cache" python3 test/gpu/prepare_buffer_kernels.py
PYTHONPATH=python EPIC_CACHE_DIR="$out/cache" python3 bench/multinode_bench.py --compile-only
EPIC_CACHE_DIR="$out/cache" python3 test/gpu/soak.py --compile-only  # run.sh soak's configurations
# test/gpu/stress.py: one NCCL rank (torchrun --nproc-per-node 1) and a virtual world of 8.
EPIC_CACHE_DIR="$out/cache" python3 test/gpu/stress.py --compile-only --world-size 1
EPIC_CACHE_DIR="$out/cache" python3 test/gpu/stress.py --compile-only --virtual 8
python3 examples/quickstart.py --cache-dir "$out/cache" > /dev/null  # no GPU here: compiles only
EPIC_CACHE_DIR="$out/cache" python3 bench/ep_bench.py --compile-only
EPIC_CACHE_DIR="$out/cache" python3 bench/latency.py --compile-only
# The DSL's GPU tests, examples and bench: run in the interpreter here, every launch compiled for
# the GPU on the way (the same data, hence the same specializations as the GPU run).
EPIC_INTERPRET=1 EPIC_DSL_PRECOMPILE=1 EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python \
  python3 -m pytest -q -p no:cacheprovider test/gpu/test_dsl.py > /dev/null
for example in examples/dsl/*.py; do
  EPIC_INTERPRET=1 EPIC_DSL_PRECOMPILE=1 EPIC_CACHE_DIR="$out/cache" python3 "$example" > /dev/null
done
EPIC_CACHE_DIR="$out/cache" python3 bench/dsl_bench.py --compile-only
# ep.grouped_gemm: its GPU test and bench (sm_90a: TMA + wgmma).
EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python python3 test/gpu/test_grouped_gemm.py --prepare
EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python python3 test/gpu/test_dispatch_layout.py --prepare
EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python python3 test/gpu/test_engram.py --prepare
EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python python3 test/gpu/test_v1_low_latency.py --prepare
EPIC_CACHE_DIR="$out/cache" python3 test/gpu/engine_replay.py --compile-only --world-size 1
# Direct mode across nodes on virtual worlds of 2x4, 4x2 and 2x2 ranks (run.sh multinode).
EPIC_CACHE_DIR="$out/cache" PYTHONPATH=python python3 test/gpu/ep_multinode.py --prepare
EPIC_CACHE_DIR="$out/cache" python3 bench/gemm_bench.py --compile-only
# run.sh gemm: one rank's share of a V3 layer (EP1: 32 experts, the rows an EP8 rank gets).
EPIC_CACHE_DIR="$out/cache" python3 bench/gemm_bench.py --compile-only --ranks 1 --experts 32 \
  --tokens 1024,4096,8192 --gemm-only
EPIC_CACHE_DIR="$out/cache" python3 bench/layer_bench.py --compile-only --tokens 128,1024,4096
EPIC_CACHE_DIR="$out/cache" python3 bench/layer_bench.py --compile-only --ranks 1 --experts 32 \
  --tokens 128,256,1024
EPIC_CACHE_DIR="$out/cache" python3 bench/experiments/layer_barrier_check.py --compile-only
EPIC_CACHE_DIR="$out/cache" python3 bench/experiments/layer_barrier_check.py --compile-only --staged
# run.sh layer: the EP8 layer with a 10 s wait bound (the bound is part of the kernels' key).
EPIC_CACHE_DIR="$out/cache" python3 bench/layer_bench.py --compile-only --tokens 128 \
  --gpu-timeout-secs 10
python3 examples/torch_distributed.py --compile-only --world-size 1 --cache-dir "$out/cache" > /dev/null
for ranks in 1 2 4 8; do  # the multi-process checks and bench on as many GPUs as the machine has
  EPIC_CACHE_DIR="$out/cache" python3 test/gpu/distributed_check.py --compile-only --world-size $ranks \
    > /dev/null
  EPIC_CACHE_DIR="$out/cache" python3 bench/ep_multi_gpu.py --compile-only --world-size $ranks > /dev/null
done
# The device comm struct must match between the shim and the driver: carry the headers the
# shim was compiled against (the device's NCCL wheel supplies the library).
cp -r "$build/runtime/device/nccl-include" "$out/nccl-include"
# The kernel cache travels packed: its PTX and cubins compress ~15x with xz, so the whole
# suite's cache fits the device tool's 64 MiB transfer (unpacked, it no longer did). run.sh
# unpacks it there.
tar -C "$out" -cf - cache | xz -T0 -6 > "$out/cache.tar.xz" && rm -rf "$out/cache"
(cd "$out" && find . -type f | sort > MANIFEST)
echo "prepared $out ($(du -sh "$out" | cut -f1)); run on the device: tools/device/run.sh"
