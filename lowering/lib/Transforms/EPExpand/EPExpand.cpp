//===- EPExpand.cpp - ep ops to communication kernels ---------------------===//
//
// See EPExpand in Passes.td for the protocol. This file has three parts: the
// byte layout of the window and of the parameter records (EPLayout), a small
// builder for kernel code (KernelBuilder), and the four kernels.
//
//===----------------------------------------------------------------------===//

#include "epic/Transforms/Passes.h"

#include "GroupedGemm.h"

#include "epic/Dialect/Comm/IR/CommDialect.h"
#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/Dialect/EP/IR/EPWindow.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/xxhash.h"

namespace epic {
#define GEN_PASS_DEF_EPEXPAND
#include "epic/Transforms/Passes.h.inc"
} // namespace epic

using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

namespace {

int64_t align(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

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
  /// Tmax, or 0: read from record field `tmaxField` at run time.
  int64_t tmax, tmaxField = -1;
  int64_t elemBytes, idxBytes;
  // Dispatch record: hidden | scale packs | ids (i32 x K) | weights (f32 x K) | token, master.
  int64_t rowBytes, rowPad, packPad, idsOff, weightsOff, tokenOff, record;
  // Combine record: bf16 row | weights (f32 x K).
  int64_t combineRow, combineRecord;
  // Counters (EPWindow.h says what each holds).
  static constexpr int64_t countsIn = epic::ep::window::kCountsIn,
                           expertIn = epic::ep::window::kExpertIn,
                           slots = epic::ep::window::kSlots,
                           expertLocal = epic::ep::window::kExpertLocal,
                           expertCursor = epic::ep::window::kExpertCursor,
                           dispatchDone = epic::ep::window::kDispatchDone,
                           dispatchFlags = epic::ep::window::kDispatchFlags,
                           combineDone = epic::ep::window::kCombineDone,
                           combineFlags = epic::ep::window::kCombineFlags,
                           barrierArrivals = epic::ep::window::kBarrierArrivals,
                           barrierEpochs = epic::ep::window::kBarrierEpochs,
                           data = epic::ep::window::kControlEnd;
  /// The window: `data + tmax * windowPerToken` bytes (windowBytes when
  /// Tmax is static, else just the control region, `data`).
  int64_t windowPerToken, windowBytes;
  /// Bound of every device-side wait (DeepEP's num_gpu_timeout_secs); the
  /// entry function's `epic.timeout_ms` overrides it.
  int64_t timeoutMs = kDefaultTimeoutMs;
  /// Bytes per rank of the parameter table (more for fused entries' fields).
  int64_t paramStride = 128;
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
    elemBytes = cfg.getDtype().getIntOrFloatBitWidth() / 8;
    idxBytes = idxBits / 8;
    epic::ep::window::DispatchRecord d(hidden, elemBytes, packs, topk);
    rowBytes = d.rowBytes, rowPad = d.rowPad, packPad = d.packPad, idsOff = d.idsOff;
    weightsOff = d.weightsOff, tokenOff = d.tokenOff, record = d.bytes;
    epic::ep::window::CombineRecord c(hidden, topk);
    combineRow = c.rowBytes, combineRecord = c.bytes;
    windowPerToken = epic::ep::window::dataBytesPerToken(ranks, topk, d, c);
    windowBytes = data + tmax * windowPerToken;
  }
};

/// Fields of the per-rank parameter records, 8 bytes each (pointers, or
/// integers in the low 4 bytes), in the order of their enums. A record is
/// its fields, then (entries with a GEMM) the TMA descriptors (RecordLayout).
const char *const kDispatchFields[] = {
    "x", "scale_packs", "topk_idx", "topk_weights", "recv_x", "recv_scale_packs",
    "recv_topk_idx", "recv_topk_weights", "recv_src_metadata",
    "psum_num_recv_tokens_per_rank", "num_recv_tokens_per_expert",
    "psum_num_recv_tokens_per_expert", "host_counts", "num_tokens", "dst_buffer_slot_idx",
    "max_tokens_per_rank", "topk_idx_copy"};
enum DispatchField {
  kX, kScalePacks, kTopkIdx, kTopkWeights, kRecvX, kRecvScalePacks, kRecvTopkIdx,
  kRecvTopkWeights, kRecvSrcMetadata, kPsumPerRank, kExpertCounts, kPsumPerExpert,
  kHostCounts, kDispatchNumTokens, kDstSlots, kDispatchMaxTokens, kTopkIdxCopy,
  kNumDispatchFields
};
static_assert(std::size(kDispatchFields) == kNumDispatchFields);
const char *const kCombineFields[] = {
    "x", "topk_weights", "recv_src_metadata", "psum_num_recv_tokens_per_rank", "topk_idx",
    "bias0", "bias1", "combined_x", "combined_topk_weights", "num_tokens",
    "max_tokens_per_rank"};
enum CombineField {
  kCX, kCTopkWeights, kCSrcMetadata, kCPsumPerRank, kCTopkIdx, kCBias0, kCBias1,
  kCCombinedX, kCCombinedWeights, kCNumTokens, kCMaxTokens, kNumCombineFields
};
static_assert(std::size(kCombineFields) == kNumCombineFields);
/// ep.dispatch_gemm: the dispatch's fields, then these.
const char *const kDispatchGemmExtraFields[] = {"experts", "gemm_out"};
enum DispatchGemmField { kDGExperts = kNumDispatchFields, kDGGemmOut, kNumDispatchGemmFields };
/// ep.gemm_combine: the combine's fields ("x" is the GEMM's output), then these.
const char *const kGemmCombineExtraFields[] = {"lhs", "weights",
                                               "psum_num_recv_tokens_per_expert", "num_rows"};
enum GemmCombineField { kGCLhs = kNumCombineFields, kGCWeights, kGCPsumPerExpert, kGCNumRows,
                        kNumGemmCombineFields };

/// A record: `fields` 8-byte fields, then `maps` 128-byte TMA descriptors at
/// a 64-byte aligned offset (where the kernel uses them: the table is a
/// 64-byte aligned kernel parameter and every stride a multiple of 64).
struct RecordLayout {
  int64_t mapsOffset, stride;
  RecordLayout(int64_t fields, int64_t maps)
      : mapsOffset(align(fields * 8, 64)), stride(mapsOffset + maps * 128) {}
};

/// `gemm` reading its parameters from records laid out as `record`.
epic::detail::GroupedGemmShape withRecord(epic::detail::GroupedGemmShape gemm,
                                          const RecordLayout &record) {
  gemm.paramStride = record.stride, gemm.mapsOffset = record.mapsOffset;
  return gemm;
}

/// `base`'s field names followed by `extra`'s.
SmallVector<StringRef> fieldNames(ArrayRef<const char *> base, ArrayRef<const char *> extra = {}) {
  SmallVector<StringRef> names(base.begin(), base.end());
  names.append(extra.begin(), extra.end());
  return names;
}

//===----------------------------------------------------------------------===//
// Kernel builder
//===----------------------------------------------------------------------===//

/// A warp's share of a row split among several warps (KernelBuilder::
/// loopRowParts): `part` of `parts`; both null for a whole row.
struct RowPart {
  Value part, parts;
};

class KernelBuilder {
public:
  KernelBuilder(gpu::GPUFuncOp func, const EPLayout &layout)
      : b(func.getLoc(), func.getContext()), layout(layout) {
    b.setInsertionPointToStart(&func.getBody().front());
    comm = func.getArgument(0);
    window = func.getArgument(1);
    table = func.getArgument(2);
    params = comm::RankParamsOp::create(b, table, layout.paramStride, comm);
    lsa = comm::TeamOp::create(b, comm::TeamType::get(b.getContext()), comm::TeamKind::lsa, comm);
    me = comm::TeamRankOp::create(b, b.getI32Type(), lsa);
    tid = index(gpu::ThreadIdOp::create(b, gpu::Dimension::x));
    threads = index(gpu::BlockDimOp::create(b, gpu::Dimension::x));
    block = index(gpu::BlockIdOp::create(b, gpu::Dimension::x));
    blocks = index(gpu::GridDimOp::create(b, gpu::Dimension::x));
    lane = remu(tid, i32(32));
    Value warp = divu(tid, i32(32));
    Value warpsPerBlock = divu(threads, i32(32));
    // Warp w of block b is the rank's warp w * blocks + b: consecutive work
    // items (tokens, rows, parts of a row) go to different SMs first. Block
    // after block, a decode-sized call's 32 tokens all landed on one SM,
    // whose load/store bandwidth (~200 GB/s) then set the kernel's time.
    globalWarp = add(mul(warp, blocks), block);
    numWarps = mul(blocks, warpsPerBlock);
    if (func.getNumWorkgroupAttributions())
      sharedFlag = func.getWorkgroupAttributions()[0];
    tmax = layout.tmax ? i32(layout.tmax) : intParam(layout.tmaxField);
    // The kernel body goes after this prologue, before gpu.return.
    b.setInsertionPoint(func.getBody().front().getTerminator());
  }

  ImplicitLocOpBuilder b;
  const EPLayout &layout;
  Value comm, window, table, params, lsa, me, tid, threads, block, blocks, lane, globalWarp,
      numWarps, sharedFlag;
  /// Tmax (i32): the configuration's, or the record's `max_tokens_per_rank`.
  Value tmax;

  // --- types and constants (the kernels compute in i32 and i64) -------------
  Type i32T() { return b.getI32Type(); }
  Type i64T() { return b.getI64Type(); }
  Type ptrT() { return LLVM::LLVMPointerType::get(b.getContext(), 1); }
  Value i32(int64_t v) { return arith::ConstantIntOp::create(b, v, 32); }
  Value i64(int64_t v) { return arith::ConstantIntOp::create(b, v, 64); }
  Value index(Value v) { return arith::IndexCastOp::create(b, i32T(), v); }
  Value wide(Value v) {
    return v.getType() == i64T() ? v : arith::ExtSIOp::create(b, i64T(), v).getResult();
  }

