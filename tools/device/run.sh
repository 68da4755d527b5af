#!/usr/bin/env bash
# On the GPU machine (run through the device tool with carry=["build/device"]): builds the GPU
# test drivers against the machine's CUDA and NCCL, runs them, and leaves logs in $OUT.
#   tools/device/run.sh           # everything
#   tools/device/run.sh python    # only the Python API's tests and examples (after the build)
#   tools/device/run.sh bench     # bench/ep_bench.py, dsl_bench.py, gemm_bench.py,
#                                 # layer_bench.py, collectives_bench.py
#                                 # (into $OUT)
#   tools/device/run.sh gemm      # bench/gemm_bench.py on one rank's share (EP1) and on virtual
#                                 # EP8, bench/layer_bench.py up to 4096 tokens and on EP1
#                                 # (into $OUT)
#   tools/device/run.sh latency   # bench/latency.py: per-call wall time, eager and CUDA graphs
#   tools/device/run.sh layer     # the persistent layer kernel (ep.moe_layer): its EP8 check
#                                 # (calls synchronized, then back to back; one-pass and
#                                 # staged, the kernel processes run; its GPU tests; on NCCL
#                                 # ranks against the five ops), epic-run's fused layer,
#                                 # bench/layer_bench.py on EP1 and virtual EP8 (10 s wait
#                                 # bound) (into $OUT)
#   tools/device/run.sh low-latency
#                                 # V1's low-latency pair: its GPU tests, the engine replay (NCCL
#                                 # and virtual), bench/latency.py --low-latency and the kernels'
#                                 # token sweep (bench/ll_kernels_profile.py --sweep), into $OUT
#   tools/device/run.sh dsl       # only the DSL's GPU tests and examples (after the build)
#   tools/device/run.sh multi     # only bench/ep_multi_gpu.py on every GPU (results into $OUT)
#   tools/device/run.sh soak      # test/gpu/soak.py: 1000 random configurations vs the reference
#   tools/device/run.sh stress    # test/gpu/stress.py: 1200 random ops, mixed configurations
#   tools/device/run.sh sanitize  # compute-sanitizer: ep kernels (memcheck, racecheck, synccheck),
#                                 # the fused GEMM kernels and the DSL examples (memcheck)
#   tools/device/run.sh multinode
#                                 # test/gpu/ep_multinode.py: direct mode across nodes on virtual
#                                 # N x M worlds (virtual nodes: traffic counted)
set -uo pipefail
cd "$(dirname "$0")/../.."
dev=build/device
out=${OUT:-/tmp/epic-out}
mkdir -p "$out" /tmp/epic-gpu
[[ -f $dev/MANIFEST ]] || { echo "run.sh: $dev is missing: run tools/device/prepare.sh here first and carry it"; exit 2; }
# prepare.sh packs the kernel cache (cache.tar.xz); unpacked once per carried copy, over what
# $dev/cache already holds (kernels compiled into it after prepare.sh: prepare-variants.sh's,
# a command's own). The stamp names the archive, so the parallel runs of variants.sh skip it.
if [[ -f $dev/cache.tar.xz ]]; then
  stamp="$dev/cache/.unpacked-$(cksum < "$dev/cache.tar.xz" | tr ' ' '-')"
  if [[ ! -f $stamp ]]; then
    python3 - "$dev/cache.tar.xz" "$dev" <<'PY' || { echo "run.sh: unpacking $dev/cache.tar.xz failed"; exit 1; }
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:  # only the cache's own paths (the data filter)
    archive.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
PY
    touch "$stamp"
  fi
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nccl_home=$(python3 -c "import nvidia.nccl as m; print(m.__path__[0])")
echo "NCCL library: $(ls $nccl_home/lib/libnccl.so*)"

# The runtime, built here without LLVM/MLIR, against this machine's CUDA and NCCL, into
# $EPIC_GPU_RUNTIME (tools/device/variants.sh builds one per variant of the tree).
# The Python extension too (epic._C, into python/epic/), for this machine's Python.
runtime=${EPIC_GPU_RUNTIME:-/tmp/epic-gpu/runtime}
cmake -G Ninja -S . -B "$runtime" -DEPIC_RUNTIME_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DEPIC_NCCL_INCLUDE_DIR="$PWD/$dev/nccl-include" -DEPIC_NCCL_LIBRARY="$nccl_home/lib/libnccl.so.2" \
  -DPython3_EXECUTABLE="$(command -v python3)" -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
  > "$runtime.cmake.log" 2>&1 && cmake --build "$runtime" > "$runtime.build.log" 2>&1 \
  || { echo "run.sh: building the runtime failed"; tail -30 "$runtime.cmake.log" "$runtime.build.log"; exit 1; }

