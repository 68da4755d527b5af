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
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <algorithm>

using namespace mlir;

llvm::StringRef epic::stringifyCommBackend(CommBackend backend) {
  return backend == CommBackend::nccl ? "nccl" : "virtual";
}

std::string epic::getShimBitcodePath(CommBackend backend, llvm::StringRef shimDir,
                                     llvm::StringRef ncclShim) {
  std::string name = ("epic_shim_" + stringifyCommBackend(backend)).str();
  auto pathOf = [&](const llvm::Twine &file) {
    llvm::SmallString<256> path(shimDir.empty() ? llvm::StringRef(EPIC_DEFAULT_SHIM_DIR) : shimDir);
    llvm::sys::path::append(path, file + ".bc");
    return std::string(path);
  };
  std::string path = pathOf(name);
  if (backend != CommBackend::nccl || ncclShim.empty())
    return path;
  std::string versioned = pathOf(name + "-" + ncclShim);
  // The default shim answers to its own version too.
  if (!llvm::sys::fs::exists(versioned) && readShimInfo(path).ncclVersion == ncclShim)
    return path;
  return versioned;
}

epic::ShimInfo epic::readShimInfo(llvm::StringRef shimPath) {
  ShimInfo info;
  llvm::SmallString<256> sidecar(shimPath);
  llvm::sys::path::replace_extension(sidecar, "json");
  auto buffer = llvm::MemoryBuffer::getFile(sidecar, /*IsText=*/true);
  if (!buffer)
    return info;
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    llvm::consumeError(parsed.takeError());
    return info;
  }
  if (const llvm::json::Object *object = parsed->getAsObject()) {
    if (std::optional<llvm::StringRef> version = object->getString("nccl_version"))
      info.ncclVersion = version->str();
    if (std::optional<int64_t> ptx = object->getInteger("min_ptx"); ptx && *ptx > 0)
      info.minPtx = unsigned(*ptx);
  }
  return info;
}

std::string epic::raisePtxVersion(llvm::StringRef features, unsigned minPtx) {
  llvm::SmallVector<llvm::StringRef> parts;
  features.split(parts, ',', /*MaxSplit=*/-1, /*KeepEmpty=*/false);
  auto ptxVersion = [](llvm::StringRef feature) -> std::optional<unsigned> {
    unsigned version;
    if (feature.consume_front("+ptx") && !feature.getAsInteger(10, version))
      return version;
    return std::nullopt;
  };
  unsigned requested = 0;
  for (llvm::StringRef part : parts)
    requested = std::max(requested, ptxVersion(part).value_or(0));
  if (requested >= minPtx)
    return features.str();
  std::string raised = "+ptx" + std::to_string(minPtx), result;
  bool placed = false;
  for (llvm::StringRef part : parts) {
    if (ptxVersion(part)) {
      if (placed)
        continue;
      part = raised;
      placed = true;
    }
    result += (result.empty() ? "" : ",") + part.str();
  }
  if (!placed)
    result += (result.empty() ? "" : ",") + raised;
  return result;
}

std::string epic::getTargetFeatures(const EpicToPTXOptions &options) {
  std::string shim = getShimBitcodePath(options.backend, options.shimDir, options.ncclShim);
  return raisePtxVersion(options.features, readShimInfo(shim).minPtx);
}

epic::ConvertEPToCommOptions epic::getEPToCommOptions(const EpicToPTXOptions &options) {
  ConvertEPToCommOptions lowering;
  // One address space: a kernel reaches every rank's tensors, so neither
  // dispatch nor combine stages rows in the window (unless asked to).
  const bool onePass = options.backend == CommBackend::virtual_ && !options.staged;
  lowering.onePassDispatch = onePass;
  lowering.onePassCombine = onePass;
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
  target.features = getTargetFeatures(options);
  target.optLevel = options.optLevel;
  target.linkLibs.push_back(getShimBitcodePath(options.backend, options.shimDir, options.ncclShim));
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
  // Dynamic shared memory after the static variables (the GEMMs' mbarriers),
  // not over them.
  pm.addPass(createExternDynamicSharedMemory());
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
