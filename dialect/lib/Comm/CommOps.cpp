//===- CommOps.cpp - comm dialect operations ------------------------------===//

#include "epic/Dialect/Comm/IR/CommDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace epic::comm;

using Effects = SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>;

//===----------------------------------------------------------------------===//
// Ranks, teams and pointers
//===----------------------------------------------------------------------===//

OpFoldResult TeamToWorldOp::fold(FoldAdaptor) {
  if (auto team = getTeam().getDefiningOp<TeamOp>())
    if (team.getKind() == TeamKind::world)
      return getRank();
  return {};
}

namespace {
/// peer_ptr(win, off, team, team_rank(team)) is this rank's own copy.
struct PeerPtrOfSelf : public OpRewritePattern<PeerPtrOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PeerPtrOp op, PatternRewriter &rewriter) const override {
    auto self = op.getPeer().getDefiningOp<TeamRankOp>();
    if (!self || self.getTeam() != op.getTeam())
      return failure();
    rewriter.replaceOpWithNewOp<LocalPtrOp>(op, op.getPtr().getType(), op.getWindow(),
                                            op.getOffset());
    return success();
  }
};
} // namespace

void PeerPtrOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<PeerPtrOfSelf>(context);
}

//===----------------------------------------------------------------------===//
// One-sided network operations
//===----------------------------------------------------------------------===//

static LogicalResult verifySignalOperands(Operation *op, Value signal, Value signalAdd) {
  if (signalAdd && !signal)
    return op->emitOpError("add(...) needs a signal(...) to add to");
  return success();
}

LogicalResult PutOp::verify() { return verifySignalOperands(*this, getSignal(), getSignalAdd()); }

LogicalResult WaitSignalOp::verify() {
  APInt peer;
  if (getPeer() && matchPattern(getPeer(), m_ConstantInt(&peer)) && peer.isNegative())
    return emitOpError("peer: the world rank the signal is waited from, >= 0; got ")
           << peer.getSExtValue() << " (leave peer out if no one rank raises it)";
  return success();
}

void PutOp::getEffects(Effects &effects) {
  effects.emplace_back(MemoryEffects::Read::get(), &getSrcWindowMutable(),
                       WindowMemoryResource::get());
  effects.emplace_back(MemoryEffects::Write::get(), &getDstWindowMutable(),
                       WindowMemoryResource::get());
  if (getSignal() || getCounter())
    effects.emplace_back(MemoryEffects::Write::get(), SignalMemoryResource::get());
}

namespace {
/// A put of zero bytes moves nothing: without a signal or counter it is a
/// no-op, with only a signal it is a signal-only operation.
struct SimplifyEmptyPut : public OpRewritePattern<PutOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PutOp op, PatternRewriter &rewriter) const override {
    if (!matchPattern(op.getBytes(), m_Zero()) || op.getCounter())
      return failure();
    if (!op.getSignal()) {
      rewriter.eraseOp(op);
      return success();
    }
    rewriter.replaceOpWithNewOp<SignalOp>(op, op.getSignal(), op.getTeam(), op.getPeer(),
                                          op.getComm(), op.getSignalAdd(), op.getContextIndex(),
                                          op.getCoop());
    return success();
  }
};
} // namespace

void PutOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<SimplifyEmptyPut>(context);
}

LogicalResult PutValueOp::verify() {
  return verifySignalOperands(*this, getSignal(), getSignalAdd());
}

void PutValueOp::getEffects(Effects &effects) {
  effects.emplace_back(MemoryEffects::Write::get(), &getWindowMutable(),
                       WindowMemoryResource::get());
  if (getSignal())
    effects.emplace_back(MemoryEffects::Write::get(), SignalMemoryResource::get());
}

//===----------------------------------------------------------------------===//
// Synchronization
//===----------------------------------------------------------------------===//

LogicalResult FenceOp::verify() {
  if (getOrdering() == Ordering::relaxed)
    return emitOpError("a relaxed fence orders nothing; use acquire, release, "
                       "acq_rel or sc");
  return success();
}

namespace {
/// fence; fence (identical) == fence.
struct EraseRepeatedFence : public OpRewritePattern<FenceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(FenceOp op, PatternRewriter &rewriter) const override {
    auto next = dyn_cast_or_null<FenceOp>(op->getNextNode());
    if (!next || next.getOrdering() != op.getOrdering() || next.getScope() != op.getScope())
      return failure();
    rewriter.eraseOp(op);
    return success();
  }
};
} // namespace

void FenceOp::getCanonicalizationPatterns(RewritePatternSet &results, MLIRContext *context) {
  results.add<EraseRepeatedFence>(context);
}

/// Flag accesses touch the memory their pointer refers to; an acquire also
/// orders every later access (modeled as a write), a release every earlier
/// one (modeled as a read).
static void addFlagEffects(Effects &effects, OpOperand &ptr, bool reads, bool writes,
                           Ordering ordering) {
  bool acquire =
      ordering == Ordering::acquire || ordering == Ordering::acq_rel || ordering == Ordering::sc;
  bool release =
      ordering == Ordering::release || ordering == Ordering::acq_rel || ordering == Ordering::sc;
  if (reads)
    effects.emplace_back(MemoryEffects::Read::get(), &ptr);
  if (writes)
    effects.emplace_back(MemoryEffects::Write::get(), &ptr);
  if (acquire)
    effects.emplace_back(MemoryEffects::Write::get());
  if (release)
    effects.emplace_back(MemoryEffects::Read::get());
}

static LogicalResult verifyOrdering(Operation *op, Ordering ordering, ArrayRef<Ordering> allowed) {
  if (llvm::is_contained(allowed, ordering))
    return success();
  InFlightDiagnostic diag = op->emitOpError("ordering must be ");
  llvm::interleave(
      allowed, [&](Ordering o) { diag << stringifyOrdering(o); }, [&] { diag << " or "; });
  return diag << ", got " << stringifyOrdering(ordering);
}

LogicalResult LoadOp::verify() {
  return verifyOrdering(*this, getOrdering(), {Ordering::relaxed, Ordering::acquire});
}

void LoadOp::getEffects(Effects &effects) {
  addFlagEffects(effects, getPtrMutable(), /*reads=*/true, /*writes=*/false, getOrdering());
}

LogicalResult StoreOp::verify() {
  return verifyOrdering(*this, getOrdering(), {Ordering::relaxed, Ordering::release});
}

void StoreOp::getEffects(Effects &effects) {
  addFlagEffects(effects, getPtrMutable(), /*reads=*/false, /*writes=*/true, getOrdering());
}

LogicalResult RedOp::verify() {
  if (getKind() == AtomicKind::exch)
    return emitOpError("exch is not a reduction; use comm.atomic_rmw");
  return verifyOrdering(*this, getOrdering(), {Ordering::relaxed, Ordering::release});
}

void RedOp::getEffects(Effects &effects) {
  addFlagEffects(effects, getPtrMutable(), /*reads=*/true, /*writes=*/true, getOrdering());
}

void AtomicRMWOp::getEffects(Effects &effects) {
  addFlagEffects(effects, getPtrMutable(), /*reads=*/true, /*writes=*/true, getOrdering());
}

void AtomicCASOp::getEffects(Effects &effects) {
  addFlagEffects(effects, getPtrMutable(), /*reads=*/true, /*writes=*/true, getOrdering());
}

#define GET_OP_CLASSES
#include "epic/Dialect/Comm/IR/CommOps.cpp.inc"