# `run.sh build`: only build the runtime and the Python extension (for a
# command of one's own after it, e.g. tools/device/profile.sh).
[[ ${1:-all} == build ]] && { echo "run.sh: runtime built in $runtime"; exit 0; }

nvcc -O2 -std=c++17 -arch=sm_90 -I runtime/include -I "$dev/nccl-include" test/gpu/comm_smoke.cu \
  test/gpu/comm_smoke_nodes.cu -o /tmp/epic-gpu/comm_smoke -L "$nccl_home/lib" -l:libnccl.so.2 -lcuda \
  -Xlinker -rpath="$nccl_home/lib" || { echo "run.sh: building comm_smoke failed"; exit 1; }

status=0
run() {
  echo "== $*"
  # Bounded: a hung suite fails with its name instead of eating the device session.
  timeout "${EPIC_SUITE_TIMEOUT:-300}" "$@" 2>&1 | tee -a "$out/gpu-tests.log"
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 124 ]] && echo "run.sh: TIMED OUT after ${EPIC_SUITE_TIMEOUT:-300} s: $*" | tee -a "$out/gpu-tests.log"
  [[ $rc -eq 0 ]] || status=1
}
only=${1:-all}
if [[ $only == all ]]; then
run /tmp/epic-gpu/comm_smoke virtual "$dev/kernels/comm_virtual.cubin"
run /tmp/epic-gpu/comm_smoke nccl "$dev/kernels/comm_nccl.cubin"
run /tmp/epic-gpu/comm_smoke virtual-timeout "$dev/kernels/comm_virtual.cubin"
run /tmp/epic-gpu/comm_smoke virtual-timeout-report "$dev/kernels/comm_virtual.cubin"
run /tmp/epic-gpu/comm_smoke virtual-phase-timeout-report "$dev/kernels/comm_virtual.cubin"
run /tmp/epic-gpu/comm_smoke ep-nccl "$dev/kernels/ep_nccl.cubin" "$dev/kernels/ep_nccl.json"
# A virtual world of 2 nodes x 4 GPUs: teams, barriers, puts to the rail peer, traffic counts.
run /tmp/epic-gpu/comm_smoke virtual-2x4 "$dev/kernels/comm_virtual.cubin"
run /tmp/epic-gpu/comm_smoke virtual-lsa-violation-report "$dev/kernels/comm_virtual.cubin"
# Traps whose device printf must name the ranks: a process each (the context is lost).
run bash -c "/tmp/epic-gpu/comm_smoke virtual-lsa-violation $dev/kernels/comm_virtual.cubin 2>&1 \
  | tee /tmp/epic-gpu/lsa-violation.log; grep -qF 'rank 3 used an NVLink (LSA) pointer to rank 5 of \
another node' /tmp/epic-gpu/lsa-violation.log"
run bash -c "/tmp/epic-gpu/comm_smoke virtual-drop $dev/kernels/comm_virtual.cubin 2>&1 \
  | tee /tmp/epic-gpu/drop.log; grep -qF 'rank 5 waited for signal 3 from rank 1 (expected >= 1, \
seen 0' /tmp/epic-gpu/drop.log"
EPIC_CACHE_DIR="$dev/cache" EPIC_DEBUG=1 run "$runtime"/bin/epic-runtime-gpu-test
# Ranks that call with different token caps: the entry barrier's comm.agree traps naming both
# (the device printf; the launch's error follows). A process of its own: the context is lost.
EPIC_CACHE_DIR="$dev/cache" run bash -c "$runtime/bin/epic-runtime-gpu-test disagree \
  2>&1 | tee /tmp/epic-gpu/disagree.log; grep -q 'rank [01] and rank [01] disagree' /tmp/epic-gpu/disagree.log \
  && grep -q 'the launch failed as it must' /tmp/epic-gpu/disagree.log"