  Value add(Value x, Value y) { return arith::AddIOp::create(b, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, x, y); }
  Value divu(Value x, Value y) { return arith::DivUIOp::create(b, x, y); }
  Value remu(Value x, Value y) { return arith::RemUIOp::create(b, x, y); }
  Value divs(Value x, Value y) { return arith::DivSIOp::create(b, x, y); }
  Value rems(Value x, Value y) { return arith::RemSIOp::create(b, x, y); }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) { return arith::CmpIOp::create(b, p, x, y); }
  Value lt(Value x, Value y) { return cmp(arith::CmpIPredicate::slt, x, y); }
  Value eq(Value x, Value y) { return cmp(arith::CmpIPredicate::eq, x, y); }
  Value select(Value c, Value x, Value y) { return arith::SelectOp::create(b, c, x, y); }
  Value andi(Value x, Value y) { return arith::AndIOp::create(b, x, y); }

  // --- memory ---------------------------------------------------------------
  /// `base + bytes` (bytes: i32 or i64).
  Value at(Value base, Value bytes) {
    return LLVM::GEPOp::create(b, base.getType(), b.getI8Type(), base, ValueRange{wide(bytes)});
  }
  Value load(Type type, Value ptr, unsigned alignment) {
    return LLVM::LoadOp::create(b, type, ptr, alignment);
  }
  void store(Value value, Value ptr, unsigned alignment) {
    LLVM::StoreOp::create(b, value, ptr, alignment);
  }
  /// Field `index` of this rank's parameter record.
  Value pointerParam(int64_t field) { return load(ptrT(), at(params, i64(field * 8)), 8); }
  Value intParam(int64_t field) { return load(i32T(), at(params, i64(field * 8)), 8); }
  /// The parameter record of LSA rank `rank` (one address space only: the
  /// virtual backend), and field `index` of a record.
  Value peerParams(Value rank) {
    Value world = comm::TeamToWorldOp::create(b, i32T(), lsa, rank);
    return comm::PeerParamsOp::create(b, table, layout.paramStride, world, comm);
  }
  Value pointerField(Value record, int64_t field) {
    return load(ptrT(), at(record, i64(field * 8)), 8);
  }
  Value local(Value bytes) { return comm::LocalPtrOp::create(b, ptrT(), window, wide(bytes)); }
  Value peer(Value bytes, Value rank) {
    return comm::PeerPtrOp::create(b, ptrT(), window, wide(bytes), lsa, rank);
  }
  /// Element `index` (i32: EPLimits.def keeps every index the kernels compute
  /// below 2^31) of `bytes` each at `base`, with a 64-bit byte offset.
  Value elementAt(Value base, Value index, int64_t bytes) {
    return at(base, mul(wide(index), i64(bytes)));
  }
  /// Element `element` of the top-k id array at `ids` (the layout's index
  /// type): the i32 `id`, widened or narrowed.
  void storeTopkId(Value id, Value ids, Value element) {
    Type idxType = b.getIntegerType(layout.idxBytes * 8);
    if (layout.idxBytes > 4)
      id = arith::ExtSIOp::create(b, idxType, id);
    else if (layout.idxBytes < 4)
      id = arith::TruncIOp::create(b, idxType, id);
    store(id, elementAt(ids, element, layout.idxBytes), layout.idxBytes);
  }
  /// `x` rounded up to a multiple of `a`.
  Value alignUp(Value x, int64_t a) { return mul(divu(add(x, i32(a - 1)), i32(a)), i32(a)); }
  /// An i32 element `index` of the array at `ptr`.
  Value loadI32(Value ptr, Value index) { return load(i32T(), elementAt(ptr, index, 4), 4); }
  void storeI32(Value v, Value ptr, Value index) { store(v, elementAt(ptr, index, 4), 4); }
  Value counter(int64_t offset, Value index) {
    return local(add(i32(offset), mul(index, i32(4))));
  }

  // --- control flow ---------------------------------------------------------
  /// for (iv = lb; iv < ub; iv += step), i32 bounds.
  void loop(Value lb, Value ub, Value step, function_ref<void(Value)> body) {
    auto op = scf::ForOp::create(b, lb, ub, step);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    body(op.getInductionVar());
  }
  void when(Value cond, function_ref<void()> body) {
    auto op = scf::IfOp::create(b, cond, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    body();
  }
  Value choose(Value cond, Type type, function_ref<Value()> then, function_ref<Value()> otherwise) {
    auto op = scf::IfOp::create(b, TypeRange{type}, cond, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    scf::YieldOp::create(b, then());
    b.setInsertionPointToStart(op.elseBlock());
    scf::YieldOp::create(b, otherwise());
    return op.getResult(0);
  }
  void barrier() { gpu::BarrierOp::create(b); }

  // --- warp -----------------------------------------------------------------
  Value fullMask() { return i32(-1); }
  Value shuffle(Value v, Value srcLane) {
    return gpu::ShuffleOp::create(b, v, srcLane, i32(32), gpu::ShuffleMode::IDX).getShuffleResult();
  }
  /// A global pointer of lane `srcLane` (two 32-bit shuffles).
  Value shufflePointer(Value ptr, Value srcLane) {
    Value bits = LLVM::PtrToIntOp::create(b, i64T(), ptr);
    Value low = shuffle(arith::TruncIOp::create(b, i32T(), bits), srcLane);
    Value high = shuffle(arith::TruncIOp::create(b, i32T(), arith::ShRUIOp::create(b, bits, i64(32))),
                         srcLane);
    Value joined = arith::OrIOp::create(b, arith::ExtUIOp::create(b, i64T(), low),
                                        arith::ShLIOp::create(b, arith::ExtUIOp::create(b, i64T(), high),
                                                              i64(32)));
    return LLVM::IntToPtrOp::create(b, ptrT(), joined);
  }
  Value ballot(Value pred) {
    return NVVM::VoteSyncOp::create(b, i32T(), fullMask(), pred, NVVM::VoteSyncKind::ballot);
  }
  Value matchAny(Value v) {
    return NVVM::MatchSyncOp::create(b, i32T(), fullMask(), v, NVVM::MatchSyncKind::any);
  }
  Value ctlz(Value v) { return LLVM::CountLeadingZerosOp::create(b, i32T(), v, false); }
  Value cttz(Value v) { return LLVM::CountTrailingZerosOp::create(b, i32T(), v, false); }
  Value popc(Value v) { return LLVM::CtPopOp::create(b, i32T(), v); }

  /// For each set bit of the warp-uniform `mask`, lowest first: `body(lane)`
  /// with the whole warp.
  void forEachLane(Value mask, function_ref<void(Value)> body) {
    auto loop = scf::WhileOp::create(b, TypeRange{i32T()}, ValueRange{mask});
    OpBuilder::InsertionGuard guard(b);
    Block *before = b.createBlock(&loop.getBefore(), {}, {i32T()}, {b.getLoc()});
    Value pending = before->getArgument(0);
    scf::ConditionOp::create(b, cmp(arith::CmpIPredicate::ne, pending, i32(0)), ValueRange{pending});
    Block *after = b.createBlock(&loop.getAfter(), {}, {i32T()}, {b.getLoc()});
    pending = after->getArgument(0);
    body(cttz(pending));
    scf::YieldOp::create(b, ValueRange{andi(pending, sub(pending, i32(1)))});
  }

  /// The 16-byte chunks of a row of `bytes` (a multiple of 16) that a lane
  /// handles, `unroll` at a time: chunk `first + 32 u` of each group. `body`
  /// gets their byte offsets and, unless every group lies inside the row,
  /// whether each chunk does (else `inRange` is empty). With `warpUniform`
  /// every lane of the warp makes the same number of steps, so `body` may
  /// shuffle; otherwise lanes start at their own chunk.
  ///
  /// A row split into `parts` (RowParts): this warp takes groups `part`,
  /// `part + parts`, ... of it.
  void forEachChunkGroup(int64_t bytes, int64_t unroll, bool warpUniform,
                         function_ref<void(ArrayRef<Value>, ArrayRef<Value>)> body,
                         const RowPart &share = {}) {
    const int64_t chunks = bytes / 16;
    const bool whole = chunks % (32 * unroll) == 0; // no lane runs past the end
    Value start = warpUniform ? i32(0) : lane, step = i32(32 * unroll);
    if (share.parts) {
      start = add(start, mul(share.part, step));
      step = mul(step, share.parts);
    }
    loop(start, i32(chunks), step, [&](Value group) {
      Value first = warpUniform ? add(group, lane) : group;
      SmallVector<Value> offsets, inRange;
      for (int64_t u = 0; u < unroll; ++u) {
        // The constant part is added after widening: the chunks of a group
        // share one address register and differ by immediate offsets.
        offsets.push_back(add(wide(mul(first, i32(16))), i64(32 * 16 * u)));
        if (!whole)
          inRange.push_back(lt(add(first, i32(32 * u)), i32(chunks)));
      }
      body(offsets, inRange);
    });
  }
  /// The chunks at `base + offsets[u]`, all loads issued before any use (a
  /// zero vector where a chunk is out of range).
  SmallVector<Value> loadChunks(VectorType type, Value base, ArrayRef<Value> offsets,
                                ArrayRef<Value> inRange) {
    SmallVector<Value> values;
    for (size_t u = 0; u < offsets.size(); ++u) {
      auto read = [&]() -> Value { return load(type, at(base, offsets[u]), 16); };
      values.push_back(inRange.empty() ? read() : choose(inRange[u], type, read, [&]() -> Value {
        return arith::ConstantOp::create(b, type, b.getZeroAttr(type));
      }));
    }
    return values;
  }
  void storeChunks(Value base, ArrayRef<Value> values, ArrayRef<Value> offsets,
                   ArrayRef<Value> inRange) {
    for (size_t u = 0; u < values.size(); ++u) {
      if (inRange.empty())
        store(values[u], at(base, offsets[u]), 16);
      else
        when(inRange[u], [&] { store(values[u], at(base, offsets[u]), 16); });
    }
  }

  /// The warp copies `bytes` (a multiple of 16) from `src` to `dst`. Each
  /// lane issues kCopyUnroll 16-byte loads before their stores: a store waits
  /// for its load, so one load at a time would leave a row copy latency bound.
  static constexpr int64_t kCopyUnroll = 4;
  void copyRow(Value dst, Value src, int64_t bytes, const RowPart &share = {}) {
    auto vec = VectorType::get({4}, i32T());
    forEachChunkGroup(bytes, kCopyUnroll, /*warpUniform=*/false,
                      [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
      storeChunks(dst, loadChunks(vec, src, offsets, inRange), offsets, inRange);
    }, share);
  }

  /// The warp copies `bytes` from `src` to `dst(bit)` for each set bit of the
  /// warp-uniform `mask`: each group of chunks is loaded once and stored to
  /// every destination (an expanded dispatch writes a record to one row per
  /// local expert of its token).
  void copyRowToEach(Value src, int64_t bytes, Value mask, function_ref<Value(Value)> dst,
                     int64_t unroll = kCopyUnroll) {
    auto vec = VectorType::get({4}, i32T());
    forEachChunkGroup(bytes, unroll, /*warpUniform=*/true,
                      [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
      SmallVector<Value> values = loadChunks(vec, src, offsets, inRange);
      forEachLane(mask, [&](Value bit) { storeChunks(dst(bit), values, offsets, inRange); });
    });
  }

  /// Sums bf16 rows in fp32 into the bf16 row at `dst`: per group of
  /// kSumChunks 16-byte chunks of a lane, from +0.0, the rows `firstRows` in
  /// order, then the rows of the set bits of the warp-uniform `mask` in
  /// increasing bit order (`row(bit)`: the row's base), rounded once. The row
  /// loop issues a group's loads of a row before adding them, and absent rows
  /// cost nothing, which matters when few of the K slots are present.
  static constexpr int64_t kSumChunks = 4;
  void sumMaskedRows(Value dst, int64_t bytes, Value mask, function_ref<Value(Value)> row,
                     ArrayRef<Value> firstRows = {}, const RowPart &share = {}) {
    auto chunkF32 = VectorType::get({8}, b.getF32Type());
    auto chunkBF16 = VectorType::get({8}, b.getBF16Type());
    auto addRow = [&](ArrayRef<Value> sums, ArrayRef<Value> values) {
      SmallVector<Value> next;
      for (auto [sum, value] : llvm::zip(sums, values))
        next.push_back(arith::AddFOp::create(b, sum, arith::ExtFOp::create(b, chunkF32, value)));
      return next;
    };
    forEachChunkGroup(bytes, kSumChunks, /*warpUniform=*/true,
                      [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
      SmallVector<Value> sums(kSumChunks, arith::ConstantOp::create(b, chunkF32,
                                                                    b.getZeroAttr(chunkF32)));
      for (Value first : firstRows)
        sums = addRow(sums, loadChunks(chunkBF16, first, offsets, inRange));
      // while (pending) { j = lowest bit; sums += row j; pending &= pending - 1 }
      SmallVector<Type> types(kSumChunks + 1, chunkF32);
      types[0] = i32T();
      SmallVector<Value> state{mask};
      state.append(sums);
      auto rows = scf::WhileOp::create(b, types, state);
      {
        OpBuilder::InsertionGuard guard(b);
        SmallVector<Location> locs(types.size(), b.getLoc());
        Block *before = b.createBlock(&rows.getBefore(), {}, types, locs);
        scf::ConditionOp::create(b, cmp(arith::CmpIPredicate::ne, before->getArgument(0), i32(0)),
                                 before->getArguments());
        Block *after = b.createBlock(&rows.getAfter(), {}, types, locs);
        Value pending = after->getArgument(0);
        SmallVector<Value> values = loadChunks(chunkBF16, row(cttz(pending)), offsets, inRange);
        SmallVector<Value> next{andi(pending, sub(pending, i32(1)))};
        SmallVector<Value> carried(after->getArguments().drop_front());
        next.append(addRow(carried, values));
        scf::YieldOp::create(b, next);
      }
      SmallVector<Value> rounded;
      for (Value sum : rows.getResults().drop_front())
        rounded.push_back(arith::TruncFOp::create(b, chunkBF16, sum));
      storeChunks(dst, rounded, offsets, inRange);
    }, share);
  }

  /// Rows [0, n) over the grid's warps. When warps outnumber rows, each row
  /// is split into `parts` shares of its chunk groups, taken by different
  /// warps: a row copied by one warp costs one memory round trip per group
  /// in turn, which leaves decode-sized calls latency bound. `parts` (run
  /// time) is the largest power of two <= min(maxParts, warps / n); `body`
  /// gets the row and this warp's share, and does the row's other work only
  /// in part 0 (inFirstPart). With maxParts 1 it is the one-warp-per-row
  /// loop.
  void loopRowParts(Value n, int64_t maxParts, function_ref<void(Value, const RowPart &)> body) {
    if (maxParts <= 1) {
      loop(globalWarp, n, numWarps, [&](Value row) { body(row, RowPart{}); });
      return;
    }
    Value q = divu(numWarps, select(lt(n, i32(1)), i32(1), n));
    q = select(lt(q, i32(maxParts)), q, i32(maxParts));
    Value log = select(lt(q, i32(2)), i32(0), sub(i32(31), ctlz(q)));
    Value parts = arith::ShLIOp::create(b, i32(1), log);
    loop(globalWarp, arith::ShLIOp::create(b, n, log), numWarps, [&](Value item) {
      Value row = arith::ShRUIOp::create(b, item, log);
      body(row, RowPart{andi(item, sub(parts, i32(1))), parts});
    });
  }
  /// The most chunks per lane in flight, in (kCopyUnroll, most], that tile a
  /// row of `bytes` exactly (no range checks, no half-empty last group), or
  /// 0 if none does.
  static int64_t tilingUnroll(int64_t bytes, int64_t most) {
    for (int64_t unroll = most; unroll > kCopyUnroll; --unroll)
      if ((bytes / 16) % (32 * unroll) == 0)
        return unroll;
    return 0;
  }
  /// Chunks per lane in flight for a row read once and stored to several
  /// places: up to 8 that tile it (FP8 V3 rows: 7 x 2 groups instead of
  /// 4 x 3.5), else kCopyUnroll.
  static int64_t wholeRowUnroll(int64_t bytes) {
    int64_t unroll = tilingUnroll(bytes, 8);
    return unroll ? unroll : kCopyUnroll;
  }
  /// The most useful parts of a row of `bytes` copied `unroll` chunks per lane
  /// at a time: its chunk groups, rounded down to a power of two.
  static int64_t maxRowParts(int64_t bytes, int64_t unroll) {
    int64_t groups = (bytes / 16 + 32 * unroll - 1) / (32 * unroll);
    return groups >= 1 ? int64_t(llvm::bit_floor(uint64_t(groups))) : 1;
  }
  /// Whether this warp does a split row's other work (part 0), and `body` in it.
  Value isFirstPart(const RowPart &share) {
    return share.parts ? eq(share.part, i32(0)) : arith::ConstantIntOp::create(b, 1, 1).getResult();
  }
  void inFirstPart(const RowPart &share, function_ref<void()> body) {
    if (!share.parts)
      return body();
    when(isFirstPart(share), body);
  }

  /// One warp's inclusive prefix sums of `n` (static) i32 terms: lane j takes
  /// the run [j c, j c + c) (c = ceil(n / 32)), reads all of its terms
  /// (`term(i)`: the term and a value carried to `store`) before adding any,
  /// the runs' totals are scanned with shuffles, then `store(i, inclusive
  /// sum, carried)` for each index. Returns the total, in every lane. A
  /// thread-0 loop costs a dependent load per term (256 experts: microseconds).
  Value warpInclusiveScan(int64_t n, function_ref<std::pair<Value, Value>(Value)> term,
                          function_ref<void(Value, Value, Value)> store) {
    const int64_t c = (n + 31) / 32;
    const bool whole = n == 32 * c;
    SmallVector<Value> index, terms, carried, inRange;
    Value run = i32(0);
    for (int64_t u = 0; u < c; ++u) {
      Value i = add(mul(lane, i32(c)), i32(u));
      Value ok = whole ? Value() : lt(i, i32(n));
      std::pair<Value, Value> t;
      if (whole) {
        t = term(i);
      } else {
        auto op = scf::IfOp::create(b, TypeRange{i32T(), i32T()}, ok, /*withElseRegion=*/true);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(op.thenBlock());
        auto [value, extra] = term(i);
        scf::YieldOp::create(b, ValueRange{value, extra ? extra : i32(0)});
        b.setInsertionPointToStart(op.elseBlock());
        scf::YieldOp::create(b, ValueRange{i32(0), i32(0)});
        t = {op.getResult(0), op.getResult(1)};
      }
      index.push_back(i);
      inRange.push_back(ok);
      terms.push_back(t.first);
      carried.push_back(t.second);
      run = add(run, t.first);
    }
    Value scan = run;
    for (int64_t d = 1; d < 32; d *= 2) {
      Value up = gpu::ShuffleOp::create(b, scan, i32(d), i32(32), gpu::ShuffleMode::UP)
                     .getShuffleResult();
      scan = select(cmp(arith::CmpIPredicate::sge, lane, i32(d)), add(scan, up), scan);
    }
    Value total = shuffle(scan, i32(31));
    Value sum = sub(scan, run); // before this lane's run
    for (int64_t u = 0; u < c; ++u) {
      sum = add(sum, terms[u]);
      Value at = sum, extra = carried[u], i = index[u];
      if (whole)
        store(i, at, extra);
      else
        when(inRange[u], [&] { store(i, at, extra); });
    }
    return total;
  }

  /// The routing of token `t` in this warp: lane j < K holds expert id e_j
  /// (i32, -1 = none) and its destination rank (-1 if none); the master lanes
  /// (the highest slot of each destination) and their ballot.
  struct Routing {
    Value expert, valid, dst, masterLane, isMaster, masters;
  };
  Routing route(Value topkIdx, Value token) {
    Routing r;
    Value inTopk = lt(lane, i32(layout.topk));
    Type idxType = b.getIntegerType(layout.idxBytes * 8);
    r.expert = choose(inTopk, i32T(), [&]() -> Value {
      Value element = add(mul(token, i32(layout.topk)), lane);
      Value raw = load(idxType, elementAt(topkIdx, element, layout.idxBytes), layout.idxBytes);
      if (layout.idxBytes == 4)
        return raw;
      return layout.idxBytes > 4 ? arith::TruncIOp::create(b, i32T(), raw).getResult()
                                 : arith::ExtSIOp::create(b, i32T(), raw).getResult();
    }, [&]() -> Value { return i32(-1); });
    r.valid = cmp(arith::CmpIPredicate::sge, r.expert, i32(0));
    r.dst = select(r.valid, divs(r.expert, i32(layout.local)), i32(-1));
    Value group = matchAny(r.dst);
    r.masterLane = sub(i32(31), ctlz(group));
    r.isMaster = andi(r.valid, eq(lane, r.masterLane));
    r.masters = ballot(r.isMaster);
    return r;
  }

  /// Thread 0 counts this block's arrival (acq_rel, system scope, so the
  /// whole block's writes are ordered before it); every thread learns
  /// whether this block was the rank's last.
  Value lastBlockOfRank(int64_t counterOffset) {
    Value memref = sharedFlag;
    Value zero = arith::ConstantIndexOp::create(b, 0);
    barrier();
    when(eq(tid, i32(0)), [&] {
      Value old = comm::AtomicRMWOp::create(b, i32T(), comm::AtomicKind::add, comm::Ordering::acq_rel,
                                            comm::Scope::sys, i32(1), local(i32(counterOffset)));
      Value last = arith::ExtUIOp::create(b, i32T(), eq(old, sub(blocks, i32(1))));
      memref::StoreOp::create(b, last, memref, ValueRange{zero});
    });
    barrier();
    return eq(memref::LoadOp::create(b, memref, ValueRange{zero}), i32(1));
  }

  /// Block b of every rank meets block b of every other rank, so remote
  /// buffers are free. Built from comm ops rather than comm.barrier so that
  /// the wait is bounded on every backend (NCCL 2.28's LSA barrier is not):
  /// lanes of warp 0 add 1 (release, system scope) to arrival counter b of
  /// every rank, one rank each (a release costs a system-scope fence: one
  /// thread looping over 8 ranks paid eight in turn), then thread 0 bumps its
  /// own epoch and waits (bounded acquire) until its own counter reaches
  /// ranks * epoch. Counters only grow, so nothing is reset.
  ///
  /// Block 0 also checks that every rank entered the same op: before its
  /// arrival each lane stores the op's signature (the configuration and
  /// variant, ep-expand's constant, with the grid and the token cap) into
  /// its peer's cell for this rank, released by the arrival; after the
  /// barrier the lanes compare every rank's cell with their own signature
  /// (comm.agree traps naming both ranks). Ranks that called different ops,
  /// or the same with another num_sms, would otherwise wait for blocks that
  /// never come, or read records of another layout.
  void entryBarrier() {
    Value slot = mul(wide(block), i64(8));
    Value epochCell = local(add(i64(layout.barrierEpochs), slot));
    Value checks = eq(block, i32(0));
    // This barrier's parity: its epoch (the cell's next value) modulo 2.
    Value parity = arith::AndIOp::create(b, add(load(i64T(), epochCell, 8), i64(1)), i64(1));
    Value cells = add(i64(epic::ep::window::kOpSignatures),
                      mul(parity, i64(epic::ep::limits::kMaxRanks * 8)));
    Value signature = opSignature();
    barrier(); // the block's earlier writes, before warp 0's releases
    when(lt(tid, i32(32)), [&] {
      loop(lane, i32(layout.ranks), i32(32), [&](Value peerRank) {
        when(checks, [&] {
          comm::StoreOp::create(b, comm::Ordering::relaxed, comm::Scope::sys, signature,
                                peer(add(cells, mul(wide(me), i64(8))), peerRank));
        });
        comm::RedOp::create(b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::sys,
                            i64(1), peer(add(i64(layout.barrierArrivals), slot), peerRank));
      });
    });
    when(eq(tid, i32(0)), [&] {
      Value epoch = add(load(i64T(), epochCell, 8), i64(1));
      store(epoch, epochCell, 8);
      comm::WaitFlagOp::create(b, i64T(), local(add(i64(layout.barrierArrivals), slot)),
                               comm::Predicate::ge, mul(epoch, i64(layout.ranks)), me, Value(),
                               comm::Scope::sys, layout.timeoutMs);
    });
    barrier(); // what thread 0 acquired, for the whole block
    when(andi(checks, lt(tid, i32(32))), [&] {
      loop(lane, i32(layout.ranks), i32(32), [&](Value source) {
        Value theirs = comm::LoadOp::create(b, i64T(), comm::Ordering::relaxed, comm::Scope::sys,
                                            local(add(cells, mul(wide(source), i64(8)))));
        comm::AgreeOp::create(b, signature, theirs, me, source);
      });
    });
  }

  /// What every rank's op must agree on: ep-expand's signature of the
  /// configuration and variant, the blocks per rank and the token cap.
  Value opSignature() {
    // Odd multipliers (splitmix64's): distinct grids and caps move the value.
    Value grid = mul(wide(blocks), i64(int64_t(0x9E3779B97F4A7C15ULL)));
    Value cap = mul(wide(tmax), i64(int64_t(0xBF58476D1CE4E5B9ULL)));
    return arith::XOrIOp::create(b, i64(layout.signature), add(grid, cap));
  }
};

gpu::GPUFuncOp createKernel(OpBuilder &builder, Location loc, StringRef name, bool sharedFlag) {
  MLIRContext *ctx = builder.getContext();
  // The parameter table is a generic pointer: the kernel parameter itself
  // (comm.param_table, set by expand()), passed by value.
  Type types[] = {comm::DevCommType::get(ctx), comm::WindowType::get(ctx),
                  LLVM::LLVMPointerType::get(ctx)};
  auto func = gpu::GPUFuncOp::create(builder, loc, name, builder.getFunctionType(types, {}));
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), builder.getUnitAttr());
  if (sharedFlag) {
    auto space = gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
    func.addWorkgroupAttribution(MemRefType::get({1}, builder.getI32Type(), nullptr, space), loc);
  }
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&func.getBody().front());
  gpu::ReturnOp::create(builder, loc);
  return func;
}

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

