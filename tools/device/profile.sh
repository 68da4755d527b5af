#!/usr/bin/env bash
# On the GPU machine, after `tools/device/run.sh build`: Nsight Compute on the
# first launch of each kernel named, while a command runs (e.g. a bench).
#   tools/device/profile.sh "ep_grouped_gemm_gemm ep_dispatch_gemm_copy_gemm" \
#       python3 bench/gemm_bench.py --iterations 1 --out /tmp/epic-out
# Writes $OUT/ncu-<kernel>.txt: speed of light, occupancy, launch, warp stalls.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/epic-out}
mkdir -p "$out"
kernels=$1
shift
for kernel in $kernels; do
  EPIC_CACHE_DIR=build/device/cache ncu --kernel-name "$kernel" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis "$@" > "$out/ncu-$kernel.txt" 2>&1
  echo "profile.sh: $kernel -> $out/ncu-$kernel.txt (rc $?)"
done
