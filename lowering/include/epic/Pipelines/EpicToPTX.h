//===- EpicToPTX.h - the pipeline from ep/comm IR to PTX --------*- C++ -*-===//

#ifndef EPIC_PIPELINES_EPICTOPTX_H
#define EPIC_PIPELINES_EPICTOPTX_H

#include "epic/Conversion/Passes.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Pass/PassOptions.h"

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace epic {

struct EpicToPTXOptions : public mlir::PassPipelineOptions<EpicToPTXOptions> {
  Option<CommBackend> backend{
      *this, "backend", llvm::cl::desc("comm backend"), llvm::cl::init(CommBackend::nccl),
      llvm::cl::values(clEnumValN(CommBackend::nccl, "nccl", "the NCCL device API"),
                       clEnumValN(CommBackend::virtual_, "virtual", "R ranks on one GPU"))};
  // The virtual backend's kernels read and write every rank's tensors in place
  // (one pass); `staged` makes them stage rows in the window as they must
  // across processes, so one GPU runs the NCCL path's dispatch, combine and
  // layer kernels on many ranks.
  Option<bool> staged{*this, "staged",
                      llvm::cl::desc("stage dispatch and combine rows in the window even in "
                                     "one address space (the virtual backend)"),
                      llvm::cl::init(false)};
  Option<std::string> chip{*this, "chip", llvm::cl::desc("GPU architecture"),
                           llvm::cl::init("sm_90a")};
  // The NCCL shim's GDAKI path uses st.mmio, which needs PTX ISA 8.2; a shim that
  // needs more raises it (getTargetFeatures).
  Option<std::string> features{*this, "features", llvm::cl::desc("PTX features"),
                               llvm::cl::init("+ptx82")};
  Option<unsigned> optLevel{*this, "opt-level", llvm::cl::desc("LLVM optimization level"),
                            llvm::cl::init(3)};
  Option<std::string> shimDir{
      *this, "shim-dir",
      llvm::cl::desc("directory of epic_shim_<backend>.bc (default: the build's)"),
      llvm::cl::init("")};
  Option<std::string> ncclShim{
      *this, "nccl-shim",
      llvm::cl::desc("the NCCL version whose shim the nccl backend links "
                     "(epic_shim_nccl-<version>.bc, built for -DEPIC_EXTRA_NCCL_ROOTS); "
                     "default: the NCCL epic builds against"),
      llvm::cl::init("")};
  Option<std::string> format{
      *this, "format",
      llvm::cl::desc("what gpu-module-to-binary makes: isa (PTX), bin (cubin), fatbin"),
      llvm::cl::init("isa")};
  Option<std::string> cudaPath{*this, "cuda-path",
                               llvm::cl::desc("CUDA toolkit (ptxas) for format=bin/fatbin"),
                               llvm::cl::init("")};
};

/// "nccl" or "virtual".
llvm::StringRef stringifyCommBackend(CommBackend backend);

/// The shim bitcode file of `backend` in `shimDir`, or in the directory this
/// build wrote them to when `shimDir` is empty. For nccl, `ncclShim` names the
/// NCCL version of the shim (empty: the default one, which a version equal to
/// its own names too).
std::string getShimBitcodePath(CommBackend backend, llvm::StringRef shimDir,
                               llvm::StringRef ncclShim = "");

/// What an NCCL shim's sidecar (epic_shim_nccl[-<version>].json beside the
/// .bc) says: the NCCL version it was compiled against and the PTX ISA its
/// device API needs (86 for 8.6). Empty and 0 without a sidecar (the virtual
/// shim).
struct ShimInfo {
  std::string ncclVersion;
  unsigned minPtx = 0;
};
ShimInfo readShimInfo(llvm::StringRef shimPath);

/// `features` with its PTX ISA version (+ptxNN) raised to `minPtx` where lower.
std::string raisePtxVersion(llvm::StringRef features, unsigned minPtx);

/// The NVVM target's features for `options`: the requested ones, with the PTX
/// ISA raised to what the linked shim needs.
std::string getTargetFeatures(const EpicToPTXOptions &options);

/// convert-ep-to-comm's options for the pipeline's backend (a cached dispatch is one
/// pass where every rank's tensors share one address space: virtual).
ConvertEPToCommOptions getEPToCommOptions(const EpicToPTXOptions &options);

/// comm-to-nvvm -> attach the NVVM target (linking the shim) -> gpu/arith/
/// cf/... to NVVM and LLVM -> gpu-module-to-binary. Kernels use the bare
/// pointer calling convention.
void buildEpicToPTXPipeline(mlir::OpPassManager &pm, const EpicToPTXOptions &options);

/// Registers `epic-to-ptx` with the pass registry.
void registerEpicToPTXPipeline();

} // namespace epic

#endif // EPIC_PIPELINES_EPICTOPTX_H