struct DispatchShape {
  bool scalePacks, weights, expanded, cached, zeroPadding;
  /// Fused with the grouped GEMM (ep.dispatch_gemm): window offset of the
  /// per-(expert, 128-row tile) arrival counters the copy bumps, or -1.
  int64_t tileDone = -1, maxTiles = 0;
  /// 16-byte chunks per lane the expanded copy keeps in flight.
  int64_t rowUnroll = KernelBuilder::kCopyUnroll;
};

/// The fused copy's chunks in flight per lane: its blocks are the GEMM's (8
/// warps per SM, not 32), so each warp must keep more of a row in flight to
/// stay bandwidth bound, and the GEMM's register budget (~200) pays for it.
/// The most, up to 16, that tiles the row exactly (no range checks), else 8
/// (with range checks) for rows of at least 256 chunks.
int64_t fusedRowUnroll(int64_t rowBytes) {
  if (int64_t unroll = KernelBuilder::tilingUnroll(rowBytes, 16))
    return unroll;
  return rowBytes / 16 >= 32 * 8 ? 8 : KernelBuilder::kCopyUnroll;
}

/// Each peer gets flag 1 (release) from the rank's last block or warp
/// (threads `first`, `first + step`, ...: the block's by default), which then waits
/// (bounded acquire) for every peer's flag and resets it: all the records
/// peers sent this rank have landed.
void exchangeDoneFlags(KernelBuilder &k, int64_t flagsOffset, Value first = {},
                       Value step = {}) {
  const EPLayout &L = k.layout;
  if (!first) // the whole block
    first = k.tid, step = k.threads;
  k.loop(first, k.i32(L.ranks), step, [&](Value dst) {
    comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, k.i32(1),
                          k.peer(k.add(k.i32(flagsOffset), k.mul(k.me, k.i32(4))), dst));
  });
  k.loop(first, k.i32(L.ranks), step, [&](Value src) {
    Value cell = k.counter(flagsOffset, src);
    comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::eq, k.i32(1), k.me, src,
                             comm::Scope::sys, k.layout.timeoutMs);
    comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
  });
}

