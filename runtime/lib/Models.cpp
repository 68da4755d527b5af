//===- Models.cpp - DeepEP V2's sizing formulas ---------------------------===//

#include "epic/runtime/Models.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

using namespace epic::runtime;

namespace {
constexpr int64_t kMiB = int64_t(1) << 20;
/// Hybrid receive regions have room for this many channels (160 SMs x 8).
constexpr int64_t kMaxChannels = 1280;

int64_t align(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

void require(bool ok, const std::string &message) {
  if (!ok)
    throw std::invalid_argument(message);
}
} // namespace

Topology Topology::singleDomain(int ranks) {
  require(ranks >= 1, "ranks must be positive, got " + std::to_string(ranks));
  Topology t;
  t.numRanks = t.numScaleupRanks = t.numNvlinkRanks = ranks;
  return t;
}

Topology Topology::nodes(int nodes, int perNode, bool hybrid) {
  require(nodes >= 1 && perNode >= 1, "nodes and ranks per node must be positive");
  Topology t;
  t.numRanks = nodes * perNode;
  t.numRdmaRanks = nodes;
  t.numNvlinkRanks = perNode;
  bool useHybrid = hybrid && nodes > 1;
  t.numScaleoutRanks = useHybrid ? nodes : 1;
  t.numScaleupRanks = useHybrid ? perNode : t.numRanks;
  return t;
}

int64_t epic::runtime::kernelWindowBytes(int numRanks, int64_t maxTokensPerRank, int64_t hidden,
                                         int numTopk, bool fp8Dispatch, int64_t stagingWarps,
                                         int hybridNodes) {
  require(numRanks >= 1, "num_ranks must be positive, got " + std::to_string(numRanks));
  const int64_t r = numRanks, k = numTopk == 0 ? 32 : numTopk, tm = maxTokensPerRank;
  namespace window = epic::ep::window;
  const int64_t local = epic::ep::limits::kMaxLocalExperts;
  const int64_t packs = fp8Dispatch ? (hidden + 31) / 32 : 0; // as many as DeepEP sizes for
  // Any dtype: the widest element (f32) bounds the row.
  const window::DispatchRecord record(hidden, fp8Dispatch ? 1 : 4, packs, k);
  const window::CombineRecord combineRecord(hidden, k);
  require(stagingWarps >= 0, "staging warps must be >= 0, got " + std::to_string(stagingWarps));
  // Staging (across nodes only) follows the data region.
  const int64_t data = window::kControlEnd +
                       tm * window::dataBytesPerToken(r, k, record, combineRecord, hybridNodes) +
                       stagingWarps * window::stagingPerWarp(record, combineRecord);
  // The fused GEMM kernels multiply bf16 / f16 rows only; FP8 configurations
  // keep ep.moe_layer's rank barrier and exit count where their counters are.
  if (fp8Dispatch)
    return align(data, 256) + 256;
  // ep.dispatch_gemm's counters follow: [local experts][64-row tiles] twice.
  const int64_t tileCounters = align(local * ((r * tm + 63) / 64) * 4, 256);
  // ep.gemm_combine's scratch follows (disjoint: both keep counters across
  // calls): row -> token for every expanded row (expert alignment up to 128
  // assumed; more fails at prepare, naming the bytes), pending rows per token,
  // finished column tiles per row tile, the rank barrier and the claimed chunks.
  const int64_t expandedRows = r * tm * std::min<int64_t>(k, local) + 127 * local;
  const int64_t gemmCombine =
      align(expandedRows * 4, 256) + align(r * tm * 4, 256) + tileCounters + 256;
  return align(data, 256) + 2 * tileCounters + gemmCombine;
}

int64_t epic::runtime::elasticBufferBytes(const Topology &t, int64_t maxTokensPerRank,
                                          int64_t hidden, int numTopk, bool fp8Dispatch,
                                          bool allowMultipleReduction, int blocksPerRank) {
  int64_t deepep =
      bufferSizeHint(t, maxTokensPerRank, hidden, numTopk, fp8Dispatch, allowMultipleReduction);
  const bool acrossNodes = t.numRdmaRanks > 1;
  require(
      !acrossNodes || (blocksPerRank >= 1 && blocksPerRank <= epic::ep::window::kMaxBlocksPerRank),
      "num_sms (blocks per rank) must be in [1, " +
          std::to_string(epic::ep::window::kMaxBlocksPerRank) +
          "] to size the staging of kernels across nodes, got " + std::to_string(blocksPerRank));
  const int64_t stagingWarps = acrossNodes ? int64_t(blocksPerRank) * kMaxWarpsPerBlock : 0;
  int64_t kernels =
      kernelWindowBytes(t.numRanks, maxTokensPerRank, hidden, numTopk, fp8Dispatch, stagingWarps,
                        t.numScaleoutRanks > 1 ? t.numScaleoutRanks : 0);
  return std::max(deepep, align(kernels, 2 * kMiB));
}

int64_t epic::runtime::bufferSizeHint(const Topology &t, int64_t maxTokensPerRank, int64_t hidden,
                                      int numTopk, bool fp8Dispatch, bool allowMultipleReduction) {
  require(maxTokensPerRank > 0,
          "num_max_tokens_per_rank must be positive, got " + std::to_string(maxTokensPerRank));
  require(hidden > 0, "hidden must be positive, got " + std::to_string(hidden));
  require(numTopk >= 0 && numTopk <= 32,
          "num_topk must be in [0, 32] (0: assume 32), got " + std::to_string(numTopk));
  const int64_t k = numTopk == 0 ? 32 : numTopk;
  const int64_t packs = fp8Dispatch ? (hidden + 31) / 32 : 0;
  const int64_t hiddenBytes = hidden * (fp8Dispatch ? 1 : 2);
  // Records: every field padded to 32 bytes; dispatch records carry the
  // source id and a linked-list index per slot, combine records do not.
  const int64_t dispatchRecord =
      align(hiddenBytes, 32) + align(4 * packs, 32) + align(8 * k + 4 * (1 + k), 32);
  const int64_t combineRecord = align(2 * hidden, 32) + align(8 * k, 32);
  const int64_t tm = maxTokensPerRank, r = t.numRanks;
  const bool amr = allowMultipleReduction;
  const bool nvlink = t.numNvlinkRanks == t.numScaleupRanks;
  int64_t dispatch, combine;
  if (t.numScaleoutRanks == 1) {
    dispatch = (nvlink ? 0 : 1) * tm * dispatchRecord + r * tm * dispatchRecord;
    combine = (nvlink ? 0 : r) * tm * (amr ? 1 : k) * combineRecord +
              (amr ? std::min<int64_t>(r, k) : k) * tm * combineRecord;
  } else {
    const int64_t so = t.numScaleoutRanks, su = t.numScaleupRanks;
    dispatch = su * so * tm * dispatchRecord + tm * dispatchRecord +
               so * (tm + kMaxChannels) * dispatchRecord;
    combine = (amr ? std::min<int64_t>(su, k) : k) * so * tm * combineRecord +
              (amr ? std::min<int64_t>(so, k) : k) * tm * combineRecord +
              (amr ? 1 : k) * so * (tm + kMaxChannels) * combineRecord;
  }
  return align(std::max(dispatch, combine), 2 * kMiB);
}

double epic::runtime::expectedGroupsHit(int numExperts, int numTopk, int groups) {
  // C(E - E/G, K) / C(E, K) = prod_{i<K} (E - E/G - i) / (E - i): the chance
  // that a given group is missed.
  double missed = 1.0;
  const int perGroup = numExperts / groups;
  for (int i = 0; i < numTopk; ++i)
    missed *= double(numExperts - perGroup - i) / double(numExperts - i);
  return groups * (1.0 - std::max(missed, 0.0));
}

int epic::runtime::theoreticalNumSms(const Topology &t, int numExperts, int numTopk, double rdmaGBs,
                                     double nvlinkGBs, int deviceSms, bool preferOverlapWithCompute,
                                     double smReadGBs, double smWriteGBs) {
  require(numExperts >= 1 && numExperts % t.numRanks == 0, "num_experts (" +
                                                               std::to_string(numExperts) +
                                                               ") must be a positive multiple of "
                                                               "the number of ranks (" +
                                                               std::to_string(t.numRanks) + ")");
  require(numTopk >= 1 && numTopk <= std::min(32, numExperts),
          "num_topk must be in [1, min(32, num_experts)], got " + std::to_string(numTopk));
  require(deviceSms >= 1, "the device SM count must be positive");
  require(nvlinkGBs > 0, "the NVLink bandwidth must be positive (GB/s)");
  const bool hybrid = t.numScaleoutRanks > 1;
  require(!(hybrid || t.numRdmaRanks > 1) || rdmaGBs > 0,
          "the RDMA bandwidth must be positive with more than one node (GB/s)");

  const double k = expectedGroupsHit(numExperts, numTopk, t.numRanks);
  const double ko = hybrid ? expectedGroupsHit(numExperts, numTopk, t.numScaleoutRanks) : 0.0;
  // Volumes per unit of received data.
  double read = 1.0 / k, write = 0.0, rdma = 0.0, nvl = 0.0;
  if (hybrid) {
    const double so = t.numScaleoutRanks, su = t.numScaleupRanks;
    write += 1.0 / k + (1.0 / k) * (ko / so) + 1.0;
    rdma += (1.0 / k) * ko * (1.0 - 1.0 / so);
    read += ko / k;
    nvl += 1.0 - 1.0 / su;
  } else {
    const double nn = t.numNvlinkRanks, r = t.numRanks;
    if (t.numRdmaRanks > 1)
      write += 1.0 / k;
    write += nn / r;
    nvl += (nn / r) * (1.0 - 1.0 / nn);
    rdma += (r - nn) / r;
  }
  // The bottleneck link: its volume and bandwidth.
  double volume = nvl, bandwidth = nvlinkGBs;
  if (hybrid && rdma / rdmaGBs > nvl / nvlinkGBs) {
    volume = rdma;
    bandwidth = rdmaGBs;
  }
  double sms = volume == 0.0 ? double(deviceSms)
                             : std::max(bandwidth / volume * read / smReadGBs,
                                        bandwidth / volume * write / smWriteGBs);
  int result = int(align(std::max<int64_t>(4, int64_t(std::ceil(1.25 * sms))), 2));
  if (!preferOverlapWithCompute)
    result = std::max(result, 64);
  return std::min(result, deviceSms);
}

int epic::runtime::theoreticalNumQps(const Topology &t, int numSms, int numAllocatedQps) {
  require(numSms >= 1, "num_sms must be positive, got " + std::to_string(numSms));
  int qps = t.numScaleoutRanks > 1 ? numSms * 16 + 1 : std::min(numSms, 9);
  return numAllocatedQps > 0 ? std::min(qps, numAllocatedQps) : qps;
}
