//===- epic-run.cpp - run an epic-run program on a GPU --------------------===//
//
//   epic-run program.mlir [--check] [--backend=virtual|nccl] [--blocks-per-rank=N]
//   epic-run program.mlir --compile-only      (no GPU needed)
//   epic-run --plan program.plan.json ...
//
// Like mlir-runner for ep programs: the program (a func.func @main of run and
// ep ops, see the run dialect) becomes a run plan and kernels, through the
// kernel cache (EPIC_CACHE_DIR) or epic-compile, and runs on the GPU: a
// virtual world of the program's ranks on one GPU, or NCCL for one rank.
// `--check` compares every ep op's results with DeepEP's semantics. The tool
// links no LLVM: on a GPU machine without the compiler, fill the cache first
// with `epic-run --compile-only` where epic-compile exists.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/RunProgram.h"
#include "epic/runtime/VirtualBuffer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace epic::runtime;

namespace {

const char *kUsage =
    "usage: epic-run <program.mlir | --plan plan.json> [options]\n"
    "  --check                compare every ep op's results with DeepEP's semantics\n"
    "  --backend=virtual|nccl the program's ranks on one GPU (default), or NCCL (1 rank)\n"
    "  --blocks-per-rank=N    blocks of every kernel per rank (default: fits the GPU)\n"
    "  --compile-only         make the plan and the kernels (into the cache), run nothing\n"
    "  --print-plan           print the run plan\n"
    "  --cache-dir=DIR        the kernel cache (default $EPIC_CACHE_DIR or ~/.cache/epic)\n";

struct Options {
  std::string input;
  bool isPlan = false, check = false, compileOnly = false, printPlan = false;
  std::string backend = "virtual", cacheDir;
  int blocksPerRank = 0;
};

[[noreturn]] void usage(const std::string &problem) {
  std::fprintf(stderr, "epic-run: %s\n%s", problem.c_str(), kUsage);
  std::exit(2);
}

Options parseArguments(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char *prefix) -> const char * {
      size_t n = std::strlen(prefix);
      return a.compare(0, n, prefix) == 0 ? argv[i] + n : nullptr;
    };
    if (a == "--check")
      o.check = true;
    else if (a == "--compile-only")
      o.compileOnly = true;
    else if (a == "--print-plan")
      o.printPlan = true;
    else if (a == "--plan")
      o.isPlan = true;
    else if (const char *v = value("--backend="))
      o.backend = v;
    else if (const char *v = value("--cache-dir="))
      o.cacheDir = v;
    else if (const char *v = value("--blocks-per-rank=")) {
      char *end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (!*v || *end || n < 1)
        usage("--blocks-per-rank must be a positive integer, got \"" + std::string(v) + "\"");
      o.blocksPerRank = int(n);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (!a.empty() && a[0] == '-')
      usage("unknown option " + a);
    else if (o.input.empty())
      o.input = a;
    else
      usage("more than one input (" + o.input + ", " + a + ")");
  }
  if (o.input.empty())
    usage("no program given");
  if (o.backend != "virtual" && o.backend != "nccl")
    usage("--backend must be virtual or nccl, got \"" + o.backend + "\"");
  return o;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int run(const Options &o) {
  KernelCache cache(o.cacheDir);
  CompileSettings settings;
  settings.backend = o.backend;
  KernelProvider provider(cache, settings);
  std::string planText = o.isPlan ? readFile(o.input) : provider.runPlan(o.input);
  if (o.printPlan)
    std::fputs(planText.c_str(), stdout);
  RunPlan plan = RunPlan::parse(planText);

  // Every kernel first (compiled or loaded): the window must fit them all
  // (sized once the blocks per rank are known).
  std::vector<std::pair<epic::LaunchMetadata, int64_t>> entries; // and their token cap
  int maxBlocks = 1 << 20;
  for (const PlanKernel &k : plan.kernels()) {
    KernelProvider::Result r = provider.get(k.request());
    const Json meta = Json::parse(r.module->metadataJson);
    const epic::LaunchMetadata entry = readLaunchMetadata(meta.at("entries").array.at(0), r.key);
    entries.push_back({entry, k.spec.maxTokensPerRank});
    maxBlocks = std::min<int>(maxBlocks, int(entry.maxBlocksPerRank));
    const char *source = r.source == KernelCache::Source::compiled ? "compiled"
                         : r.source == KernelCache::Source::disk   ? "loaded"
                                                                   : "in memory";
    std::printf("kernels of ep.%s at %s: %s in %.3f s (%s)\n", kindName(k.kind), k.loc.c_str(),
                source, r.seconds, r.key.c_str());
  }
  if (o.compileOnly) {
    std::printf("epic-run: plan and kernels are in %s\n", cache.directory().c_str());
    return 0;
  }

  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr,
                 "epic-run: no GPU here (%s); the plan and kernels are compiled and cached in %s "
                 "(--compile-only does only that)\n",
                 e == cudaSuccess ? "no devices" : cudaGetErrorString(e),
                 cache.directory().c_str());
    return 1;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int blocks = o.blocksPerRank;
  if (!blocks)
    blocks = std::max(1, std::min({maxBlocks, 16, sms / plan.ranks}));
  int64_t windowBytes = 1 << 20;
  for (const auto &[entry, tokens] : entries)
    windowBytes = std::max(windowBytes, entry.windowFor(tokens, blocks * entry.ctasPerSm));

  std::unique_ptr<Communicator> comm;
  std::unique_ptr<KernelHost> buffer;
  if (o.backend == "virtual") {
    buffer = std::make_unique<VirtualElasticBuffer>(plan.ranks, windowBytes, provider, blocks,
                                                    plan.gpusPerNode);
  } else {
    if (plan.ranks != 1)
      throw std::invalid_argument(
          "--backend=nccl runs programs of one rank in one process; this one has " +
          std::to_string(plan.ranks) + " ranks (use --backend=virtual)");
    comm = std::make_unique<Communicator>(1, 0, Communicator::newUniqueId());
    buffer = std::make_unique<NcclElasticBuffer>(*comm, windowBytes, provider, blocks);
  }
  std::printf("running on %s: %d rank(s) x %d blocks, window %lld bytes per rank\n",
              o.backend == "virtual" ? "a virtual world" : "NCCL", plan.ranks, blocks,
              (long long)buffer->windowBytes());
  RunOptions options;
  options.check = o.check;
  RunSummary summary = executePlan(plan, *buffer, options);
  if (o.check)
    std::printf("epic-run: %d ep op(s) checked, %d failed\n", summary.checks, summary.failures);
  return summary.failures ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  Options options = parseArguments(argc, argv);
  try {
    return run(options);
  } catch (const std::exception &e) {
    std::fflush(stdout);
    std::fprintf(stderr, "epic-run: %s\n", e.what());
    return 1;
  }
}
