//===- EntryIRTest.cpp - the runtime's entry IR parses, verifies, expands -===//

#include "epic/InitAllDialects.h"
#include "epic/Conversion/Passes.h"
#include "epic/Transforms/Passes.h"
#include "epic/runtime/EntryIR.h"
#include "epic/runtime/Models.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <set>

using namespace epic::runtime;

namespace {

/// Parses, verifies and ep-expands `ir`; returns the diagnostics ("" if fine).
std::string expand(const std::string &ir) {
  mlir::DialectRegistry registry;
  epic::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  std::string diagnostics;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    diagnostics += d.str() + "\n";
    return mlir::success();
  });
  auto module = mlir::parseSourceString<mlir::ModuleOp>(ir, &context);
  if (!module)
    return "parse failed: " + diagnostics;
  mlir::PassManager pm(&context);
  pm.addPass(epic::createConvertEPToComm());
  if (mlir::failed(pm.run(*module)))
    return "ep-expand failed: " + diagnostics;
  return diagnostics;
}

/// Runs the compiler's fusions and ep-expand on `ir`; then `inspect` sees
/// every function. False when parsing or a pass fails.
bool expandThen(const std::string &ir, llvm::function_ref<void(mlir::func::FuncOp)> inspect) {
  mlir::DialectRegistry registry;
  epic::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  auto module = mlir::parseSourceString<mlir::ModuleOp>(ir, &context);
  mlir::PassManager pm(&context);
  pm.addNestedPass<mlir::func::FuncOp>(epic::createEPFuseDispatchGemm());
  pm.addNestedPass<mlir::func::FuncOp>(epic::createEPFuseGemmCombine());
  pm.addPass(epic::createConvertEPToComm());
  if (!module || mlir::failed(pm.run(*module)))
    return false;
  module->walk(inspect);
  return true;
}

/// The window the kernels of `ir` use with `tmax` tokens per rank: the
/// metadata's window_bytes, plus window_bytes_per_token per token where the
/// kernels take the cap at run time.
int64_t windowBytesOf(const std::string &ir, int64_t tmax) {
  int64_t bytes = -1;
  expandThen(ir, [&](mlir::func::FuncOp f) {
    if (auto attr = f->getAttrOfType<mlir::IntegerAttr>("epic.window_bytes"))
      bytes = attr.getInt();
    if (auto perToken = f->getAttrOfType<mlir::IntegerAttr>("epic.window_bytes_per_token"))
      bytes += perToken.getInt() * tmax;
  });
  return bytes;
}

/// The launch function's `epic.entry` kind after fusion and ep-expand.
std::string expandedEntryKind(const std::string &ir) {
  std::string entry = "(compilation failed)";
  expandThen(ir, [&](mlir::func::FuncOp f) {
    if (auto attr = f->getAttrOfType<mlir::StringAttr>("epic.entry"))
      entry = attr.getValue().str();
  });
  return entry;
}

EPSpec v3(bool expanded) {
  EPSpec s;
  s.ranks = 8, s.experts = 256, s.topk = 8, s.hidden = 7168, s.dtype = "f8E4M3FN";
  s.scalePacks = 56, s.expertAlignment = 128, s.expanded = expanded, s.maxTokensPerRank = 4096;
  return s;
}

TEST(EntryIR, EveryVariantParsesVerifiesAndExpands) {
  for (bool expanded : {false, true})
    for (std::string dtype : {"bf16", "f8E4M3FN"})
      for (bool weights : {false, true})
        for (bool cached : {false, true}) {
          if (cached && weights)
            continue;
          EPSpec spec = v3(expanded);
          spec.dtype = dtype;
          spec.scalePacks = dtype == "bf16" ? 0 : 56;
          DispatchVariant d{weights, cached, expanded && !cached, 64};
          std::string ir = dispatchEntryIR(spec, d, "dispatch");
          EXPECT_EQ(expand(ir), "") << ir;
        }
  for (bool expanded : {false, true})
    for (int biases : {0, 1, 2})
      for (bool weights : {false, true}) {
        std::string ir = combineEntryIR(v3(expanded), {weights, biases}, "combine");
        EXPECT_EQ(expand(ir), "") << ir;
      }
}

