//===- KernelBuilder.h - convert-ep-to-comm: building kernel code ---------*- C++ -*-===//
//
// A small typed builder over the arith, scf, gpu, nvvm and comm ops that the
// dispatch, combine and fused kernels are written with: constants, integer
// arithmetic, memory and window access, control flow (when, loop, choose),
// warp collectives, row copies, the entry barrier; across nodes (Network.cpp)
// the send helper, staging ring and signalled exchanges.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELBUILDER_H
#define EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELBUILDER_H

#include "ArithBuilder.h"
#include "Layout.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

//===----------------------------------------------------------------------===//
// Kernel builder
//===----------------------------------------------------------------------===//

/// A warp's share of a row split among several warps (KernelBuilder::
/// loopRowParts): `part` of `parts`; both null for a whole row.
struct RowPart {
  Value part, parts;
};

class KernelBuilder : public ArithBuilder<KernelBuilder> {
public:
  KernelBuilder(gpu::GPUFuncOp func, const EPLayout &layout)
      : b(func.getLoc(), func.getContext()), layout(layout) {
    b.setInsertionPointToStart(&func.getBody().front());
    comm = func.getArgument(0);
    window = func.getArgument(1);
    table = func.getArgument(2);
    params = comm::RankParamsOp::create(b, table, layout.paramStride, comm);
    // Ranks are world ranks. On one node the LSA team is the world; across
    // nodes peers are named in the world team, whose peer pointers NCCL maps
    // for the same node's ranks (sameNode), and whose puts reach every rank.
    team =
        comm::TeamOp::create(b, comm::TeamType::get(b.getContext()),
                             layout.multiNode ? comm::TeamKind::world : comm::TeamKind::lsa, comm);
    me = comm::TeamRankOp::create(b, b.getI32Type(), team);
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
    if (func.getNumWorkgroupAttributions() > 1)
      sharedWords = func.getWorkgroupAttributions()[1];
    tmax = layout.tmax ? i32(layout.tmax) : intParam(layout.tmaxField);
    if (layout.multiNode)
      node = divu(me, i32(layout.ranksPerNode));
    // The kernel body goes after this prologue, before gpu.return.
    b.setInsertionPoint(func.getBody().front().getTerminator());
  }

