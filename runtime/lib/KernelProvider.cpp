//===- KernelProvider.cpp - kernels for an entry IR, cached ---------------===//

#include "epic/runtime/KernelProvider.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

using namespace epic::runtime;
namespace fs = std::filesystem;

#include "KernelSourceHash.h" // generated: EPIC_KERNEL_SOURCE_HASH
#ifndef EPIC_KERNEL_SOURCE_HASH
#error "the build generates EPIC_KERNEL_SOURCE_HASH"
#endif
#ifndef EPIC_NCCL_VERSION_STRING
#error "the build defines EPIC_NCCL_VERSION_STRING"
#endif

std::string epic::runtime::shimHash() { return EPIC_KERNEL_SOURCE_HASH; }
std::string epic::runtime::ncclVersion() { return EPIC_NCCL_VERSION_STRING; }

namespace {
std::string readAll(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool debug() { return envFlag("EPIC_DEBUG"); }
} // namespace

bool epic::runtime::envFlag(const char *name) {
  const char *value = std::getenv(name);
  return value && *value && std::string(value) != "0";
}

KernelProvider::KernelProvider(KernelCache &cache, CompileSettings settings)
    : cache(cache), compileSettings(std::move(settings)) {
  if (compileSettings.backend != "nccl" && compileSettings.backend != "virtual")
    throw std::invalid_argument("backend must be \"nccl\" or \"virtual\", got \"" +
                                compileSettings.backend + "\"");
}

std::string KernelProvider::keyFor(const std::string &ir) const {
  return kernelKey({ir, "backend=" + compileSettings.backend + " O=3 features=+ptx82",
                    ncclVersion(), shimHash(), compileSettings.arch});
}

std::string KernelProvider::compilerPath() const {
  if (!compileSettings.compiler.empty())
    return compileSettings.compiler;
  if (const char *env = std::getenv("EPIC_COMPILE"); env && *env)
    return env;
#ifdef EPIC_DEFAULT_COMPILE
  if (fs::exists(EPIC_DEFAULT_COMPILE))
    return EPIC_DEFAULT_COMPILE;
#endif
  return "epic-compile";
}

CompiledModule KernelProvider::compile(const std::string &ir, const std::string &key) const {
  fs::path work = fs::temp_directory_path() /
                  ("epic-compile-" + key + "-" + std::to_string(::getpid()));
  fs::create_directories(work);
  struct Cleanup {
    fs::path path;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(path, e);
    }
  } cleanup{work};
  {
    std::ofstream(work / "entry.mlir") << ir;
  }
  std::string compiler = compilerPath();
  std::string input = (work / "entry.mlir").string(), output = (work / "kernels").string();
  std::string backend = "--backend=" + compileSettings.backend;
  std::string chip = "--chip=" + compileSettings.arch;
  std::string log = (work / "log").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE *out = std::freopen(log.c_str(), "w", stderr);
    (void)out;
    ::dup2(::fileno(stderr), ::fileno(stdout));
    ::execlp(compiler.c_str(), compiler.c_str(), input.c_str(), backend.c_str(), chip.c_str(),
             "-o", output.c_str(), (char *)nullptr);
    std::fprintf(stderr, "cannot run %s: %s\n", compiler.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) < 0)
    throw std::runtime_error("cannot start the compiler " + compiler + ": " +
                             std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string text = readAll(log);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      throw std::runtime_error(
          "kernel " + key + " is not in the kernel cache " + cache.directory() +
          " and the compiler is not available here (" + text +
          "); fill the cache ahead of time where epic-compile exists, or set EPIC_COMPILE");
    throw std::runtime_error("epic-compile failed for kernel " + key + ":\n" + text);
  }
  return {readAll(output + ".cubin"), readAll(output + ".ptx"), readAll(output + ".json")};
}

KernelProvider::Result KernelProvider::get(const std::string &ir) {
  Result result;
  result.key = keyFor(ir);
  auto start = std::chrono::steady_clock::now();
  result.module = &cache.get(result.key, [&] { return compile(ir, result.key); }, &result.source);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.source != KernelCache::Source::memory) {
    if (envFlag("EPIC_DUMP_IR"))
      std::fprintf(stderr, "epic: entry IR of kernels %s:\n%s\n", result.key.c_str(), ir.c_str());
    if (envFlag("EPIC_DUMP_PTX"))
      std::fprintf(stderr, "epic: PTX of kernels %s:\n%s\n", result.key.c_str(),
                   result.module->ptx.c_str());
  }
  if (debug() && result.source != KernelCache::Source::memory)
    std::fprintf(stderr, "epic: kernels %s %s in %.6f s (%s)\n", result.key.c_str(),
                 result.source == KernelCache::Source::compiled ? "compiled" : "loaded from disk",
                 result.seconds, cache.entryDirectory(result.key).c_str());
  return result;
}
