//===- StreamMemOps.h - flag writes and waits on a stream -----------------===//
//
// What AGRS and PP (Agrs.cpp, Pp.cpp) synchronize with: stream memory
// operations on i32 flags in the windows, no kernel. A write is fenced after
// the stream's earlier work (its copies land first); a wait holds the stream
// until (int32_t)(*flag - value) >= 0, so counters may wrap.

#ifndef EPIC_RUNTIME_STREAMMEMOPS_H
#define EPIC_RUNTIME_STREAMMEMOPS_H

#include "CudaCheck.h"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace epic::runtime::detail {

/// `offset` bytes into `base` (a window: its flags and slots).
inline void *byteAt(void *base, int64_t offset) { return static_cast<char *>(base) + offset; }

inline CUstreamBatchMemOpParams writeFlagOp(void *flag, uint32_t value) {
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = reinterpret_cast<CUdeviceptr>(flag);
  op.writeValue.value = value;
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT; // a fence first
  return op;
}

inline CUstreamBatchMemOpParams waitFlagOp(void *flag, uint32_t value) {
  CUstreamBatchMemOpParams op{};
  op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op.waitValue.address = reinterpret_cast<CUdeviceptr>(flag);
  op.waitValue.value = value;
  op.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  return op;
}

/// Enqueues `ops` on `stream` in the batches the driver accepts (256 each).
inline void streamMemOps(const std::vector<CUstreamBatchMemOpParams> &ops, void *stream,
                         const std::string &what) {
  constexpr size_t kPerBatch = 256;
  for (size_t first = 0; first < ops.size(); first += kPerBatch) {
    const unsigned count = unsigned(std::min(kPerBatch, ops.size() - first));
    check(driver().streamBatchMemOp(static_cast<CUstream>(stream), count,
                                    const_cast<CUstreamBatchMemOpParams *>(ops.data() + first), 0),
          what);
  }
}

} // namespace epic::runtime::detail

#endif // EPIC_RUNTIME_STREAMMEMOPS_H
