//===- RuntimeTest.cpp - the runtime's models and kernel cache ------------===//
//
// Linked without MLIR/LLVM: the runtime must not need them. Models, kernel
// cache and provider, and the host-side checks of dispatch/combine calls.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/Calls.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelHost.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/Models.h"
#include "epic/runtime/WindowBytes.h"

#include "epic/Dialect/EP/IR/EPRecords.h"

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

// The window bytes calls wrote data to: a fused kernel's scratch is zeroed
// only where it overlaps them (once per change of configuration).
TEST(WindowBytes, MergesRemovesAndFindsOverlaps) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  WindowBytes w;
  w.add(100, 200);
  w.add(100, 200); // the same call again: nothing new
  w.add(300, 400);
  EXPECT_EQ(w.list(), (Ranges{{100, 200}, {300, 400}}));
  w.add(150, 350); // bridges both
  EXPECT_EQ(w.list(), (Ranges{{100, 400}}));
  w.add(400, 500); // touching ranges merge
  EXPECT_EQ(w.list(), (Ranges{{100, 500}}));
  w.add(7, 7); // empty
  EXPECT_EQ(w.list(), (Ranges{{100, 500}}));
  EXPECT_TRUE(w.overlaps(499, 600));
  EXPECT_FALSE(w.overlaps(500, 600)); // half-open
  EXPECT_FALSE(w.overlaps(0, 100));
  w.remove(200, 300); // splits
  EXPECT_EQ(w.list(), (Ranges{{100, 200}, {300, 500}}));
  EXPECT_FALSE(w.overlaps(200, 300));
  w.remove(0, 1000);
  EXPECT_TRUE(w.list().empty());
}

