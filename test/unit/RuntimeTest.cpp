//===- RuntimeTest.cpp - the runtime's models and kernel cache ------------===//
//
// Linked without MLIR/LLVM: the runtime must not need them.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/EntryIR.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/Models.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

using namespace epic::runtime;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

// --- Models: the figures of DeepEP's README and semantics document ----------------

TEST(Models, TheoreticalSmsMatchDeepEPsReadme) {
  // E = 256, K = 8; NVLink 0.9 x 900 GB/s, 400 Gb/s NICs (50 GB/s), H200: 132 SMs.
  EXPECT_EQ(theoreticalNumSms(Topology::singleDomain(8), 256, 8, 0, 0.9 * 900, 132), 24);
  EXPECT_EQ(theoreticalNumSms(Topology::nodes(2, 8, true), 256, 8, 50, 0.9 * 900, 132), 12);
  EXPECT_EQ(theoreticalNumSms(Topology::nodes(4, 8, true), 256, 8, 50, 0.9 * 900, 132), 6);
}

TEST(Models, TheoreticalSmsOptionsAndCaps) {
  Topology ep8 = Topology::singleDomain(8);
  // Not preferring overlap with compute: at least 64 SMs.
  EXPECT_EQ(theoreticalNumSms(ep8, 256, 8, 0, 810, 132, /*preferOverlap=*/false), 64);
  // Never more than the device has, never fewer than 4.
  EXPECT_EQ(theoreticalNumSms(ep8, 256, 8, 0, 100000, 20), 20);
  EXPECT_EQ(theoreticalNumSms(ep8, 256, 8, 0, 1, 132), 4);
  // One rank moves nothing over NVLink: the whole device.
  EXPECT_EQ(theoreticalNumSms(Topology::singleDomain(1), 8, 2, 0, 810, 132), 132);
}

