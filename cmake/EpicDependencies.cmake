# Finds everything epic builds against and fails with a message that says how to get it.

# --- LLVM / MLIR 22 (Debian packages llvm-22-dev, libmlir-22-dev) -------------------------------
if(NOT EPIC_RUNTIME_ONLY)
set(EPIC_LLVM_ROOT "/usr/lib/llvm-22" CACHE PATH "Root of the LLVM/MLIR 22 installation")
find_package(MLIR CONFIG
  HINTS "${EPIC_LLVM_ROOT}/lib/cmake/mlir")
if(NOT MLIR_FOUND OR NOT LLVM_VERSION_MAJOR EQUAL 22)
  message(FATAL_ERROR
    "MLIR 22 not found under ${EPIC_LLVM_ROOT}. Run ./install.sh, or install the Debian packages "
    "llvm-22-dev libmlir-22-dev mlir-22-tools and set EPIC_LLVM_ROOT.")
endif()
find_package(LLVM CONFIG REQUIRED HINTS "${MLIR_DIR}/../llvm")
list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
include(TableGen)
include(AddLLVM)
include(AddMLIR)
include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
separate_arguments(EPIC_LLVM_DEFINITIONS NATIVE_COMMAND "${LLVM_DEFINITIONS}")
add_definitions(${EPIC_LLVM_DEFINITIONS})
set(EPIC_LLVM_TOOLS_DIR "${LLVM_TOOLS_BINARY_DIR}" CACHE PATH "FileCheck, not, llc, ...")
endif()

# --- CUDA toolkit 13 -----------------------------------------------------------------------------
find_package(CUDAToolkit 13)
if(NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR
    "CUDA toolkit 13 not found. Install it (e.g. under /usr/local/cuda) and put its bin/ on PATH "
    "or pass -DCUDAToolkit_ROOT=<dir>.")
endif()

# --- NCCL (default: the toolkit's copy; override with -DNCCL_ROOT=<dir> or $NCCL_ROOT) ------------
# epic_nccl_inspect(<include dir> <prefix>) sets, for the NCCL whose nccl.h is in <include dir>:
#  <prefix>_VERSION     "2.28.9", from nccl.h;
#  <prefix>_MIN_PTX     the PTX ISA its device API needs, as in +ptx<N> (82: PTX ISA 8.2). 2.28.9
#                       needs 8.2 (GDAKI's st.mmio); 2.32.3 needs 8.4 (st.relaxed.sys.b128 in its
#                       GIN backends; ptxas rejects 8.3). 2.29 to 2.31 were not measured: 8.4.
#  <prefix>_NEEDS_PATCH whether clang needs cmake/PatchNcclHeaders.cmake's fixes (2.28.x's headers;
#                       2.32's compile unpatched).
function(epic_nccl_inspect include prefix)
  file(STRINGS "${include}/nccl.h" ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
    "\\1.\\2.\\3" version "${ver}")
  if(NOT version MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
    message(FATAL_ERROR "no NCCL version in ${include}/nccl.h")
  endif()
  set(min_ptx 84)
  if(version VERSION_LESS 2.29)
    set(min_ptx 82)
  endif()
  file(GLOB_RECURSE headers "${include}/nccl_device/*.h")
  set(needs_patch FALSE)
  foreach(header "${include}/nccl_device.h" ${headers})
    file(STRINGS "${header}" hits REGEX "#if __CUDACC__|Optional\\(args, IntSeqUpTo<")
    if(hits)
      set(needs_patch TRUE)
      break()
    endif()
  endforeach()
  set(${prefix}_VERSION "${version}" PARENT_SCOPE)
  set(${prefix}_MIN_PTX "${min_ptx}" PARENT_SCOPE)
  set(${prefix}_NEEDS_PATCH "${needs_patch}" PARENT_SCOPE)
endfunction()

if(NOT NCCL_ROOT AND DEFINED ENV{NCCL_ROOT})
  set(NCCL_ROOT "$ENV{NCCL_ROOT}")
endif()
find_path(EPIC_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} PATH_SUFFIXES include
  PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
# libnccl.so.2 alone: the nvidia-nccl-cu13 wheel has no unversioned libnccl.so. NAMES_PER_DIR:
# NCCL_ROOT's libnccl.so.2 before the toolkit's libnccl.so.
find_library(EPIC_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${NCCL_ROOT} PATH_SUFFIXES lib lib64
  PATHS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH)
if(NOT EPIC_NCCL_INCLUDE_DIR OR NOT EPIC_NCCL_LIBRARY)
  message(FATAL_ERROR
    "NCCL not found (looked in NCCL_ROOT='${NCCL_ROOT}' and the CUDA toolkit). Install NCCL >= 2.28.9 "
    "with its device API headers and pass -DNCCL_ROOT=<dir>.")
endif()
if(NOT EXISTS "${EPIC_NCCL_INCLUDE_DIR}/nccl_device.h")
  message(FATAL_ERROR "${EPIC_NCCL_INCLUDE_DIR}/nccl.h has no nccl_device.h beside it: "
    "epic needs the NCCL device API (NCCL >= 2.28.9).")
endif()
epic_nccl_inspect("${EPIC_NCCL_INCLUDE_DIR}" EPIC_NCCL)

# --- More NCCL versions for the nccl backend's kernels (compile only: the runtime links the NCCL
#     above). Each root is an NCCL install, or the nvidia-nccl-cu13 wheel's nvidia/nccl (install.sh
#     fetches its include/); only its headers are read. For each, the build makes a device shim,
#     epic_shim_nccl-<version>.bc, which `epic-compile --nccl-shim=<version>` links.
set(EPIC_EXTRA_NCCL_ROOTS "" CACHE STRING
  "NCCL roots (;-separated) to compile the nccl backend's kernels against too")
set(EPIC_EXTRA_NCCL_VERSIONS "")
if(NOT EPIC_RUNTIME_ONLY)
  foreach(root IN LISTS EPIC_EXTRA_NCCL_ROOTS)
    if(NOT EXISTS "${root}/include/nccl_device.h")
      message(FATAL_ERROR "EPIC_EXTRA_NCCL_ROOTS: ${root}/include has no nccl_device.h (the NCCL "
        "device API). Give NCCL roots: install.sh fetches the nvidia-nccl-cu13 wheel's headers.")
    endif()
    epic_nccl_inspect("${root}/include" extra)
    if(extra_VERSION STREQUAL EPIC_NCCL_VERSION OR extra_VERSION IN_LIST EPIC_EXTRA_NCCL_VERSIONS)
      message(FATAL_ERROR "EPIC_EXTRA_NCCL_ROOTS: ${root} is NCCL ${extra_VERSION} again")
    endif()
    list(APPEND EPIC_EXTRA_NCCL_VERSIONS "${extra_VERSION}")
    set(EPIC_NCCL_${extra_VERSION}_INCLUDE_DIR "${root}/include")
    set(EPIC_NCCL_${extra_VERSION}_MIN_PTX "${extra_MIN_PTX}")
    set(EPIC_NCCL_${extra_VERSION}_NEEDS_PATCH "${extra_NEEDS_PATCH}")
  endforeach()
endif()

# --- Python and pybind11 (the extension module comes with the Python API) ------------------------
if(EPIC_RUNTIME_ONLY)
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG)
else()
  find_package(Python3 COMPONENTS Interpreter Development.Module REQUIRED)
  find_package(pybind11 CONFIG REQUIRED)
endif()