TEST(WaitReports, TimedOutWaitsAreGroupedByRankFlagAndValue) {
  using epic_device::WaitReport;
  auto waited = [](int rank, int block, uint64_t flag, int64_t expected, int64_t seen) {
    WaitReport r{};
    r.valid = 1, r.flag = flag, r.expected = expected, r.seen = seen;
    r.timeoutNs = 10'000'000'000, r.predicate = 2, r.rank = rank, r.peer = -1;
    r.block = block, r.thread = 0;
    return r;
  };
  // A stalled grid: rank 5's blocks 88-95 at one flag, 80-83 and 85 at another; rank 0's
  // block 1 alone; an empty slot; a disagreement, reported on its own.
  std::vector<WaitReport> reports;
  for (int block = 95; block >= 88; --block)
    reports.push_back(waited(5, block, 0x40, 1152, 1151));
  for (int block : {85, 80, 81, 82, 83})
    reports.push_back(waited(5, block, 0x1b000, 80, 72));
  reports.push_back(waited(0, 1, 0x1b000, 80, 72));
  reports.push_back(WaitReport{});
  WaitReport disagree = waited(2, 0, 0, 7, 9);
  disagree.predicate = epic_device::kDisagreed, disagree.peer = 3;
  reports.push_back(disagree);
  // Two blocks of rank 3 stuck in a GEMM pipeline: an mbarrier phase, not a flag.
  for (int block : {25, 24}) {
    WaitReport phase = waited(3, block, 0x430, 1, 0);
    phase.predicate = epic_device::kPhaseNotCompleted, phase.thread = 256;
    reports.push_back(phase);
  }
  const std::string text = epic::runtime::formatDeviceWaitReports(reports);
  EXPECT_EQ(text,
            "; rank 2 and rank 3 disagree (block 0 thread 0): signature 7 here, 9 there: every "
            "rank must make the same call at the same time (the same op, configuration, variant, "
            "num_sms and token cap)"
            "; device wait timed out after 10000 ms: rank 5 blocks 88-95 thread 0 waited for "
            "peer -1: the flag at 0x40 >= 1152 (seen 1151)"
            "; device wait timed out after 10000 ms: rank 5 blocks 80-83, 85 thread 0 waited for "
            "peer -1: the flag at 0x1b000 >= 80 (seen 72)"
            "; device wait timed out after 10000 ms: rank 0 block 1 thread 0 waited for peer -1: "
            "the flag at 0x1b000 >= 80 (seen 72)"
            "; device wait timed out after 10000 ms: rank 3 blocks 24-25 thread 256 waited for "
            "the mbarrier at shared 0x430 to complete its phase of parity 1: the pipeline's "
            "other side never got there (its producer and consumers disagree on its steps, one "
            "of them is held outside the pipeline, or a TMA load never arrived)");
  EXPECT_EQ(epic::runtime::formatDeviceWaitReports({}), "");
}

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
    std::string *fields[] = {&p.input, &p.options, &p.ncclVersion, &p.shimHash, &p.arch};
    *fields[i] += "x";
    keys.insert(kernelKey(p));
  }
  EXPECT_EQ(keys.size(), 6u);
  // Bytes moved from one part to the next make another key.
  KernelKeyParts a = base, b = base;
  a.input = "ab", a.options = "c";
  b.input = "a", b.options = "bc";
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
  KernelInput request = dispatchRequest(smallSpec(), {}, "dispatch");
  auto first = provider.get(request);
  EXPECT_EQ(first.source, KernelCache::Source::compiled);
  EXPECT_FALSE(first.module->cubin.empty());
  // The virtual backend dispatches in one pass: count, then scatter.
  EXPECT_NE(first.module->metadataJson.find("\"dispatch_count\""), std::string::npos);
  EXPECT_NE(first.module->ptx.find(".entry dispatch_scatter"), std::string::npos);
  EXPECT_EQ(provider.get(request).source, KernelCache::Source::memory);
  KernelCache again(dir.string());
  KernelProvider fresh(again, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  auto warm = fresh.get(request);
  EXPECT_EQ(warm.source, KernelCache::Source::disk);
  EXPECT_EQ(warm.module->cubin, first.module->cubin);
  // The key covers the backend and the architecture.
  KernelProvider nccl(cache, {"nccl", "sm_90", ""});
  EXPECT_NE(nccl.keyFor(request), provider.keyFor(request));
  EXPECT_NE(KernelProvider(cache, {"virtual", "sm_100", ""}).keyFor(request),
            provider.keyFor(request));
  EXPECT_EQ(shimHash().size(), 64u);
  std::string version = ncclVersion();
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
}

TEST_F(CacheTest, ProviderSaysWhatToDoWithoutACompiler) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  try {
    provider.get(dispatchRequest(smallSpec(), {}, "dispatch"));
    FAIL() << "a missing compiler went unnoticed";
  } catch (const std::runtime_error &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("is not in the kernel cache"), std::string::npos) << what;
    EXPECT_NE(what.find("EPIC_COMPILE"), std::string::npos) << what;
  }
  EXPECT_THROW(KernelProvider(cache, {"gloo", "sm_90", ""}), std::invalid_argument);
}

// The runtime writes no IR: a request's entry IR comes from the compiler, for
// people (EPIC_DUMP_IR) and the Python API (Runtime.entry_ir).
TEST_F(CacheTest, TheCompilerPrintsARequestsEntryIR) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  KernelRequest request = dispatchRequest(smallSpec(), {}, "dispatch");
  std::string ir = provider.entryIR(request);
  EXPECT_NE(ir.find("func.func @dispatch("), std::string::npos) << ir;
  EXPECT_NE(ir.find("ep.dispatch %arg0 topk(%arg1 : tensor<?x2xi64>) config"), std::string::npos)
      << ir;

  ::setenv("EPIC_DUMP_IR", "1", 1);
  testing::internal::CaptureStderr();
  provider.get(request);
  std::string compiled = testing::internal::GetCapturedStderr();
  KernelCache again(dir.string());
  KernelProvider offline(again, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  testing::internal::CaptureStderr();
  offline.get(request);
  std::string loaded = testing::internal::GetCapturedStderr();
  ::unsetenv("EPIC_DUMP_IR");
  EXPECT_NE(compiled.find("epic: entry IR of kernels"), std::string::npos) << compiled;
  EXPECT_NE(compiled.find(request.json()), std::string::npos) << compiled;
  EXPECT_NE(compiled.find("ep.dispatch %arg0"), std::string::npos) << compiled;
  // Without a compiler (a cache filled elsewhere) the request is what there is.
  EXPECT_NE(loaded.find("epic: kernel request of kernels"), std::string::npos) << loaded;
  EXPECT_NE(loaded.find(request.json()), std::string::npos) << loaded;
  EXPECT_THROW(offline.entryIR(request), std::runtime_error);
}

