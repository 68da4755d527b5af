//===- EpicToPTX.cpp - the pipeline from ep/comm IR to PTX ----------------===//

#include "epic/Pipelines/EpicToPTX.h"

#include "epic/Conversion/Passes.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/Path.h"

using namespace mlir;

llvm::StringRef epic::stringifyCommBackend(CommBackend backend) {
  return backend == CommBackend::nccl ? "nccl" : "virtual";
}

std::string epic::getShimBitcodePath(CommBackend backend, llvm::StringRef shimDir) {
  llvm::SmallString<256> path(shimDir.empty() ? llvm::StringRef(EPIC_DEFAULT_SHIM_DIR) : shimDir);
  llvm::sys::path::append(path, "epic_shim_" + stringifyCommBackend(backend) + ".bc");
  return std::string(path);
}

epic::ConvertEPToCommOptions epic::getEPToCommOptions(const EpicToPTXOptions &options) {
  ConvertEPToCommOptions lowering;
  lowering.onePassCachedDispatch = options.backend == CommBackend::virtual_;
  return lowering;
}

void epic::buildEpicToPTXPipeline(OpPassManager &pm, const EpicToPTXOptions &options) {
  ConvertCommToNVVMOptions commOptions;
  commOptions.backend = options.backend;

  // ep ops -> kernels of comm + upstream ops, then communication: it still
  // sees the comm types and gpu.block_id.
  pm.addPass(createConvertEPToComm(getEPToCommOptions(options)));
  pm.addPass(createConvertCommToNVVM(commOptions));

  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  target.linkLibs.push_back(getShimBitcodePath(options.backend, options.shimDir));
  pm.addPass(createGpuNVVMAttachTarget(target));

  // The upstream GPU-to-NVVM lowering, as gpu-lower-to-nvvm-pipeline does it.
  pm.addPass(createConvertNVGPUToNVVMPass());
  pm.addPass(createConvertVectorToSCFPass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertNVVMToLLVMPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  ConvertGpuOpsToNVVMOpsOptions gpuOptions;
  gpuOptions.useBarePtrCallConv = true; // kernels take plain pointers
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps(gpuOptions));
  pm.addNestedPass<gpu::GPUModuleOp>(createCanonicalizerPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createCSEPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createReconcileUnrealizedCastsPass());
  // Each kernel's parameter table becomes a by-value kernel parameter (the
  // GPU-to-NVVM lowering drops llvm.byval from gpu.func arguments).
  CommParamTablesByValueOptions tables;
  tables.backend = options.backend;
  pm.addPass(createCommParamTablesByValue(tables));

  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.toolkitPath = options.cudaPath.empty() ? std::string(EPIC_DEFAULT_CUDA_PATH)
                                                : std::string(options.cudaPath);
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void epic::registerEpicToPTXPipeline() {
  PassPipelineRegistration<EpicToPTXOptions>(
      "epic-to-ptx",
      "ep/comm IR to PTX (or cubin): comm-to-nvvm, NVVM target with the device "
      "shim linked in, GPU to NVVM/LLVM, gpu-module-to-binary",
      buildEpicToPTXPipeline);
}