/// What the kernels that walk a rank's own tokens read from its record.
struct TokenInputs {
  Value numTokens, x, topkIdx, scalePacks;
  /// The slot of every (token, master slot): written by an uncached send,
  /// replayed by a cached dispatch (which has no count exchange).
  Value dstSlots;
  TokenInputs(KernelBuilder &k, const DispatchShape &shape)
      : numTokens(k.intParam(kDispatchNumTokens)), x(k.pointerParam(kX)),
        topkIdx(k.pointerParam(kTopkIdx)),
        scalePacks(shape.scalePacks ? k.pointerParam(kScalePacks) : Value()),
        dstSlots(k.pointerParam(kDstSlots)) {}
};

/// What the dispatch send reads of a token before it routes it: everything
/// its records hold, loaded at once, so that these loads are in flight while
/// the routing is read and the slots are taken, and each destination's record
/// is then only stores (reading them per destination cost a memory round trip
/// each: three per destination rank, on top of the row's groups in turn).
struct TokenReads {
  /// The row, when it is one group of at most kMaxHeldChunks 16-byte chunks
  /// per lane (chunk `lane + 32 u` at rowOffsets[u]); else empty, and the row
  /// is copied group by group.
  SmallVector<Value> row, rowOffsets;
  /// Scale pack `lane + 32 u` (where packInRange[u]).
  SmallVector<Value> packs, packInRange;
  /// The weight of slot `lane` (lane < K; null without weights).
  Value weight;
};
/// 32 registers of a lane (1024-thread blocks leave 64 per thread): FP8 rows
/// up to 4 KiB, bf16 rows up to 2 Ki wide.
constexpr int64_t kMaxHeldChunks = 8;

TokenReads readToken(KernelBuilder &k, const DispatchShape &shape, Value x, Value scalePacks,
                     Value weights, Value token) {
  const EPLayout &L = k.layout;
  TokenReads reads;
  const int64_t chunks = L.rowBytes / 16;
  if (chunks % 32 == 0 && chunks / 32 <= kMaxHeldChunks) {
    Value laneBytes = k.wide(k.mul(k.lane, k.i32(16)));
    for (int64_t u = 0; u < chunks / 32; ++u)
      reads.rowOffsets.push_back(k.add(laneBytes, k.i64(32 * 16 * u)));
    reads.row = k.loadChunks(VectorType::get({4}, k.i32T()),
                             k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), reads.rowOffsets, {});
  }
  if (shape.scalePacks) {
    for (int64_t u = 0; u * 32 < L.packs; ++u) {
      Value p = k.add(k.lane, k.i32(32 * u));
      Value inRange = k.lt(p, k.i32(L.packs));
      reads.packInRange.push_back(inRange);
      reads.packs.push_back(k.choose(inRange, k.i32T(), [&]() -> Value {
        return k.loadI32(scalePacks, k.add(k.mul(token, k.i32(L.packs)), p));
      }, [&]() -> Value { return k.i32(0); }));
    }
  }
  if (shape.weights) {
    FloatType f32 = k.b.getF32Type();
    reads.weight = k.choose(k.lt(k.lane, k.i32(L.topk)), f32, [&]() -> Value {
      return k.load(f32, k.elementAt(weights, k.add(k.mul(token, k.i32(L.topk)), k.lane), 4), 4);
    }, [&]() -> Value { return arith::ConstantFloatOp::create(k.b, f32, APFloat(0.0f)); });
  }
  return reads;
}

void buildDispatchSend(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  KernelBuilder k(func, L);
  TokenInputs in(k, shape);
  Value numTokens = in.numTokens, x = in.x, topkIdx = in.topkIdx, scalePacks = in.scalePacks,
        dstSlots = in.dstSlots;
  Value weights = shape.weights ? k.pointerParam(kTopkWeights) : Value();
  // DeepEP's do_handle_copy: the handle's own copy of the routing (i64), or null.
  Value idxCopy = shape.cached ? Value() : k.pointerParam(kTopkIdxCopy);
  Value copyIds = shape.cached ? Value()
                               : k.cmp(arith::CmpIPredicate::ne,
                                       LLVM::PtrToIntOp::create(k.b, k.i64T(), idxCopy), k.i64(0));
  k.entryBarrier();

  // One warp per token: send it once to each destination rank.
  k.loop(k.globalWarp, numTokens, k.numWarps, [&](Value token) {
    TokenReads reads = readToken(k, shape, x, scalePacks, weights, token);
    auto r = k.route(topkIdx, token);
    Value slotCell = k.add(k.mul(token, k.i32(L.topk)), k.lane);
    if (!shape.cached) {
      // The routing into the handle's copy as it was given (the warp read it).
      k.when(k.andi(copyIds, k.lt(k.lane, k.i32(L.topk))), [&] {
        Type idxType = k.b.getIntegerType(L.idxBytes * 8);
        Value id = k.load(idxType, k.elementAt(topkIdx, slotCell, L.idxBytes), L.idxBytes);
        if (L.idxBytes < 8)
          id = arith::ExtSIOp::create(k.b, k.i64T(), id);
        k.store(id, k.elementAt(idxCopy, slotCell, 8), 8);
      });
      // Per-(destination rank, local expert) counts of this rank's tokens.
      k.when(r.valid, [&] {
        Value slot = k.add(k.mul(r.dst, k.i32(L.local)), k.remu(r.expert, k.i32(L.local)));
        comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::relaxed, comm::Scope::gpu,
                            k.i32(1), k.counter(L.expertLocal, slot));
      });
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] { k.storeI32(k.i32(-1), dstSlots, slotCell); });
    }
    // Each master lane takes its slot at its destination (all at once), and
    // the address of record [me][slot] of the destination's receive region.
    Value myRecord = k.choose(r.isMaster, k.ptrT(), [&]() -> Value {
      Value slot;
      if (shape.cached) {
        slot = k.loadI32(dstSlots, slotCell);
      } else {
        slot = comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                         comm::Ordering::relaxed, comm::Scope::gpu, k.i32(1),
                                         k.counter(L.slots, r.dst));
        k.storeI32(slot, dstSlots, slotCell);
      }
      Value index = k.add(k.mul(k.wide(k.me), k.wide(k.tmax)), k.wide(slot));
      return k.peer(k.add(k.i64(L.data), k.mul(index, k.i64(L.record))), r.dst);
    }, [&]() -> Value { return LLVM::ZeroOp::create(k.b, k.ptrT()); });
    // The row is stored to every destination's record (read once: above, or
    // group by group here when it is too wide to hold); then each record's
    // scale packs, ids, weights, token and master slot.
    if (reads.row.empty())
      k.copyRowToEach(k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), L.rowBytes, r.masters,
                      [&](Value master) { return k.shufflePointer(myRecord, master); },
                      KernelBuilder::wholeRowUnroll(L.rowBytes));
    k.forEachLane(r.masters, [&](Value master) {
      Value record = k.shufflePointer(myRecord, master);
      if (!reads.row.empty())
        k.storeChunks(record, reads.row, reads.rowOffsets, {});
      for (auto [u, v] : llvm::enumerate(reads.packs)) {
        Value p = k.add(k.lane, k.i32(32 * int64_t(u)));
        k.when(reads.packInRange[u], [&] { k.storeI32(v, k.at(record, k.i32(L.rowPad)), p); });
      }
      k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
        k.storeI32(r.expert, k.at(record, k.i32(L.idsOff)), k.lane);
        if (reads.weight)
          k.store(reads.weight, k.at(record, k.add(k.i32(L.weightsOff), k.mul(k.lane, k.i32(4)))), 4);
      });
      k.when(k.eq(k.lane, k.i32(0)), [&] {
        k.store(token, k.at(record, k.i32(L.tokenOff)), 4);
        k.store(master, k.at(record, k.i32(L.tokenOff + 4)), 4);
      });
    });
  });

  Value last = k.lastBlockOfRank(L.dispatchDone);
  if (shape.cached) {
    // The counts are the handle's: only say that everything was sent.
    k.when(last, [&] {
      k.when(k.eq(k.tid, k.i32(0)), [&] {
        comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0),
                              k.local(k.i32(L.dispatchDone)));
      });
      exchangeDoneFlags(k, L.dispatchFlags);
    });
    return;
  }
  // The rank's last block exchanges the counts.
  k.when(last, [&] {
    Value psumPerRank = k.pointerParam(kPsumPerRank);
    Value expertCounts = k.pointerParam(kExpertCounts);
    Value psumPerExpert = k.pointerParam(kPsumPerExpert);
    Value hostCounts = k.pointerParam(kHostCounts);
    // Per-expert counts to each destination (relaxed), then the token
    // counts encoded as -c-1 with release: a peer that sees a count sees
    // the expert counts and every record this rank sent it.
    k.loop(k.tid, k.i32(L.ranks * L.local), k.threads, [&](Value i) {
      Value from = k.counter(L.expertLocal, i);
      Value v = comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, from);
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), from);
      Value dst = k.divu(i, k.i32(L.local));
      Value slot = k.add(k.mul(k.me, k.i32(L.local)), k.remu(i, k.i32(L.local)));
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::sys, v,
                            k.peer(k.add(k.i32(L.expertIn), k.mul(slot, k.i32(4))), dst));
    });
    k.barrier();
    k.loop(k.tid, k.i32(L.ranks), k.threads, [&](Value dst) {
      Value from = k.counter(L.slots, dst);
      Value c = comm::LoadOp::create(k.b, k.i32T(), comm::Ordering::relaxed, comm::Scope::gpu, from);
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), from);
      Value encoded = k.sub(k.i32(-1), c);
      comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, encoded,
                            k.peer(k.add(k.i32(L.countsIn), k.mul(k.me, k.i32(4))), dst));
    });
    k.when(k.eq(k.tid, k.i32(0)), [&] {
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0),
                            k.local(k.i32(L.dispatchDone)));
    });
    // The copy epilogue of the previous call is over: its row cursors can go back to zero.
    k.loop(k.tid, k.i32(L.local), k.threads, [&](Value e) {
      k.storeI32(k.i32(0), k.local(k.i32(L.expertCursor)), e);
    });
    // Every source's count (bounded acquire wait), reset for the next call.
    k.loop(k.tid, k.i32(L.ranks), k.threads, [&](Value src) {
      Value cell = k.counter(L.countsIn, src);
      Value seen = comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::ne, k.i32(0),
                                            k.me, src, comm::Scope::sys, L.timeoutMs);
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
      k.storeI32(k.sub(k.i32(-1), seen), psumPerRank, src);
    });
    k.barrier();
    // Warp 0: the inclusive prefix sums per source rank and per local expert
    // (of the counts rounded up to the alignment), the experts' counts
    // (summed over sources, their cells reset) and the host-visible counts.
    k.when(k.lt(k.tid, k.i32(32)), [&] {
      Value received = k.warpInclusiveScan(L.ranks, [&](Value src) {
        return std::pair<Value, Value>{k.loadI32(psumPerRank, src), Value()};
      }, [&](Value src, Value total, Value) { k.storeI32(total, psumPerRank, src); });
      k.when(k.eq(k.lane, k.i32(0)), [&] { k.storeI32(received, hostCounts, k.i32(0)); });
      k.warpInclusiveScan(L.local, [&](Value e) {
        auto sum = scf::ForOp::create(k.b, k.i32(0), k.i32(L.ranks), k.i32(1), ValueRange{k.i32(0)});
        {
          OpBuilder::InsertionGuard g(k.b);
          k.b.setInsertionPointToStart(sum.getBody());
          Value cell = k.counter(L.expertIn, k.add(k.mul(sum.getInductionVar(), k.i32(L.local)), e));
          Value v = k.load(k.i32T(), cell, 4);
          k.store(k.i32(0), cell, 4);
          scf::YieldOp::create(k.b, ValueRange{k.add(sum.getRegionIterArg(0), v)});
        }
        Value count = sum.getResult(0);
        return std::pair<Value, Value>{k.alignUp(count, L.alignment), count};
      }, [&](Value e, Value end, Value count) {
        Value aligned = k.alignUp(count, L.alignment);
        k.storeI32(count, expertCounts, e);
        // Plain: inclusive prefix of the aligned counts. Expanded: the end of
        // the expert's real rows, start_e + count_e.
        k.storeI32(shape.expanded ? k.add(k.sub(end, aligned), count) : end, psumPerExpert, e);
        k.storeI32(aligned, hostCounts, k.add(e, k.i32(1)));
      });
    });
  });
}

