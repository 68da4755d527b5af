//===- KernelRequestTest.cpp - what the runtime asks the compiler for -----===//
//
// Linked without MLIR: the canonical JSON of kernel requests (the kernel
// cache key's main part) and the checks that refuse bad ones by name. That
// the compiler reads the JSON back into the same entry IR is
// EntryBuilderTest's and test/Tools/epic-compile-request.mlir's to show.
//
//===----------------------------------------------------------------------===//

#include "epic/runtime/Json.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/KernelRequest.h"

#include "Refusal.h"

#include <gtest/gtest.h>

#include <set>

using namespace epic::runtime;
using epic::test::refusal;

namespace {

EPSpec v3(bool expanded) {
  EPSpec s;
  s.ranks = 8, s.experts = 256, s.topk = 8, s.hidden = 7168, s.dtype = "f8E4M3FN";
  s.scalePacks = 56, s.expertAlignment = 128, s.expanded = expanded, s.maxTokensPerRank = 4096;
  return s;
}

EPSpec bf16(bool expanded = true) {
  EPSpec s = v3(expanded);
  s.dtype = "bf16", s.scalePacks = 0;
  return s;
}

TEST(KernelRequest, JsonIsCanonical) {
  EPSpec s = v3(false);
  s.timeoutMs = 5000;
  EXPECT_EQ(dispatchRequest(s, {true, false, false, 32}).json(),
            R"({"version":5,"kind":"dispatch","name":"ep_dispatch",)"
            R"("spec":{"ranks":8,"experts":256,"topk":8,"hidden":7168,"dtype":"f8E4M3FN",)"
            R"("scale_packs":56,"expert_alignment":128,"expanded":false,"num_sms":0,)"
            R"("max_tokens_per_rank":0,"scaleup_ranks":0,"hybrid":false,"timeout_ms":5000},)"
            R"("dispatch":{"weights":true,"cached":false,"zero_padding":false,"topk_idx_bits":32,)"
            R"("window_outputs":false,"round_scale":false,"use_ue8m0":false}})");
  EXPECT_EQ(gemmCombineRequest(bf16(), 2, "moe").json(),
            R"({"version":5,"kind":"gemm_combine","name":"moe",)"
            R"("spec":{"ranks":8,"experts":256,"topk":8,"hidden":7168,"dtype":"bf16",)"
            R"("scale_packs":0,"expert_alignment":128,"expanded":true,"num_sms":0,)"
            R"("max_tokens_per_rank":4096,"scaleup_ranks":0,"hybrid":false,"timeout_ms":0},)"
            R"("combine":{"weights":false,"biases":2,"window_outputs":false}})");
  // Every kind has its sections and only those, and its default entry name.
  std::string grouped = groupedGemmRequest(bf16(), 2048, "f32").json();
  EXPECT_NE(grouped.find(R"("gemm":{"n":2048,"out_dtype":"f32","k":0,"in_dtype":"bf16"})"),
            std::string::npos);
  EXPECT_EQ(grouped.find(R"("dispatch":)"), std::string::npos);
  // K: the hidden size is written as 0 (one request, one key); another width as itself.
  EXPECT_EQ(groupedGemmRequest(bf16(), 2048, "f32", "", bf16().hidden).json(), grouped);
  EXPECT_NE(groupedGemmRequest(bf16(), 2048, "f32", "", 2048).json().find(R"("k":2048,)"),
            std::string::npos);
  std::string fused = dispatchGemmRequest(bf16(), {true, false, true, 64}, 256, "bf16").json();
  EXPECT_NE(fused.find(R"("name":"ep_dispatch_gemm")"), std::string::npos);
  EXPECT_NE(fused.find(R"("dispatch":{"weights":true,"cached":false,"zero_padding":true,)"
                       R"("topk_idx_bits":64,"window_outputs":false,"round_scale":false,)"
                       R"("use_ue8m0":false},"gemm":{"n":256,)"
                       R"("out_dtype":"bf16","k":0,"in_dtype":"bf16"}})"),
            std::string::npos);
  EXPECT_NE(combineRequest(v3(true), {true, 1}).json().find(R"("name":"ep_combine","spec":)"),
            std::string::npos);
  // Equal requests, equal text; any difference, another text.
  EXPECT_EQ(dispatchRequest(v3(false), {}).json(), dispatchRequest(v3(false), {}).json());
  EXPECT_NE(dispatchRequest(v3(false), {}).json(), dispatchRequest(v3(true), {}).json());
  EXPECT_NE(dispatchRequest(v3(false), {}).json(), dispatchRequest(v3(false), {}, "d").json());
}

// The token cap is a run-time value of the kernels: every cap asks for the
// same request (one kernel key, one compilation), except the fused GEMM
// entries, which size scratch by it.
TEST(KernelRequest, OneKernelSetServesEveryTokenCap) {
  std::vector<std::string> dispatches, combines, gemms, fused, fusedCombines;
  for (int cap : {128, 256, 512, 1000, 4096}) {
    EPSpec s = v3(true);
    s.maxTokensPerRank = cap;
    dispatches.push_back(dispatchRequest(s, {true, false, false, 64}).json());
    combines.push_back(combineRequest(s, {true, 1}).json());
    s.dtype = "bf16", s.scalePacks = 0;
    gemms.push_back(groupedGemmRequest(s, 256, "bf16").json());
    fused.push_back(dispatchGemmRequest(s, {true, false, false, 64}, 256, "bf16").json());
    fusedCombines.push_back(gemmCombineRequest(s, 1).json());
  }
  for (const auto *requests : {&dispatches, &combines, &gemms}) {
    EXPECT_EQ(std::set<std::string>(requests->begin(), requests->end()).size(), 1u);
    EXPECT_NE(requests->front().find(R"("max_tokens_per_rank":0,)"), std::string::npos);
  }
  EXPECT_EQ(std::set<std::string>(fused.begin(), fused.end()).size(), 5u);
  EXPECT_EQ(std::set<std::string>(fusedCombines.begin(), fusedCombines.end()).size(), 5u);
  EXPECT_NE(fused.front().find(R"("max_tokens_per_rank":128,)"), std::string::npos);
}

// A cached dispatch reads the handle's int64 routing whatever the variant's
// width says: one request (one kernel set) for all of them.
TEST(KernelRequest, ACachedDispatchAsksForInt64Routing) {
  std::string wide = dispatchRequest(v3(false), {false, true, false, 64}).json();
  EXPECT_EQ(dispatchRequest(v3(false), {false, true, false, 32}).json(), wide);
  EXPECT_NE(wide.find(R"("cached":true,"zero_padding":false,"topk_idx_bits":64)"),
            std::string::npos);
  EXPECT_NE(dispatchRequest(v3(false), {false, false, false, 32}).json(),
            dispatchRequest(v3(false), {false, false, false, 64}).json());
}

TEST(KernelRequest, BadArgumentsAreNamed) {
  auto dispatch = [](const EPSpec &spec, DispatchVariant v = {}) {
    return refusal([&] { dispatchRequest(spec, v, "d"); });
  };
  EPSpec s = v3(false);
  s.experts = 100;
  EXPECT_NE(dispatch(s).find("num_experts (100)"), std::string::npos);
  s = v3(false);
  s.topk = 40;
  EXPECT_NE(dispatch(s).find("num_topk"), std::string::npos);
  s = v3(false);
  s.dtype = "int8";
  EXPECT_NE(dispatch(s).find("dtype"), std::string::npos);
  s = v3(false);
  s.scalePacks = 0;
  EXPECT_NE(dispatch(s).find("scale packs"), std::string::npos);
  s = v3(false);
  s.maxTokensPerRank = 0;
  EXPECT_NE(dispatch(s).find("num_max_tokens_per_rank"), std::string::npos);
  s = v3(false);
  s.timeoutMs = -1;
  EXPECT_NE(dispatch(s).find("GPU timeout"), std::string::npos);
  s = v3(false);
  s.scaleupRanks = 3;
  EXPECT_NE(dispatch(s).find("num_scaleup_ranks (3) must divide the number of ranks (8)"),
            std::string::npos);
  s = v3(false);
  s.hybrid = true;
  EXPECT_NE(dispatch(s).find("hybrid mode needs more than one node"), std::string::npos);
  s.scaleupRanks = 4; // two nodes of four: valid
  EXPECT_EQ(dispatch(s), "");
  s.ranks = 128, s.experts = 256, s.scaleupRanks = 2; // 64 nodes
  EXPECT_NE(dispatch(s).find("num_scaleout_ranks must be in [2, 32], got 64"), std::string::npos);
  EXPECT_NE(dispatch(v3(false), {false, false, true, 64}).find("do_zero_padding"),
            std::string::npos);
  EXPECT_NE(dispatch(v3(false), {false, false, false, 12}).find("topk_idx"), std::string::npos);
  EXPECT_NE(dispatch(v3(false), {true, true, false, 64}).find("cached dispatch takes no"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              combineRequest(v3(false), {false, 3});
            }).find("combine takes 0, 1 or 2 biases, got 3"),
            std::string::npos);
}

