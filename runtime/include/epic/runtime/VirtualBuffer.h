//===- VirtualBuffer.h - R virtual ranks on one GPU -------------*- C++ -*-===//
//
// The virtual world's ElasticBuffer state: one window of R equal slices, the
// EpicVirtualComm descriptor (signals, counters, barrier counters) and the
// kernels, all on one GPU. One launch serves every rank: the kernels find
// their rank from the block index and their tensors in per-rank parameter
// records. Runs what ep-expand made for backend=virtual.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_VIRTUALBUFFER_H
#define EPIC_RUNTIME_VIRTUALBUFFER_H

#include "epic/runtime/KernelProvider.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace epic::runtime {

/// A CUDA driver or runtime call failed.
struct CudaError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One rank's parameter record: field name -> pointer or integer (the
/// fields are the entry's `param_fields` in the metadata).
using ParamRecord = std::map<std::string, uint64_t>;

struct Loaded;

class VirtualElasticBuffer {
public:
  /// `windowBytes` per rank (at least the entries' `window_bytes`);
  /// `blocksPerRank` blocks of every kernel serve each rank.
  VirtualElasticBuffer(int ranks, int64_t windowBytes, KernelProvider &provider,
                       int blocksPerRank = 16);
  ~VirtualElasticBuffer();
  VirtualElasticBuffer(const VirtualElasticBuffer &) = delete;
  VirtualElasticBuffer &operator=(const VirtualElasticBuffer &) = delete;

  struct Run {
    std::string key;
    KernelCache::Source source;
    double seconds; ///< compile or load time of the kernels
  };

  /// A validated launch whose parameter records already live on the device:
  /// launching it is kernel launches only, so it can be captured in a CUDA
  /// graph and replayed (the records and tensors must stay valid).
  class Prepared {
  public:
    Prepared() = default;
    Prepared(Prepared &&other) noexcept;
    Prepared &operator=(Prepared &&other) noexcept;
    ~Prepared();
    const Run &info() const { return run; }

  private:
    friend class VirtualElasticBuffer;
    Run run{};
    struct Loaded *kernels = nullptr;
    void *params = nullptr;
  };

  /// Loads the kernels of the entry function in `entryIR` (compiled for
  /// backend=virtual) and uploads `records[r]` for rank r. Validates: one
  /// record per rank, known field names, the window large enough, every
  /// rank's blocks resident at once.
  Prepared prepare(const std::string &entryIR, const std::vector<ParamRecord> &records);

  /// Launches a prepared entry's kernels, in order, on `stream` (no host
  /// synchronization, no allocation: graph-capturable).
  void launch(const Prepared &prepared, void *stream = nullptr);

  /// prepare() + launch().
  Run run(const std::string &entryIR, const std::vector<ParamRecord> &records,
          void *stream = nullptr);

  int ranks() const { return numRanks; }
  int64_t windowBytes() const { return bytesPerRank; }

private:
  Loaded &load(const std::string &entryIR, Run &run);

  int numRanks;
  int64_t bytesPerRank;
  int blocksPerRank;
  KernelProvider &provider;
  void *window = nullptr, *signals = nullptr, *counters = nullptr, *barriers = nullptr;
  void *commDescriptor = nullptr, *windowDescriptor = nullptr;
  std::map<std::string, Loaded *> modules;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_VIRTUALBUFFER_H
