//===- Compiler.cpp - compile epic IR to PTX and cubins -------------------===//

#include "epic/Compiler.h"

#include "epic/Conversion/LaunchAttributes.h"
#include "epic/EntryBuilder.h"
#include "epic/InitAllDialects.h"
#include "epic/Support/SourceParser.h"
#include "epic/Pipelines/EpicToPTX.h"
#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/DebugStringHelper.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/SourceMgr.h"

#include <nccl.h>

using namespace mlir;
using namespace epic;

namespace {

/// Removes a temporary file when it goes out of scope.
struct TempFile {
  llvm::SmallString<128> path;
  explicit TempFile(llvm::StringRef suffix) {
    if (llvm::sys::fs::createTemporaryFile("epic", suffix, path))
      throw epic::CompileError("cannot create a temporary ." + suffix.str() + " file");
  }
  ~TempFile() { llvm::sys::fs::remove(path); }
};

std::string readFile(llvm::StringRef path) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false);
  if (!buffer)
    throw epic::CompileError("cannot read " + path.str());
  return (*buffer)->getBuffer().str();
}

void writeFile(llvm::StringRef path, llvm::StringRef data) {
  std::error_code error;
  llvm::raw_fd_ostream os(path, error);
  if (error)
    throw epic::CompileError("cannot write " + path.str() + ": " + error.message());
  os << data;
}

/// Assembles `result.ptx` with `ptxas -v` and fills in the cubin and the
/// per-kernel resource use it reports.
void assemble(epic::CompileResult &result, const epic::CompileOptions &options,
              llvm::StringRef cudaPath) {
  llvm::SmallString<256> ptxas(cudaPath);
  llvm::sys::path::append(ptxas, "bin", "ptxas");
  if (!llvm::sys::fs::can_execute(ptxas))
    throw epic::CompileError("ptxas not found at " + ptxas.str().str() +
                             " (set CompileOptions::cudaPath to the CUDA toolkit)");
  TempFile ptxFile("ptx"), cubinFile("cubin"), logFile("log");
  writeFile(ptxFile.path, result.ptx);
  std::string arch = "-arch=" + options.chip;
  llvm::StringRef args[] = {ptxas, arch, "-O3", "-v", ptxFile.path, "-o", cubinFile.path};
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, logFile.path, logFile.path};
  std::string error;
  int status = llvm::sys::ExecuteAndWait(ptxas, args, std::nullopt, redirects, 0, 0, &error);
  result.ptxasLog = readFile(logFile.path);
  if (status != 0)
    throw epic::CompileError("ptxas failed" + (error.empty() ? "" : " (" + error + ")") + ":\n" +
                             result.ptxasLog);
  result.cubin = readFile(cubinFile.path);

  // ptxas info : Function properties for NAME
  //     S bytes stack frame, A bytes spill stores, B bytes spill loads
  // ptxas info : Used R registers, ... [, M bytes smem] ...
  llvm::Regex properties("Function properties for ([A-Za-z0-9_$.]+)");
  llvm::Regex frame("([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) "
                    "bytes spill loads");
  llvm::Regex used("Used ([0-9]+) registers");
  llvm::Regex smem("([0-9]+) bytes smem");
  epic::KernelInfo *current = nullptr;
  llvm::SmallVector<llvm::StringRef> lines;
  llvm::StringRef(result.ptxasLog).split(lines, '\n');
  for (llvm::StringRef line : lines) {
    llvm::SmallVector<llvm::StringRef, 4> m;
    if (properties.match(line, &m)) {
      current = nullptr;
      for (epic::KernelInfo &k : result.kernels)
        if (k.name == m[1])
          current = &k;
    } else if (current && frame.match(line, &m)) {
      current->stackBytes = std::stoll(m[1].str());
      current->spillStoreBytes = std::stoll(m[2].str());
      current->spillLoadBytes = std::stoll(m[3].str());
    } else if (current && used.match(line, &m)) {
      current->registers = std::stoi(m[1].str());
      current->sharedBytes = smem.match(line, &m) ? std::stoll(m[1].str()) : 0;
    }
  }
}

