//===- DialectTest.cpp - C++ API of the ep and comm dialects --------------===//
//
// What lit cannot see: the C++ accessors of #ep.config, the type inference
// of the ep.dispatch builder, and the exact memory effects of comm ops.
//
//===----------------------------------------------------------------------===//

#include "epic/Dialect/Comm/IR/CommDialect.h"
#include "epic/Dialect/EP/IR/EPDialect.h"
#include "epic/InitAllDialects.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;
namespace ep = epic::ep;
namespace comm = epic::comm;

namespace {

class DialectTest : public ::testing::Test {
protected:
  DialectTest() {
    DialectRegistry registry;
    epic::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  /// A configuration built through the checked getter; null (and the
  /// diagnostic in `lastError`) when the verifier rejects it.
  ep::ConfigAttr config(unsigned ranks, unsigned experts, unsigned topk, unsigned hidden,
                        Type dtype, unsigned packs = 0, unsigned align = 1,
                        ep::Layout layout = ep::Layout::plain, unsigned tmax = 128) {
    lastError.clear();
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      lastError = diag.str();
      return success();
    });
    return ep::ConfigAttr::getChecked([&] { return emitError(UnknownLoc::get(&context)); },
                                      &context, ranks, experts, topk, hidden, dtype, packs, align,
                                      layout, /*numSms=*/0u, tmax, /*scaleupRanks=*/0u,
                                      ep::Mode::direct);
  }

  MLIRContext context;
  std::string lastError;
};

TEST_F(DialectTest, ConfigDerivedSizes) {
  OpBuilder b(&context);
  // DeepEP's V3 configuration with 128-row expert alignment.
  ep::ConfigAttr cfg =
      config(8, 256, 8, 7168, b.getType<Float8E4M3FNType>(), 56, 128, ep::Layout::expanded, 4096);
  ASSERT_TRUE(cfg) << lastError;
  EXPECT_EQ(cfg.getNumLocalExperts(), 32u);
  EXPECT_EQ(cfg.getHiddenBytes(), 7168u);
  EXPECT_TRUE(cfg.isFP8());
  EXPECT_TRUE(cfg.isExpanded());
  EXPECT_EQ(cfg.getMaxRecvTokens(), 8u * 4096u);
  // align(R*Tmax*min(K, E/R) + (A-1)*E/R, A) = align(262144 + 4064, 128).
  EXPECT_EQ(cfg.getMaxExpandedTokens(), 266240u);
  EXPECT_EQ(cfg.getMaxOutputRows(), cfg.getMaxExpandedTokens());

  ep::ConfigAttr plain = config(8, 64, 4, 2048, b.getBF16Type());
  ASSERT_TRUE(plain) << lastError;
  EXPECT_EQ(plain.getHiddenBytes(), 4096u);
  EXPECT_FALSE(plain.isFP8());
  EXPECT_EQ(plain.getMaxOutputRows(), 8u * 128u);
  // min(K, E/R) caps the expanded rows when a rank holds fewer experts than K.
  ep::ConfigAttr few = config(8, 16, 8, 2048, b.getBF16Type(), 0, 1, ep::Layout::expanded, 10);
  ASSERT_TRUE(few) << lastError;
  EXPECT_EQ(few.getMaxExpandedTokens(), 8u * 10u * 2u);
}

TEST_F(DialectTest, ConfigVerifierNamesTheBadParameter) {
  OpBuilder b(&context);
  EXPECT_FALSE(config(8, 100, 8, 7168, b.getBF16Type()));
  EXPECT_NE(lastError.find("experts (100) must be divisible by ranks (8)"), std::string::npos)
      << lastError;
  EXPECT_FALSE(config(8, 256, 40, 7168, b.getBF16Type()));
  EXPECT_NE(lastError.find("topk must be in [1, 32], got 40"), std::string::npos) << lastError;
  EXPECT_FALSE(config(8, 256, 8, 7168, b.getType<Float8E4M3FNType>()));
  EXPECT_NE(lastError.find("needs scale packs"), std::string::npos) << lastError;
  EXPECT_FALSE(config(8, 256, 8, 7, b.getBF16Type()));
  EXPECT_NE(lastError.find("must be a multiple of 16"), std::string::npos) << lastError;
}

