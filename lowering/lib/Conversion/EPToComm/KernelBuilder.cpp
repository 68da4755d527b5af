//===- KernelBuilder.cpp - convert-ep-to-comm: kernels and done flags ----------------===//
//
// The kernels' common shell and the done-flag exchange that ends a send.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

gpu::GPUFuncOp createKernel(OpBuilder &builder, Location loc, StringRef name, bool sharedFlag,
                            int64_t sharedWords) {
  assert((sharedFlag || !sharedWords) && "the shared array is the second attribution");
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
    if (sharedWords) {
      func.addWorkgroupAttribution(
          MemRefType::get({sharedWords}, builder.getI32Type(), nullptr, space), loc);
      // 16-byte aligned: LLVM merges the stores of a lane's consecutive
      // words (a scan's) into st.shared.v4, which faults unless the array is;
      // the default (the i32's 4) would leave it right after the flag.
      func.setWorkgroupAttributionAttr(1, LLVM::LLVMDialect::getAlignAttrName(),
                                       builder.getI64IntegerAttr(16));
    }
  }
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&func.getBody().front());
  gpu::ReturnOp::create(builder, loc);
  return func;
}

/// Signal kSigDone of `source` (i32), in a world of the layout's ranks.
static Value doneSignal(KernelBuilder &k, Value source) {
  return k.add(k.i32(epic::ep::window::sigDone(k.layout.ranks, 0)), source);
}

/// Each peer gets flag 1 (release) from the rank's last block or warp
/// (threads `first`, `first + step`, ...: the block's by default), which then waits
/// (bounded acquire) for every peer's flag and resets it: all the records
/// peers sent this rank have landed.
///
/// Across nodes a peer of another node gets signal kSigDone + this rank
/// instead (it lands after this rank's puts to it: strong signals, and every
/// warp flushed its puts before the last block got here), and its own is
/// waited for and reset.
PeerGroup PeerGroup::world(KernelBuilder &k) {
  PeerGroup g;
  g.count = k.layout.ranks;
  g.rank = [](Value i) { return i; };
  g.nvlinkOnly = !k.layout.multiNode;
  return g;
}

PeerGroup PeerGroup::node(KernelBuilder &k) {
  PeerGroup g;
  g.count = k.layout.ranksPerNode;
  Value base = k.layout.multiNode ? k.mul(k.node, k.i32(k.layout.ranksPerNode)) : k.i32(0);
  g.rank = [&k, base](Value i) { return k.add(base, i); };
  g.nvlinkOnly = true;
  return g;
}

PeerGroup PeerGroup::rail(KernelBuilder &k) {
  PeerGroup g;
  g.count = k.layout.nodes;
  g.rank = [&k](Value n) { return k.railPeer(n); };
  return g;
}

void exchangeDoneFlags(KernelBuilder &k, int64_t flagsOffset, Value first, Value step,
                       const PeerGroup *peers) {
  PeerGroup all = PeerGroup::world(k);
  const PeerGroup &group = peers ? *peers : all;
  if (!first) // the whole block
    first = k.tid, step = k.threads;
  k.loop(first, k.i32(group.count), step, [&](Value i) {
    Value dst = group.rank(i);
    auto nvlink = [&] {
      comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, k.i32(1),
                            k.peer(k.add(k.i32(flagsOffset), k.mul(k.me, k.i32(4))), dst));
    };
    if (group.nvlinkOnly)
      return nvlink();
    k.ifElse(k.sameNode(dst), nvlink, [&] {
      comm::SignalOp::create(k.b, doneSignal(k, k.me), k.team, dst, k.comm,
                             /*signal_add=*/Value(), k.i32(0), comm::Coop::thread);
    });
  });
  k.loop(first, k.i32(group.count), step, [&](Value i) {
    Value src = group.rank(i);
    auto nvlink = [&] {
      Value cell = k.counter(flagsOffset, src);
      comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::eq, k.i32(1), k.me, src,
                               comm::Scope::sys, k.layout.timeoutMs);
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
    };
    if (group.nvlinkOnly)
      return nvlink();
    k.ifElse(k.sameNode(src), nvlink, [&] { k.awaitSignalOnce(doneSignal(k, src), src); });
  });
}

} // namespace epic::expand
