//===- Layout.h - convert-ep-to-comm: the window, the records, the kernels' shapes -===//
//
// The byte layout the kernels use (EPLayout: the window of EPWindow.h for one
// configuration, the dispatch and combine records), the parameter records'
// fields, and what each kernel is specialized on (its shape). No code that
// builds IR: KernelBuilder.h has that.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_LAYOUT_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_LAYOUT_H

#include "GroupedGemm.h"

#include "epic/Dialect/Comm/IR/CommDialect.h"
#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/Dialect/EP/IR/EPRecords.h"
#include "epic/Dialect/EP/IR/EPWindow.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

/// 16-byte chunks per lane a row copy keeps in flight (KernelBuilder::kCopyUnroll).
inline constexpr int64_t kDefaultRowUnroll = 4;

// Byte offsets round up as the window's do.
using epic::ep::window::align;

//===----------------------------------------------------------------------===//
// Layout of the window and of the parameter records
//===----------------------------------------------------------------------===//

using epic::ep::window::kMaxBlocksPerRank;
constexpr int64_t kDefaultTimeoutMs = 100000;

/// Every byte offset the kernels use. The window (EPWindow.h) holds, in each
/// rank's copy: the control region at offsets that are the same for every
/// configuration, then one data region shared by dispatch ([src rank][Tmax]
/// [record]) and combine ([master slot][Tmax][record]); entry barriers keep
/// them apart in time. Tmax is the configuration's or, where it leaves it
/// out, a run-time value (KernelBuilder::tmax): then only the data region's
/// size depends on it.
struct EPLayout {
  int64_t ranks, experts, local, topk, hidden, packs, alignment;
  /// Ranks per node (NVLink domain) and nodes; peers in other nodes are
  /// reached by GIN puts and signals (Network.cpp) when there are several.
  int64_t ranksPerNode, nodes;
  bool multiNode;
  /// Hybrid mode across nodes: a token goes once to each node, to its
  /// forwarder there (Hybrid.cpp); else direct.
  bool hybrid;
  /// Tmax, or 0: read from record field `tmaxField` at run time.
  int64_t tmax, tmaxField = -1;
  int64_t elemBytes, idxBytes;
  // Dispatch record: hidden | scale packs | ids (i32 x K) | weights (f32 x K) | token, master.
  int64_t rowBytes, rowPad, packPad, idsOff, weightsOff, tokenOff, record;
  // Combine record: bf16 row | weights (f32 x K).
  int64_t combineRow, combineRecord;
  // Counters (EPWindow.h says what each holds).
  static constexpr int64_t countsIn = epic::ep::window::kCountsIn,
                           expertIn = epic::ep::window::kExpertIn, slots = epic::ep::window::kSlots,
                           expertLocal = epic::ep::window::kExpertLocal,
                           expertCursor = epic::ep::window::kExpertCursor,
                           dispatchDone = epic::ep::window::kDispatchDone,
                           dispatchFlags = epic::ep::window::kDispatchFlags,
                           combineDone = epic::ep::window::kCombineDone,
                           combineFlags = epic::ep::window::kCombineFlags,
                           barrierArrivals = epic::ep::window::kBarrierArrivals,
                           barrierEpochs = epic::ep::window::kBarrierEpochs,
                           entryPassed = epic::ep::window::kEntryPassed,
                           publishedRecord = epic::ep::window::kPublishedRecord,
                           data = epic::ep::window::kControlEnd;
  /// The window: `data + tmax * windowPerToken` bytes (windowBytes when
  /// Tmax is static, else just the control region, `data`).
  int64_t windowPerToken, windowBytes;
  /// Multi-node: bytes of a staging slot, and of a warp's ring of them (after
  /// the data region: EPWindow.h); 0 on one node.
  int64_t stageSlot = 0, stagingPerWarp = 0;
  /// Bound of every device-side wait (DeepEP's num_gpu_timeout_secs); the
  /// entry function's `epic.timeout_ms` overrides it.
  int64_t timeoutMs = kDefaultTimeoutMs;
  /// Bytes per rank of the parameter table (more for fused entries' fields).
  int64_t paramStride = 128;
  /// The op's outputs (and what peers read of its inputs) lie in the
  /// symmetric window: a peer's tensors are found through the record it
  /// publishes there (KernelBuilder::peerRecord), on any backend; else
  /// through the launch's parameter table (one address space).
  bool peersInWindow = false;
  /// The entry's configuration and variant, hashed (opSignatureOf): the
  /// entry barrier checks that every rank entered the same op.
  int64_t signature = 0;

  EPLayout(ep::ConfigAttr cfg, unsigned idxBits) {
    ranks = cfg.getRanks();
    experts = cfg.getExperts();
    local = cfg.getNumLocalExperts();
    topk = cfg.getTopk();
    hidden = cfg.getHidden();
    packs = cfg.getScalePacks();
    tmax = cfg.getMaxTokensPerRank();
    alignment = cfg.getExpertAlignment();
    ranksPerNode = cfg.getRanksPerNode();
    nodes = cfg.getNumNodes();
    multiNode = cfg.isMultiNode();
    hybrid = multiNode && cfg.isHybrid();
    elemBytes = cfg.getDtype().getIntOrFloatBitWidth() / 8;
    idxBytes = idxBits / 8;
    epic::ep::window::DispatchRecord d(hidden, elemBytes, packs, topk);
    rowBytes = d.rowBytes, rowPad = d.rowPad, packPad = d.packPad, idsOff = d.idsOff;
    weightsOff = d.weightsOff, tokenOff = d.tokenOff, record = d.bytes;
    epic::ep::window::CombineRecord c(hidden, topk);
    combineRow = c.rowBytes, combineRecord = c.bytes;
    windowPerToken = epic::ep::window::dataBytesPerToken(ranks, topk, d, c, hybrid ? nodes : 0);
    windowBytes = data + tmax * windowPerToken;
    if (multiNode) {
      stageSlot = epic::ep::window::stagingSlotBytes(d, c);
      stagingPerWarp = epic::ep::window::stagingPerWarp(d, c);
    }
  }
};

