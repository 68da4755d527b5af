//===- Compiler.h - compile epic IR to PTX and cubins (no MLIR) -*- C++ -*-===//
//
// The compiler as a library, for tools/epic-compile (which the runtime runs
// on a kernel cache miss). Deliberately free of MLIR and LLVM headers so that
// code including it does not depend on them.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_COMPILER_H
#define EPIC_COMPILER_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace epic {

struct CompileOptions {
  std::string backend = "nccl"; ///< "nccl" or "virtual"
  /// Stage dispatch and combine rows in the window on the virtual backend too,
  /// as across processes (EpicToPTXOptions::staged).
  bool staged = false;
  std::string chip = "sm_90a";     // wgmma and TMA need the arch-specific target
  std::string features = "+ptx82"; ///< raised to what the linked shim needs
  unsigned optLevel = 3;
  std::string shimDir; ///< empty: the shims this build made
  /// The NCCL version whose shim the nccl backend links (a build's extra
  /// NCCL, see EPIC_EXTRA_NCCL_ROOTS); empty: the NCCL epic builds against.
  std::string ncclShim;
  std::string cudaPath;  ///< empty: the CUDA toolkit this build found (ptxas)
  bool emitCubin = true; ///< also assemble with `ptxas -v`
};

/// One kernel of the compiled module.
struct KernelInfo {
  std::string name;
  std::vector<std::string> argumentTypes; ///< as written in the input IR
  /// From `ptxas -v` (-1 when no cubin was made).
  int registers = -1;
  int64_t sharedBytes = -1;
  int64_t stackBytes = -1;
  int64_t spillStoreBytes = -1;
  int64_t spillLoadBytes = -1;
};

struct CompileResult {
  std::string ptx;
  std::string cubin; ///< empty unless CompileOptions::emitCubin
  std::string ptxasLog;
  std::vector<KernelInfo> kernels;
  /// One JSON object per launch function that convert-ep-to-comm made: its name,
  /// kernels in launch order, threads, parameter fields, window bytes, config.
  std::vector<std::string> entriesJson;
  /// As asked, with the features the target got (the PTX ISA raised to what
  /// the shim needs).
  CompileOptions options;
  /// The NCCL the nccl backend's shim was compiled against.
  std::string ncclVersion;
  /// Kernel names, argument types, register/shared-memory use, the target
  /// and the NCCL version, as a JSON object.
  std::string metadataJson() const;
};

/// A compile error: the MLIR diagnostics (with locations), or ptxas' output.
struct CompileError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Parses `source` (MLIR with gpu.module kernels in the comm and upstream
/// dialects), lowers it with the epic-to-ptx pipeline and, if asked,
/// assembles the PTX with ptxas. Throws CompileError.
CompileResult compileModule(const std::string &source, const CompileOptions &options,
                            const std::string &sourceName = "<input>");

/// compileModule for a kernel request: the JSON the runtime writes
/// (runtime/include/epic/runtime/KernelRequest.def), whose entry function the
/// compiler builds (EntryBuilder.h). Throws CompileError naming a bad field,
/// or refusing a request of another version.
CompileResult compileRequest(const std::string &request, const CompileOptions &options,
                             const std::string &sourceName = "<request>");

/// The entry IR of a kernel request as compileRequest builds it, printed
/// (what `epic-compile --print-entry-ir` and EPIC_DUMP_IR show). Throws like
/// compileRequest.
std::string printEntryIR(const std::string &request, const std::string &sourceName = "<request>");

/// Checks an epic-run program (a `func.func @main()` of run, ep, tensor.dim
/// and index arith.constant ops, see the run dialect) and returns its run
/// plan: JSON that tools/epic-run executes with the runtime, no MLIR needed.
/// Throws CompileError with the diagnostics.
std::string translateRunProgram(const std::string &source,
                                const std::string &sourceName = "<input>");

} // namespace epic

#endif // EPIC_COMPILER_H
