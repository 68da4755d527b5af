//===- NcclChecks.h - what ranks and libraries must agree on ----*- C++ -*-===//
//
// The decisions behind the NCCL backend's refusals, as pure functions of what
// the ranks report: no NCCL, CUDA or GPU needed, so they are unit-tested on
// any machine (NcclBuffer.cpp gathers the facts and calls them).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_NCCLCHECKS_H
#define EPIC_RUNTIME_NCCLCHECKS_H

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace epic::runtime {

/// An NCCL call failed, or the NCCL library cannot be used.
struct NcclError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// "2.28.9" for an NCCL_VERSION_CODE (22809; codes below 2.9 as 2800 -> "2.8.0").
std::string ncclVersionName(int code);

/// Throws NcclError naming both versions unless the library's version is
/// exactly (major.minor.patch) the headers': ncclDevComm, the requirements
/// and the window struct changed between 2.28 patch releases.
void checkVersionsEqual(int compiledCode, int loadedCode);

/// What every rank of a buffer must agree on, all-gathered at construction.
/// Trivially copyable: it travels as bytes.
struct RankFacts {
  int64_t numBytes = 0;      ///< the window's bytes
  int64_t blocksPerRank = 0; ///< the most blocks any call launches (the entry barrier pairs them)
  int64_t ncclVersion = 0;   ///< ncclGetVersion of the loaded library
  int64_t smCount = 0;       ///< the device's multiprocessors
  int64_t lsaSize = 1;       ///< ranks in this rank's NVLink (LSA) domain: GPUs per node
  int64_t lsaRank = 0;       ///< this rank's index in it
  char pciBusId[32] = {};    ///< the device (cudaDeviceGetPCIBusId), to check P2P between peers
};

/// Throws NcclError naming the first field the ranks disagree on and every
/// rank's value (facts[r] is rank r's). Then the nodes: every NVLink domain
/// must hold the same number of ranks, numbered node-major (rank r is LSA rank
/// r % lsaSize), as the kernels' node arithmetic assumes.
void checkRanksAgree(const std::vector<RankFacts> &facts);

/// Rank `me`'s view of native P2P atomics between its node's GPUs: 0 every pair
/// it could check has them; 1 + i*R + j: GPUs of ranks i and j lack them;
/// -(1 + i*R + j): this process cannot see both of them (CUDA_VISIBLE_DEVICES).
/// `visible(busId)` is the device ordinal here or -1; `nativeAtomics(a, b)`
/// queries cudaDevP2PAttrNativeAtomicSupported. Pairs on one GPU, and pairs in
/// different nodes (they talk over the network, not P2P), are skipped.
int64_t p2pAtomicsVerdict(const std::vector<RankFacts> &facts, int64_t me,
                          const std::function<int(const std::string &)> &visible,
                          const std::function<bool(int, int)> &nativeAtomics);

/// Throws NcclError naming the GPUs (and ranks) of the first pair some rank
/// found without native P2P atomics, or that no rank of a node could check
/// its node's pairs, unless
/// `assumeUnchecked`. verdicts[r] is rank r's p2pAtomicsVerdict; every rank
/// gets the same verdicts, so every rank decides the same.
void checkP2PVerdicts(const std::vector<RankFacts> &facts, const std::vector<int64_t> &verdicts,
                      bool assumeUnchecked);

/// Polls `status` (an ncclResult_t: ncclCommGetAsyncError of the communicator
/// `what` runs on) while it says ncclInProgress, for at most `timeoutSeconds`;
/// returns the final status. On timeout throws NcclError naming `what`.
int waitWhileInProgress(const std::function<int()> &status, const std::string &what,
                        double timeoutSeconds);

/// ncclInProgress (nccl.h's value; NcclBuffer.cpp asserts it).
constexpr int kNcclInProgress = 7;

} // namespace epic::runtime

#endif // EPIC_RUNTIME_NCCLCHECKS_H
