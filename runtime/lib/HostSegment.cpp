//===- HostSegment.cpp - Windows with a host-memory segment ---------------===//

#include "epic/runtime/HostSegment.h"

#include "CudaCheck.h"

#include <stdexcept>
#include <string>

using namespace epic::runtime;
using detail::check;
using detail::driver;

MixedWindows::MixedWindows(int count, int64_t deviceBytes, int64_t hostBytes)
    : count(count), deviceBytes(deviceBytes), hostBytes(hostBytes) {
  if (count < 1 || deviceBytes <= 0 || hostBytes <= 0 || deviceBytes % kGranularity ||
      hostBytes % kGranularity)
    throw std::invalid_argument("a window with a host segment needs positive multiples of 2 MiB "
                                "for both parts, got " +
                                std::to_string(deviceBytes) + " device and " +
                                std::to_string(hostBytes) + " host bytes");
  const detail::DriverApi &cu = driver();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int supported = 0, numa = -1;
  check(cu.deviceGetAttribute(
            &supported, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device),
        "cuDeviceGetAttribute(host NUMA virtual memory)");
  if (!supported)
    throw CudaError("num_cpu_bytes: this GPU and driver cannot map host memory into a window "
                    "(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)");
  check(cu.deviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device),
        "cuDeviceGetAttribute(host NUMA id)");
  CUmemAllocationProp onDevice{};
  onDevice.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  onDevice.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  onDevice.location.id = device;
  // NCCL exports a registered window's handles to its peers as file descriptors.
  onDevice.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemAllocationProp onHost = onDevice;
  onHost.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  onHost.location.id = numa < 0 ? 0 : numa; // -1: a machine without NUMA, node 0
  for (const CUmemAllocationProp *prop : {&onDevice, &onHost}) {
    size_t granularity = 0;
    check(cu.memGetAllocationGranularity(&granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (kGranularity % int64_t(granularity))
      throw CudaError("num_cpu_bytes: the driver's allocation granularity (" +
                      std::to_string(granularity) + " bytes) does not divide 2 MiB");
  }
  const size_t total = size_t(count) * size_t(stride());
  CUdeviceptr va = 0;
  check(cu.memAddressReserve(&va, total, size_t(kGranularity), 0, 0),
        "cuMemAddressReserve(" + std::to_string(total) + " bytes)");
  reserved = va;
  try {
    for (int w = 0; w < count; ++w)
      for (bool host : {false, true}) {
        const size_t bytes = size_t(host ? hostBytes : deviceBytes);
        CUmemGenericAllocationHandle h = 0;
        check(cu.memCreate(&h, bytes, host ? &onHost : &onDevice, 0),
              std::string("cuMemCreate(") + std::to_string(bytes) + " bytes of " +
                  (host ? "host NUMA node " + std::to_string(onHost.location.id) : "GPU") +
                  " memory)");
        handles.push_back(h);
        const CUdeviceptr at = va + CUdeviceptr(w) * stride() + (host ? deviceBytes : 0);
        check(cu.memMap(at, bytes, 0, h, 0), "cuMemMap");
        ++mapped;
      }
    // The GPU reads and writes both parts; the host writes tables into the host parts
    // (cudaMemcpy reaches them as device memory: the GPU's mapping is enough).
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(cu.memSetAccess(va, total, &access, 1), "cuMemSetAccess");
    check(cudaMemset(base(), 0, total), "cudaMemset(window with host segment)");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (zeroing the windows)");
  } catch (...) {
    release();
    throw;
  }
}

MixedWindows::~MixedWindows() { release(); }

void MixedWindows::release() {
  if (!reserved)
    return;
  const detail::DriverApi &cu = driver();
  cudaDeviceSynchronize(); // nothing may still use the memory
  for (int i = 0; i < mapped; ++i) {
    const int w = i / 2;
    const bool host = i % 2;
    cu.memUnmap(reserved + CUdeviceptr(w) * stride() + (host ? deviceBytes : 0),
                size_t(host ? hostBytes : deviceBytes));
  }
  for (unsigned long long h : handles)
    cu.memRelease(h);
  cu.memAddressFree(reserved, size_t(count) * size_t(stride()));
  reserved = 0, mapped = 0;
  handles.clear();
}