  ImplicitLocOpBuilder b;
  const EPLayout &layout;
  /// `team`: the team ranks are named in (LSA on one node, else the world);
  /// `me`: this rank in it, its world rank either way.
  Value comm, window, table, params, team, me, tid, threads, block, blocks, lane, globalWarp,
      numWarps, sharedFlag;
  /// The kernel's shared i32 array (createKernel's `sharedWords`), if any.
  Value sharedWords;
  /// Multi-node only: this rank's node (me / ranks per node).
  Value node;
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
    Value world = comm::TeamToWorldOp::create(b, i32T(), team, rank);
    return comm::PeerParamsOp::create(b, table, layout.paramStride, world, comm);
  }
  Value pointerField(Value record, int64_t field) {
    return load(ptrT(), at(record, i64(field * 8)), 8);
  }
  Value local(Value bytes) { return comm::LocalPtrOp::create(b, ptrT(), window, wide(bytes)); }
  /// `bytes` into the window of `rank`, which must be of this node.
  Value peer(Value bytes, Value rank) {
    return comm::PeerPtrOp::create(b, ptrT(), window, wide(bytes), team, rank);
  }

  /// Another rank's tensors: through its record in the launch's table (one
  /// address space), or, when the op's tensors lie in the window, through
  /// the record the rank published there (publishRecord): a field is an
  /// address in that rank's process, so it is rebased on the rank's window
  /// and reached by its LSA pointer.
  struct PeerRecord {
    KernelBuilder &k;
    Value rank, record, windowBase; // windowBase: null in one address space
    /// Field `field` as the rank's kernel sees it (null stays null).
    Value raw(int64_t field) { return k.pointerField(record, field); }
    /// Where this rank reaches the tensor `raw(field)` names.
    Value reach(Value raw) {
      if (!windowBase)
        return raw;
      Value offset =
          arith::SubIOp::create(k.b, LLVM::PtrToIntOp::create(k.b, k.i64T(), raw), windowBase);
      return k.peer(offset, rank);
    }
    Value pointer(int64_t field) { return reach(raw(field)); }
  };
  PeerRecord peerRecord(Value rank) {
    if (!layout.peersInWindow)
      return {*this, rank, peerParams(rank), Value()};
    Value record = peer(i64(layout.publishedRecord), rank);
    Value base = load(i64T(), at(record, i64(epic::ep::window::kMaxPublishedRecordBytes)), 8);
    return {*this, rank, record, base};
  }
  /// Ops whose tensors lie in the window: every block copies this rank's
  /// record (and the window's address) to where peers read it, before its
  /// entry barrier (which releases it); all blocks write the same bytes.
  void publishRecord() {
    const int64_t words = layout.paramStride / 8;
    loop(tid, i32(words), threads, [&](Value w) {
      Value offset = mul(wide(w), i64(8));
      store(load(i64T(), at(params, offset), 8), local(add(i64(layout.publishedRecord), offset)),
            8);
    });
    when(eq(tid, i32(0)), [&] {
      Value base = LLVM::PtrToIntOp::create(b, i64T(), local(i64(0)));
      store(base, local(i64(layout.publishedRecord + epic::ep::window::kMaxPublishedRecordBytes)),
            8);
    });
  }
  /// Element `index` (i32: EPLimits.def keeps every index the kernels compute
  /// below 2^31) of `bytes` each at `base`, with a 64-bit byte offset.
  Value elementAt(Value base, Value index, int64_t bytes) {
    return at(base, mul(wide(index), i64(bytes)));
  }
  /// Element `element` of the top-k id array at `ids` (the layout's index
  /// type) as i32, narrowed or sign-extended.
  Value loadTopkId(Value ids, Value element) {
    Value raw = load(b.getIntegerType(layout.idxBytes * 8),
                     elementAt(ids, element, layout.idxBytes), layout.idxBytes);
    if (layout.idxBytes == 4)
      return raw;
    return layout.idxBytes > 4 ? arith::TruncIOp::create(b, i32T(), raw).getResult()
                               : arith::ExtSIOp::create(b, i32T(), raw).getResult();
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
  Value counter(int64_t offset, Value index) { return local(add(i32(offset), mul(index, i32(4)))); }
  /// Word `index` (i32) of the kernel's shared array.
  Value loadShared(Value index) {
    return memref::LoadOp::create(b, sharedWords, ValueRange{indexOf(index)});
  }
  void storeShared(Value v, Value index) {
    memref::StoreOp::create(b, v, sharedWords, ValueRange{indexOf(index)});
  }
  Value indexOf(Value v) { return arith::IndexCastOp::create(b, b.getIndexType(), v); }

  // --- control flow ---------------------------------------------------------
  /// for (iv = lb; iv < ub; iv += step), i32 bounds.
  void loop(Value lb, Value ub, Value step, function_ref<void(Value)> body) {
    auto op = scf::ForOp::create(b, lb, ub, step);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.getBody());
    body(op.getInductionVar());
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

  /// True where `ptr` (an optional tensor of a record) is not null.
  Value isGiven(Value ptr) {
    return cmp(arith::CmpIPredicate::ne, LLVM::PtrToIntOp::create(b, i64T(), ptr), i64(0));
  }

  // --- warp -----------------------------------------------------------------
  Value fullMask() { return i32(-1); }
  Value shuffle(Value v, Value srcLane) {
    return gpu::ShuffleOp::create(b, v, srcLane, i32(32), gpu::ShuffleMode::IDX).getShuffleResult();
  }
  /// A global pointer of lane `srcLane` (two 32-bit shuffles).
  Value shufflePointer(Value ptr, Value srcLane) {
    Value bits = LLVM::PtrToIntOp::create(b, i64T(), ptr);
    Value low = shuffle(arith::TruncIOp::create(b, i32T(), bits), srcLane);
    Value high = shuffle(
        arith::TruncIOp::create(b, i32T(), arith::ShRUIOp::create(b, bits, i64(32))), srcLane);
    Value joined = arith::OrIOp::create(
        b, arith::ExtUIOp::create(b, i64T(), low),
        arith::ShLIOp::create(b, arith::ExtUIOp::create(b, i64T(), high), i64(32)));
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
    scf::ConditionOp::create(b, cmp(arith::CmpIPredicate::ne, pending, i32(0)),
                             ValueRange{pending});
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
  static constexpr int64_t kCopyUnroll = kDefaultRowUnroll;
  void copyRow(Value dst, Value src, int64_t bytes, const RowPart &share = {}) {
    auto vec = VectorType::get({4}, i32T());
    forEachChunkGroup(
        bytes, kCopyUnroll, /*warpUniform=*/false,
        [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
          storeChunks(dst, loadChunks(vec, src, offsets, inRange), offsets, inRange);
        },
        share);
  }

  /// The warp copies `bytes` from `src` to `dst(bit)` for each set bit of the
  /// warp-uniform `mask`: each group of chunks is loaded once and stored to
  /// every destination (an expanded dispatch writes a record to one row per
  /// local expert of its token).
  void copyRowToEach(Value src, int64_t bytes, Value mask, function_ref<Value(Value)> dst,
                     int64_t unroll = kCopyUnroll) {
    auto vec = VectorType::get({4}, i32T());
    forEachChunkGroup(
        bytes, unroll, /*warpUniform=*/true, [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
          SmallVector<Value> values = loadChunks(vec, src, offsets, inRange);
          forEachLane(mask, [&](Value bit) { storeChunks(dst(bit), values, offsets, inRange); });
        });
  }

  /// Sums bf16 rows in fp32 into the bf16 row at `dst`: per group of
  /// kSumChunks 16-byte chunks of a lane, from +0.0, the rows `firstRows` in
  /// order, then the rows of the set bits of the warp-uniform `mask` in
  /// increasing bit order (`row(bit)`: the row's base), rounded once. The row
  /// loop issues a group's loads of a row before adding them, and absent rows
  /// cost nothing, which matters when few of the K slots are present. With
  /// `weight`, a masked row's values are multiplied by `weight(bit)` (f32,
  /// the same in every lane) before they are added (DeepEP V1's weighted
  /// low-latency combine).
  static constexpr int64_t kSumChunks = 4;
  void sumMaskedRows(Value dst, int64_t bytes, Value mask, function_ref<Value(Value)> row,
                     ArrayRef<Value> firstRows = {}, const RowPart &share = {},
                     function_ref<Value(Value)> weight = {}) {
    auto chunkF32 = VectorType::get({8}, b.getF32Type());
    auto chunkBF16 = VectorType::get({8}, b.getBF16Type());
    auto addRow = [&](ArrayRef<Value> sums, ArrayRef<Value> values, Value scale = {}) {
      SmallVector<Value> next;
      Value factor = scale ? vector::BroadcastOp::create(b, chunkF32, scale).getResult() : Value();
      for (auto [sum, value] : llvm::zip(sums, values)) {
        Value term = arith::ExtFOp::create(b, chunkF32, value);
        if (factor)
          term = arith::MulFOp::create(b, term, factor);
        next.push_back(arith::AddFOp::create(b, sum, term));
      }
      return next;
    };
    forEachChunkGroup(
        bytes, kSumChunks, /*warpUniform=*/true,
        [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
          SmallVector<Value> sums(kSumChunks,
                                  arith::ConstantOp::create(b, chunkF32, b.getZeroAttr(chunkF32)));
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
            scf::ConditionOp::create(b,
                                     cmp(arith::CmpIPredicate::ne, before->getArgument(0), i32(0)),
                                     before->getArguments());
            Block *after = b.createBlock(&rows.getAfter(), {}, types, locs);
            Value pending = after->getArgument(0);
            Value bit = cttz(pending);
            SmallVector<Value> values = loadChunks(chunkBF16, row(bit), offsets, inRange);
            SmallVector<Value> next{andi(pending, sub(pending, i32(1)))};
            SmallVector<Value> carried(after->getArguments().drop_front());
            next.append(addRow(carried, values, weight ? weight(bit) : Value()));
            scf::YieldOp::create(b, next);
          }
          SmallVector<Value> rounded;
          for (Value sum : rows.getResults().drop_front())
            rounded.push_back(arith::TruncFOp::create(b, chunkBF16, sum));
          storeChunks(dst, rounded, offsets, inRange);
        },
        share);
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
      Value up =
          gpu::ShuffleOp::create(b, scan, i32(d), i32(32), gpu::ShuffleMode::UP).getShuffleResult();
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
  /// (i32, -1 = none) and its destination (-1 if none); the master lanes
  /// (the highest slot of each destination) and their ballot.
  struct Routing {
    Value expert, valid, dst, masterLane, isMaster, masters;
  };
  /// Destinations are the experts' ranks, or what `target` makes of a rank:
  /// hybrid mode sends a token to one forwarder per node, and reduces per node.
  Routing route(Value topkIdx, Value token, function_ref<Value(Value)> target = {}) {
    Value expert = choose(
        lt(lane, i32(layout.topk)), i32T(),
        [&]() -> Value { return loadTopkId(topkIdx, add(mul(token, i32(layout.topk)), lane)); },
        [&]() -> Value { return i32(-1); });
    return routeExperts(expert, target);
  }
  /// The same from each lane's expert id (-1 beyond K).
  Routing routeExperts(Value expert, function_ref<Value(Value)> target = {}) {
    Value valid = cmp(arith::CmpIPredicate::sge, expert, i32(0));
    Value rank = divs(expert, i32(layout.local));
    Routing r = routeTo(select(valid, target ? target(rank) : rank, i32(-1)));
    r.expert = expert;
    return r;
  }
  /// The same from each lane's destination (-1: none); no expert ids.
  Routing routeTo(Value dst) {
    Routing r;
    r.dst = dst;
    r.valid = cmp(arith::CmpIPredicate::sge, dst, i32(0));
    Value group = matchAny(r.dst);
    r.masterLane = sub(i32(31), ctlz(group));
    r.isMaster = andi(r.valid, eq(lane, r.masterLane));
    r.masters = ballot(r.isMaster);
    return r;
  }

  /// Thread 0 sets the rank's counter at window offset `offset` back to zero
  /// (relaxed: the kernel boundary orders it before the next launch's use).
  void resetCounter(int64_t offset) { resetCounter(i32(offset)); }
  /// The same at a run-time offset (i32 or i64).
  void resetCounter(Value offset) {
    when(eq(tid, i32(0)), [&] {
      comm::StoreOp::create(b, comm::Ordering::relaxed, comm::Scope::gpu, i32(0), local(offset));
    });
  }

  /// Thread 0 counts this block's arrival (acq_rel, system scope, so the
  /// whole block's writes are ordered before it); every thread learns
  /// whether this block was the rank's last. Across nodes the last block also
  /// takes back the entry release (nodeEntryBarrier): every block of the op
  /// has passed its entry wait by now.
  Value lastBlockOfRank(int64_t counterOffset) { return lastBlockOfRank(i32(counterOffset)); }
  /// The same with the counter at a run-time window offset (i32 or i64).
  Value lastBlockOfRank(Value counterOffset) {
    Value memref = sharedFlag;
    Value zero = arith::ConstantIndexOp::create(b, 0);
    barrier();
    when(eq(tid, i32(0)), [&] {
      Value old =
          comm::AtomicRMWOp::create(b, i32T(), comm::AtomicKind::add, comm::Ordering::acq_rel,
                                    comm::Scope::sys, i32(1), local(counterOffset));
      Value isLast = eq(old, sub(blocks, i32(1)));
      Value last = arith::ExtUIOp::create(b, i32T(), isLast);
      memref::StoreOp::create(b, last, memref, ValueRange{zero});
      if (layout.multiNode)
        when(isLast, [&] {
          comm::StoreOp::create(b, comm::Ordering::relaxed, comm::Scope::gpu, i64(0),
                                local(i64(layout.entryPassed)));
        });
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
  /// variant, convert-ep-to-comm's constant, with the grid and the token cap) into
  /// its peer's cell for this rank, released by the arrival; after the
  /// barrier the lanes compare every rank's cell with their own signature
  /// (comm.agree traps naming both ranks). Ranks that called different ops,
  /// or the same with another num_sms, would otherwise wait for blocks that
  /// never come, or read records of another layout.
  void entryBarrier() {
    if (layout.multiNode)
      return nodeEntryBarrier();
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

  // --- peers in other nodes (Network.cpp; multi-node configurations) -------
  /// Whether world rank `p` is in this rank's node, or in another (i1).
  Value sameNode(Value p);
  Value otherNode(Value p);
  /// The world rank of `p`'s LSA peer in node `n` (the rail peer).
  Value railPeer(Value n);
  /// Hybrid mode (Hybrid.cpp): the forwarder of world rank `rank`'s node for
  /// this rank's tokens (its rail peer there; itself for its own node).
  Value forwarderOf(Value rank);
  /// Window offset (i64) of dispatch record [srcNode][slot] of the forward
  /// region (after the receive region: EPWindow.h).
  Value forwardRecordAt(Value srcNode, Value slot);
  /// Window offset (i64) of combine record [rank master slot][item] of the
  /// forwarder's region (after the origin's [slot][Tmax] region).
  Value partialRecordAt(Value master, Value item);
  /// The entry barrier across nodes: block 0 meets its node's ranks (as
  /// entryBarrier does, over NVLink), then the same LSA rank of every other
  /// node (GIN put_value + signal), checks every rank's signature, and
  /// releases the rank's other blocks (EPWindow.h: kEntryPassed).
  void nodeEntryBarrier();
  /// The window offset (i64) of this warp's staging slot for its work item
  /// `item` (a value of a loop from globalWarp by numWarps): the ring's slots
  /// in turn. Where `staged` (warp-uniform) and the slot was used before,
  /// first waits until the warp's earlier puts have read their sources.
  Value stagingSlot(Value item, Value staged);
  /// comm.put of `bytes` from this window at `from` to world rank `dst`'s at
  /// `to` (both i64), by the warp, on context 0.
  void putWarp(Value from, Value dst, Value to, Value bytes);
  /// The warp's puts have read their sources (comm.flush, context 0).
  void flushWarp();
  /// A 4-byte cell `cell` (i64 window offset) of rank `dst` set to `value`:
  /// an NVLink store in the node (`ordering`, system scope), else a
  /// put_value by this thread with, where given, signal `signal` (i32) raised
  /// once it has landed.
  void storeCell(Value value, Value cell, Value dst, comm::Ordering ordering, Value signal = {});
  /// This thread waits (bounded) until signal `signal` (i32) was raised once
  /// by world rank `peer` (named in a timeout's report), then resets it: each source raises its
  /// count and done signals once per op, and again only after the next entry barrier, which this
  /// rank joins after the reset.
  void awaitSignalOnce(Value signal, Value peer);

  /// What every rank's op must agree on: convert-ep-to-comm's signature of the
  /// configuration and variant, the blocks per rank and the token cap.
  Value opSignature() {
    // Odd multipliers (splitmix64's): distinct grids and caps move the value.
    Value grid = mul(wide(blocks), i64(int64_t(0x9E3779B97F4A7C15ULL)));
    Value cap = mul(wide(tmax), i64(int64_t(0xBF58476D1CE4E5B9ULL)));
    return arith::XOrIOp::create(b, i64(layout.signature), add(grid, cap));
  }
};

/// A kernel with convert-ep-to-comm's signature (device communicator, window, the
/// parameter table), empty but for its gpu.return; `sharedFlag`: one i32 of
/// shared memory (KernelBuilder::sharedFlag); `sharedWords` (with it): an
/// i32 array of that many words after it (KernelBuilder::sharedWords).
gpu::GPUFuncOp createKernel(OpBuilder &builder, Location loc, StringRef name, bool sharedFlag,
                            int64_t sharedWords = 0);

/// The ranks an exchange at the end of a kernel runs over: `count` peers,
/// peer i being world rank `rank(i)`, this rank among them. Default: the world.
/// Hybrid mode: the node's ranks (NVLink only) or the rail peers.
struct PeerGroup {
  int64_t count = 0;
  std::function<Value(Value)> rank;
  /// Every peer is in this rank's node: no network path is built.
  bool nvlinkOnly = false;
  /// The world (or one node's ranks, all of them, for single-node layouts).
  static PeerGroup world(KernelBuilder &k);
  /// The ranks of this rank's node.
  static PeerGroup node(KernelBuilder &k);
  /// This rank's rail peers: its LSA rank in every node, itself included.
  static PeerGroup rail(KernelBuilder &k);
};

/// Each peer of `peers` (the world by default) gets flag 1 (release) from the
/// rank's last block or warp (threads `first`, `first + step`, ...: the
/// block's by default), which then waits (bounded acquire) for every peer's
/// flag and resets it: all the records peers sent this rank have landed.
void exchangeDoneFlags(KernelBuilder &k, int64_t flagsOffset, Value first = {}, Value step = {},
                       const PeerGroup *peers = nullptr);

} // namespace epic::expand

#endif // EPIC_LOWERING_CONVERSION_EPTOCOMM_KERNELBUILDER_H