// window_outputs: a dispatch's or a combine's, on one NVLink domain.
TEST(KernelRequest, WindowOutputsNeedOneNVLinkDomain) {
  DispatchVariant window;
  window.windowOutputs = true;
  EXPECT_EQ(refusal([&] { dispatchRequest(v3(false), window, "d"); }), "");
  EPSpec nodes = v3(false);
  nodes.scaleupRanks = 4;
  EXPECT_NE(refusal([&] {
              dispatchRequest(nodes, window, "d");
            }).find("window_outputs needs every rank in one NVLink domain"),
            std::string::npos);
  CombineVariant combine;
  combine.windowOutputs = true;
  EXPECT_NE(refusal([&] { combineRequest(nodes, combine, "c"); }).find("one NVLink domain"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              dispatchGemmRequest(bf16(), window, 256, "bf16");
            }).find("window_outputs is a dispatch's or a combine's option"),
            std::string::npos);
}

TEST(KernelRequest, TheExpertGemmsRefuseWhatTheyCannotMultiply) {
  auto gemm = [](const EPSpec &s, int64_t n, const std::string &out) {
    return refusal([&] { groupedGemmRequest(s, n, out); });
  };
  // e4m3 rows (with their block scales) are the FP8 grouped GEMM's; e5m2 rows are nobody's.
  EXPECT_EQ(gemm(v3(true), 2048, "bf16"), "");
  EPSpec e5m2 = v3(true);
  e5m2.dtype = "f8E5M2";
  EXPECT_NE(gemm(e5m2, 2048, "bf16").find("bf16, f16 or f8E4M3FN rows, got f8E5M2"),
            std::string::npos);
  EXPECT_NE(gemm(bf16(), 2048, "i32").find("grouped_gemm's output must be bf16, f16 or f32"),
            std::string::npos);
  EXPECT_NE(gemm(bf16(), 0, "bf16").find("N must be positive, got 0"), std::string::npos);
  EXPECT_NE(gemm(bf16(false), 2048, "bf16").find("needs the expanded layout"), std::string::npos);

  auto fused = [](const EPSpec &s, DispatchVariant v, const std::string &out = "bf16") {
    return refusal([&] { dispatchGemmRequest(s, v, 2048, out); });
  };
  EXPECT_NE(fused(v3(true), {}).find("multiplies bf16 or f16 rows"), std::string::npos);
  EXPECT_NE(fused(bf16(), {false, true, false, 64}).find("cannot be a cached dispatch"),
            std::string::npos);
  EXPECT_NE(fused(bf16(false), {}).find("needs the expanded layout"), std::string::npos);
  EXPECT_NE(fused(bf16(), {}, "f64").find("expert GEMM's output must be"), std::string::npos);

  EXPECT_NE(refusal([] { gemmCombineRequest(v3(true), 0); }).find("bf16 or f16 rows"),
            std::string::npos);
  EXPECT_NE(refusal([] { gemmCombineRequest(bf16(false), 0); }).find("expanded layout"),
            std::string::npos);
  EXPECT_NE(refusal([] { gemmCombineRequest(bf16(), 3); }).find("0, 1 or 2 biases, got 3"),
            std::string::npos);
  KernelRequest weighted = gemmCombineRequest(bf16(), 0);
  weighted.combine.weights = true;
  EXPECT_NE(refusal([&] { weighted.json(); }).find("takes no topk_weights"), std::string::npos);
}

