//===- LaunchMetadataTest.cpp - the launch metadata's one definition -------===//
//
// What the compiler writes (setLaunchAttributes, launchMetadataJson) the
// runtime reads back unchanged (readLaunchMetadata), and what the runtime
// cannot launch it refuses naming the field.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/LaunchAttributes.h"
#include "epic/runtime/Json.h"
#include "epic/runtime/LaunchMetadata.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <gtest/gtest.h>

using namespace mlir;
using epic::LaunchMetadata;
using epic::runtime::Json;
using epic::runtime::readLaunchMetadata;

namespace {

/// Every field away from its absent value.
LaunchMetadata fullMetadata() {
  LaunchMetadata md;
  md.entry = "dispatch_gemm";
  md.kernels = {"a", "b"};
  md.threads = 128;
  md.paramFields = {"x", "rows", "w"};
  md.paramStride = 320;
  md.windowBytes = 1 << 20;
  md.windowBytesPerToken = 4096;
  md.windowBytesPerWarp = 8320;
  md.ginSignals = 24;
  md.windowScratchAt = 1 << 19;
  md.maxBlocksPerRank = 132;
  md.cooperative = true;
  md.timeoutMs = 5000;
  md.ctasPerSm = 2;
  md.dynamicSharedBytes = 99 * 1024;
  md.clusterDims = {2, 1, 1};
  md.programmaticLaunch = true;
  epic::TensorMapSpec lhs{"x", 64, {0, "rows"}, 512, 2, 64, 64, 128};
  epic::TensorMapSpec rhs{"w", 192, {4096, ""}, 256, 2, 64, 64, 128};
  md.tensorMaps = {lhs, rhs};
  return md;
}

/// `md` through the compiler: attributes on a function, then JSON.
std::string compiled(const LaunchMetadata &md) {
  MLIRContext context;
  context.loadDialect<func::FuncDialect>();
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(module->getBody());
  auto fn = func::FuncOp::create(b, b.getUnknownLoc(), "launch", b.getFunctionType({}, {}));
  epic::setLaunchAttributes(fn, md);
  FailureOr<llvm::json::Object> json = epic::launchMetadataJson(fn);
  EXPECT_TRUE(succeeded(json));
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(*json));
  return text;
}

bool same(int64_t a, int64_t b) { return a == b; }
bool same(bool a, bool b) { return a == b; }
bool same(const std::string &a, const std::string &b) { return a == b; }
template <typename T> bool same(const std::vector<T> &a, const std::vector<T> &b) { return a == b; }
bool same(const epic::IntOrField &a, const epic::IntOrField &b) {
  return a.value == b.value && a.field == b.field;
}
bool same(const epic::TensorMapSpec &a, const epic::TensorMapSpec &b) {
  bool equal = true;
#define EP_LAUNCH_MAP_FIELD(member, name, Kind) equal = equal && same(a.member, b.member);
#include "epic/runtime/LaunchMetadata.def"
  return equal;
}
bool same(const std::vector<epic::TensorMapSpec> &a, const std::vector<epic::TensorMapSpec> &b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i]))
      return false;
  return true;
}

void expectSame(const LaunchMetadata &a, const LaunchMetadata &b) {
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent)                                      \
  EXPECT_TRUE(same(a.member, b.member)) << name;
#include "epic/runtime/LaunchMetadata.def"
}

LaunchMetadata read(const std::string &text) {
  return readLaunchMetadata(Json::parse(text), "test");
}

/// `text` with `from` replaced by `to` (once; it must be there).
std::string edited(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

std::string errorOf(const std::string &text) {
  try {
    read(text);
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(LaunchMetadata, WhatTheCompilerWritesTheRuntimeReads) {
  LaunchMetadata full = fullMetadata();
  expectSame(read(compiled(full)), full);
  // Fields at their absent values are left out and read back as absent.
  LaunchMetadata least;
  least.entry = "dsl";
  least.kernels = {"k"};
  least.threads = 256;
  least.paramStride = 128;
  least.maxBlocksPerRank = 8;
  std::string text = compiled(least);
  EXPECT_EQ(text.find("ctas_per_sm"), std::string::npos) << text;
  EXPECT_NE(text.find("\"cooperative\":0"), std::string::npos) << text; // required
  expectSame(read(text), least);
}

TEST(LaunchMetadata, TheRuntimeRefusesWhatItCannotLaunch) {
  const std::string text = compiled(fullMetadata());
  EXPECT_EQ(errorOf(text), "");

  EXPECT_NE(errorOf(edited(text, "\"threads\":128", "\"threads\":128,\"thread\":1"))
                .find("launch metadata \"thread\" is not a launch field this runtime knows"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"threads\":128,", "")).find("\"threads\" is missing"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"ctas_per_sm\":2", "\"ctas_per_sm\":33"))
                .find("\"ctas_per_sm\" must be in [1, 32]"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"cooperative\":1", "\"cooperative\":\"yes\""))
                .find("\"cooperative\" is not what it must be"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"param_stride\":320", "\"param_stride\":100"))
                .find("\"param_stride\" 100 cannot hold 3 8-byte fields"),
            std::string::npos);
  // A descriptor that overlaps the fields, or runs past the record.
  EXPECT_NE(errorOf(edited(text, "\"offset\":64", "\"offset\":0"))
                .find("puts the TMA descriptor of x at byte 0"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"offset\":192", "\"offset\":256"))
                .find("puts the TMA descriptor of w at byte 256"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, ",\"swizzle\":128", "")).find("has a map without \"swizzle\""),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"cluster_dims\":[2,1,1]", "\"cluster_dims\":[2,2,1]"))
                .find("\"cluster_dims\" must be [x, 1, 1]"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"window_scratch_at\":524288", "\"window_scratch_at\":8"))
                .find("\"window_scratch_at\" 8 is outside the window's data region"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"window_bytes_per_warp\":8320", "\"window_bytes_per_warp\":-1"))
                .find("\"window_bytes_per_warp\" must not be negative"),
            std::string::npos);
  EXPECT_NE(errorOf(edited(text, "\"gin_signals\":24", "\"gin_signals\":-8"))
                .find("\"gin_signals\" must not be negative"),
            std::string::npos);
}

TEST(LaunchMetadata, TheWindowCoversTokensAndEachWarpsStaging) {
  LaunchMetadata md = fullMetadata(); // 128 threads: 4 warps per block
  EXPECT_EQ(md.windowFor(0, 0), 1 << 20);
  EXPECT_EQ(md.windowFor(10, 0), (1 << 20) + 10 * 4096);
  // 3 blocks of 4 warps, each with its staging.
  EXPECT_EQ(md.windowFor(10, 3), (1 << 20) + 10 * 4096 + 12 * 8320);
  md.threads = 100; // a partial warp still has its staging
  EXPECT_EQ(md.windowFor(0, 2), (1 << 20) + 8 * 8320);
}
