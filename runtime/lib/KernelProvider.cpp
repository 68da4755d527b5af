//===- KernelProvider.cpp - kernels for a request, cached -----------------===//

#include "epic/runtime/KernelProvider.h"

#include <algorithm>
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
#if !defined(EPIC_NCCL_VERSION_STRING) || !defined(EPIC_NCCL_MIN_PTX)
#error "the build defines EPIC_NCCL_VERSION_STRING and EPIC_NCCL_MIN_PTX"
#endif

std::string epic::runtime::shimHash() { return EPIC_KERNEL_SOURCE_HASH; }
std::string epic::runtime::ncclVersion() { return EPIC_NCCL_VERSION_STRING; }

namespace {
std::string readAll(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool debug() { return envFlag("EPIC_DEBUG"); }

/// A private temporary directory for one compiler run, removed afterwards.
struct WorkDirectory {
  fs::path path;
  explicit WorkDirectory(const std::string &name)
      : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    fs::create_directories(path);
  }
  ~WorkDirectory() {
    std::error_code e;
    fs::remove_all(path, e);
  }
};
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
  if (compileSettings.staged && compileSettings.backend != "virtual")
    throw std::invalid_argument("staged: only the virtual backend has one-pass kernels to "
                                "replace (nccl always stages), got backend \"" +
                                compileSettings.backend + "\"");
}

std::string KernelProvider::keyFor(const KernelInput &input) const {
  // The features the compiler's target gets: its default, +ptx82, raised to the
  // PTX ISA the nccl shim of this build's NCCL needs (EpicToPTX.cpp).
  int ptx = compileSettings.backend == "nccl" ? std::max(82, EPIC_NCCL_MIN_PTX) : 82;
  // A request's key says so: no request's JSON can then share a key with IR.
  std::string options =
      "backend=" + compileSettings.backend + " O=3 features=+ptx" + std::to_string(ptx);
  if (compileSettings.staged)
    options += " staged";
  if (input.isRequest())
    options += " request";
  return kernelKey({input.text(), options, ncclVersion(), shimHash(), compileSettings.arch});
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

std::string KernelProvider::inputArgument(const KernelInput &input, const std::string &directory) {
  fs::path path = fs::path(directory) / (input.isRequest() ? "request.json" : "entry.mlir");
  std::ofstream(path) << input.text();
  return input.isRequest() ? "--request=" + path.string() : path.string();
}

CompiledModule KernelProvider::compile(const KernelInput &input, const std::string &key) const {
  WorkDirectory scratch("epic-compile-" + key);
  const fs::path &work = scratch.path;
  std::string output = (work / "kernels").string();
  std::vector<std::string> arguments{inputArgument(input, work.string()),
                                     "--backend=" + compileSettings.backend,
                                     "--chip=" + compileSettings.arch, "-o", output};
  if (compileSettings.staged)
    arguments.push_back("--staged");
  runCompiler(arguments, (work / "log").string(), "kernel " + key);
  return {readAll(output + ".cubin"), readAll(output + ".ptx"), readAll(output + ".json")};
}

std::string KernelProvider::entryIR(const KernelRequest &request) const {
  KernelInput input(request);
  return entryIROf(input, keyFor(input));
}

std::string KernelProvider::entryIROf(const KernelInput &input, const std::string &key) const {
  WorkDirectory scratch("epic-entry-ir-" + key);
  const fs::path &work = scratch.path;
  std::string output = (work / "printed.mlir").string();
  runCompiler({inputArgument(input, work.string()), "--print-entry-ir"}, (work / "log").string(),
              "the entry IR of kernel " + key, output);
  return readAll(output);
}

void KernelProvider::runCompiler(const std::vector<std::string> &arguments, const std::string &log,
                                 const std::string &what, const std::string &output) const {
  std::string compiler = compilerPath();
  std::vector<char *> argv{const_cast<char *>(compiler.c_str())};
  for (const std::string &argument : arguments)
    argv.push_back(const_cast<char *>(argument.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    std::FILE *out = std::freopen(log.c_str(), "w", stderr);
    (void)out;
    if (output.empty() || !std::freopen(output.c_str(), "w", stdout))
      ::dup2(::fileno(stderr), ::fileno(stdout));
    ::execvp(compiler.c_str(), argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", compiler.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) < 0)
    throw std::runtime_error("cannot start the compiler " + compiler + ": " + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string text = readAll(log);
    if (text.empty())
      text = "cannot run " + compiler;
    while (!text.empty() && text.back() == '\n')
      text.pop_back();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      throw std::runtime_error(
          what + " is not in the kernel cache " + cache.directory() +
          " and the compiler is not available here (" + text +
          "); fill the cache ahead of time where epic-compile exists, or set EPIC_COMPILE");
    throw std::runtime_error("epic-compile failed for " + what + ":\n" + text);
  }
}

std::string KernelProvider::runPlan(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read the program " + path);
  std::string program((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The plan quotes source locations: the path is part of the key.
  std::string key = kernelKey({path + "\n" + program, "run-plan", ncclVersion(), shimHash(), ""});
  if (std::optional<std::string> plan = cache.loadText("plans", key)) {
    if (debug())
      std::fprintf(stderr, "epic: run plan of %s loaded from the cache (%s)\n", path.c_str(),
                   key.c_str());
    return *plan;
  }
  WorkDirectory scratch("epic-run-plan-" + key);
  const fs::path &work = scratch.path;
  std::string output = (work / "program").string();
  runCompiler({path, "--run-plan", "-o", output}, (work / "log").string(),
              "the run plan of " + path);
  std::string plan = readAll(output + ".plan.json");
  cache.storeText("plans", key, plan);
  if (debug())
    std::fprintf(stderr, "epic: run plan of %s compiled (%s)\n", path.c_str(), key.c_str());
  return plan;
}

void KernelProvider::dumpEntryIR(const KernelInput &input, const std::string &key) const {
  if (!input.isRequest()) {
    std::fprintf(stderr, "epic: entry IR of kernels %s:\n%s\n", key.c_str(), input.text().c_str());
    return;
  }
  std::string ir;
  try {
    ir = entryIROf(input, key);
  } catch (const std::runtime_error &e) {
    // Kernels loaded from a cache filled elsewhere: the request is what there is.
    std::fprintf(stderr, "epic: kernel request of kernels %s (no entry IR: %s):\n%s\n", key.c_str(),
                 e.what(), input.text().c_str());
    return;
  }
  std::fprintf(stderr, "epic: entry IR of kernels %s (kernel request %s):\n%s\n", key.c_str(),
               input.text().c_str(), ir.c_str());
}

KernelProvider::Result KernelProvider::get(const KernelInput &input) {
  Result result;
  result.key = keyFor(input);
  auto start = std::chrono::steady_clock::now();
  result.module =
      &cache.get(result.key, [&] { return compile(input, result.key); }, &result.source);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.source != KernelCache::Source::memory) {
    if (envFlag("EPIC_DUMP_IR"))
      dumpEntryIR(input, result.key);
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