/// Rows [start_e + count_e, start_e + align(count_e)) of each local expert
/// of this rank's outputs: zero (data, scale packs, weight).
void zeroPaddingRows(KernelBuilder &k, const EPLayout &L, const DispatchShape &shape, Value recvX,
                     Value recvPacks, Value recvWeights, Value expertCounts, Value psumPerExpert) {
  k.loop(k.globalWarp, k.i32(L.local), k.numWarps, [&](Value e) {
    Value count = k.loadI32(expertCounts, e);
    Value end = k.loadI32(psumPerExpert, e);
    Value aligned = k.alignUp(count, L.alignment);
    Value stop = k.add(k.sub(end, count), aligned);
    k.loop(end, stop, k.i32(1), [&](Value row) {
      Type vec = VectorType::get({4}, k.i32T());
      Value zero = arith::ConstantOp::create(k.b, vec, DenseElementsAttr::get(cast<ShapedType>(vec), 0));
      Value base = k.at(recvX, k.mul(k.wide(row), k.i64(L.rowBytes)));
      k.loop(k.lane, k.i32(L.rowBytes / 16), k.i32(32), [&](Value chunk) {
        k.store(zero, k.elementAt(base, chunk, 16), 16);
      });
      if (shape.scalePacks)
        k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
          k.storeI32(k.i32(0), recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
        });
      if (shape.weights)
        k.when(k.eq(k.lane, k.i32(0)), [&] {
          k.store(arith::ConstantFloatOp::create(k.b, k.b.getF32Type(), APFloat(0.0f)),
                  k.elementAt(recvWeights, row, 4), 4);
        });
    });
  });
}

void buildDispatchCopy(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  KernelBuilder k(func, L);
  Value psum = k.pointerParam(kPsumPerRank);
  Value recvX = k.pointerParam(kRecvX);
  Value recvPacks = shape.scalePacks ? k.pointerParam(kRecvScalePacks) : Value();
  Value recvIdx = shape.expanded ? Value() : k.pointerParam(kRecvTopkIdx);
  Value recvWeights = shape.weights ? k.pointerParam(kRecvTopkWeights) : Value();
  Value metadata = k.pointerParam(kRecvSrcMetadata);
  Value expertCounts = k.pointerParam(kExpertCounts);
  Value psumPerExpert = k.pointerParam(kPsumPerExpert);
  Value received = k.loadI32(psum, k.i32(L.ranks - 1));
  int64_t metaColumns = L.topk + 2;

  // Output row `row` of recv_x.
  auto rowOf = [&](Value row) { return k.at(recvX, k.mul(k.wide(row), k.i64(L.rowBytes))); };
  // The record's scale packs to output row `row`.
  auto copyPacks = [&](Value record, Value row) {
    if (!shape.scalePacks)
      return;
    k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
      Value v = k.loadI32(k.at(record, k.i32(L.rowPad)), p);
      k.storeI32(v, recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
    });
  };
  auto recordWeight = [&](Value record, Value slot) {
    return k.load(k.b.getF32Type(),
                  k.at(record, k.add(k.i32(L.weightsOff), k.mul(slot, k.i32(4)))), 4);
  };

  // A plain row may be split among warps; an expanded one takes row cursors
  // once per token, so one warp does all of it.
  int64_t maxParts = shape.expanded ? 1 : KernelBuilder::maxRowParts(L.rowBytes, KernelBuilder::kCopyUnroll);
  k.loopRowParts(received, maxParts, [&](Value row, const RowPart &share) {
    // Source rank: how many prefix sums are <= row (32 ranks per step).
    auto search = scf::ForOp::create(k.b, k.i32(0), k.i32(L.ranks), k.i32(32), ValueRange{k.i32(0)});
    {
      OpBuilder::InsertionGuard g(k.b);
      k.b.setInsertionPointToStart(search.getBody());
      Value s = k.add(search.getInductionVar(), k.lane);
      Value bound = k.choose(k.lt(s, k.i32(L.ranks)), k.i32T(),
                             [&]() -> Value { return k.loadI32(psum, s); },
                             [&]() -> Value { return k.i32(INT32_MAX); });
      Value below = k.ballot(k.cmp(arith::CmpIPredicate::sle, bound, row));
      scf::YieldOp::create(k.b, ValueRange{k.add(search.getRegionIterArg(0), k.popc(below))});
    }
    Value src = search.getResult(0);
    Value before = k.choose(k.cmp(arith::CmpIPredicate::sgt, src, k.i32(0)), k.i32T(),
                            [&]() -> Value { return k.loadI32(psum, k.sub(src, k.i32(1))); },
                            [&]() -> Value { return k.i32(0); });
    Value slot = k.sub(row, before);
    Value index = k.add(k.mul(k.wide(src), k.wide(k.tmax)), k.wide(slot));
    Value record = k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.record))));

    // Lane j < K: the slot's global expert id, and whether it lives here
    // (read after a plain row's copy is issued: its loads need not wait).
    Value inTopk = k.lt(k.lane, k.i32(L.topk));
    Value mine, localId;
    auto readIds = [&] {
      Value e = k.choose(inTopk, k.i32T(),
                         [&]() -> Value { return k.loadI32(k.at(record, k.i32(L.idsOff)), k.lane); },
                         [&]() -> Value { return k.i32(-1); });
      mine = k.andi(k.cmp(arith::CmpIPredicate::sge, e, k.i32(0)), k.eq(k.divs(e, k.i32(L.local)), k.me));
      localId = k.select(mine, k.rems(e, k.i32(L.local)), k.i32(-1));
    };
    Value metaRow = k.mul(row, k.i32(metaColumns));

    if (!shape.expanded) {
      k.copyRow(rowOf(row), record, L.rowBytes, share);
      k.inFirstPart(share, [&] {
        readIds();
        copyPacks(record, row);
        k.when(inTopk, [&] {
          Value element = k.add(k.mul(row, k.i32(L.topk)), k.lane);
          k.storeTopkId(localId, recvIdx, element);
          if (shape.weights)
            k.store(recordWeight(record, k.lane), k.elementAt(recvWeights, element, 4), 4);
        });
      });
    } else {
      readIds();
      // One output row per local slot: the expert's start plus a cursor
      // (or, cached, the row the handle recorded).
      Value myRow = k.choose(mine, k.i32T(), [&]() -> Value {
        if (shape.cached)
          return k.loadI32(metadata, k.add(metaRow, k.add(k.lane, k.i32(2))));
        Value start = k.sub(k.loadI32(psumPerExpert, localId), k.loadI32(expertCounts, localId));
        Value offset = comm::AtomicRMWOp::create(
            k.b, k.i32T(), comm::AtomicKind::add, comm::Ordering::relaxed, comm::Scope::gpu,
            k.i32(1), k.counter(L.expertCursor, localId));
        return k.add(start, offset);
      }, [&]() -> Value { return k.i32(-1); });
      if (!shape.cached)
        k.when(inTopk, [&] { k.storeI32(myRow, metadata, k.add(metaRow, k.add(k.lane, k.i32(2)))); });
      // The record's row is read once and written to every row of the token
      // here; then each row's packs, weight and, fused, its count.
      Value targets = k.ballot(mine);
      k.copyRowToEach(record, L.rowBytes, targets,
                      [&](Value j) { return rowOf(k.shuffle(myRow, j)); }, shape.rowUnroll);
      k.forEachLane(targets, [&](Value j) {
        Value out = k.shuffle(myRow, j);
        copyPacks(record, out);
        if (shape.weights)
          k.when(k.eq(k.lane, k.i32(0)), [&] {
            k.store(recordWeight(record, j), k.elementAt(recvWeights, out, 4), 4);
          });
        if (shape.tileDone >= 0) {
          // The row is in place: count it in its GEMM row tile of the expert
          // (every lane's stores, then one release by lane 0).
          Value expert = k.shuffle(localId, j);
          Value start = k.sub(k.loadI32(psumPerExpert, expert), k.loadI32(expertCounts, expert));
          Value tile = k.add(k.mul(expert, k.i32(shape.maxTiles)),
                             k.divu(k.sub(out, start), k.i32(epic::detail::kGemmTileM)));
          comm::FenceOp::create(k.b, comm::Ordering::acq_rel, comm::Scope::gpu);
          NVVM::SyncWarpOp::create(k.b, k.fullMask());
          k.when(k.eq(k.lane, k.i32(0)), [&] {
            comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release,
                                comm::Scope::gpu, k.i32(1), k.counter(shape.tileDone, tile));
          });
        }
      });
    }
    if (!shape.cached) {
      // recv_src_metadata[row][0..1] = (src * Tmax + token, src * K + master);
      // plain layout: the expanded rows (columns 2..) are -1.
      k.inFirstPart(share, [&] {
        Value token = k.load(k.i32T(), k.at(record, k.i32(L.tokenOff)), 4);
        Value master = k.load(k.i32T(), k.at(record, k.i32(L.tokenOff + 4)), 4);
        k.when(k.eq(k.lane, k.i32(0)), [&] {
          k.storeI32(k.add(k.mul(src, k.tmax), token), metadata, metaRow);
          k.storeI32(k.add(k.mul(src, k.i32(L.topk)), master), metadata, k.add(metaRow, k.i32(1)));
        });
        if (!shape.expanded)
          k.when(inTopk, [&] { k.storeI32(k.i32(-1), metadata, k.add(metaRow, k.add(k.lane, k.i32(2)))); });
      });
    }
  });

  if (shape.zeroPadding)
    zeroPaddingRows(k, L, shape, recvX, recvPacks, recvWeights, expertCounts, psumPerExpert);
}

/// The one-pass cached dispatch (`one-pass-cached-dispatch`): every rank's
/// tensors are in one address space, so the handle's routing places each row
/// straight into its destination's outputs, no window records and no copy.
/// One warp per token: lane j's destination d_j and the token's received row
/// there (d_j's prefix sum before this rank + the slot the handle replays);
/// the warp reads the token's row once and stores it to every target row
/// (plain: one per destination; expanded: one per slot, the row d_j's
/// recv_src_metadata gives), then each target's scale packs and (plain) its
/// local top-k ids. No rank waits for another: the launch serves every rank,
/// and its end is the end of every rank's writes.
void buildDispatchScatter(gpu::GPUFuncOp func, const EPLayout &L, DispatchShape shape) {
  assert(!shape.weights && "a cached dispatch takes no weights (the ep.dispatch verifier)");
  KernelBuilder k(func, L);
  TokenInputs in(k, shape);
  Value numTokens = in.numTokens, x = in.x, topkIdx = in.topkIdx, scalePacks = in.scalePacks,
        dstSlots = in.dstSlots;
  const int64_t metaColumns = L.topk + 2;

  k.loop(k.globalWarp, numTokens, k.numWarps, [&](Value token) {
    auto r = k.route(topkIdx, token);
    // Lane j (valid): the row the token has among d_j's received tokens.
    Value tokenRow = k.choose(r.valid, k.i32T(), [&]() -> Value {
      Value psum = k.pointerField(k.peerParams(r.dst), kPsumPerRank);
      Value before = k.choose(k.cmp(arith::CmpIPredicate::sgt, k.me, k.i32(0)), k.i32T(),
                              [&]() -> Value { return k.loadI32(psum, k.sub(k.me, k.i32(1))); },
                              [&]() -> Value { return k.i32(0); });
      Value slot = k.loadI32(dstSlots, k.add(k.mul(token, k.i32(L.topk)), r.masterLane));
      return k.add(before, slot);
    }, [&]() -> Value { return k.i32(-1); });
    // Lane j: its target row (plain: the token row on masters; expanded: slot
    // j's expanded row) and that row's address in d_j's recv_x.
    Value targetRow = tokenRow;
    Value targets = r.masters;
    if (shape.expanded) {
      targetRow = k.choose(r.valid, k.i32T(), [&]() -> Value {
        Value metadata = k.pointerField(k.peerParams(r.dst), kRecvSrcMetadata);
        return k.loadI32(metadata, k.add(k.mul(tokenRow, k.i32(metaColumns)),
                                         k.add(k.lane, k.i32(2))));
      }, [&]() -> Value { return k.i32(-1); });
      targets = k.ballot(k.cmp(arith::CmpIPredicate::sge, targetRow, k.i32(0)));
    }
    Value rowAddress = k.choose(k.cmp(arith::CmpIPredicate::sge, targetRow, k.i32(0)), k.ptrT(),
                                [&]() -> Value {
      Value recvX = k.pointerField(k.peerParams(r.dst), kRecvX);
      return k.at(recvX, k.mul(k.wide(targetRow), k.i64(L.rowBytes)));
    }, [&]() -> Value { return x; });
    k.copyRowToEach(k.at(x, k.mul(k.wide(token), k.i64(L.rowBytes))), L.rowBytes, targets,
                    [&](Value j) { return k.shufflePointer(rowAddress, j); });
    k.forEachLane(targets, [&](Value j) {
      Value dst = k.shuffle(r.dst, j);
      Value row = k.shuffle(targetRow, j);
      Value theirs = k.peerParams(dst);
      if (shape.scalePacks) {
        Value recvPacks = k.pointerField(theirs, kRecvScalePacks);
        k.loop(k.lane, k.i32(L.packs), k.i32(32), [&](Value p) {
          Value v = k.loadI32(scalePacks, k.add(k.mul(token, k.i32(L.packs)), p));
          k.storeI32(v, recvPacks, k.add(k.mul(row, k.i32(L.packs)), p));
        });
      }
      if (!shape.expanded) {
        // Lane i < K: slot i's local expert id at d, or -1.
        Value recvIdx = k.pointerField(theirs, kRecvTopkIdx);
        k.when(k.lt(k.lane, k.i32(L.topk)), [&] {
          Value localId = k.select(k.eq(r.dst, dst), k.rems(r.expert, k.i32(L.local)), k.i32(-1));
          k.storeTopkId(localId, recvIdx, k.add(k.mul(row, k.i32(L.topk)), k.lane));
        });
      }
    });
  });

  if (shape.zeroPadding)
    zeroPaddingRows(k, L, shape, k.pointerParam(kRecvX),
                    shape.scalePacks ? k.pointerParam(kRecvScalePacks) : Value(), Value(),
                    k.pointerParam(kExpertCounts), k.pointerParam(kPsumPerExpert));
}