TEST_F(CacheTest, ProviderReportsCompilerErrors) {
  KernelCache cache(dir.string());
  KernelProvider provider(cache, {"virtual", "sm_90", ""});
  try {
    provider.get(KernelInput::fromIR("func.func @f() { ep.nonsense }"));
    FAIL() << "broken IR compiled";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("epic-compile failed"), std::string::npos) << e.what();
  }
}

} // namespace

// --- Calls: every bad argument is refused on the host, by name -------------------

namespace {

/// Plausible device addresses: distinct, 256-byte aligned.
uint64_t fakeAddress(int i) { return 0x7f0000000000ull + uint64_t(i) * 0x100000; }

struct CallFixture {
  EPSpec spec;
  DispatchVariant dispatchVariant{/*weights=*/true, false, false, 64};
  CombineVariant combineVariant{/*weights=*/true, /*biases=*/1};
  DispatchCall dispatch;
  CombineCall combine;
  int64_t T = 100;

  explicit CallFixture(bool fp8 = false, bool expanded = false) {
    spec.ranks = 4, spec.experts = 32, spec.topk = 8, spec.hidden = 1024;
    spec.maxTokensPerRank = 128, spec.expanded = expanded, spec.expertAlignment = expanded ? 64 : 1;
    if (fp8)
      spec.dtype = "f8E4M3FN", spec.scalePacks = 8;
    const int64_t K = spec.topk, H = spec.hidden, L = 8, R = 4, rows = receiveRows(spec);
    int n = 0;
    auto t = [&](const char *dtype, std::vector<int64_t> shape) {
      return DeviceTensor{fakeAddress(++n), dtype, std::move(shape)};
    };
    Handle h{t("i64", {T, K}), t("i32", {T, K}), t("i32", {R * 128, K + 2}),
             t("i32", {R}),    t("i32", {L}),    t("i32", {L})};
    dispatch.x = t(spec.dtype.c_str(), {T, H});
    if (fp8) {
      dispatch.scalePacks = t("f32", {T, 8});
      dispatch.recvScalePacks = t("f32", {rows, 8});
    }
    dispatch.topkWeights = t("f32", {T, K});
    dispatch.recvX = t(spec.dtype.c_str(), {rows, H});
    if (!expanded)
      dispatch.recvTopkIdx = t("i64", {rows, K});
    dispatch.recvTopkWeights = expanded ? t("f32", {rows}) : t("f32", {rows, K});
    dispatch.hostCounts = t("i32", {1 + L});
    dispatch.handle = h;
    combine.x = t("bf16", {rows, H});
    combine.topkWeights = expanded ? t("f32", {rows}) : t("f32", {rows, K});
    combine.bias0 = t("bf16", {T, H});
    combine.combinedX = t("bf16", {T, H});
    combine.combinedTopkWeights = t("f32", {T, K});
    combine.handle = h;
  }
  std::string dispatchError() {
    try {
      dispatchRecord(spec, dispatchVariant, dispatch);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  }
  std::string combineError() {
    try {
      combineRecord(spec, combineVariant, combine);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  }
};

} // namespace

TEST(Calls, ReceiveRowsFollowTheLayout) {
  CallFixture plain, expanded(false, true);
  EXPECT_EQ(receiveRows(plain.spec), 4 * 128);
  // 512 tokens x min(8 topk, 8 local experts) pairs + 63 padding rows per expert, rounded to 64.
  EXPECT_EQ(receiveRows(expanded.spec), (512 * 8 + 63 * 8 + 63) / 64 * 64);
}

TEST(Calls, GoodCallsBecomeTheKernelsRecords) {
  for (bool fp8 : {false, true})
    for (bool expanded : {false, true}) {
      CallFixture f(fp8, expanded);
      EXPECT_EQ(f.dispatchError(), "") << "fp8=" << fp8 << " expanded=" << expanded;
      EXPECT_EQ(f.combineError(), "") << "fp8=" << fp8 << " expanded=" << expanded;
    }
  CallFixture f;
  f.dispatch.x.slot = 3, f.dispatch.handle.topkIdx.slot = 7;
  ParamRecord r = dispatchRecord(f.spec, f.dispatchVariant, f.dispatch);
  EXPECT_EQ(r.at("num_tokens").value, 100u);
  EXPECT_EQ(r.at("max_tokens_per_rank").value, 128u); // the cap travels in the record
  EXPECT_EQ(r.at("x").value, f.dispatch.x.data);
  EXPECT_EQ(r.at("topk_idx").value, f.dispatch.handle.topkIdx.data);
  EXPECT_EQ(r.at("dst_buffer_slot_idx").value, f.dispatch.handle.dstBufferSlotIdx.data);
  EXPECT_EQ(r.count("scale_packs"), 0u); // not FP8: no field
  // Tensor fields remember their call slot and the alignment the checks asked
  // for (a plan checks the same of later addresses); counts are no slot.
  EXPECT_EQ(r.at("x").slot, 3);
  EXPECT_EQ(r.at("x").alignment, 16);
  EXPECT_EQ(r.at("topk_idx").slot, 7);
  EXPECT_EQ(r.at("num_tokens").slot, -1);
  ParamRecord c = combineRecord(f.spec, f.combineVariant, f.combine);
  EXPECT_EQ(c.at("num_tokens").value, 100u);
  EXPECT_EQ(c.at("max_tokens_per_rank").value, 128u);
  EXPECT_EQ(c.at("bias0").value, f.combine.bias0.data);
  EXPECT_EQ(c.count("bias1"), 0u);
}

// The runtime fills records by name, the kernels read them by index: every
// field a record has must be one of the entry's fields (EPRecords.def), or
// the launch would refuse it as an unknown parameter, on a GPU only.
TEST(Calls, RecordsHaveOnlyTheKernelsFields) {
  namespace records = epic::ep::records;
  auto within = [](const ParamRecord &r, std::vector<std::string> fields) {
    for (const auto &[name, value] : r)
      if (std::find(fields.begin(), fields.end(), name) == fields.end())
        return name;
    return std::string();
  };
  std::vector<std::string> dispatch(std::begin(records::kDispatchFields),
                                    std::end(records::kDispatchFields));
  std::vector<std::string> combine(std::begin(records::kCombineFields),
                                   std::end(records::kCombineFields));
  for (bool fp8 : {false, true})
    for (bool expanded : {false, true}) {
      CallFixture f(fp8, expanded);
      EXPECT_EQ(within(dispatchRecord(f.spec, f.dispatchVariant, f.dispatch), dispatch), "");
      EXPECT_EQ(within(combineRecord(f.spec, f.combineVariant, f.combine), combine), "");
    }
}

TEST(Calls, OutputsAreWhatTheChecksExpect) {
  for (bool fp8 : {false, true})
    for (bool expanded : {false, true}) {
      CallFixture f(fp8, expanded);
      std::vector<TensorSpec> outs = dispatchOutputs(f.spec, f.dispatchVariant, 100);
      std::map<std::string, TensorSpec> byName;
      for (const TensorSpec &t : outs)
        byName[t.name] = t;
      // Every output the fixture allocates, with the fixture's shape and dtype.
      auto same = [&](const char *name, const DeviceTensor &t) {
        ASSERT_TRUE(byName.count(name)) << name;
        EXPECT_EQ(byName[name].dtype, t.dtype) << name;
        EXPECT_EQ(byName[name].shape, t.shape) << name;
      };
      same("recv_x", f.dispatch.recvX);
      same("host_counts", f.dispatch.hostCounts);
      same("recv_src_metadata", f.dispatch.handle.recvSrcMetadata);
      same("dst_buffer_slot_idx", f.dispatch.handle.dstBufferSlotIdx);
      EXPECT_EQ(byName.count("recv_x_scale_packs"), size_t(fp8));
      EXPECT_EQ(byName.count("recv_topk_idx"), size_t(!expanded));
      std::vector<TensorSpec> combined = combineOutputs(f.spec, f.combineVariant, 100);
      ASSERT_EQ(combined.size(), 2u); // combined_x, combined_topk_weights
      EXPECT_EQ(combined[0].shape, f.combine.combinedX.shape);
    }
  // A cached dispatch writes the received rows only.
  CallFixture f;
  DispatchVariant cached = f.dispatchVariant;
  cached.cached = true, cached.weights = false;
  EXPECT_EQ(dispatchOutputs(f.spec, cached, 100).size(), 2u); // recv_x, recv_topk_idx
}

// A cached signature's later calls are checked by address alone, before
// anything is written, and an error names the tensor (and its rank).
TEST(Calls, CachedSignaturesCheckTheAddressesTheyBind) {
  CallFixture f;
  const std::vector<std::string> names = {"x", "x_scale_packs", "topk_weights", "topk_idx"};
  f.dispatch.x.slot = 0, f.dispatch.topkWeights.slot = 2, f.dispatch.handle.topkIdx.slot = 3;
  std::vector<ParamRecord> records(2, dispatchRecord(f.spec, f.dispatchVariant, f.dispatch));
  std::vector<std::string> fields;
  for (const auto &[name, value] : records[0])
    fields.push_back(name);
  const int64_t stride = int64_t(fields.size()) * 8;
  AddressBindings bindings(records, fields, stride, names);
  ASSERT_EQ(bindings.slotsPerRank(), 4);
  auto word = [&](int rank, const char *field) {
    return size_t(rank) * stride / 8 +
           size_t(std::find(fields.begin(), fields.end(), field) - fields.begin());
  };
  std::vector<uint64_t> table(size_t(2 * stride / 8), 7);
  // Rank-major addresses; slot 1 (no scale packs in this signature) is ignored.
  std::vector<uint64_t> addresses = {0x1000, 0, 0x2000, 0x3000, 0x4000, 0, 0x5000, 0x6000};
  bindings.bind(addresses.data(), addresses.size(), table, {});
  EXPECT_EQ(table[word(0, "x")], 0x1000u);
  EXPECT_EQ(table[word(1, "topk_idx")], 0x6000u);
  EXPECT_EQ(table[word(1, "topk_weights")], 0x5000u);
  EXPECT_EQ(table[word(0, "num_tokens")], 7u); // counts stay what the plan laid out

  auto error = [&](std::vector<uint64_t> a) -> std::string {
    std::vector<uint64_t> before = table;
    try {
      bindings.bind(a.data(), a.size(), table, {});
    } catch (const std::invalid_argument &e) {
      EXPECT_EQ(table, before) << "a refused call wrote the table";
      return e.what();
    }
    return "";
  };
  std::vector<uint64_t> misaligned = addresses;
  misaligned[4] += 8; // rank 1's x: rows move as 16-byte vectors
  EXPECT_EQ(error(misaligned), "x[1] must be 16-byte aligned, it is at 16392");
  std::vector<uint64_t> missing = addresses;
  missing[2] = 0;
  EXPECT_EQ(error(missing), "topk_weights[0] is required here but was not given (a null pointer)");
  EXPECT_NE(error({1, 2, 3}).find("expected 2 x 4 tensor addresses"), std::string::npos);
}

// window_outputs: what peers write or read at a rank must lie in its window,
// past the kernels' region; a tensor elsewhere is named before anything runs.
TEST(Calls, WindowOutputsMustLieInTheWindow) {
  CallFixture f;
  DispatchVariant window = f.dispatchVariant;
  window.windowOutputs = true;
  f.dispatch.recvX.slot = 0, f.dispatch.handle.recvSrcMetadata.slot = 1;
  std::vector<ParamRecord> records = {dispatchRecord(f.spec, window, f.dispatch)};
  EXPECT_TRUE(records[0].at("recv_x").inWindow);
  EXPECT_EQ(records[0].at("recv_x").bytes, f.dispatch.recvX.bytes());
  EXPECT_FALSE(records[0].at("x").inWindow); // the sender's own input
  EXPECT_FALSE(dispatchRecord(f.spec, f.dispatchVariant, f.dispatch).at("recv_x").inWindow);
  std::vector<std::string> fields;
  for (const auto &[name, value] : records[0])
    fields.push_back(name);
  AddressBindings bindings(records, fields, int64_t(fields.size()) * 8,
                           {"recv_x", "recv_src_metadata"});
  std::vector<uint64_t> table(fields.size(), 0);
  const uint64_t base = 1 << 20, end = base + (uint64_t(1) << 30);
  const std::vector<WindowRange> windows = {{base, end}};
  std::vector<uint64_t> inside = {base, base + (uint64_t(1) << 29)};
  bindings.bind(inside.data(), inside.size(), table, windows);
  std::vector<uint64_t> outside = {base - 4096, base + (uint64_t(1) << 29)};
  try {
    bindings.bind(outside.data(), outside.size(), table, windows);
    ADD_FAILURE() << "recv_x outside the window was bound";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("recv_x must lie in the buffer's window"),
              std::string::npos)
        << e.what();
  }
  // The last byte counts: a tensor running past the window's end is refused too.
  std::vector<uint64_t> overrun = {end - 16, base + (uint64_t(1) << 29)};
  EXPECT_THROW(bindings.bind(overrun.data(), overrun.size(), table, windows),
               std::invalid_argument);
}

TEST(Calls, TheHandlesCopyOfTheRoutingIsChecked) {
  CallFixture f;
  f.dispatch.topkIdxCopy = f.dispatch.handle.topkIdx;
  f.dispatch.topkIdxCopy.data = fakeAddress(99);
  EXPECT_EQ(f.dispatchError(), "");
  // The send kernel writes it: a field of the record (none without a copy).
  EXPECT_EQ(dispatchRecord(f.spec, f.dispatchVariant, f.dispatch).at("topk_idx_copy").value,
            fakeAddress(99));
  DispatchCall uncopied = f.dispatch;
  uncopied.topkIdxCopy = {};
  EXPECT_EQ(dispatchRecord(f.spec, f.dispatchVariant, uncopied).count("topk_idx_copy"), 0u);
  f.dispatch.topkIdxCopy.shape = {99, 8};
  EXPECT_NE(f.dispatchError().find("handle.topk_idx (the copy) must have shape i64[100, 8]"),
            std::string::npos)
      << f.dispatchError();
}

TEST(Calls, TooManyTokens) {
  CallFixture f;
  f.dispatch.x.shape[0] = 129;
  EXPECT_NE(f.dispatchError().find("x has 129 tokens, more than num_max_tokens_per_rank (128)"),
            std::string::npos)
      << f.dispatchError();
}

TEST(Calls, WrongDtypes) {
  CallFixture f;
  f.dispatch.x.dtype = "f32";
  EXPECT_NE(f.dispatchError().find("x must be bf16, got f32"), std::string::npos)
      << f.dispatchError();
  CallFixture g; // an uncached dispatch's routing is the caller's topk_idx
  g.dispatch.handle.topkIdx.dtype = "i32";
  EXPECT_EQ(g.dispatchError(), "topk_idx must be i64, got i32");
  g.dispatchVariant.cached = true, g.dispatchVariant.weights = false;
  g.dispatch.topkWeights = {};
  EXPECT_EQ(g.dispatchError(), "handle.topk_idx must be i64, got i32");
  CallFixture h;
  h.combine.x.dtype = "f8E4M3FN";
  EXPECT_NE(h.combineError().find("x must be bf16"), std::string::npos) << h.combineError();
}

TEST(Calls, BufferTooSmallAndWrongShapes) {
  CallFixture f;
  f.dispatch.recvX.shape[0] = 100;
  EXPECT_NE(f.dispatchError().find("recv_x has 100 rows but the buffer can receive 512"),
            std::string::npos)
      << f.dispatchError();
  CallFixture g;
  g.dispatch.topkWeights.shape = {100, 4};
  EXPECT_NE(g.dispatchError().find("topk_weights must have shape f32[100, 8], got f32[100, 4]"),
            std::string::npos)
      << g.dispatchError();
  CallFixture h;
  h.combine.combinedX.shape = {99, 1024};
  EXPECT_NE(h.combineError().find("combined_x must have shape bf16[100, 1024]"), std::string::npos)
      << h.combineError();
}

TEST(Calls, MissingAndUnexpectedArguments) {
  CallFixture f;
  f.dispatch.topkWeights = {};
  EXPECT_NE(f.dispatchError().find("topk_weights is required"), std::string::npos);
  CallFixture fp8(true);
  fp8.dispatch.scalePacks = {};
  EXPECT_NE(fp8.dispatchError().find("x_scale_packs is required"), std::string::npos);
  CallFixture g;
  g.dispatch.scalePacks = g.dispatch.topkWeights;
  EXPECT_NE(g.dispatchError().find("x_scale_packs was given but x is bf16, not FP8"),
            std::string::npos)
      << g.dispatchError();
  CallFixture h;
  h.combine.bias1 = h.combine.bias0;
  EXPECT_NE(h.combineError().find("bias_1 was given"), std::string::npos) << h.combineError();
  CallFixture e(false, true);
  e.dispatch.recvTopkIdx = e.dispatch.hostCounts;
  EXPECT_NE(e.dispatchError().find("the expanded layout receives no top-k ids"), std::string::npos)
      << e.dispatchError();
}

TEST(Calls, MisalignedRows) {
  CallFixture f;
  f.dispatch.x.data += 8;
  EXPECT_NE(f.dispatchError().find("x must be 16-byte aligned"), std::string::npos)
      << f.dispatchError();
}

TEST(Calls, TopkIndicesOutOfRange) {
  CallFixture f;
  std::vector<int64_t> idx(size_t(3) * 8, -1);
  idx[0] = 31;
  EXPECT_NO_THROW(checkTopkIndices(f.spec, idx.data(), 3));
  idx[2 * 8 + 5] = 32;
  try {
    checkTopkIndices(f.spec, idx.data(), 3);
    FAIL() << "expert 32 of 32 accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("topk_idx[2][5] = 32 is out of range"), std::string::npos)
        << e.what();
  }
  idx[2 * 8 + 5] = -2;
  EXPECT_THROW(checkTopkIndices(f.spec, idx.data(), 3), std::invalid_argument);
}

TEST(Calls, TopkIndicesRepeatingAnExpert) {
  CallFixture f;
  std::vector<int64_t> idx(size_t(2) * 8, -1); // masked slots may repeat -1
  idx[8 + 1] = 7, idx[8 + 4] = 7;
  try {
    checkTopkIndices(f.spec, idx.data(), 2);
    FAIL() << "expert 7 twice in token 1 accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("topk_idx[1][4] = 7 repeats slot 1"), std::string::npos)
        << e.what();
  }
}

TEST(Calls, EngramFetchArgumentsAreCheckedByName) {
  CallFixture f;
  EngramCall c{{fakeAddress(50), "i32", {64, 24}},
               {fakeAddress(51), f.spec.dtype, {64, 24 * int64_t(f.spec.hidden)}}};
  auto error = [&](const EngramCall &call, int64_t entries = 4096) -> std::string {
    try {
      engramRecord(f.spec, entries, 1 << 21, 0x7000, call);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(c), "");
  ParamRecord r = engramRecord(f.spec, 4096, 1 << 21, 0x7000, c);
  EXPECT_EQ(r.at("num_rows").value, uint64_t(64 * 24));
  EXPECT_EQ(r.at("entries_per_rank").value, 4096u);
  EXPECT_EQ(r.at("table_offset").value, uint64_t(1) << 21);
  EXPECT_EQ(r.at("own_table").value, 0x7000u);
  EXPECT_EQ(r.at("out").value, c.out.data);
  EngramCall bad = c;
  bad.indices.dtype = "i64";
  EXPECT_NE(error(bad).find("indices must be i32, got i64"), std::string::npos) << error(bad);
  bad = c;
  bad.out.shape = {64, 100};
  EXPECT_NE(error(bad).find("out must have shape"), std::string::npos) << error(bad);
  bad = c;
  bad.out.data += 8;
  EXPECT_NE(error(bad).find("out must be 16-byte aligned"), std::string::npos) << error(bad);
  bad = c;
  bad.indices.shape = {64};
  EXPECT_NE(error(bad).find("indices must be [tokens, entries per token]"), std::string::npos);
  EXPECT_NE(error(c, int64_t(1) << 31).find("must be ids an i32 holds"), std::string::npos);
}

TEST(Calls, GroupedGemmArgumentsAreCheckedByName) {
  CallFixture f(false, true);
  const int64_t rows = receiveRows(f.spec);
  GroupedGemmCall g{{fakeAddress(40), "bf16", {rows, 1024}},
                    {fakeAddress(41), "bf16", {8, 1024, 256}},
                    {fakeAddress(42), "bf16", {rows, 256}},
                    {fakeAddress(43), "i32", {8}}};
  auto error = [&](const EPSpec &spec, const GroupedGemmCall &call) -> std::string {
    try {
      groupedGemmRecord(spec, call);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(f.spec, g), "");
  ParamRecord r = groupedGemmRecord(f.spec, g);
  EXPECT_EQ(r.at("num_rows").value, uint64_t(rows));
  EXPECT_EQ(r.at("weights").value, g.weights.data);
  EXPECT_EQ(r.count("tensor_maps"), 0u); // the runtime's, encoded per call

  CallFixture plain;
  EXPECT_NE(error(plain.spec, g).find("needs an expanded dispatch"), std::string::npos);
  GroupedGemmCall bad = g;
  bad.weights.shape = {4, 1024, 256};
  EXPECT_NE(error(f.spec, bad)
                .find("weights must have shape bf16[8, 1024, N] (K = x's 1024 columns), got "
                      "bf16[4, 1024, 256]"),
            std::string::npos);
  bad = g;
  bad.out.shape = {rows, 128};
  EXPECT_NE(error(f.spec, bad)
                .find("out must have shape bf16[" + std::to_string(rows) + ", 256], got bf16[" +
                      std::to_string(rows) + ", 128]"),
            std::string::npos)
      << error(f.spec, bad);
  bad = g;
  bad.out.dtype = "i32";
  EXPECT_NE(error(f.spec, bad).find("out must be bf16, f16 or f32"), std::string::npos);
  bad = g;
  bad.x.data += 8;
  EXPECT_NE(error(f.spec, bad).find("x must be 16-byte aligned"), std::string::npos);
  bad = g;
  bad.x.shape[0] = rows + 1;
  EXPECT_NE(error(f.spec, bad).find("more than a dispatch can receive"), std::string::npos);
  bad = g;
  bad.psumNumRecvTokensPerExpert = {};
  EXPECT_NE(error(f.spec, bad).find("handle.psum_num_recv_tokens_per_expert is required"),
            std::string::npos);
}