TEST(KernelRequest, MoeLayerKeepsItsTokenCapAndIntermediateSize) {
  // The persistent kernel sizes its rows by the cap: two caps are two kernels.
  std::string layer = moeLayerRequest(v3(true), 64, 2048).json();
  EXPECT_NE(layer.find(R"("kind":"moe_layer","name":"ep_moe_layer")"), std::string::npos);
  EXPECT_NE(layer.find(R"("gemm":{"n":2048,"out_dtype":"bf16","k":0,"in_dtype":"f8E4M3FN"})"),
            std::string::npos);
  EXPECT_NE(layer.find(R"("weights":true,"cached":false,"zero_padding":false)"), std::string::npos);
  EPSpec other = v3(true);
  other.maxTokensPerRank = 128;
  EXPECT_NE(moeLayerRequest(other, 64, 2048).json(), layer);
  EXPECT_NE(
      refusal([] { moeLayerRequest(v3(true), 64, 200); }).find("positive multiple of 128, got 200"),
      std::string::npos);
  EXPECT_NE(refusal([] { moeLayerRequest(bf16(), 64, 2048); }).find("dtype f8E4M3FN, expanded"),
            std::string::npos);
  KernelRequest unweighted = moeLayerRequest(v3(true), 64, 2048);
  unweighted.dispatch.weights = false;
  EXPECT_NE(refusal([&] { unweighted.json(); }).find("routes its tokens with their weights"),
            std::string::npos);
}