//===----------------------------------------------------------------------===//
// Combine
//===----------------------------------------------------------------------===//

struct CombineShape {
  bool weights;
  unsigned biases;
  bool expanded;
};

/// The expanded combine's send of one received token (`meta`: its row of
/// recv_src_metadata) by the calling warp: this rank's rows of the token (one
/// per local slot, columns 2.. of the metadata) summed in fp32 from +0.0 in
/// increasing slot order and rounded once, into `record` of the source.
void sendExpandedToken(KernelBuilder &k, const EPLayout &L, const CombineShape &shape, Value x,
                       Value weights, Value meta, Value record, const RowPart &share = {}) {
  Type f32 = k.b.getF32Type();
  // Lane j < K: the token's expanded row of slot j here (-1: none).
  Value expandedRow = k.choose(k.lt(k.lane, k.i32(L.topk)), k.i32T(),
                               [&]() -> Value { return k.loadI32(meta, k.add(k.lane, k.i32(2))); },
                               [&]() -> Value { return k.i32(-1); });
  Value present = k.ballot(k.cmp(arith::CmpIPredicate::sge, expandedRow, k.i32(0)));
  k.sumMaskedRows(record, L.hidden * 2, present, [&](Value j) {
    return k.at(x, k.mul(k.wide(k.shuffle(expandedRow, j)), k.i64(L.hidden * 2)));
  }, {}, share);
  if (shape.weights) {
    // Slot j's weight is that of its expanded row (1-D weights), else 0.
    k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
      Value w = k.choose(k.cmp(arith::CmpIPredicate::sge, expandedRow, k.i32(0)), f32,
                         [&]() -> Value {
        return k.load(f32, k.elementAt(weights, expandedRow, 4), 4);
      }, [&]() -> Value { return arith::ConstantFloatOp::create(k.b, cast<FloatType>(f32), APFloat(0.0f)); });
      k.store(w, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
    });
  }
}

/// Where token `row`'s combine record goes: (its metadata row, the record in
/// the source rank's window).
std::pair<Value, Value> combineDestination(KernelBuilder &k, const EPLayout &L, Value metadata,
                                           Value row) {
  Value meta = k.elementAt(metadata, k.mul(row, k.i32(L.topk + 2)), 4);
  Value gid = k.load(k.i32T(), meta, 4);
  Value back = k.loadI32(meta, k.i32(1));
  Value src = k.divu(gid, k.tmax);
  Value token = k.remu(gid, k.tmax);
  Value master = k.remu(back, k.i32(L.topk));
  Value index = k.add(k.mul(k.wide(master), k.wide(k.tmax)), k.wide(token));
  Value record = k.peer(k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord))), src);
  return {meta, record};
}

void buildCombineSend(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  Value x = k.pointerParam(kCX);
  Value weights = shape.weights ? k.pointerParam(kCTopkWeights) : Value();
  Value metadata = k.pointerParam(kCSrcMetadata);
  Value received = k.loadI32(k.pointerParam(kCPsumPerRank), k.i32(L.ranks - 1));
  k.entryBarrier();

  // Every received token (a warp, or a share of its row): back to its source,
  // into [master slot][token].
  int64_t maxParts = KernelBuilder::maxRowParts(
      L.hidden * 2, shape.expanded ? KernelBuilder::kSumChunks : KernelBuilder::kCopyUnroll);
  k.loopRowParts(received, maxParts, [&](Value row, const RowPart &share) {
    auto [meta, record] = combineDestination(k, L, metadata, row);
    if (!shape.expanded) {
      k.copyRow(record, k.at(x, k.mul(k.wide(row), k.i64(L.hidden * 2))), L.hidden * 2, share);
      if (shape.weights) {
        k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
          Value w = k.load(k.b.getF32Type(),
                           k.elementAt(weights, k.add(k.mul(row, k.i32(L.topk)), k.lane), 4), 4);
          k.store(w, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
        });
      }
    } else {
      sendExpandedToken(k, L, shape, x, weights, meta, record, share);
    }
  });

  // The rank's last block tells every peer it is done, and waits for all.
  Value last = k.lastBlockOfRank(L.combineDone);
  k.when(last, [&] {
    k.when(k.eq(k.tid, k.i32(0)), [&] {
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0),
                            k.local(k.i32(L.combineDone)));
    });
    exchangeDoneFlags(k, L.combineFlags);
  });
}

void buildCombineReduce(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape) {
  KernelBuilder k(func, L);
  Value numTokens = k.intParam(kCNumTokens);
  Value topkIdx = k.pointerParam(kCTopkIdx);
  Value out = k.pointerParam(kCCombinedX);
  Value outWeights = shape.weights ? k.pointerParam(kCCombinedWeights) : Value();
  SmallVector<Value> biases;
  for (unsigned i = 0; i < shape.biases; ++i)
    biases.push_back(k.pointerParam(kCBias0 + i));
  Type f32 = k.b.getF32Type();

  k.loopRowParts(numTokens, KernelBuilder::maxRowParts(L.hidden * 2, KernelBuilder::kSumChunks),
                 [&](Value token, const RowPart &share) {
    auto r = k.route(topkIdx, token);
    Value rowBytes = k.mul(k.wide(token), k.i64(L.hidden * 2));
    // fp32 from +0.0: the biases, then the master slots' rows in increasing
    // slot order; one rounding.
    SmallVector<Value> biasRows;
    for (Value bias : biases)
      biasRows.push_back(k.at(bias, rowBytes));
    k.sumMaskedRows(k.at(out, rowBytes), L.hidden * 2, r.masters, [&](Value j) {
      Value index = k.add(k.mul(k.wide(j), k.wide(k.tmax)), k.wide(token));
      return k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord))));
    }, biasRows, share);
    if (shape.weights) {
      // Slot j's weight comes from the record of its rank's master slot.
      k.when(k.andi(k.lt(k.lane, k.i32(L.topk)), k.isFirstPart(share)), [&] {
        Value w = k.choose(r.valid, f32, [&]() -> Value {
          Value index = k.add(k.mul(k.wide(r.masterLane), k.wide(k.tmax)), k.wide(token));
          Value record = k.local(k.add(k.i64(L.data), k.mul(index, k.i64(L.combineRecord))));
          return k.load(f32, k.at(record, k.add(k.i32(L.combineRow), k.mul(k.lane, k.i32(4)))), 4);
        }, [&]() -> Value { return arith::ConstantFloatOp::create(k.b, cast<FloatType>(f32), APFloat(0.0f)); });
        k.store(w, k.elementAt(outWeights, k.add(k.mul(token, k.i32(L.topk)), k.lane), 4), 4);
      });
    }
  });
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

/// After the kernels already in `module`, so they stay in launch order.
//===----------------------------------------------------------------------===//
// Dispatch fused with the grouped GEMM
//===----------------------------------------------------------------------===//

/// Copies the body of `from` (a kernel with ep-expand's signature) before
/// `b`'s insertion point, its arguments mapped to `to`'s, with its block
/// index and count replaced by `block`/`blocks`.
void inlineKernelBody(OpBuilder &b, gpu::GPUFuncOp from, gpu::GPUFuncOp to, Value block,
                      Value blocks) {
  IRMapping map;
  for (auto [a, c] : llvm::zip(from.getArguments(), to.getArguments()))
    map.map(a, c);
  SmallVector<Operation *> cloned;
  for (Operation &op : from.getBody().front().without_terminator())
    cloned.push_back(b.clone(op, map));
  // Only the copies: `block`/`blocks` may themselves be ids of this block.
  auto rename = [&](Operation *op) {
    if (auto id = dyn_cast<gpu::BlockIdOp>(op); id && id.getDimension() == gpu::Dimension::x) {
      id.replaceAllUsesWith(block);
      id.erase();
    } else if (auto dim = dyn_cast<gpu::GridDimOp>(op);
               dim && dim.getDimension() == gpu::Dimension::x) {
      dim.replaceAllUsesWith(blocks);
      dim.erase();
    }
  };
  for (Operation *top : cloned)
    top->walk(rename);
}

/// `<name>_copy_gemm`: every block first copies its share of the dispatch's
/// rows, counting placed rows per 128-row tile, then takes grouped GEMM
/// tiles, each tile waiting for its count. All blocks copy because the copy is
/// latency-bound (it runs at the speed of the warps that do it; a few blocks
/// took longer than the whole GEMM), and a block done with its rows starts
/// the tiles whose rows are placed while the others still copy. Built as two
/// kernels, then merged into one.
void buildCopyGemmKernel(OpBuilder &builder, Location loc, StringRef name, const EPLayout &L,
                         DispatchShape shape, const epic::detail::GroupedGemmShape &gemm) {
  gpu::GPUFuncOp copy = createKernel(builder, loc, (name + "_copy_role").str(), false);
  buildDispatchCopy(copy, L, shape);
  gpu::GPUFuncOp compute = createKernel(builder, loc, (name + "_gemm_role").str(), false);
  epic::detail::buildGroupedGemmKernel(compute, gemm);
  gpu::GPUFuncOp kernel = createKernel(builder, loc, name, false);

  OpBuilder b(kernel.getBody().front().getTerminator());
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  inlineKernelBody(b, copy, kernel, block, blocks);
  inlineKernelBody(b, compute, kernel, block, blocks);
  copy.erase();
  compute.erase();
}

//===----------------------------------------------------------------------===//
// The grouped GEMM fused with the combine
//===----------------------------------------------------------------------===//

struct GemmCombineScratch {
  int64_t rowToken, pending, colDone, arrivals, maxTiles, columnTiles;
  /// In the 256 bytes at `arrivals`, a cache line apart: the rank barrier,
  /// then the count of row chunks claimed by the rank's warps.
  int64_t claimed() const { return arrivals + 64; }
};

/// Where the fused kernels keep their state, after every layout's window:
/// ep.dispatch_gemm's tile counters ([L][128-row tiles] twice), then
/// ep.gemm_combine's scratch. Disjoint, because each kernel relies on its
/// counters being back at zero from its previous call.
struct FusedScratch {
  int64_t maxTiles, counters, tileDone, tileConsumed;
  int64_t rowToken, pending, colDone, arrivals, end;

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
  }
};

/// Blocks of each rank that take no tile and send ep.gemm_combine's tokens
/// from the start (the others join them after their last tile).
constexpr int64_t kGemmCombineSendBlocks = 1;
// A rank has at least kGemmCtasPerSm blocks (one SM): some must take tiles.
static_assert(kGemmCombineSendBlocks < epic::detail::kGemmCtasPerSm);

