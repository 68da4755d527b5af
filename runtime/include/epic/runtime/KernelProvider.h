//===- KernelProvider.h - kernels for an entry IR, cached -------*- C++ -*-===//
//
// Turns the entry IR of an ep op into a compiled module: from the kernel
// cache, or — on a miss, where the compiler is installed — by running
// epic-compile (the runtime links no LLVM). Cold compile and warm load times
// are measured, and printed when EPIC_DEBUG is set; EPIC_DUMP_IR and
// EPIC_DUMP_PTX print the entry IR and the PTX of every module the first
// time a process asks for it.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_KERNELPROVIDER_H
#define EPIC_RUNTIME_KERNELPROVIDER_H

#include "epic/runtime/KernelCache.h"

#include <string>
#include <vector>

namespace epic::runtime {

struct CompileSettings {
  std::string backend = "nccl"; ///< "nccl" or "virtual"
  std::string arch = "sm_90a";  // Hopper-specific: wgmma (ep.grouped_gemm) needs sm_90a
  /// epic-compile to run on a miss; empty: $EPIC_COMPILE, else the one this
  /// build made (if any), else `epic-compile` on PATH.
  std::string compiler;
};

/// The hash of the compiler's and the device shims' sources and the NCCL
/// version, fixed when the runtime was built: part of every kernel key.
std::string shimHash();
/// "MAJOR.MINOR.PATCH" of the NCCL headers the runtime was built against.
std::string ncclVersion();
/// Whether the environment variable `name` is set to anything but "" or "0"
/// (EPIC_DEBUG, EPIC_DUMP_IR, EPIC_DUMP_PTX).
bool envFlag(const char *name);

class KernelProvider {
public:
  KernelProvider(KernelCache &cache, CompileSettings settings);

  struct Result {
    const CompiledModule *module = nullptr;
    KernelCache::Source source = KernelCache::Source::memory;
    double seconds = 0; ///< compile (miss) or load time
    std::string key;
  };

  /// The module for `ir`. Throws std::runtime_error when it is neither cached
  /// nor compilable here, or when the compiler fails (with its diagnostics).
  Result get(const std::string &ir);

  std::string keyFor(const std::string &ir) const;

  /// The run plan of the epic-run program in the file `path` (see
  /// RunProgram.h): from the cache (<cache>/plans), else made by the
  /// compiler (`epic-compile --run-plan`) and stored. Throws like get().
  std::string runPlan(const std::string &path);
  const CompileSettings &settings() const { return compileSettings; }
  const std::string &cacheDirectory() const { return cache.directory(); }

private:
  CompiledModule compile(const std::string &ir, const std::string &key) const;
  /// Runs the compiler with `arguments`, its output into `log`; throws with
  /// the log if it fails or cannot be started (naming `what`).
  void runCompiler(const std::vector<std::string> &arguments, const std::string &log,
                   const std::string &what) const;
  std::string compilerPath() const;

  KernelCache &cache;
  CompileSettings compileSettings;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_KERNELPROVIDER_H