for program in examples/run/*.mlir examples/mlir/moe_layer.mlir; do
  run "$runtime"/bin/epic-run "$program" --check --cache-dir="$dev/cache"
done
run "$runtime"/bin/epic-run test/gpu/run_nccl_one_rank.mlir --backend=nccl --check \
  --cache-dir="$dev/cache"
run "$runtime"/bin/epic-run test/gpu/agrs_nccl_one_rank.mlir --backend=nccl --check \
  --cache-dir="$dev/cache"
# Direct and hybrid mode across nodes on virtual worlds of 2x4, 4x2 and 2x2 ranks.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 test/gpu/ep_multinode.py
# A hybrid forwarder that stalls inside the combine: its rail peer's bounded wait names it
# (signal 8 + 4 + 1 of a world of 4). A process of its own: the context is lost.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run bash -c "python3 test/gpu/ep_multinode.py \
  --stall-forwarder 2>&1 | tee /tmp/epic-gpu/stall.log; grep -qF 'rank 3 waited for signal 13 \
from rank 1 (expected >= 1, seen 0' /tmp/epic-gpu/stall.log && grep -qF 'the launch failed as it \
must' /tmp/epic-gpu/stall.log"
fi
if [[ $only == soak ]]; then
  # Random configurations and routings against epic.reference, buffers reused (>= 1000 iterations).
  EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python EPIC_SUITE_TIMEOUT=${EPIC_SUITE_TIMEOUT:-540} \
    run python3 test/gpu/soak.py --iterations "${EPIC_SOAK_ITERATIONS:-1000}"
  exit $status
fi
if [[ $only == stress ]]; then
  # test/gpu/stress.py: random ops on one buffer across configurations (expert counts, token
  # caps, dtypes, layouts, fused ops), a second buffer, destroy and re-create, per-rank delays;
  # a virtual world of 8 and one NCCL rank.
  EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 test/gpu/stress.py --virtual 8
  EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run torchrun --nproc-per-node 1 test/gpu/stress.py
  exit $status
fi
if [[ $only == multinode ]]; then
  EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 test/gpu/ep_multinode.py "${@:2}"
  exit $status
fi
if [[ $only == sanitize ]]; then
  # compute-sanitizer over the ep kernels on virtual worlds of 2 and 8 ranks (plain, expanded,
  # zero padding, cached dispatch, combine with weights): every tool must report 0 errors.
  for tool in memcheck racecheck synccheck; do
    for ranks in 2 8; do
      kernels=$dev/kernels/ep_virtual_r$ranks
      [[ $ranks == 8 ]] && kernels=$dev/kernels/ep_virtual
      EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run compute-sanitizer --tool "$tool" \
        --error-exitcode 3 --print-limit 5 python3 test/gpu/ep_virtual.py "$kernels.cubin" \
        "$kernels.json" "$ranks"
    done
  done
  # The fused GEMM kernels (grouped GEMM, dispatch + GEMM, GEMM + combine) and the DSL's
  # examples: memcheck.
  EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run compute-sanitizer --tool memcheck \
    --error-exitcode 3 --print-limit 5 python3 -m pytest -q -p no:cacheprovider \
    test/gpu/test_grouped_gemm.py
  for example in examples/dsl/*.py; do
    EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run compute-sanitizer --tool memcheck \
      --error-exitcode 3 --print-limit 5 python3 "$example"
  done
  echo "sanitizers: $([[ $status -eq 0 ]] && echo clean || echo FAILED)"
  exit $status
fi
if [[ $only == multi ]]; then
  EPIC_CACHE_DIR="$dev/cache" torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" \
    bench/ep_multi_gpu.py --out "$out" 2>&1 | tee "$out/ep_multi_gpu.log"
  exit "${PIPESTATUS[0]}"
fi
if [[ $only == latency ]]; then
  EPIC_CACHE_DIR="$dev/cache" python3 bench/latency.py --out "$out" --profile 2>&1 | tee "$out/latency.log"
  exit "${PIPESTATUS[0]}"
fi
# A mode of steps in turn (each bounded, each line logged), into $out/NAME.log; exits with
# whether every step passed.
steps() {
  local name=$1 log="$out/$1.log" rc=0 step
  shift
  export EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python
  for step in "$@"; do
    echo "== $step" | tee -a "$log"
    timeout "${EPIC_SUITE_TIMEOUT:-300}" $step 2>&1 | tee -a "$log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  done
  echo "$name: $([[ $rc -eq 0 ]] && echo passed || echo FAILED)" | tee -a "$log"
  exit $rc
}
[[ $only == layer ]] && steps layer \
  "python3 bench/experiments/layer_barrier_check.py --calls 20" \
  "python3 bench/experiments/layer_barrier_check.py --calls 20 --staged" \
  "python3 -m pytest -q -p no:cacheprovider test/gpu/test_grouped_gemm.py -k persistent" \
  "torchrun --nproc-per-node $(nvidia-smi -L | wc -l) test/gpu/distributed_check.py" \
  "$runtime/bin/epic-run examples/run/fp8_moe_layer_fused.mlir --check --cache-dir=$dev/cache" \
  "python3 bench/layer_bench.py --ranks 1 --experts 32 --tokens 128,256,1024 --out $out/ep1" \
  "python3 bench/layer_bench.py --tokens 128 --gpu-timeout-secs 10 --out $out"
[[ $only == low-latency ]] && steps low-latency \
  "python3 -m pytest -q -p no:cacheprovider test/gpu/test_v1_low_latency.py" \
  "torchrun --nproc-per-node 1 test/gpu/engine_replay.py" \
  "python3 test/gpu/engine_replay.py --virtual" \
  "python3 bench/latency.py --low-latency --profile --iterations 100 --out $out" \
  "python3 bench/ll_kernels_profile.py --sweep"
if [[ $only == gemm ]]; then
  # Issue 25's rows: the grouped GEMMs on one rank's share of a V3 layer (EP1), on a virtual EP8
  # world with the fused pairs and the summary, and the FP8 layer step by step.
  EPIC_CACHE_DIR="$dev/cache" python3 bench/gemm_bench.py --ranks 1 --experts 32 \
    --tokens 1024,4096,8192 --gemm-only --out "$out/ep1" 2>&1 | tee "$out/gemm_ep1.log"
  rc=${PIPESTATUS[0]}
  EPIC_CACHE_DIR="$dev/cache" python3 bench/gemm_bench.py --out "$out" 2>&1 | tee "$out/gemm_bench.log"
  rc=$(( rc | PIPESTATUS[0] ))
  EPIC_CACHE_DIR="$dev/cache" python3 bench/layer_bench.py --tokens 128,1024,4096 --out "$out" 2>&1 \
    | tee "$out/layer_bench.log"
  rc=$(( rc | PIPESTATUS[0] ))
  # The layer on one rank's share (EP1: what one GPU of a real EP8 runs at these tokens per rank).
  EPIC_CACHE_DIR="$dev/cache" python3 bench/layer_bench.py --ranks 1 --experts 32 \
    --tokens 128,256,1024 --out "$out/ep1" 2>&1 | tee "$out/layer_ep1.log"
  exit $(( rc | PIPESTATUS[0] ))
fi
if [[ $only == bench ]]; then
  EPIC_CACHE_DIR="$dev/cache" python3 bench/ep_bench.py --out "$out" 2>&1 | tee "$out/ep_bench.log"
  rc=${PIPESTATUS[0]}
  EPIC_CACHE_DIR="$dev/cache" python3 bench/dsl_bench.py --out "$out" 2>&1 | tee "$out/dsl_bench.log"
  rc=$(( rc | PIPESTATUS[0] ))
  EPIC_CACHE_DIR="$dev/cache" python3 bench/gemm_bench.py --out "$out" 2>&1 | tee "$out/gemm_bench.log"
  rc=$(( rc | PIPESTATUS[0] ))
  EPIC_CACHE_DIR="$dev/cache" python3 bench/layer_bench.py --out "$out" 2>&1 | tee "$out/layer_bench.log"
  rc=$(( rc | PIPESTATUS[0] ))
  python3 bench/collectives_bench.py --out "$out" 2>&1 | tee "$out/collectives_bench.log"
  exit $(( rc | PIPESTATUS[0] ))
fi
# ep.grouped_gemm against torch per expert, and feeding the combine; ep.dispatch_layout.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider \
  test/gpu/test_grouped_gemm.py test/gpu/test_dispatch_layout.py
# The DSL: kernels compiled here by prepare.sh (DSL + kernel caches), launched by the runtime.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider \
  test/gpu/test_dsl.py
for example in examples/dsl/*.py; do
  EPIC_CACHE_DIR="$dev/cache" run python3 "$example"
done
if [[ $only == dsl ]]; then
  echo "DSL GPU tests: $([[ $status -eq 0 ]] && echo passed || echo FAILED)"
  exit $status
fi
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider \
  test/gpu/test_elastic_buffer.py test/gpu/test_graphs.py
# AGRS sessions and PP channels (copy engines, no kernel): virtual worlds of 1-8 ranks, then
# real NCCL ranks.
PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider test/gpu/test_agrs.py \
  test/gpu/test_pp.py
# Engram: tables in the windows' host segments, fetched by the kernel of ep.engram_fetch.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider \
  test/gpu/test_engram.py
EPIC_CACHE_DIR="$dev/cache" run torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" \
  test/gpu/collectives_distributed.py
# DeepEP V1's low-latency mode (ep.low_latency_dispatch / _combine) on virtual worlds.
EPIC_CACHE_DIR="$dev/cache" PYTHONPATH=python run python3 -m pytest -q -p no:cacheprovider \
  test/gpu/test_v1_low_latency.py
# The engines' DeepEP V2 call sequences on epic.deep_ep (vLLM, SGLang), then again with DeepEP's
# environment: 32-bit topk_idx_t, no record_stream, buffer debug lines, PTX paths.
EPIC_CACHE_DIR="$dev/cache" run torchrun --nproc-per-node 1 test/gpu/engine_replay.py
EPIC_CACHE_DIR="$dev/cache" run python3 test/gpu/engine_replay.py --virtual
EPIC_CACHE_DIR="$dev/cache" EP_NUM_TOPK_IDX_BITS=32 EP_AVOID_RECORD_STREAM=1 EP_BUFFER_DEBUG=1 \
  EP_JIT_DUMP_PTX=1 run torchrun --nproc-per-node 1 test/gpu/engine_replay.py
EPIC_CACHE_DIR="$dev/cache" run python3 examples/quickstart.py
EPIC_CACHE_DIR="$dev/cache" run torchrun --nproc-per-node 1 examples/torch_distributed.py
EPIC_CACHE_DIR="$dev/cache" EPIC_REUSE_NCCL_COMM=0 run torchrun --nproc-per-node 1 \
  examples/torch_distributed.py
gpus=$(nvidia-smi -L | wc -l)
EPIC_CACHE_DIR="$dev/cache" run torchrun --nproc-per-node "$gpus" test/gpu/distributed_check.py \
  --slow-rank $((gpus - 1))
if [[ $gpus -ge 2 ]]; then  # a missing rank must end in the bounded wait's diagnostic, not a hang
  echo "== missing rank: torchrun --nproc-per-node $gpus test/gpu/distributed_check.py --missing-rank 1"
  EPIC_CACHE_DIR="$dev/cache" timeout 120 torchrun --nproc-per-node "$gpus" \
    test/gpu/distributed_check.py --missing-rank 1 > "$out/missing-rank.log" 2>&1
  if grep -q "device wait timed out" "$out/missing-rank.log" && \
     grep -q "failed as expected" "$out/missing-rank.log"; then
    echo "missing rank: diagnosed (bounded wait) ok" | tee -a "$out/gpu-tests.log"
  else
    echo "missing rank: FAILED (no diagnostic; see missing-rank.log)" | tee -a "$out/gpu-tests.log"
    status=1
  fi
fi
if [[ $only == all ]]; then
for ranks in 1 2 4; do
  run python3 test/gpu/ep_virtual.py "$dev/kernels/ep_virtual_r$ranks.cubin" "$dev/kernels/ep_virtual_r$ranks.json" $ranks
done
run python3 test/gpu/ep_virtual.py "$dev/kernels/ep_virtual.cubin" "$dev/kernels/ep_virtual.json" 8
fi
echo "GPU tests: $([[ $status -eq 0 ]] && echo passed || echo FAILED)"
if [[ "${EPIC_BENCH:-0}" == 1 ]]; then
  echo "== bench: bench/ep_bench.py"
  EPIC_CACHE_DIR="$dev/cache" python3 bench/ep_bench.py --out "$out" 2>&1 | tee "$out/ep_bench.log"
fi
exit $status
