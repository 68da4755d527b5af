//===- ExternDynamicShared.cpp - dynamic shared memory after the static -------===//
//
// See ExternDynamicSharedMemory in Passes.td. The upstream GPU-to-NVVM lowering
// gives the dynamic shared memory base internal linkage; NVPTX then makes it a
// one-byte static variable of the kernel, and the grouped GEMMs' ring (which
// starts there) overlapped their mbarriers.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/Passes.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace epic {
#define GEN_PASS_DEF_EXTERNDYNAMICSHAREDMEMORY
#include "epic/Conversion/Passes.h.inc"
} // namespace epic

using namespace mlir;

namespace {
/// NVVM's shared address space.
constexpr unsigned kSharedAddressSpace = 3;

struct ExternDynamicSharedMemoryPass
    : public epic::impl::ExternDynamicSharedMemoryBase<ExternDynamicSharedMemoryPass> {
  void runOnOperation() override {
    WalkResult result = getOperation().walk([&](LLVM::GlobalOp global) {
      auto array = dyn_cast<LLVM::LLVMArrayType>(global.getGlobalType());
      if (global.getAddrSpace() != kSharedAddressSpace || !array || array.getNumElements() != 0)
        return WalkResult::advance();
      if (global.getValue() || !global.getInitializerRegion().empty()) {
        global.emitError("extern-dynamic-shared-memory: the zero-sized shared global '")
            << global.getSymName()
            << "' has an initializer: dynamic shared memory cannot be initialized";
        return WalkResult::interrupt();
      }
      global.setLinkage(LLVM::Linkage::External);
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};
} // namespace
