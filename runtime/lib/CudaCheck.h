//===- CudaCheck.h - CUDA errors as exceptions (runtime-internal) -*- C++ -*-===//
//
// Shared by the ElasticBuffer sources: a failed driver or runtime call
// throws CudaError naming the call.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_LIB_CUDACHECK_H
#define EPIC_RUNTIME_LIB_CUDACHECK_H

#include "epic/runtime/VirtualBuffer.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

namespace epic::runtime::detail {

inline void check(CUresult result, const std::string &what) {
  if (result != CUDA_SUCCESS) {
    const char *name = nullptr, *text = nullptr;
    cuGetErrorName(result, &name);
    cuGetErrorString(result, &text);
    throw CudaError(what + " failed: " + (name ? name : "?") + " (" + (text ? text : "") + ")");
  }
}

inline void check(cudaError_t result, const std::string &what) {
  if (result != cudaSuccess)
    throw CudaError(what + " failed: " + cudaGetErrorString(result));
}

} // namespace epic::runtime::detail

#endif // EPIC_RUNTIME_LIB_CUDACHECK_H