/// `<name>_gemm_send` (see EPFuseGemmCombine in Passes.td): the combine's
/// entry barrier, row -> token map and per-token counts, a barrier of the
/// rank's blocks, the persistent grouped GEMM on all blocks but the send
/// block (each stored tile counted in its 128-row tile's slot), then every
/// warp claims chunks of 32 rows in expert order, each lane waiting for its
/// row's tile, and sends every token whose last row that was; the rank's last
/// warp ends the combine's send (done flags).
void buildGemmSendKernel(gpu::GPUFuncOp func, const EPLayout &L, CombineShape shape,
                         epic::detail::GroupedGemmShape gemm, GemmCombineScratch scratch) {
  KernelBuilder k(func, L);
  Value x = k.pointerParam(kCX); // the GEMM's output, the rows the combine sends
  Value metadata = k.pointerParam(kCSrcMetadata);
  Value psumPerExpert = k.pointerParam(kGCPsumPerExpert);
  Value received = k.loadI32(k.pointerParam(kCPsumPerRank), k.i32(L.ranks - 1));
  k.entryBarrier();

  // Every received token: its expanded rows point back at it; count them.
  k.loop(k.globalWarp, received, k.numWarps, [&](Value t) {
    Value meta = k.elementAt(metadata, k.mul(t, k.i32(L.topk + 2)), 4);
    Value row = k.choose(k.lt(k.lane, k.i32(L.topk)), k.i32T(),
                         [&]() -> Value { return k.loadI32(meta, k.add(k.lane, k.i32(2))); },
                         [&]() -> Value { return k.i32(-1); });
    Value mine = k.cmp(arith::CmpIPredicate::sge, row, k.i32(0));
    k.when(mine, [&] { k.store(t, k.counter(scratch.rowToken, row), 4); });
    Value count = k.popc(k.ballot(mine));
    k.when(k.eq(k.lane, k.i32(0)), [&] { k.store(count, k.counter(scratch.pending, t), 4); });
  });
  // The rank's blocks meet: the map is complete before any row is counted.
  k.barrier();
  k.when(k.eq(k.tid, k.i32(0)), [&] {
    comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::gpu,
                        k.i32(1), k.local(k.i32(scratch.arrivals)));
    comm::WaitFlagOp::create(k.b, k.i32T(), k.local(k.i32(scratch.arrivals)),
                             comm::Predicate::ge, k.blocks, k.me, Value(), comm::Scope::gpu,
                             L.timeoutMs);
  });
  k.barrier();

  // A tile block: thread 0 counts each stored tile in its 128-row tile's
  // slot (release: the block's stores met at a barrier before it).
  gemm.afterTile = [&](OpBuilder &at, Value expert, Value rowTile) {
    OpBuilder::InsertionGuard guard(k.b);
    k.b.setInsertionPoint(at.getInsertionBlock(), at.getInsertionPoint());
    Value slot = k.add(k.mul(k.index(expert), k.i32(scratch.maxTiles)), k.index(rowTile));
    k.when(k.eq(k.tid, k.i32(0)), [&] {
      comm::RedOp::create(k.b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::gpu,
                          k.i32(1), k.counter(scratch.colDone, slot));
    });
  };
  gemm.commBlocks = kGemmCombineSendBlocks;
  epic::detail::buildGroupedGemmKernel(func, gemm);

  // Every warp, the send block's at once and the tile blocks' after their last
  // tile: claim the rank's next chunk of 32 rows (chunks in expert order, the
  // order the tiles finish in; a lane per row). A lane waits until every
  // column tile of its row's 128-row tile is stored, takes one of its token's
  // rows off the count, and the warp sends the tokens whose count that ended.
  k.b.setInsertionPoint(func.getBody().front().getTerminator());
  auto chunksOf = [&](Value start, Value end) {
    return k.divu(k.add(k.sub(end, start), k.i32(31)), k.i32(32));
  };
  // Chunk c's expert, the expert's first and end rows, and the chunk's index
  // in it: a scan of the experts (the counts are in L1 after the first).
  auto locate = [&](Value c) {
    auto scan = scf::ForOp::create(
        k.b, k.i32(0), k.i32(L.local), k.i32(1),
        ValueRange{k.i32(0), k.i32(0), k.i32(0), k.i32(0), k.i32(0), k.i32(0)});
    OpBuilder::InsertionGuard guard(k.b);
    k.b.setInsertionPointToStart(scan.getBody());
    Value e = scan.getInductionVar();
    // Carried: the previous expert's end, the chunks before e, then the found
    // chunk's expert, first row, end row and index in its expert.
    ValueRange carried = scan.getRegionIterArgs();
    Value start = k.alignUp(carried[0], L.alignment);
    Value end = k.loadI32(psumPerExpert, e);
    Value after = k.add(carried[1], chunksOf(start, end));
    Value here = k.andi(k.cmp(arith::CmpIPredicate::ule, carried[1], c),
                        k.cmp(arith::CmpIPredicate::ult, c, after));
    scf::YieldOp::create(k.b, ValueRange{end, after, k.select(here, e, carried[2]),
                                         k.select(here, start, carried[3]),
                                         k.select(here, end, carried[4]),
                                         k.select(here, k.sub(c, carried[1]), carried[5])});
    return scan;
  };
  Value totalChunks = locate(k.i32(-1)).getResult(1);
  auto claims = scf::WhileOp::create(k.b, TypeRange{k.i32T()}, ValueRange{});
  {
    OpBuilder::InsertionGuard guard(k.b);
    k.b.createBlock(&claims.getBefore());
    Value claim = k.choose(k.eq(k.lane, k.i32(0)), k.i32T(), [&]() -> Value {
      return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                       comm::Ordering::relaxed, comm::Scope::gpu, k.i32(1),
                                       k.local(k.i32(scratch.claimed())));
    }, [&]() -> Value { return k.i32(0); });
    claim = k.shuffle(claim, k.i32(0));
    scf::ConditionOp::create(k.b, k.lt(claim, totalChunks), ValueRange{claim});
    Block *body = k.b.createBlock(&claims.getAfter(), {}, {k.i32T()}, {k.b.getLoc()});
    auto where = locate(body->getArgument(0));
    Value e = where.getResult(2), start = where.getResult(3), end = where.getResult(4);
    Value row = k.add(start, k.add(k.mul(where.getResult(5), k.i32(32)), k.lane));
    Value valid = k.lt(row, end);
    Value token = k.choose(valid, k.i32T(), [&]() -> Value {
      Value rowTile = k.divu(k.sub(row, start), k.i32(epic::detail::kGemmTileM));
      Value slot = k.add(k.mul(e, k.i32(scratch.maxTiles)), rowTile);
      comm::WaitFlagOp::create(k.b, k.i32T(), k.counter(scratch.colDone, slot),
                               comm::Predicate::ge, k.i32(scratch.columnTiles), k.me, Value(),
                               comm::Scope::gpu, L.timeoutMs);
      return k.load(k.i32T(), k.counter(scratch.rowToken, row), 4);
    }, [&]() -> Value { return k.i32(-1); });
    Value left = k.choose(valid, k.i32T(), [&]() -> Value {
      return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                       comm::Ordering::acq_rel, comm::Scope::gpu, k.i32(-1),
                                       k.counter(scratch.pending, token));
    }, [&]() -> Value { return k.i32(0); });
    // Every row of those tokens is final (their lanes acquired it).
    k.forEachLane(k.ballot(k.eq(left, k.i32(1))), [&](Value lane) {
      // What the completing lane acquired, for the warp (a ballot or a
      // shuffle is no memory synchronization; a warp barrier is).
      NVVM::SyncWarpOp::create(k.b, k.fullMask());
      comm::FenceOp::create(k.b, comm::Ordering::acq_rel, comm::Scope::gpu);
      auto [meta, record] = combineDestination(k, L, metadata, k.shuffle(token, lane));
      sendExpandedToken(k, L, shape, x, Value(), meta, record);
    });
    scf::YieldOp::create(k.b, ValueRange{});
  }

  // The rank's last warp (every chunk claimed and sent) resets the rank
  // barrier, the claims and the tile counts, tells every peer it is done, and
  // waits for all (the combine send's ending).
  NVVM::SyncWarpOp::create(k.b, k.fullMask()); // the warp's sends, before lane 0's release
  Value before = k.choose(k.eq(k.lane, k.i32(0)), k.i32T(), [&]() -> Value {
    return comm::AtomicRMWOp::create(k.b, k.i32T(), comm::AtomicKind::add,
                                     comm::Ordering::acq_rel, comm::Scope::sys, k.i32(1),
                                     k.local(k.i32(L.combineDone)));
  }, [&]() -> Value { return k.i32(0); });
  k.when(k.eq(k.shuffle(before, k.i32(0)), k.sub(k.numWarps, k.i32(1))), [&] {
    NVVM::SyncWarpOp::create(k.b, k.fullMask()); // what lane 0 acquired, for the warp
    k.when(k.eq(k.lane, k.i32(0)), [&] {
      for (int64_t cell : {L.combineDone, scratch.arrivals, scratch.claimed()})
        comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0),
                              k.local(k.i32(cell)));
    });
    k.loop(k.lane, k.i32(L.local * scratch.maxTiles), k.i32(32),
           [&](Value slot) { k.store(k.i32(0), k.counter(scratch.colDone, slot), 4); });
    exchangeDoneFlags(k, L.combineFlags, k.lane, k.i32(32));
  });
}

OpBuilder kernelInsertionPoint(gpu::GPUModuleOp module) {
  Block *body = module.getBody();
  if (!body->empty() && body->back().hasTrait<OpTrait::IsTerminator>())
    return OpBuilder(&body->back());
  return OpBuilder::atBlockEnd(body);
}

/// The one ep op of an entry function, or a diagnostic.
FailureOr<Operation *> entryOp(func::FuncOp func) {
  Operation *epOp = nullptr;
  for (Operation &op : func.getBody().front()) {
    if (isa<ep::DispatchOp, ep::CombineOp, ep::GroupedGemmOp, ep::DispatchGemmOp,
            ep::GemmCombineOp>(op)) {
      if (epOp)
        return func.emitError("ep-expand: expected one ep.dispatch, ep.combine or "
                              "ep.grouped_gemm per function, found a second one"),
               failure();
      epOp = &op;
    } else if (!isa<func::ReturnOp>(op)) {
      return op.emitError("ep-expand: an ep op must be alone in its function (the entry form "
                          "the runtime generates); found '")
                 << op.getName() << "'",
             failure();
    }
  }
  return epOp;
}

/// A hash of what the ranks' kernels must agree on, the same in every
/// process (of the op's text, not of context pointers): the op's name,
/// attributes (the configuration included) and operand and result types
/// (which say whether weights, scale packs and biases are there, and their
/// dtypes), the timeout and the block size.
int64_t opSignatureOf(Operation *op, int64_t timeoutMs, unsigned threads) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName() << op->getAttrDictionary() << " timeout " << timeoutMs << " threads "
     << threads;
  for (Type type : op->getOperandTypes())
    os << " in " << type;
  for (Type type : op->getResultTypes())
    os << " out " << type;
  return int64_t(llvm::xxh3_64bits(text));
}