TEST(KernelRequest, SwigluSaysItsRowsAndResult) {
  // The FP8 layer's activation: BF16 gate/up rows of 2 I channels into e4m3 rows of I.
  std::string fp8 = swigluRequest(v3(true), 2048, "bf16", "f8E4M3FN").json();
  EXPECT_NE(fp8.find(R"("kind":"swiglu","name":"ep_swiglu")"), std::string::npos);
  EXPECT_NE(fp8.find(R"("gemm":{"n":2048,"out_dtype":"f8E4M3FN","k":4096,"in_dtype":"bf16"})"),
            std::string::npos);
  EXPECT_EQ(fp8.find(R"("dispatch":)"), std::string::npos);
  EXPECT_NE(swigluRequest(v3(true), 2048, "f32", "bf16").json(), fp8);
  auto refused = [](const EPSpec &s, int64_t inter, const std::string &in, const std::string &out) {
    return refusal([&] { swigluRequest(s, inter, in, out); });
  };
  EXPECT_NE(refused(v3(true), 200, "bf16", "bf16").find("positive multiple of 128, got 200"),
            std::string::npos);
  EXPECT_NE(refused(v3(true), 256, "f8E4M3FN", "bf16")
                .find("must be bf16, f16 or f32, got "
                      "\"f8E4M3FN\""),
            std::string::npos);
  EXPECT_NE(refused(v3(true), 256, "bf16", "i32").find("bf16, f16, f32 or f8E4M3FN, got"),
            std::string::npos);
  EXPECT_NE(refused(bf16(false), 256, "bf16", "bf16").find("configuration's layout is plain"),
            std::string::npos);
  KernelRequest odd = swigluRequest(v3(true), 256, "bf16", "bf16");
  odd.gemm.k = 256;
  EXPECT_NE(
      refusal([&] { odd.json(); }).find("twice its intermediate size (gemm.n = 256), got 256"),
      std::string::npos);
  // A GEMM's rows are the configuration's dtype, and its request says so.
  KernelRequest gemm = groupedGemmRequest(bf16(), 2048, "bf16");
  gemm.gemm.inDtype = "f32";
  EXPECT_NE(refusal([&] { gemm.json(); }).find("gemm.in_dtype must say so, got \"f32\""),
            std::string::npos);
}

TEST(KernelRequest, EngramFetchIsOneKernelPerRowShape) {
  // Whatever routing fields the caller's spec has, the request keeps only what the fetch is
  // specialized on: two buffers of other expert counts share the kernel.
  EPSpec a = bf16(), b = bf16(false);
  b.experts = 64, b.topk = 2, b.maxTokensPerRank = 7;
  EXPECT_EQ(engramFetchRequest(a).json(), engramFetchRequest(b).json());
  std::string json = engramFetchRequest(a).json();
  EXPECT_NE(json.find(R"("kind":"engram_fetch","name":"ep_engram_fetch")"), std::string::npos);
  EXPECT_NE(json.find(R"("experts":8,"topk":1)"), std::string::npos) << json;
  EXPECT_EQ(json.find(R"("dispatch")"), std::string::npos); // no variant section
  EXPECT_NE(engramFetchRequest(v3(false)).json().find(R"("scale_packs":1)"), std::string::npos);
  b.hidden = 2048;
  EXPECT_NE(engramFetchRequest(a).json(), engramFetchRequest(b).json());
  // A hand-made request with a routing configuration is refused by name.
  KernelRequest r = engramFetchRequest(a);
  r.spec.topk = 4;
  EXPECT_NE(refusal([&] { r.validate(); }).find("engram_fetch's configuration is normalized"),
            std::string::npos);
}

