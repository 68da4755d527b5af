//===- DLPack.h - the DLPack ABI, as far as epic reads it -------*- C++ -*-===//
//
// Tensors reach the extension as DLPack capsules (`tensor.__dlpack__()`), so
// it works with torch, numpy, cupy, ... and links none of them. The structs
// below follow the DLPack C ABI (https://dmlc.github.io/dlpack/latest/c_api.html,
// unversioned "dltensor" capsules, which every producer still emits).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_PYTHON_DLPACK_H
#define EPIC_PYTHON_DLPACK_H

#include <cstdint>

namespace epic::python::dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3, kCUDAManaged = 13 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

struct Device {
  int32_t deviceType;
  int32_t deviceId;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void *data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t *shape;
  int64_t *strides; ///< in elements; null means compact row-major
  uint64_t byteOffset;
};

struct ManagedTensor {
  Tensor tensor;
  void *managerContext;
  void (*deleter)(ManagedTensor *self);
};

inline constexpr const char *kCapsuleName = "dltensor";

} // namespace epic::python::dlpack

#endif // EPIC_PYTHON_DLPACK_H