LogicalResult expand(func::FuncOp func, Operation *op, unsigned threads,
                     bool onePassCachedDispatch) {
  int64_t timeoutMs = kDefaultTimeoutMs;
  if (Attribute attr = func->getAttr("epic.timeout_ms")) {
    auto value = dyn_cast<IntegerAttr>(attr);
    if (!value || value.getInt() < 1 || value.getInt() > (int64_t(1) << 31))
      return func.emitError("ep-expand: epic.timeout_ms must be an integer in [1, 2^31] "
                            "(milliseconds), got ")
             << attr;
    timeoutMs = value.getInt();
  }
  OpBuilder builder(func);
  Location loc = op->getLoc();
  MLIRContext *ctx = func.getContext();
  std::string name = func.getName().str();
  const std::string moduleName = "ep_kernels";

  SmallVector<std::string> kernelNames;
  SmallVector<StringRef> fields;
  int64_t tensorMaps = 0; // TMA descriptors at the end of each record
  ep::ConfigAttr cfg;
  // Builds the kernels; gets the record's stride.
  std::function<void(gpu::GPUModuleOp, const RecordLayout &)> build;
  SmallVector<NamedAttribute> extraMetadata;
  bool cooperative = true;
  int64_t windowBytes = -1; // the configuration's layout unless set
  int64_t scratchAt = -1;   // fused entries: [scratchAt, windowBytes) must be zero at entry
  // The layout the kernels see, with the entry's timeout and record.
  const int64_t signature = opSignatureOf(op, timeoutMs, threads);
  auto layoutFor = [&](unsigned idxBits, const RecordLayout &record, int64_t tmaxField) {
    EPLayout layout(cfg, idxBits);
    layout.signature = signature;
    layout.timeoutMs = timeoutMs;
    layout.paramStride = record.stride;
    layout.tmaxField = tmaxField;
    return layout;
  };
  auto gemmMetadata = [&](const epic::detail::GroupedGemmShape &gemm, StringRef lhs,
                          StringRef weights, Attribute rows, const RecordLayout &record) {
    extraMetadata.push_back(builder.getNamedAttr(
        "epic.dynamic_shared_bytes",
        builder.getI64IntegerAttr(epic::detail::kGemmDynamicSharedBytes)));
    extraMetadata.push_back(builder.getNamedAttr(
        "epic.ctas_per_sm", builder.getI64IntegerAttr(epic::detail::kGemmCtasPerSm)));
    extraMetadata.push_back(builder.getNamedAttr(
        "epic.tensor_maps", epic::detail::groupedGemmTensorMaps(builder, gemm, lhs, weights, rows,
                                                                record.mapsOffset)));
  };

  if (auto gemm = dyn_cast<ep::GroupedGemmOp>(op)) {
    cfg = gemm.getConfig();
    auto lhs = cast<ShapedType>(gemm.getLhs().getType());
    auto rhs = cast<ShapedType>(gemm.getRhs().getType());
    epic::detail::GroupedGemmShape shape{
        cfg.getHidden(), rhs.getDimSize(2), cfg.getNumLocalExperts(), cfg.getExpertAlignment(),
        lhs.getElementType(), cast<ShapedType>(gemm.getResult().getType()).getElementType()};
    if (failed(epic::detail::checkGroupedGemmShape(op, shape)))
      return failure();
    kernelNames = {name + "_gemm"};
    fields = fieldNames(epic::detail::kGroupedGemmFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads; // one warpgroup
    cooperative = false;                  // blocks never wait for each other
    windowBytes = 0;
    RecordLayout record(fields.size(), tensorMaps);
    gemmMetadata(shape, "x", "weights", builder.getStringAttr("num_rows"), record);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      OpBuilder b = kernelInsertionPoint(module);
      epic::detail::buildGroupedGemmKernel(createKernel(b, loc, kernelNames[0], false),
                                           withRecord(shape, record));
    };
  } else if (auto fused = dyn_cast<ep::GemmCombineOp>(op)) {
    cfg = fused.getConfig();
    epic::detail::GroupedGemmShape gemm{
        cfg.getHidden(), cfg.getHidden(), cfg.getNumLocalExperts(), cfg.getExpertAlignment(),
        cast<ShapedType>(fused.getLhs().getType()).getElementType(),
        builder.getBF16Type()};
    if (failed(epic::detail::checkGroupedGemmShape(op, gemm)))
      return failure();
    // Scratch after the windows (FusedScratch): row -> token, each token's rows
    // still to compute, each 128-row tile's finished column tiles, a rank
    // barrier and the count of row chunks claimed.
    FusedScratch at(cfg);
    windowBytes = at.end, scratchAt = at.tileDone;
    gemm.outField = kCX, gemm.psumField = kGCPsumPerExpert;
    gemm.timeoutMs = timeoutMs;
    CombineShape shape{false, static_cast<unsigned>(fused.getBiases().size()), true};
    kernelNames = {name + "_gemm_send", name + "_reduce"};
    fields = fieldNames(kCombineFields, kGemmCombineExtraFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads;
    RecordLayout record(fields.size(), tensorMaps);
    gemmMetadata(gemm, "lhs", "weights", builder.getStringAttr("num_rows"), record);
    GemmCombineScratch scratch{at.rowToken, at.pending, at.colDone, at.arrivals,
                               at.maxTiles, cfg.getHidden() / epic::detail::kGemmTileN};
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout fusedLayout = layoutFor(64, record, kCMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildGemmSendKernel(createKernel(b, loc, kernelNames[0], false), fusedLayout, shape,
                          withRecord(gemm, record), scratch);
      buildCombineReduce(createKernel(b, loc, kernelNames[1], false), fusedLayout, shape);
    };
  } else if (auto fused = dyn_cast<ep::DispatchGemmOp>(op)) {
    cfg = fused.getConfig();
    auto experts = cast<ShapedType>(fused.getExperts().getType());
    epic::detail::GroupedGemmShape gemm{
        cfg.getHidden(), experts.getDimSize(2), cfg.getNumLocalExperts(),
        cfg.getExpertAlignment(), cfg.getDtype(),
        cast<ShapedType>(fused.getResult().getType()).getElementType()};
    if (failed(epic::detail::checkGroupedGemmShape(op, gemm)))
      return failure();
    unsigned idxBits = cast<ShapedType>(fused.getTopkIdx().getType()).getElementTypeBitWidth();
    EPLayout layout(cfg, idxBits);
    // The tile counters follow the windows (FusedScratch).
    FusedScratch at(cfg);
    int64_t maxTiles = at.maxTiles, tileDone = at.tileDone;
    windowBytes = at.tileConsumed + at.counters, scratchAt = at.tileDone;
    gemm.outField = kDGGemmOut, gemm.psumField = kPsumPerExpert;
    gemm.tileDone = tileDone, gemm.tileConsumed = at.tileConsumed, gemm.maxTiles = maxTiles;
    gemm.timeoutMs = timeoutMs;
    DispatchShape shape{false, static_cast<bool>(fused.getTopkWeights()), true, false,
                        fused.getZeroPadding(), tileDone, maxTiles,
                        fusedRowUnroll(layout.rowBytes)};
    kernelNames = {name + "_send", name + "_copy_gemm"};
    fields = fieldNames(kDispatchFields, kDispatchGemmExtraFields);
    tensorMaps = 2;
    threads = epic::detail::kGemmThreads;
    RecordLayout record(fields.size(), tensorMaps);
    // The verifier asks for a static Tmax: the recv_x rows are a constant.
    gemmMetadata(gemm, "recv_x", "experts",
                 builder.getI64IntegerAttr(*cfg.getMaxOutputRows()), record);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout fusedLayout = layoutFor(idxBits, record, kDispatchMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildDispatchSend(createKernel(b, loc, kernelNames[0], true), fusedLayout, shape);
      buildCopyGemmKernel(b, loc, kernelNames[1], fusedLayout, shape, withRecord(gemm, record));
    };
  } else if (auto dispatch = dyn_cast<ep::DispatchOp>(op)) {
    cfg = dispatch.getConfig();
    // A cached dispatch reads the handle's routing, which the runtime keeps as int64.
    unsigned idxBits =
        dispatch.isCached()
            ? 64
            : cast<ShapedType>(dispatch.getTopkIdx().getType()).getElementTypeBitWidth();
    DispatchShape shape{static_cast<bool>(dispatch.getScalePacks()),
                        static_cast<bool>(dispatch.getTopkWeights()), cfg.isExpanded(),
                        dispatch.isCached(), dispatch.getZeroPadding()};
    fields = fieldNames(kDispatchFields);
    const bool scatter = shape.cached && onePassCachedDispatch;
    if (scatter) {
      kernelNames = {name + "_scatter"};
      cooperative = false; // no rank waits for another
    } else {
      kernelNames = {name + "_send", name + "_copy"};
    }
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      EPLayout layout = layoutFor(idxBits, record, kDispatchMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      if (scatter) {
        buildDispatchScatter(createKernel(b, loc, kernelNames[0], false), layout, shape);
        return;
      }
      buildDispatchSend(createKernel(b, loc, kernelNames[0], true), layout, shape);
      buildDispatchCopy(createKernel(b, loc, kernelNames[1], false), layout, shape);
    };
  } else {
    auto combine = cast<ep::CombineOp>(op);
    cfg = combine.getConfig();
    if (cfg.getHidden() % 8 != 0)
      return op->emitError("ep-expand: combine reduces 8 bf16 channels per step, so hidden (")
             << cfg.getHidden() << ") must be a multiple of 8";
    CombineShape shape{static_cast<bool>(combine.getTopkWeights()),
                       static_cast<unsigned>(combine.getBiases().size()), cfg.isExpanded()};
    kernelNames = {name + "_send", name + "_reduce"};
    fields = fieldNames(kCombineFields);
    build = [=](gpu::GPUModuleOp module, const RecordLayout &record) {
      // The routing comes from the handle (topk_idx of the dispatch); int64.
      EPLayout layout = layoutFor(64, record, kCMaxTokens);
      OpBuilder b = kernelInsertionPoint(module);
      buildCombineSend(createKernel(b, loc, kernelNames[0], true), layout, shape);
      buildCombineReduce(createKernel(b, loc, kernelNames[1], false), layout, shape);
    };
  }
  const RecordLayout record(fields.size(), tensorMaps);

  // The kernels, in the module's one gpu.module (one cubin for the runtime).
  ModuleOp parent = func->getParentOfType<ModuleOp>();
  parent->setAttr(gpu::GPUDialect::getContainerModuleAttrName(), builder.getUnitAttr());
  auto kernels = SymbolTable::lookupSymbolIn(parent, moduleName);
  auto kernelModule = dyn_cast_or_null<gpu::GPUModuleOp>(kernels);
  if (!kernelModule) {
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(parent.getBody());
    kernelModule = gpu::GPUModuleOp::create(builder, loc, moduleName);
  }
  build(kernelModule, record);
  // The launch's block size, known to the kernels: ptxas sizes their register
  // budget for it (.reqntid), so a launch of `threads` always fits an SM. The
  // records travel by value, one per rank a launch serves.
  auto table = comm::ParamTableAttr::get(ctx, 2, record.stride, cfg.getRanks());
  for (const std::string &kernel : kernelNames)
    if (auto fn = kernelModule.lookupSymbol<gpu::GPUFuncOp>(kernel)) {
      fn.setKnownBlockSizeAttr(builder.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
      fn->setAttr(comm::ParamTableAttr::getAttrName(), table);
    }
  builder.setInsertionPoint(func);

  // The launch function replaces the entry function.
  Type args[] = {comm::DevCommType::get(ctx), comm::WindowType::get(ctx),
                 LLVM::LLVMPointerType::get(ctx), builder.getIndexType()};
  auto launch = func::FuncOp::create(builder, loc, name, builder.getFunctionType(args, {}));
  Block *body = launch.addEntryBlock();
  OpBuilder lb = OpBuilder::atBlockEnd(body);
  Value one = arith::ConstantIndexOp::create(lb, loc, 1);
  Value threadCount = arith::ConstantIndexOp::create(lb, loc, threads);
  Value grid = body->getArgument(3);
  for (const std::string &kernel : kernelNames) {
    auto symbol = SymbolRefAttr::get(ctx, moduleName, {FlatSymbolRefAttr::get(ctx, kernel)});
    gpu::LaunchFuncOp::create(lb, loc, symbol, gpu::KernelDim3{grid, one, one},
                              gpu::KernelDim3{threadCount, one, one}, Value(),
                              ValueRange{body->getArgument(0), body->getArgument(1),
                                         body->getArgument(2)});
  }
  func::ReturnOp::create(lb, loc);

  EPLayout layout(cfg, 64);
  SmallVector<Attribute> fieldAttrs;
  for (StringRef field : fields)
    fieldAttrs.push_back(builder.getStringAttr(field));
  SmallVector<Attribute> kernelAttrs;
  for (const std::string &kernel : kernelNames)
    kernelAttrs.push_back(builder.getStringAttr(kernel));
  launch->setAttr("epic.entry", builder.getStringAttr(isa<ep::DispatchOp>(op)   ? "dispatch"
                                                     : isa<ep::CombineOp>(op) ? "combine"
                                                     : isa<ep::GroupedGemmOp>(op)
                                                         ? "grouped_gemm"
                                                     : isa<ep::DispatchGemmOp>(op)
                                                         ? "dispatch_gemm"
                                                         : "gemm_combine"));
  launch->setAttr("epic.config", cfg);
  launch->setAttr("epic.kernels", builder.getArrayAttr(kernelAttrs));
  launch->setAttr("epic.threads", builder.getI64IntegerAttr(threads));
  launch->setAttr("epic.param_fields", builder.getArrayAttr(fieldAttrs));
  launch->setAttr("epic.param_stride", builder.getI64IntegerAttr(record.stride));
  launch->setAttr("epic.window_bytes",
                  builder.getI64IntegerAttr(windowBytes >= 0 ? windowBytes : layout.windowBytes));
  // A run-time Tmax: the window needs window_bytes + Tmax x this.
  if (windowBytes < 0 && !cfg.hasStaticTokenCap())
    launch->setAttr("epic.window_bytes_per_token",
                    builder.getI64IntegerAttr(layout.windowPerToken));
  // The fused kernels' scratch: zero when they start (they leave it so), but
  // another configuration's data may have been there (EPWindow.h).
  if (scratchAt >= 0)
    launch->setAttr("epic.window_scratch_at", builder.getI64IntegerAttr(scratchAt));
  launch->setAttr("epic.max_blocks_per_rank", builder.getI64IntegerAttr(kMaxBlocksPerRank));
  // The blocks of a launch wait for each other (entry barriers, the count
  // exchange): the runtime must launch them cooperatively (all resident).
  launch->setAttr("epic.cooperative", builder.getI64IntegerAttr(cooperative ? 1 : 0));
  launch->setAttr("epic.timeout_ms", builder.getI64IntegerAttr(timeoutMs));
  for (NamedAttribute attr : extraMetadata)
    launch->setAttr(attr.getName(), attr.getValue());
  func.erase();
  return success();
}

struct EPExpandPass : public epic::impl::EPExpandBase<EPExpandPass> {
  using EPExpandBase::EPExpandBase;
  void runOnOperation() override {
    if (threadsPerBlock % 32 != 0 || threadsPerBlock == 0 || threadsPerBlock > 1024) {
      getOperation().emitError("ep-expand: threads-per-block must be a multiple of 32 in "
                               "[32, 1024], got ")
          << threadsPerBlock;
      return signalPassFailure();
    }
    SmallVector<std::pair<func::FuncOp, Operation *>> entries;
    bool failed = false;
    getOperation().walk([&](func::FuncOp func) {
      bool hasEP = false;
      func.walk([&](Operation *op) {
        hasEP |= isa<ep::DispatchOp, ep::CombineOp, ep::GroupedGemmOp, ep::DispatchGemmOp,
                     ep::GemmCombineOp>(op);
      });
      if (!hasEP)
        return;
      FailureOr<Operation *> op = entryOp(func);
      if (mlir::failed(op)) {
        failed = true;
        return;
      }
      entries.push_back({func, *op});
    });
    for (auto [func, op] : entries)
      failed |= mlir::failed(expand(func, op, threadsPerBlock, onePassCachedDispatch));
    if (failed)
      signalPassFailure();
  }
};

} // namespace
