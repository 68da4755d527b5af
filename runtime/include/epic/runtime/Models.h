//===- Models.h - DeepEP V2's sizing formulas -------------------*- C++ -*-===//
//
// The analytical models an ElasticBuffer uses before any kernel runs: how
// many bytes the symmetric buffer needs, how many SMs the communication
// kernels should take, and how many network contexts (QPs). The formulas are
// DeepEP V2's (its analytic SM, QP and buffer-size models), so a
// DeepEP user gets the same numbers. Pure arithmetic: no CUDA, no NCCL.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_MODELS_H
#define EPIC_RUNTIME_MODELS_H

#include <cstdint>

namespace epic::runtime {

/// The rank layout: R = scaleout x scaleup ranks (hybrid), or one scale-up
/// domain (direct). `nvlinkRanks` / `rdmaRanks` are the physical domain sizes.
struct Topology {
  int numRanks = 1;
  int numScaleoutRanks = 1; ///< S_o: nodes in hybrid mode, 1 in direct mode
  int numScaleupRanks = 1;  ///< S_u: ranks per node in hybrid mode, R in direct mode
  int numRdmaRanks = 1;     ///< N_rdma: physical nodes
  int numNvlinkRanks = 1;   ///< N_nvl: physical ranks per NVLink domain

  /// One NVLink domain of `ranks` GPUs (what one node or the virtual world is).
  static Topology singleDomain(int ranks);
  /// `nodes` x `perNode` ranks, hybrid (allow_hybrid_mode) or direct.
  static Topology nodes(int nodes, int perNode, bool hybrid);
};

/// get_buffer_size_hint: bytes for dispatch and combine (2 MiB aligned; the
/// workspace is extra). `numTopk` 0 means "assume 32"; FP8 sizing assumes
/// ceil(hidden / 32) scale packs. Throws std::invalid_argument on a
/// non-positive size or a topk above 32.
int64_t bufferSizeHint(const Topology &topology, int64_t maxTokensPerRank, int64_t hidden,
                       int numTopk = 0, bool fp8Dispatch = false,
                       bool allowMultipleReduction = true);

/// Bytes of the symmetric window epic's dispatch/combine kernels use per rank
/// (convert-ep-to-comm's layout, lowering/lib/Conversion/EPToComm: counters, then the
/// larger of R x Tmax dispatch records and K x Tmax combine records), an
/// upper bound over experts, dtypes and layouts; `numTopk` 0 means 32 and FP8
/// sizing allows ceil(hidden / 32) scale packs, as DeepEP's formula does.
/// Unit tests check it against what convert-ep-to-comm reports. Kernels that
/// reach other nodes also stage records per warp of the launch:
/// `stagingWarps` (blocks per rank x warps per block) of them. Hybrid mode
/// over `hybridNodes` nodes adds the forwarders' regions (EPWindow.h).
int64_t kernelWindowBytes(int numRanks, int64_t maxTokensPerRank, int64_t hidden, int numTopk = 0,
                          bool fp8Dispatch = false, int64_t stagingWarps = 0, int hybridNodes = 0);

/// A launch's warps per block at most (CUDA's 1024 threads): what sizing the
/// staging for `blocks` blocks per rank assumes.
inline constexpr int64_t kMaxWarpsPerBlock = 1024 / 32;

/// What an ElasticBuffer of epic needs: DeepEP's bufferSizeHint, or more if
/// the kernels' window needs more (2 MiB aligned). Across nodes (direct mode)
/// the window also holds the staging of `blocksPerRank` blocks (required >= 1
/// there: the most a call of the buffer launches per rank).
int64_t elasticBufferBytes(const Topology &topology, int64_t maxTokensPerRank, int64_t hidden,
                           int numTopk = 0, bool fp8Dispatch = false,
                           bool allowMultipleReduction = true, int blocksPerRank = 0);

/// get_theoretical_num_sms. Bandwidths in GB/s (0 = unknown: rdmaGBs only
/// matters with several nodes, nvlinkGBs must be positive); per-SM read and
/// write rates default to DeepEP's 200 and 50 GB/s. Throws
/// std::invalid_argument for experts not divisible by ranks, topk outside
/// [1, min(32, experts)], or a missing bandwidth.
int theoreticalNumSms(const Topology &topology, int numExperts, int numTopk, double rdmaGBs,
                      double nvlinkGBs, int deviceSms, bool preferOverlapWithCompute = true,
                      double smReadGBs = 200.0, double smWriteGBs = 50.0);

/// get_theoretical_num_qps: direct min(sms, 9), hybrid sms * 16 + 1, capped
/// at the contexts allocated.
int theoreticalNumQps(const Topology &topology, int numSms, int numAllocatedQps);

/// Expected number of distinct groups (of `groups` equal groups of experts)
/// hit by `topk` experts drawn uniformly without replacement.
double expectedGroupsHit(int numExperts, int numTopk, int groups);

} // namespace epic::runtime

#endif // EPIC_RUNTIME_MODELS_H
