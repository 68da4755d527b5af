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
if(NOT NCCL_ROOT AND DEFINED ENV{NCCL_ROOT})
  set(NCCL_ROOT "$ENV{NCCL_ROOT}")
endif()
find_path(EPIC_NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} PATH_SUFFIXES include
  PATHS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_library(EPIC_NCCL_LIBRARY nccl
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
file(STRINGS "${EPIC_NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
  EPIC_NCCL_VERSION "${_nccl_ver}")

# --- Python and pybind11 (the extension module comes with the Python API) ------------------------
if(EPIC_RUNTIME_ONLY)
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG)
else()
  find_package(Python3 COMPONENTS Interpreter Development.Module REQUIRED)
  find_package(pybind11 CONFIG REQUIRED)
endif()
