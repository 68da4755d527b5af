//===- NcclBuffer.h - the NCCL communicator and ElasticBuffer ---*- C++ -*-===//
//
// The real backend: one rank per process. Communicator owns an ncclComm_t
// (a new one, or a split of PyTorch's: never PyTorch's own, so epic's
// collectives cannot interleave with PyTorch's and epic's lifetime is its own)
// and reports what the device API offers; NcclElasticBuffer holds
// the symmetric window (ncclMemAlloc + ncclCommWindowRegister), the device
// communicator (in device memory, passed to kernels by pointer) and launches
// what convert-ep-to-comm made for backend=nccl. NCCL version differences are handled
// in NcclBuffer.cpp's `requirements()` and `checkVersion()` only.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_NCCLBUFFER_H
#define EPIC_RUNTIME_NCCLBUFFER_H

#include "epic/runtime/NcclChecks.h"
#include "epic/runtime/HostSegment.h"
#include "epic/runtime/KernelHost.h"

#include <memory>
#include <string>
#include <vector>

typedef struct ncclComm *ncclComm_t;

namespace epic::runtime {

struct DeviceApiInfo {
  int version = 0; ///< NCCL_VERSION_CODE of the loaded library
  int worldSize = 0, rank = 0;
  int lsaSize = 0, lsaRank = 0;
  bool gin = false;       ///< network one-sided operations available
  bool ginProbed = false; ///< false: not known (NCCL 2.28 has no query; see deviceApi)
  int ginType = 0;        ///< NCCL's GIN type: 0 none, 2 proxy, 3 GDAKI, 4 GPI, 5 EFA
  std::string describe() const;
};

class Communicator {
public:
  /// A new communicator of `worldSize` ranks from a unique id (the 128 bytes
  /// of ncclUniqueId, e.g. broadcast by torch.distributed). `timeoutSeconds`
  /// bounds every host wait on it (e.g. a rank that never joins a collective).
  Communicator(int worldSize, int rank, const std::string &uniqueId, double timeoutSeconds = 300);
  /// Collective over `parent` (e.g. PyTorch's communicator, blocking or not):
  /// ncclCommSplit with every rank, blocking. The split is epic's: its
  /// collectives never enter the parent's order and it outlives the parent.
  static std::unique_ptr<Communicator> splitOf(ncclComm_t parent, double timeoutSeconds = 300);
  ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  /// 128 bytes for the constructor above (rank 0 makes it, all ranks use it).
  static std::string newUniqueId();

  ncclComm_t get() const { return comm; }
  int worldSize() const;
  int rank() const;
  /// What the device API offers on this communicator: world and LSA team,
  /// whether GIN is available and its type. NCCL 2.28 cannot tell without a
  /// device communicator with GIN signals, which switches GIN on for every
  /// later window of the communicator and fails without a GIN network: there
  /// GIN is reported as not probed (ginProbed false; the ep kernels use none).
  const DeviceApiInfo &deviceApi();

  /// Collective: every rank's `bytes` bytes at `mine`, in rank order (an
  /// ncclAllGather; waits at most the timeout for it).
  std::vector<char> allGather(const void *mine, size_t bytes);

  /// Throws NcclError unless the loaded library is exactly the version of the
  /// headers the runtime and the device shim were built with.
  static void checkVersion();
  /// The loaded library's NCCL_VERSION_CODE (ncclGetVersion).
  static int loadedVersion();
  /// Throws unless `result` (an ncclResult_t of `what` on this communicator)
  /// is ncclSuccess, after a bounded wait where it is ncclInProgress.
  void settle(int result, const std::string &what);

private:
  Communicator(ncclComm_t comm, double timeoutSeconds);
  ncclComm_t comm = nullptr;
  double timeout;
  bool broken = false; ///< a wait timed out: destroyed with ncclCommAbort (no wait)
  bool queried = false;
  DeviceApiInfo api;
};

class NcclElasticBuffer : public KernelHost {
public:
  /// Collective: every rank of `comm` calls it with the same arguments.
  /// `hostBytes`: a host segment after the window (HostSegment.h), on a
  /// one-rank communicator only: NCCL 2.28 maps no host memory for its LSA
  /// peers (a peer's segment would need NCCL's GIN get), refused by name.
  NcclElasticBuffer(Communicator &comm, int64_t windowBytes, KernelProvider &provider,
                    int blocksPerRank = 16, int64_t hostBytes = 0);
  ~NcclElasticBuffer() override;

  const DeviceApiInfo &info() const { return apiInfo; }
  int worldSize() const override { return apiInfo.worldSize; }
  /// NCCL's LSA team: the ranks this rank reaches over NVLink.
  int gpusPerNode() const override { return apiInfo.lsaSize; }
  /// A one-integer ncclAllReduce on `stream` on epic's communicator
  /// (collective: every rank calls it).
  void barrier(void *stream = nullptr) override;
  void *windowMemory(int servedRank) const override;
  void *peerWindowMemory(int servedRank, int peer) const override;
  int worldRankOf(int) const override { return apiInfo.rank; }

private:
  void acquire(int blocksPerRank);
  /// All-gathers RankFacts and the ranks' P2P-atomics verdicts; throws the
  /// same NcclError on every rank where they disagree or a pair lacks them.
  void checkRanks(int blocksPerRank);
  void release();

  Communicator &comm;
  DeviceApiInfo apiInfo;
  bool devCommCreated = false;
  void *memory = nullptr;
  /// The window's memory when it has a host segment (else ncclMemAlloc's).
  std::unique_ptr<MixedWindows> mixed;
  void *window = nullptr;      ///< ncclWindow_t
  void *devCommHost = nullptr; ///< ncclDevComm (host copy, for destruction)
  int *barrierWord = nullptr;  ///< the barrier's all-reduce operand
  /// The LSA team's mapping of the window (NCCL's ncclGetLsaPointer, read
  /// once from the window's device descriptor): peer i's window at
  /// lsaBase + i * lsaStride.
  char *lsaBase = nullptr;
  uint64_t lsaStride = 0;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_NCCLBUFFER_H
