//===- epic-compile.cpp - epic IR to PTX, cubin and metadata --------------===//
//
//   epic-compile kernels.mlir -o out/kernels [--backend=virtual] [--chip=sm_90a]
//
// writes out/kernels.ptx, out/kernels.cubin and out/kernels.json (kernel
// names, argument types, registers, shared memory, spills, target, NCCL
// version). A deployment fills its kernel cache this way ahead of time.
// `--staged` (virtual backend) builds the kernels that stage rows in the
// window, as across processes, instead of the one-pass ones.
//
//   epic-compile program.mlir --run-plan -o out/program
//
// checks an epic-run program (see the run dialect) and writes its run plan,
// out/program.plan.json (`-o -`: to stdout), which tools/epic-run executes.
//
//   epic-compile --request=request.json -o out/kernels [--backend=...]
//   epic-compile --request=request.json --print-entry-ir
//
// compile the kernels of a kernel request, the JSON the runtime asks for
// kernels with (runtime/include/epic/runtime/KernelRequest.def), or print the
// entry IR the compiler builds for it (to stdout).
//
//   epic-compile kernels.mlir --backend=nccl --nccl-shim=2.32.3 -o out/kernels
//
// compiles the nccl backend's kernels against another NCCL than the one epic
// builds against (a shim the build made for EPIC_EXTRA_NCCL_ROOTS); the PTX
// ISA rises to what that NCCL's device API needs.
//
//===----------------------------------------------------------------------===//

#include "epic/Compiler.h"
#include "epic/Support/LargeStack.h"

#include "mlir/IR/AsmState.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

namespace cl = llvm::cl;

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<input .mlir>"));
static cl::opt<std::string> requestFile("request",
                                        cl::desc("a kernel request (JSON) instead of an input"),
                                        cl::value_desc("file"));
static cl::opt<bool>
    printEntryIRRequested("print-entry-ir",
                          cl::desc("print the entry IR of --request (no kernels)"));
static cl::opt<std::string> outputPrefix("o", cl::desc("output prefix (default: the input's)"),
                                         cl::value_desc("prefix"));
static cl::opt<std::string> backend("backend", cl::desc("nccl or virtual"), cl::init("nccl"));
static cl::opt<bool> staged("staged",
                            cl::desc("virtual backend: stage dispatch and combine rows in the "
                                     "window, as across processes (the NCCL path's kernels)"));
static cl::opt<std::string> chip("chip", cl::desc("GPU architecture"), cl::init("sm_90a"));
static cl::opt<std::string> features("features", cl::desc("PTX features"), cl::init("+ptx82"));
static cl::opt<unsigned> optLevel("O", cl::desc("optimization level"), cl::init(3));
static cl::opt<std::string> shimDir("shim-dir", cl::desc("device shim bitcode directory"));
static cl::opt<std::string> ncclShim(
    "nccl-shim",
    cl::desc("link the nccl backend's shim for this NCCL version (one the build was "
             "configured with, EPIC_EXTRA_NCCL_ROOTS; default: the NCCL it builds against)"),
    cl::value_desc("version"));
static cl::opt<std::string> cudaPath("cuda-path", cl::desc("CUDA toolkit (ptxas)"));
static cl::opt<bool> noCubin("no-cubin", cl::desc("write PTX and metadata only"));
static cl::opt<bool> verbose("v", cl::desc("print ptxas' report"));
static cl::opt<bool> runPlan("run-plan",
                             cl::desc("write the run plan of an epic-run program (no kernels)"));

static int write(const std::string &path, const std::string &data) {
  std::error_code error;
  llvm::raw_fd_ostream os(path, error);
  if (error) {
    llvm::errs() << "epic-compile: cannot write " << path << ": " << error.message() << "\n";
    return 1;
  }
  os << data;
  return 0;
}

static int compileMain(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // --print-entry-ir prints as asked (e.g. --mlir-print-op-generic).
  mlir::registerAsmPrinterCLOptions();
  cl::ParseCommandLineOptions(argc, argv, "epic IR -> PTX, cubin and JSON metadata\n");

  if (inputFile.empty() == requestFile.empty()) {
    llvm::errs() << "epic-compile: give either an input .mlir or --request=<file>\n";
    return 1;
  }
  if (runPlan && !requestFile.empty()) {
    llvm::errs() << "epic-compile: --run-plan reads an epic-run program, not a --request\n";
    return 1;
  }
  if (printEntryIRRequested && requestFile.empty()) {
    llvm::errs() << "epic-compile: --print-entry-ir prints what a --request builds\n";
    return 1;
  }
  const std::string &inputName = requestFile.empty() ? inputFile : requestFile;
  auto input = llvm::MemoryBuffer::getFileOrSTDIN(inputName);
  if (!input) {
    llvm::errs() << "epic-compile: cannot read " << inputName << "\n";
    return 1;
  }
  std::string source = (*input)->getBuffer().str();
  epic::CompileOptions options;
  options.backend = backend;
  options.staged = staged;
  options.chip = chip;
  options.features = features;
  options.optLevel = optLevel;
  options.shimDir = shimDir;
  options.ncclShim = ncclShim;
  options.cudaPath = cudaPath;
  options.emitCubin = !noCubin;

  std::string prefix = outputPrefix;
  if (prefix.empty()) {
    llvm::StringRef in(inputName);
    prefix = (in == "-" ? llvm::StringRef("out") : in.rsplit('.').first).str();
  }
  try {
    if (printEntryIRRequested) {
      llvm::outs() << epic::printEntryIR(source, inputName);
      return 0;
    }
    if (runPlan) {
      std::string plan = epic::translateRunProgram(source, inputFile);
      if (prefix == "-") {
        llvm::outs() << plan;
        return 0;
      }
      return write(prefix + ".plan.json", plan);
    }
    epic::CompileResult result = requestFile.empty()
                                     ? epic::compileModule(source, options, inputFile)
                                     : epic::compileRequest(source, options, requestFile);
    if (verbose)
      llvm::errs() << result.ptxasLog;
    int failed =
        write(prefix + ".ptx", result.ptx) + write(prefix + ".json", result.metadataJson());
    if (options.emitCubin)
      failed += write(prefix + ".cubin", result.cubin);
    return failed ? 1 : 0;
  } catch (const epic::CompileError &error) {
    llvm::errs() << "epic-compile: " << error.what() << "\n";
    return 1;
  }
}

int main(int argc, char **argv) {
  return epic::runWithLargeStack([&] { return compileMain(argc, argv); });
}