TEST(KernelRequest, VersionNameAndKindAreChecked) {
  KernelRequest r = dispatchRequest(v3(false), {});
  EXPECT_EQ(r.version, kKernelRequestVersion);
  r.version = kKernelRequestVersion + 1;
  EXPECT_NE(refusal([&] { r.json(); })
                .find("version must be " + std::to_string(kKernelRequestVersion) +
                      " (the kernel request format this runtime writes), got " +
                      std::to_string(kKernelRequestVersion + 1)),
            std::string::npos);
  for (std::string bad : {"2x", "a b", "x\"y"})
    EXPECT_NE(refusal([&] {
                dispatchRequest(v3(false), {}, bad);
              }).find("name must be an entry function name"),
              std::string::npos)
        << bad;
  KernelRequest unnamed = dispatchRequest(v3(false), {});
  unnamed.name.clear();
  EXPECT_NE(refusal([&] { unnamed.json(); }).find("name must be an entry function name"),
            std::string::npos);
  EXPECT_EQ(kindNamed("gemm_combine"), KernelKind::gemmCombine);
  EXPECT_EQ(std::string(kindName(KernelKind::groupedGemm)), "grouped_gemm");
  EXPECT_EQ(std::string(defaultEntryName(KernelKind::dispatchGemm)), "ep_dispatch_gemm");
  EXPECT_EQ(refusal([] { kindNamed("gather"); }),
            "kind must be dispatch, combine, grouped_gemm, swiglu, dispatch_gemm, gemm_combine, "
            "moe_layer, dispatch_layout, engram_fetch, low_latency_dispatch or "
            "low_latency_combine, got \"gather\"");
}

TEST(KernelRequest, LowLatencyRequestsKeepWhatTheKernelsAreSpecializedOn) {
  // The caller's layout fields are normalized away; the FP8 options and the ids' width stay.
  EPSpec a = v3(true), b = v3(false);
  b.expertAlignment = 1, b.maxTokensPerRank = 128;
  EXPECT_EQ(lowLatencyDispatchRequest(a, 64, true, false).json(),
            lowLatencyDispatchRequest(b, 64, true, false).json());
  std::string json = lowLatencyDispatchRequest(a, 32, true, true).json();
  EXPECT_NE(json.find(R"("kind":"low_latency_dispatch","name":"ep_low_latency_dispatch")"),
            std::string::npos);
  EXPECT_NE(json.find(R"("expert_alignment":1,"expanded":false)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("topk_idx_bits":32)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("round_scale":true,"use_ue8m0":true)"), std::string::npos) << json;
  EXPECT_NE(lowLatencyDispatchRequest(a, 64, false, false).json(), json);
  // The combine is bf16 whatever the dispatch's dtype, without the FP8 options.
  std::string combine = lowLatencyCombineRequest(a, 64).json();
  EXPECT_NE(combine.find(R"("dtype":"bf16","scale_packs":0)"), std::string::npos) << combine;
  EXPECT_EQ(combine, lowLatencyCombineRequest(bf16(false), 64).json());
  // Refused by name: UE8M0 without the rounding, the options on a bf16 dispatch or on another
  // kind, a hidden size that is not whole scale groups.
  EXPECT_NE(refusal([&] {
              lowLatencyDispatchRequest(a, 64, false, true);
            }).find("use_ue8m0 needs round_scale"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              lowLatencyDispatchRequest(bf16(false), 64, true, false);
            }).find("both need FP8 rows"),
            std::string::npos);
  KernelRequest d = dispatchRequest(v3(false), {});
  d.dispatch.roundScale = true;
  EXPECT_NE(refusal([&] { d.validate(); }).find("options of the low-latency dispatch only"),
            std::string::npos);
  EPSpec odd = bf16(false);
  odd.hidden = 7104, odd.scalePacks = 0;
  EXPECT_NE(refusal([&] { lowLatencyCombineRequest(odd, 64); }).find("multiple of 128"),
            std::string::npos);
}

TEST(KernelRequest, ARequestAndIRNeverShareAKey) {
  KernelCache cache("/nonexistent/epic-cache");
  KernelProvider provider(cache, {"virtual", "sm_90", "/nonexistent/epic-compile"});
  KernelRequest request = dispatchRequest(v3(false), {});
  KernelInput asRequest(request);
  EXPECT_TRUE(asRequest.isRequest());
  EXPECT_EQ(asRequest.text(), request.json());
  // The same bytes handed over as IR make another key.
  EXPECT_NE(provider.keyFor(asRequest), provider.keyFor(KernelInput::fromIR(request.json())));
  EXPECT_EQ(provider.keyFor(asRequest), provider.keyFor(dispatchRequest(v3(false), {})));
}

TEST(JsonObjectWriter, WritesCompactJsonInInsertionOrder) {
  JsonObjectWriter inner;
  inner.add("b", true).add("a", int64_t(-3));
  JsonObjectWriter outer;
  outer.add("z", "quote \" backslash \\ newline \n").add("inner", inner).add("n", 7);
  std::string text = outer.str();
  EXPECT_EQ(text, R"({"z":"quote \" backslash \\ newline \u000a","inner":{"b":true,"a":-3},)"
                  R"("n":7})");
  Json back = Json::parse(text);
  EXPECT_EQ(back.at("inner").at("a").integer(), -3);
  EXPECT_EQ(back.at("z").text().substr(0, 8), "quote \" ");
}

} // namespace
