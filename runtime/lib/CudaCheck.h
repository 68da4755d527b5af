//===- CudaCheck.h - CUDA errors as exceptions, the driver API (runtime-internal) -*- C++ -*-===//
//
// Shared by the ElasticBuffer sources: a failed driver or runtime call
// throws CudaError naming the call. The driver API is reached through the
// CUDA runtime's entry-point query instead of linking libcuda, so programs
// built on the runtime (epic-run, the Python extension) start and do their
// host-side work (compiling, validating) on machines without a GPU driver.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_LIB_CUDACHECK_H
#define EPIC_RUNTIME_LIB_CUDACHECK_H

#include "epic/runtime/KernelHost.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

namespace epic::runtime::detail {

inline void check(cudaError_t result, const std::string &what) {
  if (result != cudaSuccess)
    throw CudaError(what + " failed: " + cudaGetErrorString(result) + takeDeviceWaitReports());
}

/// Whether `stream` is being captured into a CUDA graph.
inline bool capturing(void *stream) {
  if (!stream)
    return false; // the legacy stream is never captured
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

/// The driver functions the runtime calls, resolved once.
struct DriverApi {
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuModuleLoadData) moduleLoadData = nullptr;
  decltype(&::cuModuleUnload) moduleUnload = nullptr;
  decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
  decltype(&::cuModuleGetGlobal) moduleGetGlobal = nullptr;
  decltype(&::cuFuncSetAttribute) funcSetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) occupancy = nullptr;
  decltype(&::cuLaunchKernelEx) launchKernelEx = nullptr;
  decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled = nullptr;
  /// Where a kernel's parameters are (CUDA 12.4+ drivers; null on older ones).
  decltype(&::cuFuncGetParamInfo) funcGetParamInfo = nullptr;
  /// Stream memory operations (flag writes and waits of AGRS, Agrs.cpp).
  decltype(&::cuStreamBatchMemOp) streamBatchMemOp = nullptr;
  /// Virtual memory management (windows with a host segment, HostSegment.cpp).
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
};

/// Throws CudaError if the driver (or one of its functions) is unavailable.
inline const DriverApi &driver() {
  static const DriverApi api = [] {
    DriverApi a;
    // `required`: throw if missing; else the slot stays null.
    auto resolve = [](const char *name, auto &slot, bool required = true) {
      void *fn = nullptr;
      cudaDriverEntryPointQueryResult found{};
      cudaError_t e =
          cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &found);
      const bool ok = e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn;
      if (!ok && !required)
        return;
      if (!ok)
        throw CudaError(std::string("the CUDA driver does not provide ") + name + " (" +
                        (e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found") +
                        "): is there a GPU and a driver for CUDA " +
                        std::to_string(CUDA_VERSION / 1000) + "?");
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(fn);
    };
    resolve("cuGetErrorName", a.getErrorName);
    resolve("cuGetErrorString", a.getErrorString);
    resolve("cuModuleLoadData", a.moduleLoadData);
    resolve("cuModuleUnload", a.moduleUnload);
    resolve("cuModuleGetFunction", a.moduleGetFunction);
    resolve("cuModuleGetGlobal", a.moduleGetGlobal);
    resolve("cuFuncSetAttribute", a.funcSetAttribute);
    resolve("cuOccupancyMaxActiveBlocksPerMultiprocessor", a.occupancy);
    resolve("cuLaunchKernelEx", a.launchKernelEx);
    resolve("cuTensorMapEncodeTiled", a.tensorMapEncodeTiled);
    resolve("cuFuncGetParamInfo", a.funcGetParamInfo, /*required=*/false);
    resolve("cuStreamBatchMemOp", a.streamBatchMemOp);
    resolve("cuDeviceGetAttribute", a.deviceGetAttribute);
    resolve("cuMemGetAllocationGranularity", a.memGetAllocationGranularity);
    resolve("cuMemAddressReserve", a.memAddressReserve);
    resolve("cuMemAddressFree", a.memAddressFree);
    resolve("cuMemCreate", a.memCreate);
    resolve("cuMemRelease", a.memRelease);
    resolve("cuMemMap", a.memMap);
    resolve("cuMemUnmap", a.memUnmap);
    resolve("cuMemSetAccess", a.memSetAccess);
    return a;
  }();
  return api;
}

inline void check(CUresult result, const std::string &what) {
  if (result != CUDA_SUCCESS) {
    const char *name = nullptr, *text = nullptr;
    driver().getErrorName(result, &name);
    driver().getErrorString(result, &text);
    throw CudaError(what + " failed: " + (name ? name : "?") + " (" + (text ? text : "") + ")" +
                    takeDeviceWaitReports());
  }
}

/// Points `module`'s `epic_wait_report` global (if it has one: kernels with
/// call-free waits) at the process's mapped report slots.
void attachDeviceWaitReports(CUmodule module);

} // namespace epic::runtime::detail

#endif // EPIC_RUNTIME_LIB_CUDACHECK_H