TEST(Models, TheoreticalSmsRejectsBadArguments) {
  Topology ep8 = Topology::singleDomain(8);
  try {
    theoreticalNumSms(ep8, 100, 8, 0, 810, 132);
    FAIL() << "experts not divisible by ranks accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("num_experts (100)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(theoreticalNumSms(ep8, 256, 33, 0, 810, 132), std::invalid_argument);
  EXPECT_THROW(theoreticalNumSms(ep8, 256, 8, 0, 0, 132), std::invalid_argument);
  EXPECT_THROW(theoreticalNumSms(Topology::nodes(2, 8, true), 256, 8, 0, 810, 132),
               std::invalid_argument);
}

TEST(Models, ExpectedGroupsHit) {
  // One group is always hit; K experts of E in E groups hit K groups.
  EXPECT_DOUBLE_EQ(expectedGroupsHit(256, 8, 1), 1.0);
  EXPECT_NEAR(expectedGroupsHit(256, 8, 256), 8.0, 1e-9);
  // EP8, top-8 of 256: 5.2947 destination ranks per token (the H200 run
  // measured 173569 rows for 8 x 4096 tokens: 5.297).
  EXPECT_NEAR(expectedGroupsHit(256, 8, 8), 5.2947, 1e-4);
}

TEST(Models, BufferSizeHintMatchesTheWorkedExamples) {
  // H = 7168, K = 8, FP8 dispatch, Tmax = 8192: EP8 -> 900 MiB, EP 8x2 hybrid -> 2286 MiB.
  EXPECT_EQ(bufferSizeHint(Topology::singleDomain(8), 8192, 7168, 8, true), 900 * kMiB);
  EXPECT_EQ(bufferSizeHint(Topology::nodes(2, 8, true), 8192, 7168, 8, true), 2286 * kMiB);
  // Always 2 MiB aligned; more tokens never need less.
  for (int64_t tokens : {1, 7, 100, 4096}) {
    int64_t bytes = bufferSizeHint(Topology::singleDomain(4), tokens, 2048, 6);
    EXPECT_EQ(bytes % (2 * kMiB), 0);
    EXPECT_GE(bufferSizeHint(Topology::singleDomain(4), tokens + 1, 2048, 6), bytes);
  }
  // num_topk = 0 sizes for 32; no multiple reduction needs K slots per token.
  EXPECT_GE(bufferSizeHint(Topology::singleDomain(8), 1024, 7168, 0),
            bufferSizeHint(Topology::singleDomain(8), 1024, 7168, 8));
  EXPECT_GT(bufferSizeHint(Topology::singleDomain(4), 1024, 7168, 8, false, false),
            bufferSizeHint(Topology::singleDomain(4), 1024, 7168, 8, false, true));
  EXPECT_THROW(bufferSizeHint(Topology::singleDomain(8), 0, 7168), std::invalid_argument);
  EXPECT_THROW(bufferSizeHint(Topology::singleDomain(8), 16, 7168, 33), std::invalid_argument);
}

TEST(Models, TheoreticalQps) {
  EXPECT_EQ(theoreticalNumQps(Topology::singleDomain(8), 24, 0), 9);
  EXPECT_EQ(theoreticalNumQps(Topology::singleDomain(8), 4, 0), 4);
  EXPECT_EQ(theoreticalNumQps(Topology::nodes(2, 8, true), 12, 0), 193);
  EXPECT_EQ(theoreticalNumQps(Topology::nodes(2, 8, true), 12, 65), 65);
  EXPECT_THROW(theoreticalNumQps(Topology::singleDomain(8), 0, 0), std::invalid_argument);
}

// --- Kernel cache -------------------------------------------------------------------

class CacheTest : public ::testing::Test {
protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("epic-cache-test-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

KernelKeyParts parts() { return {"module {}", "backend=virtual", "2.28.9", "abc", "sm_90"}; }

TEST_F(CacheTest, KeyDependsOnEveryPart) {
  std::set<std::string> keys;
  KernelKeyParts base = parts();
  keys.insert(kernelKey(base));
  for (int i = 0; i < 5; ++i) {
    KernelKeyParts p = base;
    std::string *fields[] = {&p.ir, &p.options, &p.ncclVersion, &p.shimHash, &p.arch};
    *fields[i] += "x";
    keys.insert(kernelKey(p));
  }
  EXPECT_EQ(keys.size(), 6u);
  // Bytes moved from one part to the next make another key.
  KernelKeyParts a = base, b = base;
  a.ir = "ab", a.options = "c";
  b.ir = "a", b.options = "bc";
  EXPECT_NE(kernelKey(a), kernelKey(b));
  EXPECT_EQ(kernelKey(base), kernelKey(parts()));
  EXPECT_EQ(kernelKey(base).size(), 32u);
}

TEST_F(CacheTest, StoresLoadsAndServesFromMemory) {
  KernelCache cache(dir.string());
  std::string key = kernelKey(parts());
  EXPECT_FALSE(cache.load(key));
  int compiles = 0;
  auto compile = [&] {
    ++compiles;
    return CompiledModule{"CUBIN", "PTX", "{}"};
  };
  KernelCache::Source source;
  EXPECT_EQ(cache.get(key, compile, &source).cubin, "CUBIN");
  EXPECT_EQ(source, KernelCache::Source::compiled);
  EXPECT_EQ(cache.get(key, compile, &source).ptx, "PTX");
  EXPECT_EQ(source, KernelCache::Source::memory);
  // A new process (a new cache object) finds it on disk.
  KernelCache again(dir.string());
  EXPECT_EQ(again.get(key, compile, &source).metadataJson, "{}");
  EXPECT_EQ(source, KernelCache::Source::disk);
  EXPECT_EQ(compiles, 1);
  EXPECT_TRUE(fs::is_empty(dir / "tmp"));
}

TEST_F(CacheTest, ConcurrentWritersLeaveOneCompleteEntry) {
  std::string key = kernelKey(parts());
  std::vector<std::thread> writers;
  for (int i = 0; i < 8; ++i)
    writers.emplace_back([&, i] {
      KernelCache cache(dir.string());
      std::string body(1 << 20, char('a' + i)); // large enough to interleave
      cache.store(key, {body, "ptx" + std::to_string(i), "{}"});
    });
  for (auto &t : writers)
    t.join();
  auto module = KernelCache(dir.string()).load(key);
  ASSERT_TRUE(module);
  // One writer's entry, whole: all bytes of the cubin from the same writer.
  ASSERT_EQ(module->cubin.size(), size_t(1) << 20);
  EXPECT_EQ(module->cubin.find_first_not_of(module->cubin[0]), std::string::npos);
  EXPECT_EQ(module->ptx, std::string("ptx") + char('0' + (module->cubin[0] - 'a')));
  EXPECT_TRUE(fs::is_empty(dir / "tmp"));
}

TEST_F(CacheTest, CorruptedEntriesAreReportedNotUsed) {
  KernelCache cache(dir.string());
  std::string key = kernelKey(parts());
  cache.store(key, {"CUBIN", "PTX", "{}"});
  fs::remove(fs::path(cache.entryDirectory(key)) / "kernels.cubin");
  try {
    cache.load(key);
    FAIL() << "a truncated entry was used";
  } catch (const CacheError &e) {
    EXPECT_NE(std::string(e.what()).find("kernels.cubin is missing"), std::string::npos)
        << e.what();
  }
  // An entry written for another key.
  std::string other = kernelKey({"other", "", "", "", ""});
  fs::rename(cache.entryDirectory(key), cache.entryDirectory(other));
  std::ofstream(fs::path(cache.entryDirectory(other)) / "kernels.cubin") << "CUBIN";
  EXPECT_THROW(cache.load(other), CacheError);
  EXPECT_THROW(cache.load("not-a-key"), std::invalid_argument);
}

TEST_F(CacheTest, DefaultDirectoryFollowsTheEnvironment) {
  ::setenv("EPIC_CACHE_DIR", dir.c_str(), 1);
  EXPECT_EQ(KernelCache::defaultDirectory(), dir.string());
  EXPECT_EQ(KernelCache().directory(), dir.string());
  ::unsetenv("EPIC_CACHE_DIR");
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(KernelCache::defaultDirectory(), "/home/someone/.cache/epic");
}

// --- Kernel provider: the cache in front of epic-compile ---------------------------

EPSpec smallSpec() {
  EPSpec s;
  s.ranks = 2, s.experts = 8, s.topk = 2, s.hidden = 256, s.maxTokensPerRank = 16;
  return s;
}

TEST_F(CacheTest, ProviderCompilesOnceThenLoads) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  std::string ir = dispatchEntryIR(smallSpec(), {}, "dispatch");
  auto first = provider.get(ir);
  EXPECT_EQ(first.source, KernelCache::Source::compiled);
  EXPECT_FALSE(first.module->cubin.empty());
  EXPECT_NE(first.module->metadataJson.find("\"dispatch_send\""), std::string::npos);
  EXPECT_NE(first.module->ptx.find(".entry dispatch_copy"), std::string::npos);
  EXPECT_EQ(provider.get(ir).source, KernelCache::Source::memory);
  KernelCache again(dir.string());
  KernelProvider fresh(again, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  auto warm = fresh.get(ir);
  EXPECT_EQ(warm.source, KernelCache::Source::disk);
  EXPECT_EQ(warm.module->cubin, first.module->cubin);
  // The key covers the backend and the architecture.
  KernelProvider nccl(cache, {"nccl", "sm_90", ""});
  EXPECT_NE(nccl.keyFor(ir), provider.keyFor(ir));
  EXPECT_NE(KernelProvider(cache, {"virtual", "sm_100", ""}).keyFor(ir), provider.keyFor(ir));
  EXPECT_EQ(shimHash().size(), 64u);
  std::string version = ncclVersion();
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
}

TEST_F(CacheTest, ProviderSaysWhatToDoWithoutACompiler) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  try {
    provider.get(dispatchEntryIR(smallSpec(), {}, "dispatch"));
    FAIL() << "a missing compiler went unnoticed";
  } catch (const std::runtime_error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("is not in the kernel cache"), std::string::npos) << what;
    EXPECT_NE(what.find("EPIC_COMPILE"), std::string::npos) << what;
  }
  EXPECT_THROW(KernelProvider(cache, {"gloo", "sm_90", ""}), std::invalid_argument);
}

TEST_F(CacheTest, ProviderReportsCompilerErrors) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  try {
    provider.get("func.func @f() { ep.nonsense }");
    FAIL() << "broken IR compiled";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("epic-compile failed"), std::string::npos) << e.what();
  }
}

} // namespace
