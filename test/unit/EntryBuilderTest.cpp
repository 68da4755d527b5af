//===- EntryBuilderTest.cpp - requests become entry IR that expands -------===//
//
// The runtime writes a kernel request (KernelRequest.h), the compiler reads
// it and builds the entry function (EntryBuilder.h): every kind and variant
// verifies, fuses and expands, the window the runtime reserves covers what
// convert-ep-to-comm lays out, and a bad request is refused naming its field. The
// printed entry IR of every kind is pinned by
// test/Tools/epic-compile-request.mlir.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/Passes.h"
#include "epic/EntryBuilder.h"
#include "epic/InitAllDialects.h"
#include "epic/Transforms/FusionCostModel.h"
#include "epic/Transforms/Passes.h"
#include "epic/runtime/KernelRequest.h"
#include "epic/runtime/Models.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"

#include <gtest/gtest.h>

#include <functional>

using namespace epic::runtime;

namespace {

/// A context for entry modules, its diagnostics collected as text (not the
/// fusions' remarks on what they leave alone).
struct EntryContext {
  mlir::MLIRContext context;
  std::string diagnostics;
  mlir::ScopedDiagnosticHandler handler{&context, [this](mlir::Diagnostic &d) {
                                          if (d.getSeverity() != mlir::DiagnosticSeverity::Remark)
                                            diagnostics += d.str() + "\n";
                                          return mlir::success();
                                        }};
  EntryContext() {
    mlir::DialectRegistry registry;
    epic::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  /// The verified entry module of the request `json`; null with the reason
  /// in `diagnostics`.
  mlir::OwningOpRef<mlir::ModuleOp> build(const std::string &json) {
    llvm::Expected<epic::EntryRequest> request = epic::parseEntryRequest(json);
    if (!request) {
      diagnostics += llvm::toString(request.takeError()) + "\n";
      return nullptr;
    }
    mlir::OwningOpRef<mlir::ModuleOp> module =
        epic::buildEntryModule(*request, mlir::UnknownLoc::get(&context));
    if (!module || mlir::failed(mlir::verify(*module)))
      return nullptr;
    return module;
  }

  /// Builds, fuses what the compiler fuses and converts the ep ops to comm; "" if all is
  /// fine, else the diagnostics. `inspect` then sees every function.
  std::string expand(const KernelRequest &request,
                     llvm::function_ref<void(mlir::func::FuncOp)> inspect = {}) {
    mlir::OwningOpRef<mlir::ModuleOp> module = build(request.json());
    if (!module)
      return "building failed: " + diagnostics;
    mlir::PassManager pm(&context);
    epic::addEntryFusionPasses(pm, "sm_90a");
    pm.addPass(epic::createConvertEPToComm());
    if (mlir::failed(pm.run(*module)))
      return "convert-ep-to-comm failed: " + diagnostics;
    if (inspect)
      module->walk(inspect);
    return diagnostics;
  }
};

/// The window the kernels of `request` use with `tmax` tokens per rank: the
/// metadata's window_bytes, plus window_bytes_per_token per token where the
/// kernels take the cap at run time.
int64_t windowBytesOf(const KernelRequest &request, int64_t tmax, int64_t warps = 0) {
  int64_t bytes = -1;
  EntryContext c;
  c.expand(request, [&](mlir::func::FuncOp f) {
    if (auto attr = f->getAttrOfType<mlir::IntegerAttr>("epic.window_bytes"))
      bytes = attr.getInt();
    if (auto perToken = f->getAttrOfType<mlir::IntegerAttr>("epic.window_bytes_per_token"))
      bytes += perToken.getInt() * tmax;
    if (auto perWarp = f->getAttrOfType<mlir::IntegerAttr>("epic.window_bytes_per_warp"))
      bytes += perWarp.getInt() * warps;
  });
  return bytes;
}

/// The launch function's `epic.entry` kind after fusion and convert-ep-to-comm.
std::string expandedEntryKind(const KernelRequest &request) {
  std::string entry = "(compilation failed)";
  EntryContext c;
  c.expand(request, [&](mlir::func::FuncOp f) {
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

EPSpec bf16V3() {
  EPSpec s = v3(true);
  s.dtype = "bf16", s.scalePacks = 0;
  return s;
}

TEST(EntryBuilder, EveryVariantVerifiesAndExpands) {
  for (bool expanded : {false, true})
    for (std::string dtype : {"bf16", "f8E4M3FN"})
      for (bool weights : {false, true})
        for (bool cached : {false, true}) {
          if (cached && weights)
            continue;
          EPSpec spec = v3(expanded);
          spec.dtype = dtype;
          spec.scalePacks = dtype == "bf16" ? 0 : 56;
          KernelRequest r =
              dispatchRequest(spec, {weights, cached, expanded && !cached, 64}, "dispatch");
          EXPECT_EQ(EntryContext().expand(r), "") << r.json();
        }
  for (bool expanded : {false, true})
    for (int biases : {0, 1, 2})
      for (bool weights : {false, true}) {
        KernelRequest r = combineRequest(v3(expanded), {weights, biases}, "combine");
        EXPECT_EQ(EntryContext().expand(r), "") << r.json();
      }
}

TEST(EntryBuilder, GroupedGemmTakesTheRowsWeightsAndHandle) {
  for (std::string out : {"bf16", "f32"}) {
    KernelRequest r = groupedGemmRequest(bf16V3(), 2048, out, "gemm");
    EntryContext c;
    mlir::OwningOpRef<mlir::ModuleOp> module = c.build(r.json());
    ASSERT_TRUE(module) << c.diagnostics;
    auto func = module->lookupSymbol<mlir::func::FuncOp>("gemm");
    ASSERT_TRUE(func);
    auto gemm = llvm::cast<epic::ep::GroupedGemmOp>(func.getBody().front().front());
    EXPECT_EQ(gemm->getOperands(), mlir::ValueRange(func.getArguments()));
    EXPECT_EQ(EntryContext().expand(r), "") << r.json();
  }
}

TEST(EntryBuilder, DispatchGemmIsFusedThenExpanded) {
  for (bool weights : {false, true}) {
    KernelRequest r =
        dispatchGemmRequest(bf16V3(), {weights, false, true, 64}, 2048, "bf16", "moe");
    EXPECT_EQ(expandedEntryKind(r), "dispatch_gemm") << "the compiler fuses the pair: " << r.json();
  }
}

TEST(EntryBuilder, GemmCombineIsFusedThenExpanded) {
  for (int biases : {0, 1, 2}) {
    KernelRequest r = gemmCombineRequest(bf16V3(), biases, "moe");
    EXPECT_EQ(expandedEntryKind(r), "gemm_combine") << "the compiler fuses the pair: " << r.json();
  }
}

TEST(EntryBuilder, MoeLayerIsOneOpExpandedToOneKernel) {
  KernelRequest r = moeLayerRequest(v3(true), 64, 2048, "layer");
  EntryContext c;
  mlir::OwningOpRef<mlir::ModuleOp> module = c.build(r.json());
  ASSERT_TRUE(module) << c.diagnostics;
  auto func = module->lookupSymbol<mlir::func::FuncOp>("layer");
  ASSERT_TRUE(func);
  auto layer = llvm::cast<epic::ep::MoeLayerOp>(func.getBody().front().front());
  EXPECT_EQ(layer->getOperands(), mlir::ValueRange(func.getArguments()));
  EXPECT_EQ(layer.getIntermediateSize(), 2048);
  EXPECT_EQ(expandedEntryKind(r), "moe_layer") << r.json();
}

TEST(EntryBuilder, TheGpuTimeoutReachesTheKernels) {
  EPSpec s = v3(false);
  s.timeoutMs = 5000;
  EntryContext c;
  mlir::OwningOpRef<mlir::ModuleOp> module = c.build(dispatchRequest(s, {}, "d").json());
  ASSERT_TRUE(module) << c.diagnostics;
  auto func = module->lookupSymbol<mlir::func::FuncOp>("d");
  auto timeout = func->getAttrOfType<mlir::IntegerAttr>("epic.timeout_ms");
  ASSERT_TRUE(timeout);
  EXPECT_EQ(timeout.getInt(), 5000);
  EXPECT_TRUE(timeout.getType().isInteger(64));
  EXPECT_EQ(EntryContext().expand(dispatchRequest(s, {}, "d")), "");
  mlir::OwningOpRef<mlir::ModuleOp> plain = c.build(dispatchRequest(v3(false), {}, "d").json());
  EXPECT_FALSE(plain->lookupSymbol<mlir::func::FuncOp>("d")->hasAttr("epic.timeout_ms"));
}

/// The runtime's JSON of `request` with `edit` applied, as text.
std::string edited(const KernelRequest &request,
                   llvm::function_ref<void(llvm::json::Object &)> edit) {
  llvm::json::Value value = llvm::cantFail(llvm::json::parse(request.json()));
  edit(*value.getAsObject());
  return llvm::formatv("{0}", value).str();
}

/// The compiler's refusal of `json` ("" if it builds a valid entry).
std::string refusal(const std::string &json) {
  EntryContext c;
  return c.build(json) ? "" : c.diagnostics;
}

TEST(EntryBuilder, ABadRequestIsRefusedByField) {
  KernelRequest dispatch = dispatchRequest(v3(false), {true, false, false, 64});
  auto spec = [](llvm::json::Object &r) { return r.getObject("spec"); };
  auto variant = [](llvm::json::Object &r) { return r.getObject("dispatch"); };
  struct Case {
    std::function<void(llvm::json::Object &)> edit;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](auto &r) { r["version"] = kKernelRequestVersion + 1; },
       "kernel request: version " + std::to_string(kKernelRequestVersion + 1) +
           " is not supported: this compiler reads version " +
           std::to_string(kKernelRequestVersion)},
      {[](auto &r) { r.erase("version"); },
       "kernel request: version: expected an integer, got none"},
      {[](auto &r) { r["kind"] = "gather"; },
       "kernel request: kind: expected one of dispatch, combine, grouped_gemm, swiglu, "
       "dispatch_gemm, "
       "gemm_combine, moe_layer, dispatch_layout, engram_fetch, low_latency_dispatch, "
       "low_latency_combine, "
       "got \"gather\""},
      {[](auto &r) { r["name"] = ""; }, "kernel request: name: expected a non-empty string"},
      {[](auto &r) { r["colour"] = 1; }, "kernel request: colour: is not a field here (version, "
                                         "kind, name, spec, dispatch, combine, gemm)"},
      {[](auto &r) { r.erase("spec"); }, "kernel request: spec: missing"},
      {[](auto &r) { r["gemm"] = llvm::json::Object{}; },
       "kernel request: a dispatch request has no \"gemm\" section"},
      {[&](auto &r) { r["kind"] = "combine"; },
       "kernel request: a combine request has no \"dispatch\" section"},
      {[&](auto &r) { spec(r)->erase("hidden"); }, "kernel request: spec.hidden: missing"},
      {[&](auto &r) { (*spec(r))["hidden"] = "7168"; },
       "kernel request: spec.hidden: expected an integer in [0, 2^31), got \"7168\""},
      {[&](auto &r) { (*spec(r))["ranks"] = -8; },
       "kernel request: spec.ranks: expected an integer in [0, 2^31), got -8"},
      {[&](auto &r) { (*spec(r))["timeout_ms"] = 1.5; },
       "kernel request: spec.timeout_ms: expected a non-negative integer, got 1.5"},
      {[&](auto &r) { (*spec(r))["expanded"] = 1; },
       "kernel request: spec.expanded: expected true or false, got 1"},
      {[&](auto &r) { (*variant(r))["wieghts"] = true; },
       "kernel request: dispatch.wieghts: is not a field here (weights, cached, zero_padding, "
       "topk_idx_bits, window_outputs, round_scale, use_ue8m0)"},
      {[&](auto &r) { (*variant(r))["topk_idx_bits"] = 12; },
       "kernel request: dispatch.topk_idx_bits: topk_idx must be an 8, 16, 32 or 64-bit "
       "integer, got 12 bits"},
      {[&](auto &r) { (*spec(r))["dtype"] = "no type"; },
       "kernel request: spec.dtype: \"no type\" is not a type"},
      // What #ep.config refuses, its verifier says in the spec's words.
      {[&](auto &r) { (*spec(r))["experts"] = 100; }, "kernel request: spec: "},
  };
  for (const Case &c : cases) {
    std::string message = refusal(edited(dispatch, c.edit));
    EXPECT_NE(message.find(c.message), std::string::npos)
        << "expected: " << c.message << "\ngot: " << message;
  }
  EXPECT_NE(
      refusal(edited(dispatch, [&](auto &r) { (*spec(r))["experts"] = 100; })).find("experts"),
      std::string::npos);
  EXPECT_NE(refusal("[1]").find("kernel request: expected an object, got [1]"), std::string::npos);
  EXPECT_NE(refusal("{").find("kernel request: not JSON"), std::string::npos);
  KernelRequest gemm = groupedGemmRequest(bf16V3(), 64, "bf16");
  EXPECT_NE(refusal(edited(gemm, [](auto &r) { (*r.getObject("gemm"))["n"] = 0; }))
                .find("kernel request: gemm.n: the expert GEMM's N must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(refusal(edited(gemm, [](auto &r) { (*r.getObject("gemm"))["out_dtype"] = "?"; }))
                .find("kernel request: gemm.out_dtype: \"?\" is not a type"),
            std::string::npos);
  KernelRequest fusedCombine = gemmCombineRequest(bf16V3(), 1);
  EXPECT_NE(refusal(edited(fusedCombine, [](auto &r) { (*r.getObject("combine"))["biases"] = 3; }))
                .find("kernel request: combine.biases: combine takes 0, 1 or 2 biases, got 3"),
            std::string::npos);
  EXPECT_NE(
      refusal(edited(fusedCombine, [](auto &r) { (*r.getObject("combine"))["weights"] = true; }))
          .find("kernel request: combine.weights: the fused GEMM + combine takes no topk_weights"),
      std::string::npos);
  EXPECT_EQ(refusal(dispatch.json()), "");
}

// The runtime's spec and the compiler's #ep.config are one configuration:
// each field survives the trip through the attribute, and run plans spell it
// as requests do.
TEST(EntryBuilder, TheSpecIsTheConfigSpelledAlike) {
  epic::EntryRequest::Spec spec;
  spec.ranks = 4, spec.experts = 64, spec.topk = 6, spec.hidden = 1024, spec.dtype = "f8E5M2";
  spec.scalePacks = 8, spec.expertAlignment = 32, spec.expanded = true, spec.numSms = 20;
  spec.maxTokensPerRank = 300;
  EntryContext c;
  epic::ep::ConfigAttr config = epic::configOf(spec, mlir::UnknownLoc::get(&c.context));
  ASSERT_TRUE(config) << c.diagnostics;
  epic::EntryRequest::Spec back = epic::specOf(config);
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) EXPECT_EQ(back.member, spec.member) << name;
#include "epic/runtime/KernelRequest.def"

  EPSpec runtimeSpec = bf16V3();
  llvm::json::Value written =
      llvm::cantFail(llvm::json::parse(gemmCombineRequest(runtimeSpec, 0).json()));
  llvm::json::Object expected = *written.getAsObject()->getObject("spec");
  expected.erase("timeout_ms"); // an attribute of the entry, not of #ep.config
  mlir::OwningOpRef<mlir::ModuleOp> module = c.build(gemmCombineRequest(runtimeSpec, 0).json());
  ASSERT_TRUE(module) << c.diagnostics;
  epic::ep::ConfigAttr built;
  module->walk([&](epic::ep::GroupedGemmOp op) { built = op.getConfig(); });
  EXPECT_EQ(llvm::json::Value(epic::configJson(built)), llvm::json::Value(std::move(expected)));
}

} // namespace

TEST(EntryBuilder, TheRuntimesWindowBoundCoversEveryLayoutEpExpandMakes) {
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
              std::vector<KernelRequest> requests = {
                  dispatchRequest(s, {true, false, false, 64}, "d"),
                  combineRequest(s, {true, 2}, "c")};
              if (expanded && dtype == "bf16") { // and fused with the expert GEMM
                requests.push_back(
                    dispatchGemmRequest(s, {true, false, false, 64}, 128, "bf16", "dg"));
                requests.push_back(gemmCombineRequest(s, 2, "gc"));
              }
              if (expanded && fp8) // the whole layer's persistent kernel (ep.moe_layer)
                requests.push_back(moeLayerRequest(s, 64, 256, "layer"));
              for (const KernelRequest &request : requests) {
                int64_t used = windowBytesOf(request, tmax);
                ASSERT_GT(used, 0) << request.json();
                EXPECT_GE(bound, used) << request.json();
                // 2x: rows bounded at f32 width; + 2 MiB: the fused kernels' counters and
                // scratch (sized for 256 local experts) are in every bound.
                EXPECT_LE(bound, used * 2 + (2 << 20))
                    << "a loose bound wastes memory: " << request.json();
              }
            }
}

TEST(EntryBuilder, TheBufferSizeAcrossNodesCoversTheStagingOfItsBlocks) {
  for (auto [nodes, perNode] : {std::pair{2, 2}, std::pair{2, 8}})
    for (int hidden : {256, 7168})
      for (std::string dtype : {"bf16", "f8E4M3FN"})
        for (int blocks : {1, 33}) {
          EPSpec s;
          s.ranks = nodes * perNode, s.experts = 8 * s.ranks, s.topk = 8, s.hidden = hidden;
          s.dtype = dtype, s.scalePacks = dtype == "f8E4M3FN" ? hidden / 128 : 0;
          s.maxTokensPerRank = 100, s.scaleupRanks = perNode;
          const Topology t = Topology::nodes(nodes, perNode, /*hybrid=*/false);
          int64_t bound = elasticBufferBytes(t, 100, hidden, 8, s.isFP8(), true, blocks);
          for (const KernelRequest &request : {dispatchRequest(s, {true, false, false, 64}, "d"),
                                               combineRequest(s, {true, 2}, "c")}) {
            // Every warp a launch of `blocks` blocks can have stages its records.
            int64_t used = windowBytesOf(request, 100, blocks * kMaxWarpsPerBlock);
            ASSERT_GT(used, 0) << request.json();
            EXPECT_GE(bound, used) << request.json();
          }
        }
  // Across nodes the staging needs the blocks per rank; one node does not.
  const Topology two = Topology::nodes(2, 4, false);
  EXPECT_THROW(elasticBufferBytes(two, 100, 256, 8, false, true, 0), std::invalid_argument);
  EXPECT_NO_THROW(elasticBufferBytes(Topology::nodes(1, 8, false), 100, 256, 8, false, true, 0));
  EXPECT_GT(elasticBufferBytes(two, 4096, 7168, 8, false, true, 132),
            elasticBufferBytes(two, 4096, 7168, 8, false, true, 1));
}
