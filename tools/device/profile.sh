#!/usr/bin/env bash
# On the GPU machine, after `tools/device/run.sh build`: Nsight Compute on the
# first launch of each kernel named, while a command runs (e.g. a bench).
#   tools/device/profile.sh "ep_grouped_gemm_gemm ep_dispatch_gemm_copy_gemm" \
#       python3 bench/gemm_bench.py --iterations 1 --out /tmp/epic-out
# A name may end in :N to skip its first N launches (ep_grouped_gemm_gemm:3 is the
# bench's layer GEMM). EPIC_NCU_SECTIONS adds sections (e.g. SourceCounters), EPIC_NCU_ARGS
# other ncu options (e.g. --metrics dram__bytes_read.sum).
# Writes $OUT/ncu-<kernel>-<skipped>.txt: speed of light, occupancy, launch, warp stalls.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/epic-out}
mkdir -p "$out"
kernels=$1
shift
for spec in $kernels; do
  kernel=${spec%%:*}
  skip=0
  [[ $spec == *:* ]] && skip=${spec##*:}
  extra=()
  for section in ${EPIC_NCU_SECTIONS:-}; do extra+=(--section "$section"); done
  extra+=(${EPIC_NCU_ARGS:-})
  EPIC_CACHE_DIR=build/device/cache ncu --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis "${extra[@]}" "$@" > "$out/ncu-$kernel-$skip.txt" 2>&1
  echo "profile.sh: $spec -> $out/ncu-$kernel-$skip.txt (rc $?)"
done