/// Sets `pipeline` from `options`; throws for an unknown backend or a
/// missing device shim.
void setPipelineOptions(EpicToPTXOptions &pipeline, const epic::CompileOptions &options) {
  if (options.backend == "nccl")
    pipeline.backend = CommBackend::nccl;
  else if (options.backend == "virtual")
    pipeline.backend = CommBackend::virtual_;
  else
    throw epic::CompileError("backend must be \"nccl\" or \"virtual\", got \"" + options.backend +
                             "\"");
  if (!options.ncclShim.empty() && pipeline.backend != CommBackend::nccl)
    throw epic::CompileError("an NCCL shim (" + options.ncclShim +
                             ") is for the nccl backend, not " + options.backend);
  if (options.staged && pipeline.backend != CommBackend::virtual_)
    throw epic::CompileError("staged: only the virtual backend has a one-pass variant to "
                             "replace; the nccl backend always stages in the window");
  pipeline.staged = options.staged;
  pipeline.chip = options.chip;
  pipeline.features = options.features;
  pipeline.optLevel = options.optLevel;
  pipeline.shimDir = options.shimDir;
  pipeline.ncclShim = options.ncclShim;
  pipeline.cudaPath = options.cudaPath;
  pipeline.format = "isa";
  std::string shim = getShimBitcodePath(pipeline.backend, options.shimDir, options.ncclShim);
  if (llvm::sys::fs::exists(shim))
    return;
  if (options.ncclShim.empty())
    throw epic::CompileError("device shim bitcode not found: " + shim);
  // Name the shims there are.
  std::string built;
  llvm::StringRef dir = llvm::sys::path::parent_path(shim);
  std::error_code error;
  for (llvm::sys::fs::directory_iterator it(dir, error), end; it != end && !error;
       it.increment(error)) {
    llvm::StringRef file = llvm::sys::path::filename(it->path());
    if (file.starts_with("epic_shim_nccl") && file.ends_with(".bc")) {
      std::string version = readShimInfo(it->path()).ncclVersion;
      built += (built.empty() ? "" : ", ") + (version.empty() ? file.str() : version);
    }
  }
  throw epic::CompileError(
      "no device shim for NCCL " + options.ncclShim + " in " + dir.str() +
      " (there: " + (built.empty() ? "none" : built) +
      "); configure the build with -DEPIC_EXTRA_NCCL_ROOTS=<that NCCL's root>");
}

/// A context with every dialect and extension the pipeline meets.
std::unique_ptr<MLIRContext> compilerContext() {
  DialectRegistry registry;
  registerAllDialects(registry);
  registerCompilerExtensions(registry);
  auto context = std::make_unique<MLIRContext>(registry);
  context->loadAllAvailableDialects();
  return context;
}

/// The diagnostics of a module built from a request, which has no text to
/// quote: one "<source>: error: message" line each (notes included).
class RequestDiagnostics {
public:
  RequestDiagnostics(MLIRContext &context, std::string sourceName)
      : sourceName(std::move(sourceName)), handler(&context, [this](Diagnostic &diagnostic) {
          add(diagnostic);
          return success();
        }) {
    // The message names the op; the entry is the request's, not the user's IR.
    context.printOpOnDiagnostic(false);
  }
  const std::string &text() const { return collected; }

private:
  void add(Diagnostic &diagnostic) {
    const char *severity = diagnostic.getSeverity() == DiagnosticSeverity::Error     ? "error"
                           : diagnostic.getSeverity() == DiagnosticSeverity::Warning ? "warning"
                                                                                     : "note";
    collected += sourceName + ": " + severity + ": " + diagnostic.str() + "\n";
    for (Diagnostic &note : diagnostic.getNotes())
      add(note);
  }

  std::string sourceName, collected;
  ScopedDiagnosticHandler handler;
};

/// The verified entry module of the kernel request `text`. Throws
/// CompileError naming the bad field.
OwningOpRef<ModuleOp> buildRequest(MLIRContext &context, const std::string &text,
                                   const std::string &sourceName,
                                   const RequestDiagnostics &diagnostics) {
  llvm::Expected<epic::EntryRequest> request = epic::parseEntryRequest(text);
  if (!request)
    throw epic::CompileError(sourceName + ": " + llvm::toString(request.takeError()));
  OwningOpRef<ModuleOp> module =
      epic::buildEntryModule(*request, FileLineColLoc::get(&context, sourceName, 1, 1));
  if (!module || failed(verify(*module)))
    throw epic::CompileError("the entry of kernel request " + sourceName + " is invalid:\n" +
                             llvm::StringRef(diagnostics.text()).rtrim().str());
  return module;
}