/// Fields of the per-rank parameter records, 8 bytes each (pointers, or
/// integers in the low 4 bytes), in the order of their enums. A record is
/// its fields, then (entries with a GEMM) the TMA descriptors (RecordLayout).
// The fields' indices (kX, kRecvX, ...) and names in record order:
// EPRecords.def, which the runtime fills the records from.
using namespace epic::ep::records;

/// A record: `fields` 8-byte fields, then `maps` 128-byte TMA descriptors at
/// a 64-byte aligned offset (where the kernel uses them: the table is a
/// 64-byte aligned kernel parameter and every stride a multiple of 64).
struct RecordLayout {
  int64_t mapsOffset, stride;
  RecordLayout(int64_t fields, int64_t maps)
      : mapsOffset(align(fields * 8, 64)), stride(mapsOffset + maps * 128) {}
};

/// `gemm` reading its parameters from records laid out as `record`.
inline epic::detail::GroupedGemmShape withRecord(epic::detail::GroupedGemmShape gemm,
                                                 const RecordLayout &record) {
  gemm.paramStride = record.stride, gemm.mapsOffset = record.mapsOffset;
  return gemm;
}

/// `base`'s field names followed by `extra`'s.
inline SmallVector<StringRef> fieldNames(ArrayRef<const char *> base,
                                         ArrayRef<const char *> extra = {}) {
  SmallVector<StringRef> names(base.begin(), base.end());
  names.append(extra.begin(), extra.end());
  return names;
}

//===----------------------------------------------------------------------===//
// What each kernel is specialized on
//===----------------------------------------------------------------------===//

struct DispatchShape {
  bool scalePacks, weights, expanded, cached, zeroPadding;
  /// Fused with the grouped GEMM (ep.dispatch_gemm): window offset of the
  /// per-(expert, 128-row tile) arrival counters the copy bumps, or -1.
  int64_t tileDone = -1, maxTiles = 0;
  /// 16-byte chunks per lane the expanded copy keeps in flight.
  int64_t rowUnroll = kDefaultRowUnroll;
  /// An uncached dispatch in one pass (one address space): the send kernel
  /// only counts and takes slots, the scatter kernel places every row.
  bool onePass = false;
};

struct CombineShape {
  bool weights;
  unsigned biases;
  bool expanded;
  /// One address space: one kernel reads every contribution where it lies.
  bool onePass = false;
};

struct GemmCombineScratch {
  int64_t rowToken, pending, colDone, arrivals, maxTiles, columnTiles;
  /// In the 256 bytes at `arrivals`, a cache line apart: the rank barrier,
  /// then the count of row chunks claimed by the rank's warps.
  int64_t claimed() const { return arrivals + 64; }
};

/// Where the fused kernels keep their state, after every layout's window:
/// ep.dispatch_gemm's tile counters ([L][128-row tiles] twice), then
/// ep.gemm_combine's scratch. Disjoint, because each kernel relies on its
/// counters being back at zero from its previous call. ep.moe_layer (FP8,
/// which the fused GEMM ops refuse) keeps its rank barrier's counter and its
/// blocks' exit count where their counters start, a cache line apart.
struct FusedScratch {
  int64_t maxTiles, counters, tileDone, tileConsumed;
  int64_t rowToken, pending, colDone, arrivals, end;
  int64_t layerBarrier, layerExits, layerEnd;

  explicit FusedScratch(ep::ConfigAttr cfg) {
    int64_t window = std::max(EPLayout(cfg, 32).windowBytes, EPLayout(cfg, 64).windowBytes);
    // The fused ops' verifiers ask for a static Tmax.
    int64_t tokens = int64_t(*cfg.getMaxRecvTokens());
    maxTiles = (tokens + epic::detail::kGemmTileM - 1) / epic::detail::kGemmTileM;
    counters = align(int64_t(cfg.getNumLocalExperts()) * maxTiles * 4, 256);
    tileDone = align(window, 256);
    tileConsumed = tileDone + counters;
    rowToken = tileConsumed + counters;
    pending = rowToken + align(int64_t(*cfg.getMaxOutputRows()) * 4, 256);
    colDone = pending + align(tokens * 4, 256);
    arrivals = colDone + counters;
    end = arrivals + 256;
    layerBarrier = tileDone, layerExits = tileDone + 64, layerEnd = tileDone + 256;
  }
};

/// Blocks of each rank that take no tile and send ep.gemm_combine's tokens
/// from the start (the others join them after their last tile).
constexpr int64_t kGemmCombineSendBlocks = 1;
// A rank has at least kGemmCtasPerSm blocks (one SM): some must take tiles.
static_assert(kGemmCombineSendBlocks < epic::detail::kGemmCtasPerSm);

} // namespace epic::expand

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_LAYOUT_H
