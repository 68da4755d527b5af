//===- KernelProvider.h - kernels for a request, cached ---------*- C++ -*-===//
//
// Turns a kernel request (KernelRequest.h), or entry IR of the caller's own,
// into a compiled module: from the kernel cache, or — on a miss, where the
// compiler is installed — by running epic-compile (the runtime links no
// LLVM). Cold compile and warm load times are measured, and printed when
// EPIC_DEBUG is set; EPIC_DUMP_IR and EPIC_DUMP_PTX print the entry IR (a
// request's as the compiler builds it, from a second epic-compile run) and
// the PTX of every module the first time a process asks for it.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_KERNELPROVIDER_H
#define EPIC_RUNTIME_KERNELPROVIDER_H

#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelRequest.h"

#include <string>
#include <vector>

namespace epic::runtime {

struct CompileSettings {
  std::string backend = "nccl"; ///< "nccl" or "virtual"
  std::string arch = "sm_90a";  // Hopper-specific: wgmma (ep.grouped_gemm) needs sm_90a
  /// epic-compile to run on a miss; empty: $EPIC_COMPILE, else the one this
  /// build made (if any), else `epic-compile` on PATH.
  std::string compiler;
  /// virtual: the kernels that stage rows in the window, as across processes
  /// (epic-compile --staged), instead of the one-pass ones.
  bool staged = false;
};

/// The hash of the compiler's and the device shims' sources and the NCCL
/// version, fixed when the runtime was built: part of every kernel key.
std::string shimHash();
/// "MAJOR.MINOR.PATCH" of the NCCL headers the runtime was built against.
std::string ncclVersion();
/// Whether the environment variable `name` is set to anything but "" or "0"
/// (EPIC_DEBUG, EPIC_DUMP_IR, EPIC_DUMP_PTX).
bool envFlag(const char *name);

/// What a module is compiled from: a kernel request (the typed API's ep
/// ops), or entry IR that the caller wrote (an @epic.jit kernel's), which the
/// runtime passes on as it is.
class KernelInput {
public:
  /// The request's canonical JSON; throws std::invalid_argument for an
  /// invalid request.
  KernelInput(const KernelRequest &request) : isRequestInput(true), body(request.json()) {}
  static KernelInput fromIR(std::string ir) { return KernelInput(false, std::move(ir)); }

  bool isRequest() const { return isRequestInput; }
  /// The request's JSON, or the IR.
  const std::string &text() const { return body; }

private:
  KernelInput(bool isRequest, std::string text)
      : isRequestInput(isRequest), body(std::move(text)) {}
  bool isRequestInput;
  std::string body;
};

class KernelProvider {
public:
  KernelProvider(KernelCache &cache, CompileSettings settings);

  struct Result {
    const CompiledModule *module = nullptr;
    KernelCache::Source source = KernelCache::Source::memory;
    double seconds = 0; ///< compile (miss) or load time
    std::string key;
  };

  /// The module for `input`. Throws std::runtime_error when it is neither
  /// cached nor compilable here, or when the compiler fails (with its
  /// diagnostics).
  Result get(const KernelInput &input);

  std::string keyFor(const KernelInput &input) const;

  /// The entry IR the compiler builds for `request` (`epic-compile --request
  /// --print-entry-ir`): for people to read, the runtime writes none. Throws
  /// like get() without a compiler.
  std::string entryIR(const KernelRequest &request) const;

  /// The run plan of the epic-run program in the file `path` (see
  /// RunProgram.h): from the cache (<cache>/plans), else made by the
  /// compiler (`epic-compile --run-plan`) and stored. Throws like get().
  std::string runPlan(const std::string &path);
  const CompileSettings &settings() const { return compileSettings; }
  const std::string &cacheDirectory() const { return cache.directory(); }

private:
  CompiledModule compile(const KernelInput &input, const std::string &key) const;
  /// Runs the compiler with `arguments`, its output into `log` (its standard
  /// output into `output` if given); throws with the log if it fails or
  /// cannot be started (naming `what`).
  void runCompiler(const std::vector<std::string> &arguments, const std::string &log,
                   const std::string &what, const std::string &output = "") const;
  /// The entry IR of a request input (the compiler prints it).
  std::string entryIROf(const KernelInput &input, const std::string &key) const;
  /// EPIC_DUMP_IR: `input`'s entry IR on stderr; a request's without a
  /// compiler here (kernels from a cache filled elsewhere) as its JSON.
  void dumpEntryIR(const KernelInput &input, const std::string &key) const;
  /// The compiler's argument naming `input`, written into `directory`.
  static std::string inputArgument(const KernelInput &input, const std::string &directory);
  std::string compilerPath() const;

  KernelCache &cache;
  CompileSettings compileSettings;
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_KERNELPROVIDER_H
