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
void exchangeDoneFlags(KernelBuilder &k, int64_t flagsOffset, Value first, Value step) {
  const EPLayout &L = k.layout;
  if (!first) // the whole block
    first = k.tid, step = k.threads;
  k.loop(first, k.i32(L.ranks), step, [&](Value dst) {
    auto nvlink = [&] {
      comm::StoreOp::create(k.b, comm::Ordering::release, comm::Scope::sys, k.i32(1),
                            k.peer(k.add(k.i32(flagsOffset), k.mul(k.me, k.i32(4))), dst));
    };
    if (!L.multiNode)
      return nvlink();
    k.ifElse(k.sameNode(dst), nvlink, [&] {
      comm::SignalOp::create(k.b, doneSignal(k, k.me), k.team, dst, k.comm,
                             /*signal_add=*/Value(), k.i32(0), comm::Coop::thread);
    });
  });
  k.loop(first, k.i32(L.ranks), step, [&](Value src) {
    auto nvlink = [&] {
      Value cell = k.counter(flagsOffset, src);
      comm::WaitFlagOp::create(k.b, k.i32T(), cell, comm::Predicate::eq, k.i32(1), k.me, src,
                               comm::Scope::sys, k.layout.timeoutMs);
      comm::StoreOp::create(k.b, comm::Ordering::relaxed, comm::Scope::gpu, k.i32(0), cell);
    };
    if (!L.multiNode)
      return nvlink();
    k.ifElse(k.sameNode(src), nvlink, [&] { k.awaitSignalOnce(doneSignal(k, src), src); });
  });
}

} // namespace epic::expand