/// Expands the ep ops of `module` into kernels, lowers them to PTX and, if
/// asked, assembles it. `diagnostics` collects what the passes report.
epic::CompileResult lower(MLIRContext &context, ModuleOp module,
                          const epic::CompileOptions &options, const EpicToPTXOptions &pipeline,
                          const std::string &sourceName, const std::string &diagnostics) {
  using epic::CompileError;
  std::string cudaPath = options.cudaPath.empty() ? EPIC_DEFAULT_CUDA_PATH : options.cudaPath;
  // ep ops become kernels first, so their names and signatures can be read.
  // ep ops the compiler can fuse become one op (a dispatch feeding the expert
  // GEMM), then every ep op becomes kernels.
  // A compiled function holds one ep op or one pair to fuse, so every pair
  // that can be fused is. The cost model decides where a refusal leaves
  // working code: epic-opt, and epic-run programs, whose ops are separate
  // steps (RunPlan).
  PassManager expand(&context);
  epic::addEntryFusionPasses(expand, pipeline.chip);
  expand.addPass(createConvertEPToComm(getEPToCommOptions(pipeline)));
  if (failed(expand.run(module)))
    throw CompileError("expanding the ep ops of " + sourceName + " failed:\n" + diagnostics);

  epic::CompileResult result;
  result.options = options;
  result.options.features = getTargetFeatures(pipeline);
  if (pipeline.backend == CommBackend::nccl)
    result.ncclVersion =
        readShimInfo(getShimBitcodePath(pipeline.backend, pipeline.shimDir, pipeline.ncclShim))
            .ncclVersion;
  if (result.ncclVersion.empty()) // the virtual backend: the NCCL this build has
    result.ncclVersion = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                         std::to_string(NCCL_PATCH);
  // The launch metadata: each launch function's epic.* attributes, checked
  // against LaunchMetadata.def (also what the DSL wrote).
  const std::string entryAttr = epic::launchAttributeName(epic::LaunchField::entry);
  bool metadataOk = true;
  module.walk([&](func::FuncOp func) {
    if (!func->hasAttr(entryAttr))
      return;
    FailureOr<llvm::json::Object> entry = epic::launchMetadataJson(func);
    if (failed(entry)) {
      metadataOk = false;
      return;
    }
    (*entry)["name"] = func.getName().str();
    std::string text;
    llvm::raw_string_ostream os(text);
    os << llvm::json::Value(std::move(*entry));
    result.entriesJson.push_back(text);
  });
  if (!metadataOk)
    throw CompileError("the launch metadata of " + sourceName + " is invalid:\n" + diagnostics);
  module.walk([&](gpu::GPUFuncOp func) {
    if (!func.isKernel())
      return;
    epic::KernelInfo kernel;
    kernel.name = func.getName().str();
    for (Type type : func.getArgumentTypes())
      kernel.argumentTypes.push_back(debugString(type));
    result.kernels.push_back(std::move(kernel));
  });
  if (result.kernels.empty())
    throw CompileError(sourceName + " has no gpu.func kernel to compile");

  PassManager pm(&context);
  buildEpicToPTXPipeline(pm, pipeline);
  if (failed(pm.run(module)))
    throw CompileError("lowering " + sourceName + " to PTX failed:\n" + diagnostics);

  SmallVector<gpu::BinaryOp> binaries(module.getOps<gpu::BinaryOp>());
  if (binaries.size() != 1)
    throw CompileError(sourceName + ": expected exactly one gpu.module, found " +
                       std::to_string(binaries.size()));
  auto object = cast<gpu::ObjectAttr>(binaries.front().getObjects()[0]);
  result.ptx = object.getObject().getValue().str();

  if (options.emitCubin)
    assemble(result, options, cudaPath);
  return result;
}

} // namespace

epic::CompileResult epic::compileModule(const std::string &source, const CompileOptions &options,
                                        const std::string &sourceName) {
  EpicToPTXOptions pipeline;
  setPipelineOptions(pipeline, options);
  std::unique_ptr<MLIRContext> context = compilerContext();
  // Diagnostics go into the exception, with their source locations.
  SourceParser parser(*context, source, sourceName);
  OwningOpRef<ModuleOp> module = parser.parse();
  if (!module)
    throw CompileError("cannot parse " + sourceName + ":\n" + parser.diagnostics());
  return lower(*context, *module, options, pipeline, sourceName, parser.diagnostics());
}

epic::CompileResult epic::compileRequest(const std::string &request, const CompileOptions &options,
                                         const std::string &sourceName) {
  EpicToPTXOptions pipeline;
  setPipelineOptions(pipeline, options);
  std::unique_ptr<MLIRContext> context = compilerContext();
  RequestDiagnostics diagnostics(*context, sourceName);
  OwningOpRef<ModuleOp> module = buildRequest(*context, request, sourceName, diagnostics);
  return lower(*context, *module, options, pipeline, sourceName, diagnostics.text());
}

std::string epic::printEntryIR(const std::string &request, const std::string &sourceName) {
  std::unique_ptr<MLIRContext> context = compilerContext();
  RequestDiagnostics diagnostics(*context, sourceName);
  OwningOpRef<ModuleOp> module = buildRequest(*context, request, sourceName, diagnostics);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  os << "\n";
  return text;
}

std::string epic::CompileResult::metadataJson() const {
  llvm::json::Array kernelArray;
  for (const KernelInfo &k : kernels) {
    llvm::json::Array args;
    for (const std::string &type : k.argumentTypes)
      args.push_back(type);
    kernelArray.push_back(llvm::json::Object{
        {"name", k.name},
        {"arguments", std::move(args)},
        {"registers", k.registers},
        {"shared_bytes", k.sharedBytes},
        {"stack_bytes", k.stackBytes},
        {"spill_store_bytes", k.spillStoreBytes},
        {"spill_load_bytes", k.spillLoadBytes},
    });
  }
  llvm::json::Array entries;
  for (const std::string &entry : entriesJson) {
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(entry);
    if (!parsed) // entriesJson holds what compileModule serialized: a bug, not an input
      throw CompileError("launch metadata that is not JSON: " + llvm::toString(parsed.takeError()));
    entries.push_back(std::move(*parsed));
  }
  llvm::json::Object root{
      {"kernels", std::move(kernelArray)},
      {"entries", std::move(entries)},
      {"target", llvm::json::Object{{"chip", options.chip},
                                    {"features", options.features},
                                    {"opt_level", int64_t(options.optLevel)}}},
      {"backend", options.backend},
      {"nccl_version", ncclVersion},
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root)));
  return text;
}