TEST(EntryIR, GroupedGemmExpandsWithItsTensorMaps) {
  EPSpec spec = v3(true);
  spec.dtype = "bf16", spec.scalePacks = 0;
  for (std::string out : {"bf16", "f32"}) {
    std::string ir = groupedGemmEntryIR(spec, 2048, out, "gemm");
    EXPECT_EQ(expand(ir), "") << ir;
    EXPECT_NE(ir.find("ep.grouped_gemm %x, %w layout(%h"), std::string::npos) << ir;
  }
  auto message = [](const EPSpec &s, const std::string &out) -> std::string {
    try {
      groupedGemmEntryIR(s, 2048, out, "g");
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(v3(true), "bf16").find("bf16 or f16 rows, got f8E4M3FN"), std::string::npos);
  EXPECT_NE(message(spec, "i32").find("output must be bf16, f16 or f32"), std::string::npos);
  spec.expanded = false;
  EXPECT_NE(message(spec, "bf16").find("needs the expanded layout"), std::string::npos);
}

TEST(EntryIR, DispatchGemmIsFusedThenExpanded) {
  EPSpec spec = v3(true);
  spec.dtype = "bf16", spec.scalePacks = 0;
  for (bool weights : {false, true}) {
    std::string ir = dispatchGemmEntryIR(spec, {weights, false, true, 64}, 2048, "bf16", "moe");
    EXPECT_EQ(expandedEntryKind(ir), "dispatch_gemm") << "the compiler fuses the pair: " << ir;
  }
  EXPECT_THROW(dispatchGemmEntryIR(v3(true), {}, 2048, "bf16", "g"), std::invalid_argument);
  EXPECT_THROW(dispatchGemmEntryIR(spec, {false, true, false, 64}, 2048, "bf16", "g"),
               std::invalid_argument);
}

TEST(EntryIR, GemmCombineIsFusedThenExpanded) {
  EPSpec spec = v3(true);
  spec.dtype = "bf16", spec.scalePacks = 0;
  for (int biases : {0, 1, 2}) {
    std::string ir = gemmCombineEntryIR(spec, biases, "moe");
    EXPECT_EQ(expandedEntryKind(ir), "gemm_combine") << "the compiler fuses the pair: " << ir;
  }
  EXPECT_THROW(gemmCombineEntryIR(v3(true), 0, "g"), std::invalid_argument); // FP8
  EXPECT_THROW(gemmCombineEntryIR(v3(false), 0, "g"), std::invalid_argument);
  EXPECT_THROW(gemmCombineEntryIR(spec, 3, "g"), std::invalid_argument);
}

TEST(EntryIR, IsDeterministic) {
  EXPECT_EQ(dispatchEntryIR(v3(false), {}, "d"), dispatchEntryIR(v3(false), {}, "d"));
  EXPECT_NE(dispatchEntryIR(v3(false), {}, "d"), dispatchEntryIR(v3(true), {}, "d"));
}

// The token cap is a run-time value of the kernels: every cap asks for the
// same entry IR (one kernel key, one compilation), except the fused GEMM
// entries, which size scratch by it.
TEST(EntryIR, OneKernelSetServesEveryTokenCap) {
  std::vector<std::string> dispatches, combines, gemms, fused;
  for (int cap : {128, 256, 512, 1000, 4096}) {
    EPSpec s = v3(true);
    s.maxTokensPerRank = cap;
    dispatches.push_back(dispatchEntryIR(s, {true, false, false, 64}, "d"));
    combines.push_back(combineEntryIR(s, {true, 1}, "c"));
    s.dtype = "bf16", s.scalePacks = 0;
    gemms.push_back(groupedGemmEntryIR(s, 256, "bf16", "g"));
    fused.push_back(dispatchGemmEntryIR(s, {true, false, false, 64}, 256, "bf16", "dg"));
  }
  for (const auto *irs : {&dispatches, &combines, &gemms}) {
    EXPECT_EQ(std::set<std::string>(irs->begin(), irs->end()).size(), 1u) << irs->front();
    EXPECT_EQ(irs->front().find("max_tokens_per_rank"), std::string::npos) << irs->front();
  }
  EXPECT_EQ(std::set<std::string>(fused.begin(), fused.end()).size(), 5u);
  EXPECT_NE(fused.front().find("max_tokens_per_rank = 128"), std::string::npos);
  EXPECT_EQ(expand(dispatches.front()), "") << dispatches.front();
}

TEST(EntryIR, BadArgumentsAreNamed) {
  auto message = [](const EPSpec &spec, DispatchVariant v = {}) -> std::string {
    try {
      dispatchEntryIR(spec, v, "d");
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "";
  };
  EPSpec s = v3(false);
  s.experts = 100;
  EXPECT_NE(message(s).find("num_experts (100)"), std::string::npos);
  s = v3(false);
  s.topk = 40;
  EXPECT_NE(message(s).find("num_topk"), std::string::npos);
  s = v3(false);
  s.dtype = "int8";
  EXPECT_NE(message(s).find("dtype"), std::string::npos);
  s = v3(false);
  s.scalePacks = 0;
  EXPECT_NE(message(s).find("scale packs"), std::string::npos);
  s = v3(false);
  s.maxTokensPerRank = 0;
  EXPECT_NE(message(s).find("num_max_tokens_per_rank"), std::string::npos);
  EXPECT_NE(message(v3(false), {false, false, true, 64}).find("do_zero_padding"),
            std::string::npos);
  EXPECT_NE(message(v3(false), {false, false, false, 12}).find("topk_idx"), std::string::npos);
}

} // namespace

TEST(EntryIR, TheRuntimesWindowBoundCoversEveryLayoutEpExpandMakes) {
  for (int ranks : {1, 2, 8})
    for (int topk : {1, 8, 32})
      for (int hidden : {256, 7168})
        for (std::string dtype : {"bf16", "f32", "f8E4M3FN"})
          for (int tmax : {1, 100, 4096})
            for (bool expanded : {false, true}) {
              EPSpec s;
              s.ranks = ranks, s.experts = 32 * ranks, s.topk = topk, s.hidden = hidden;
              s.dtype = dtype, s.scalePacks = dtype == "f8E4M3FN" ? hidden / 128 : 0;
              s.expanded = expanded, s.maxTokensPerRank = tmax;
              bool fp8 = s.isFP8();
              int64_t bound = kernelWindowBytes(ranks, tmax, hidden, topk, fp8);
              std::vector<std::string> irs = {dispatchEntryIR(s, {true, false, false, 64}, "d"),
                                              combineEntryIR(s, {true, 2}, "c")};
              if (expanded && dtype == "bf16") { // and fused with the expert GEMM
                irs.push_back(dispatchGemmEntryIR(s, {true, false, false, 64}, 128, "bf16", "dg"));
                irs.push_back(gemmCombineEntryIR(s, 2, "gc"));
              }
              for (const std::string &ir : irs) {
                int64_t used = windowBytesOf(ir, tmax);
                ASSERT_GT(used, 0) << ir;
                EXPECT_GE(bound, used) << ir;
                // 2x: rows bounded at f32 width; + 2 MiB: the fused kernels' counters and
                // scratch (sized for 256 local experts) are in every bound.
                EXPECT_LE(bound, used * 2 + (2 << 20)) << "a loose bound wastes memory: " << ir;
              }
            }
}

TEST(EntryIR, TheGpuTimeoutReachesTheKernels) {
  EPSpec s = v3(false);
  s.timeoutMs = 5000;
  std::string ir = dispatchEntryIR(s, {true, false, false, 64}, "d");
  EXPECT_NE(ir.find("attributes {epic.timeout_ms = 5000 : i64}"), std::string::npos) << ir;
  EXPECT_EQ(expand(ir), "") << ir;
  EXPECT_EQ(dispatchEntryIR(v3(false), {true, false, false, 64}, "d").find("timeout"),
            std::string::npos);
  s.timeoutMs = -1;
  EXPECT_THROW(s.validate(), std::invalid_argument);
}
