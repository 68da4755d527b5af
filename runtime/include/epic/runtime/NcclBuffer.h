//===- NcclBuffer.h - the NCCL communicator and ElasticBuffer ---*- C++ -*-===//
//
// The real backend: one rank per process. Communicator owns (or adopts) an
// ncclComm_t and reports what the device API offers; NcclElasticBuffer holds
// the symmetric window (ncclMemAlloc + ncclCommWindowRegister), the device
// communicator (in device memory, passed to kernels by pointer) and launches
// what ep-expand made for backend=nccl. NCCL version differences are handled
// in NcclBuffer.cpp's `requirements()` and `checkVersion()` only.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_NCCLBUFFER_H
#define EPIC_RUNTIME_NCCLBUFFER_H

#include "epic/runtime/VirtualBuffer.h"

#include <string>

typedef struct ncclComm *ncclComm_t;

namespace epic::runtime {

/// An NCCL call failed, or the NCCL library cannot be used.
struct NcclError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct DeviceApiInfo {
  int version = 0;    ///< NCCL_VERSION_CODE of the loaded library
  int worldSize = 0, rank = 0;
  int lsaSize = 0, lsaRank = 0;
  bool gin = false;   ///< network one-sided operations available
  int ginType = 0;    ///< NCCL's GIN type: 0 none, 2 proxy, 3 GDAKI, 4 GPI, 5 EFA
  std::string describe() const;
};

class Communicator {
public:
  /// A new communicator of `worldSize` ranks from a unique id (the 128 bytes
  /// of ncclUniqueId, e.g. broadcast by torch.distributed); owned.
  Communicator(int worldSize, int rank, const std::string &uniqueId);
  /// Adopts an existing communicator (e.g. PyTorch's); not destroyed here.
  explicit Communicator(ncclComm_t comm);
  ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  /// 128 bytes for the constructor above (rank 0 makes it, all ranks use it).
  static std::string newUniqueId();

  ncclComm_t get() const { return comm; }
  int worldSize() const;
  int rank() const;
  /// What the device API offers on this communicator: world and LSA team,
  /// whether GIN is available and its type. Collective the first time (on
  /// NCCL 2.28 GIN is probed by creating a device communicator with GIN
  /// signals; a one-rank world skips the probe: it never needs the network).
  const DeviceApiInfo &deviceApi();

  /// Throws NcclError if the library's major.minor differs from the headers'
  /// the runtime and the device shim were built with.
  static void checkVersion();

private:
  ncclComm_t comm = nullptr;
  bool owned = false;
  bool queried = false;
  DeviceApiInfo api;
};

class NcclElasticBuffer : public KernelHost {
public:
  /// Collective: every rank of `comm` calls it with the same arguments.
  NcclElasticBuffer(Communicator &comm, int64_t windowBytes, KernelProvider &provider,
                    int blocksPerRank = 16);
  ~NcclElasticBuffer() override;

  const DeviceApiInfo &info() const { return apiInfo; }
  int worldSize() const override { return apiInfo.worldSize; }
  /// A one-integer ncclAllReduce on `stream` (collective: every rank calls it).
  void barrier(void *stream = nullptr) override;
  void *windowMemory(int servedRank) const override;

private:
  void acquire(int blocksPerRank);
  void release();

  Communicator &comm;
  DeviceApiInfo apiInfo;
  bool devCommCreated = false;
  void *memory = nullptr;
  void *window = nullptr;       ///< ncclWindow_t
  void *devCommHost = nullptr;  ///< ncclDevComm (host copy, for destruction)
  int *barrierWord = nullptr;   ///< the barrier's all-reduce operand
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_NCCLBUFFER_H
