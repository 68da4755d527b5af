#!/usr/bin/env bash
# On the GPU machine, after tools/device/prepare-variants.sh here: builds the runtime of the tree
# and of each variant in build/device/variants/ (a copy of the tree with the variant's files),
# checks that each runtime's kernel-source hash is the one its kernels were compiled under,
# then runs COMMAND once per variant, the tree first, in turns (ROUNDS times, default 1), so
# drift of the card's clocks spreads over all of them:
#   tools/device/variants.sh 'python3 bench/gemm_bench.py --gemm-only --out /tmp/o/$VARIANT'
# COMMAND runs in the variant's tree (bash -c) with VARIANT, ROUND, PYTHONPATH, EPIC_CACHE_DIR
# and EPIC_BIN (its runtime's bin/) set.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
root=$PWD dev=$PWD/build/device
[[ -d $dev/variants ]] || { echo "variants.sh: no build/device/variants: run tools/device/prepare-variants.sh here first"; exit 2; }
[[ $# -eq 1 ]] || { echo "usage: $0 COMMAND"; exit 2; }
bash tools/device/run.sh build || exit 1
# Where each variant's tree and runtime go (run.sh builds the tree's into $EPIC_GPU_RUNTIME).
tree_of() { [[ $1 == tree ]] && echo "$root" || echo "/tmp/epic-variants/$1"; }
runtime_of() { [[ $1 == tree ]] && echo "${EPIC_GPU_RUNTIME:-/tmp/epic-gpu/runtime}" || echo "/tmp/epic-gpu/variant-$1"; }
build_variant() {
  local name=$1 tree runtime
  tree=$(tree_of "$1") runtime=$(runtime_of "$1")
  rm -rf "$tree" && mkdir -p "$tree/build"
  tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$tree"
  rm -f "$tree"/python/epic/_C*.so # its own extension, built below
  cp -r "$dev/variants/$name/files/." "$tree/"
  ln -s "$dev" "$tree/build/device"
  (cd "$tree" && EPIC_GPU_RUNTIME=$runtime OUT=$runtime.out bash tools/device/run.sh build) \
    > "$runtime.log" 2>&1 || { tail -30 "$runtime.log"; return 1; }
  cmp -s "$runtime/runtime/generated/KernelSourceHash.h" "$dev/variants/$name/KernelSourceHash.h" \
    || { echo "variants.sh: $name: the runtime's kernel-source hash is not the one its kernels have"; return 1; }
}
names=()
for dir in "$dev"/variants/*/; do names+=("$(basename "$dir")"); done
pids=()
for name in "${names[@]}"; do build_variant "$name" & pids+=($!); done
for pid in "${pids[@]}"; do wait "$pid" || { echo "variants.sh: a variant did not build"; exit 1; }; done
echo "variants.sh: tree ${names[*]} built"
status=0
for round in $(seq 1 "${ROUNDS:-1}"); do
  for name in tree "${names[@]}"; do
    tree=$(tree_of "$name") bin=$(runtime_of "$name")/bin
    echo "== $name (round $round)"
    (cd "$tree" && VARIANT=$name ROUND=$round PYTHONPATH=$tree/python EPIC_CACHE_DIR=$dev/cache \
      EPIC_BIN=$bin bash -c "$1") || status=1
  done
done
exit $status
