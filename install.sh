#!/usr/bin/env bash
# Sets epic up on a Debian 12 machine that has the CUDA toolkit 13 (with NCCL):
# installs every package the project needs (apt and pip), then configures and
# builds into ./build. Idempotent: installs only what is missing and rebuilds
# only what changed.
#
# Environment: CUDA_HOME (default /usr/local/cuda), NCCL_ROOT (default: the
# toolkit's NCCL), EPIC_BUILD_DIR (default build), PYTHON (default python3),
# EPIC_NCCL_EXTRA (default 2.32.3; empty: none): another NCCL to compile the nccl
# backend's kernels against (the nvidia-nccl-cu13 wheel's headers, downloaded once
# into EPIC_WHEEL_CACHE, default ~/.cache/epic/wheels).
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "install.sh: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD_DIR=${EPIC_BUILD_DIR:-build}
PYTHON=${PYTHON:-python3}

# --- prerequisites that this script cannot install --------------------------------------------
[[ -r /etc/debian_version ]] || die "this script supports Debian 12 (bookworm); no /etc/debian_version here"
[[ -x "$CUDA_HOME/bin/nvcc" ]] || die "the CUDA toolkit 13 was not found at CUDA_HOME=$CUDA_HOME (no bin/nvcc). Install it from NVIDIA and/or set CUDA_HOME."
cuda_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
[[ "$cuda_version" -ge 13 ]] || die "CUDA toolkit 13 or newer needed, found $cuda_version at $CUDA_HOME"
nccl_dir=${NCCL_ROOT:-$CUDA_HOME}
[[ -r "$nccl_dir/include/nccl_device.h" ]] || die "NCCL with the device API (nccl_device.h) not found under $nccl_dir/include; install NCCL >= 2.28.9 or set NCCL_ROOT"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found"

# --- Debian packages ---------------------------------------------------------------------------
apt_packages=(
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools clang-22  # compiler infrastructure
  libzstd-dev                                                      # needed by LLVM's CMake config
  cmake ninja-build ccache g++                                     # build
  libgtest-dev pybind11-dev                                        # C++ tests, Python bindings
  clang-format-22                                                  # tools/lint.sh (C++ style)
)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  step "apt: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  step "apt: all ${#apt_packages[@]} packages present"
fi

# --- Python packages ---------------------------------------------------------------------------
step "pip: test and runtime requirements, epic (editable)"
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements.txt
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps -e python/

# --- another NCCL's headers (compile only: the runtime links the NCCL above) ---------------------
# Only include/ of the nvidia-nccl-cu13 wheel (305 MB, most of it libnccl.so.2) is unpacked.
nccl_extra=${EPIC_NCCL_EXTRA-2.32.3}
extra_root=""
if [[ -n $nccl_extra ]]; then
  mkdir -p "$BUILD_DIR/third_party"
  extra_root="$(cd "$BUILD_DIR/third_party" && pwd)/nccl-$nccl_extra"
  if [[ ! -r $extra_root/include/nccl_device.h ]]; then
    wheels=${EPIC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epic/wheels}
    wheel_glob="$wheels/nvidia_nccl_cu13-$nccl_extra-*.whl"
    if ! compgen -G "$wheel_glob" >/dev/null; then
      step "pip: downloading nvidia-nccl-cu13==$nccl_extra into $wheels (for its headers)"
      "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" \
        "nvidia-nccl-cu13==$nccl_extra" \
        || die "cannot download nvidia-nccl-cu13==$nccl_extra; set EPIC_NCCL_EXTRA= to build without it"
    fi
    step "unpacking NCCL $nccl_extra's include/ into $extra_root"
    # shellcheck disable=SC2086 # the glob names the wheel
    "$PYTHON" - "$extra_root" $wheel_glob <<'PY'
import os, shutil, sys, zipfile
root, wheel = sys.argv[1], sys.argv[2]
prefix = "nvidia/nccl/include/"
shutil.rmtree(root + ".part", ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(root + ".part", "include", name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(root, ignore_errors=True)
os.rename(root + ".part", root)
PY
  fi
fi

# --- configure and build -----------------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/build.ninja" ]] ||
   ! grep -qxF "EPIC_EXTRA_NCCL_ROOTS:STRING=$extra_root" "$BUILD_DIR/CMakeCache.txt"; then
  step "cmake: configuring $BUILD_DIR"
  cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DCUDAToolkit_ROOT="$CUDA_HOME" ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"} \
    -DEPIC_EXTRA_NCCL_ROOTS="$extra_root" -DPython3_EXECUTABLE="$(command -v "$PYTHON")"
fi
step "ninja: building"
cmake --build "$BUILD_DIR"
step "done: run ./test.sh"
