//===- epic-compile.cpp - epic IR to PTX, cubin and metadata --------------===//
//
//   epic-compile kernels.mlir -o out/kernels [--backend=virtual] [--chip=sm_90a]
//
// writes out/kernels.ptx, out/kernels.cubin and out/kernels.json (kernel
// names, argument types, registers, shared memory, spills, target, NCCL
// version). A deployment fills its kernel cache this way ahead of time.
//
//   epic-compile program.mlir --run-plan -o out/program
//
// checks an epic-run program (see the run dialect) and writes its run plan,
// out/program.plan.json (`-o -`: to stdout), which tools/epic-run executes.
//
//===----------------------------------------------------------------------===//

#include "epic/Compiler.h"
#include "epic/Support/LargeStack.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

namespace cl = llvm::cl;

static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<input .mlir>"), cl::Required);
static cl::opt<std::string> outputPrefix("o", cl::desc("output prefix (default: the input's)"),
                                         cl::value_desc("prefix"));
static cl::opt<std::string> backend("backend", cl::desc("nccl or virtual"), cl::init("nccl"));
static cl::opt<std::string> chip("chip", cl::desc("GPU architecture"), cl::init("sm_90a"));
static cl::opt<std::string> features("features", cl::desc("PTX features"), cl::init("+ptx82"));
static cl::opt<unsigned> optLevel("O", cl::desc("optimization level"), cl::init(3));
static cl::opt<std::string> shimDir("shim-dir", cl::desc("device shim bitcode directory"));
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
  cl::ParseCommandLineOptions(argc, argv, "epic IR -> PTX, cubin and JSON metadata\n");

  auto input = llvm::MemoryBuffer::getFileOrSTDIN(inputFile);
  if (!input) {
    llvm::errs() << "epic-compile: cannot read " << inputFile << "\n";
    return 1;
  }
  epic::CompileOptions options;
  options.backend = backend;
  options.chip = chip;
  options.features = features;
  options.optLevel = optLevel;
  options.shimDir = shimDir;
  options.cudaPath = cudaPath;
  options.emitCubin = !noCubin;

  std::string prefix = outputPrefix;
  if (prefix.empty()) {
    llvm::StringRef in(inputFile);
    prefix = (in == "-" ? llvm::StringRef("out") : in.rsplit('.').first).str();
  }
  try {
    if (runPlan) {
      std::string plan = epic::translateRunProgram((*input)->getBuffer().str(), inputFile);
      if (prefix == "-") {
        llvm::outs() << plan;
        return 0;
      }
      return write(prefix + ".plan.json", plan);
    }
    epic::CompileResult result =
        epic::compileModule((*input)->getBuffer().str(), options, inputFile);
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