TEST_F(DialectTest, DispatchBuilderInfersResultTypes) {
  OpBuilder b(&context);
  Location loc = b.getUnknownLoc();
  auto module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module.getBody());

  ep::ConfigAttr cfg =
      config(4, 32, 6, 1024, b.getType<Float8E4M3FNType>(), 8, 128, ep::Layout::expanded, 256);
  ASSERT_TRUE(cfg) << lastError;
  int64_t dyn = ShapedType::kDynamic;
  auto xTy = RankedTensorType::get({dyn, 1024}, b.getType<Float8E4M3FNType>());
  auto sfTy = RankedTensorType::get({dyn, 8}, b.getI32Type());
  auto idxTy = RankedTensorType::get({dyn, 6}, b.getI32Type());
  auto wTy = RankedTensorType::get({dyn, 6}, b.getF32Type());
  auto fn = func::FuncOp::create(b, loc, "f", b.getFunctionType({xTy, sfTy, idxTy, wTy}, {}));
  Block *body = fn.addEntryBlock();
  b.setInsertionPointToEnd(body);
  auto dispatch =
      ep::DispatchOp::create(b, loc, cfg, body->getArgument(0), body->getArgument(2),
                             body->getArgument(1), body->getArgument(3), /*cachedHandle=*/Value());
  func::ReturnOp::create(b, loc);

  // Expanded + FP8 + weights: recv_x, recv_scale_packs, recv_topk_weights
  // (1-D), handle; no recv_topk_idx.
  ASSERT_EQ(dispatch->getNumResults(), 4u);
  EXPECT_EQ(dispatch.getRecvX().getType(), RankedTensorType::get({dyn, 1024}, cfg.getDtype()));
  EXPECT_EQ(dispatch.getRecvScalePacks().getType(), sfTy);
  EXPECT_FALSE(dispatch.getRecvTopkIdx());
  EXPECT_EQ(dispatch.getRecvTopkWeights().getType(), RankedTensorType::get({dyn}, b.getF32Type()));
  EXPECT_EQ(cast<ep::HandleType>(dispatch.getHandle().getType()).getConfig(), cfg);
  EXPECT_FALSE(dispatch.isCached());
  EXPECT_TRUE(succeeded(verify(module)));

  // A cached dispatch of the handle on the same configuration verifies too.
  b.setInsertionPoint(body->getTerminator());
  auto cached = ep::DispatchOp::create(b, loc, cfg, body->getArgument(0), Value(),
                                       body->getArgument(1), Value(), dispatch.getHandle());
  EXPECT_TRUE(cached.isCached());
  EXPECT_TRUE(succeeded(verify(module)));
  module->erase();
}

/// The effects of one op, as (effect, resource name) pairs.
static std::vector<std::pair<std::string, std::string>> effectsOf(Operation *op) {
  std::vector<std::pair<std::string, std::string>> result;
  SmallVector<MemoryEffects::EffectInstance> effects;
  cast<MemoryEffectOpInterface>(op).getEffects(effects);
  for (auto &e : effects) {
    std::string kind = isa<MemoryEffects::Read>(e.getEffect())    ? "read"
                       : isa<MemoryEffects::Write>(e.getEffect()) ? "write"
                                                                  : "other";
    result.emplace_back(kind, e.getResource()->getName().str());
  }
  return result;
}

TEST_F(DialectTest, CommMemoryEffectsAreExact) {
  const char *source = R"mlir(
    func.func @f(%dc: !comm.dev_comm, %win: !comm.window, %a: i64, %n: i64,
                 %peer: i32, %sig: i32, %p: !llvm.ptr, %v: i32) {
      %world = comm.team world %dc
      comm.put %n bytes from %win[%a] to %win[%a] of %world peer %peer via %dc coop warp
      comm.put %n bytes from %win[%a] to %win[%a] of %world peer %peer via %dc signal(%sig) coop warp
      %r = comm.load relaxed scope gpu %p : !llvm.ptr -> i32
      %q = comm.load acquire scope sys %p : !llvm.ptr -> i32
      comm.store release scope sys %v, %p : i32, !llvm.ptr
      return
    })mlir";
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &context);
  ASSERT_TRUE(module);
  SmallVector<Operation *> ops;
  module->walk([&](Operation *op) {
    if (isa<comm::PutOp, comm::LoadOp, comm::StoreOp, comm::TeamOp>(op))
      ops.push_back(op);
  });
  ASSERT_EQ(ops.size(), 6u);

  using Effects = std::vector<std::pair<std::string, std::string>>;
  // Teams are pure.
  EXPECT_TRUE(isMemoryEffectFree(ops[0]));
  // A put reads the local window and writes the peer's; with a signal it
  // also writes signal memory.
  EXPECT_EQ(effectsOf(ops[1]), (Effects{{"read", "comm.window"}, {"write", "comm.window"}}));
  EXPECT_EQ(effectsOf(ops[2]),
            (Effects{{"read", "comm.window"}, {"write", "comm.window"}, {"write", "comm.signal"}}));
  // A relaxed load only reads; an acquire load also orders later accesses.
  EXPECT_EQ(effectsOf(ops[3]), (Effects{{"read", "<Default>"}}));
  EXPECT_EQ(effectsOf(ops[4]), (Effects{{"read", "<Default>"}, {"write", "<Default>"}}));
  // A release store also orders earlier accesses.
  EXPECT_EQ(effectsOf(ops[5]), (Effects{{"write", "<Default>"}, {"read", "<Default>"}}));
}

} // namespace
