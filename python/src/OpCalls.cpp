//===- OpCalls.cpp - epic._C: an op's calls from Python, typed and checked ===//
//
// What every op kind's binding shares: tensors from DLPack capsules, the
// spec and variant dicts, each kind's tensor slots (the order a plan binds
// addresses in), its kernel request, and its calls checked (no GPU) or
// planned on a buffer. The one place the op kinds are told apart.
//
//===----------------------------------------------------------------------===//

#include "OpCalls.h"
#include "DLPack.h"

#include "epic/runtime/Reference.h"

#include <pybind11/stl.h>

#include <functional>

namespace epic::python {
using namespace epic::runtime;
namespace dl = epic::python::dlpack;

namespace {
/// A call's tensor slots, in order: a plan's addresses come in this order,
/// and the Python side reads the names from Plan.slots.
template <typename Call> struct Slot {
  const char *name;
  std::function<DeviceTensor &(Call &)> get;
};
#define EPIC_SLOT(Call, name, path)                                                                \
  Slot<Call> {                                                                                     \
    name, [](Call &c) -> DeviceTensor & { return c.path; }                                         \
  }
// The handle's tensors after its routing ids, in epic.handle.HANDLE_SLOTS's order.
#define EPIC_HANDLE_SLOTS_AFTER_IDS(Call)                                                          \
  EPIC_SLOT(Call, "dst_buffer_slot_idx", handle.dstBufferSlotIdx),                                 \
      EPIC_SLOT(Call, "recv_src_metadata", handle.recvSrcMetadata),                                \
      EPIC_SLOT(Call, "psum_num_recv_tokens_per_rank", handle.psumNumRecvTokensPerRank),           \
      EPIC_SLOT(Call, "num_recv_tokens_per_expert", handle.numRecvTokensPerExpert),                \
      EPIC_SLOT(Call, "psum_num_recv_tokens_per_expert", handle.psumNumRecvTokensPerExpert),       \
      EPIC_SLOT(Call, "fwd_src_metadata", handle.fwdSrcMetadata),                                  \
      EPIC_SLOT(Call, "fwd_counts", handle.fwdCounts),                                             \
      EPIC_SLOT(Call, "recv_row_of_slot", handle.recvRowOfSlot)
const std::vector<Slot<DispatchCall>> kDispatchSlots = {
    EPIC_SLOT(DispatchCall, "x", x),
    EPIC_SLOT(DispatchCall, "x_scale_packs", scalePacks),
    EPIC_SLOT(DispatchCall, "topk_weights", topkWeights),
    EPIC_SLOT(DispatchCall, "topk_idx", handle.topkIdx),
    EPIC_SLOT(DispatchCall, "recv_x", recvX),
    EPIC_SLOT(DispatchCall, "recv_x_scale_packs", recvScalePacks),
    EPIC_SLOT(DispatchCall, "recv_topk_idx", recvTopkIdx),
    EPIC_SLOT(DispatchCall, "recv_topk_weights", recvTopkWeights),
    EPIC_SLOT(DispatchCall, "host_counts", hostCounts),
    EPIC_HANDLE_SLOTS_AFTER_IDS(DispatchCall),
    EPIC_SLOT(DispatchCall, "topk_idx_copy", topkIdxCopy)};
const std::vector<Slot<CombineCall>> kCombineSlots = {
    EPIC_SLOT(CombineCall, "x", x),
    EPIC_SLOT(CombineCall, "topk_weights", topkWeights),
    EPIC_SLOT(CombineCall, "bias_0", bias0),
    EPIC_SLOT(CombineCall, "bias_1", bias1),
    EPIC_SLOT(CombineCall, "combined_x", combinedX),
    EPIC_SLOT(CombineCall, "combined_topk_weights", combinedTopkWeights),
    EPIC_SLOT(CombineCall, "topk_idx", handle.topkIdx),
    EPIC_HANDLE_SLOTS_AFTER_IDS(CombineCall)};
const std::vector<Slot<GroupedGemmCall>> kGroupedGemmSlots = {
    EPIC_SLOT(GroupedGemmCall, "x", x),
    EPIC_SLOT(GroupedGemmCall, "weights", weights),
    EPIC_SLOT(GroupedGemmCall, "out", out),
    EPIC_SLOT(GroupedGemmCall, "psum_num_recv_tokens_per_expert", psumNumRecvTokensPerExpert),
    EPIC_SLOT(GroupedGemmCall, "x_scales", xScales),
    EPIC_SLOT(GroupedGemmCall, "weight_scales", weightScales)};
const std::vector<Slot<SwigluCall>> kSwigluSlots = {
    EPIC_SLOT(SwigluCall, "gate_up", gateUp), EPIC_SLOT(SwigluCall, "out", out),
    EPIC_SLOT(SwigluCall, "psum_num_recv_tokens_per_expert", psumNumRecvTokensPerExpert),
    EPIC_SLOT(SwigluCall, "scales", scales), EPIC_SLOT(SwigluCall, "weights", weights)};
const std::vector<Slot<LayoutCall>> kLayoutSlots = {
    EPIC_SLOT(LayoutCall, "topk_idx", topkIdx),
    EPIC_SLOT(LayoutCall, "num_tokens_per_rank", numTokensPerRank),
    EPIC_SLOT(LayoutCall, "num_tokens_per_expert", numTokensPerExpert),
    EPIC_SLOT(LayoutCall, "is_token_in_rank", isTokenInRank)};
const std::vector<Slot<EngramCall>> kEngramSlots = {EPIC_SLOT(EngramCall, "indices", indices),
                                                    EPIC_SLOT(EngramCall, "out", out)};
const std::vector<Slot<LowLatencyDispatchCall>> kLowLatencyDispatchSlots = {
    EPIC_SLOT(LowLatencyDispatchCall, "x", x),
    EPIC_SLOT(LowLatencyDispatchCall, "topk_idx", topkIdx),
    EPIC_SLOT(LowLatencyDispatchCall, "recv_x", recvX),
    EPIC_SLOT(LowLatencyDispatchCall, "recv_x_scales", recvScales),
    EPIC_SLOT(LowLatencyDispatchCall, "recv_count", recvCount),
    EPIC_SLOT(LowLatencyDispatchCall, "src_info", srcInfo),
    EPIC_SLOT(LowLatencyDispatchCall, "layout_range", layoutRange),
    EPIC_SLOT(LowLatencyDispatchCall, "route", route),
    EPIC_SLOT(LowLatencyDispatchCall, "cumulative_local_expert_recv_stats", stats)};
const std::vector<Slot<LowLatencyCombineCall>> kLowLatencyCombineSlots = {
    EPIC_SLOT(LowLatencyCombineCall, "x", x),
    EPIC_SLOT(LowLatencyCombineCall, "layout_range", layoutRange),
    EPIC_SLOT(LowLatencyCombineCall, "route", route),
    EPIC_SLOT(LowLatencyCombineCall, "topk_idx", topkIdx),
    EPIC_SLOT(LowLatencyCombineCall, "topk_weights", topkWeights),
    EPIC_SLOT(LowLatencyCombineCall, "out", out)};
#undef EPIC_HANDLE_SLOTS_AFTER_IDS
#undef EPIC_SLOT

/// A fused call's slots: the inner call's (reached through `inner`), then `own`.
template <typename Call, typename Inner>
std::vector<Slot<Call>> fusedSlots(const std::vector<Slot<Inner>> &innerSlots, Inner Call::*inner,
                                   std::vector<Slot<Call>> own) {
  std::vector<Slot<Call>> out;
  for (const Slot<Inner> &slot : innerSlots)
    out.push_back(
        {slot.name, [get = slot.get, inner](Call &c) -> DeviceTensor & { return get(c.*inner); }});
  out.insert(out.end(), own.begin(), own.end());
  return out;
}
const std::vector<Slot<DispatchGemmCall>> kDispatchGemmSlots =
    fusedSlots<DispatchGemmCall, DispatchCall>(
        kDispatchSlots, &DispatchGemmCall::dispatch,
        {{"experts", [](DispatchGemmCall &c) -> DeviceTensor & { return c.experts; }},
         {"gemm_out", [](DispatchGemmCall &c) -> DeviceTensor & { return c.gemmOut; }}});
const std::vector<Slot<GemmCombineCall>> kGemmCombineSlots =
    fusedSlots<GemmCombineCall, CombineCall>(
        kCombineSlots, &GemmCombineCall::combine,
        {{"lhs", [](GemmCombineCall &c) -> DeviceTensor & { return c.lhs; }},
         {"weights", [](GemmCombineCall &c) -> DeviceTensor & { return c.weights; }}});

#define EPIC_LAYER_SLOT(name, member)                                                              \
  {name, [](MoeLayerCall &c) -> DeviceTensor & { return c.member; }}
const std::vector<Slot<MoeLayerCall>> kMoeLayerSlots = fusedSlots<MoeLayerCall, DispatchCall>(
    kDispatchSlots, &MoeLayerCall::dispatch,
    {EPIC_LAYER_SLOT("gate_up_weights", gateUpWeights),
     EPIC_LAYER_SLOT("gate_up_scales", gateUpScales), EPIC_LAYER_SLOT("down_weights", downWeights),
     EPIC_LAYER_SLOT("down_scales", downScales), EPIC_LAYER_SLOT("gate_up", gateUp),
     EPIC_LAYER_SLOT("act", act), EPIC_LAYER_SLOT("act_scales", actScales),
     EPIC_LAYER_SLOT("down", down), EPIC_LAYER_SLOT("combined_x", combinedX)});
#undef EPIC_LAYER_SLOT

template <typename Call> std::vector<std::string> slotNames(const std::vector<Slot<Call>> &slots) {
  std::vector<std::string> names;
  for (const Slot<Call> &slot : slots)
    names.push_back(slot.name);
  return names;
}

/// One call per rank: a dict of (capsule, dtype) entries by slot name, each
/// tensor numbered with its slot (and named with its rank where there are
/// several). Unknown names are refused (a typo would otherwise drop an
/// argument silently). A tensor outside CUDA memory is reported in
/// `offDevice`, for the caller to raise after the other checks.
template <typename Call>
std::vector<Call> callsFrom(const py::list &calls, const std::vector<Slot<Call>> &slots,
                            std::string &offDevice) {
  std::vector<Call> out;
  for (const py::handle &item : calls) {
    auto call = item.cast<py::dict>();
    Call c;
    size_t known = 0;
    const std::string rank =
        calls.size() > 1 ? "[" + std::to_string(out.size()) + "]" : std::string();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!call.contains(slots[i].name))
        continue;
      ++known;
      DeviceTensor &t = slots[i].get(c);
      t = tensorFrom(slots[i].name + rank, call[slots[i].name], &offDevice);
      t.slot = int(i);
    }
    if (known != call.size())
      for (const auto &entry : call) {
        std::string name = entry.first.cast<std::string>();
        bool found = false;
        for (const Slot<Call> &slot : slots)
          found |= name == slot.name;
        if (!found)
          invalid("unknown tensor \"" + name + "\" in a call");
      }
    out.push_back(std::move(c));
  }
  return out;
}

DispatchVariant dispatchVariantFrom(const py::dict &d) {
  DispatchVariant v;
  v.weights = field<bool>(d, "weights");
  v.cached = field<bool>(d, "cached");
  v.zeroPadding = field<bool>(d, "zero_padding");
  v.windowOutputs = field<bool>(d, "window_outputs", false);
  v.roundScale = field<bool>(d, "round_scale", false);
  v.useUe8m0 = field<bool>(d, "use_ue8m0", false);
  return v;
}

/// Low-latency mode's variant: the dispatch's FP8 options, and which window
/// region the call uses.
DispatchVariant lowLatencyVariantFrom(const py::dict &d) {
  DispatchVariant v;
  v.roundScale = field<bool>(d, "round_scale", false);
  v.useUe8m0 = field<bool>(d, "use_ue8m0", false);
  v.topkIdxBits = field<int>(d, "topk_idx_bits", 64);
  return v;
}

CombineVariant combineVariantFrom(const py::dict &d) {
  CombineVariant v;
  v.weights = field<bool>(d, "weights");
  v.biases = field<int>(d, "biases");
  v.windowOutputs = field<bool>(d, "window_outputs", false);
  return v;
}

} // namespace

/// A (capsule, dtype name) pair from Python as the runtime's DeviceTensor.
/// Checks what DLPack can tell: contiguous rows, element width matching the
/// dtype name; where the tensor is not in CUDA memory, `offDevice` (if still
/// empty) gets the error to raise once every other check has passed.
DeviceTensor tensorFrom(const std::string &name, const py::handle &entry, std::string *offDevice) {
  if (entry.is_none())
    return {};
  auto pair = entry.cast<py::tuple>();
  if (pair.size() != 2)
    invalid(name + ": expected (DLPack capsule, dtype name)");
  auto capsule = pair[0].cast<py::capsule>();
  std::string dtype = pair[1].cast<std::string>();
  if (std::string(capsule.name() ? capsule.name() : "") != dl::kCapsuleName)
    invalid(name + ": not an unused DLPack capsule (\"" + std::string(dl::kCapsuleName) + "\")");
  auto *managed = static_cast<dl::ManagedTensor *>(capsule.get_pointer());
  const dl::Tensor &t = managed->tensor;
  if (envFlag("EPIC_DEBUG")) {
    std::string text;
    for (int d = 0; d < t.ndim && t.ndim <= 8; ++d)
      text += (d ? ", " : "") + std::to_string(t.shape[d]) + "/" +
              (t.strides ? std::to_string(t.strides[d]) : std::string("-"));
    std::fprintf(stderr, "epic: %s: %s, %d-D [%s] (size/stride), %d-bit, device %d:%d, at %p\n",
                 name.c_str(), dtype.c_str(), t.ndim, text.c_str(), int(t.dtype.bits),
                 t.device.deviceType, t.device.deviceId, t.data);
  }
  int bytes = dtypeBytes(dtype);
  if (t.dtype.lanes != 1 || t.dtype.bits % 8 || int(t.dtype.bits / 8) != bytes)
    invalid(name + ": " + std::to_string(t.dtype.bits) + "-bit elements do not hold " + dtype);
  if (t.device.deviceType != dl::kCUDA && t.device.deviceType != dl::kCUDAManaged) {
    std::string where = t.device.deviceType == dl::kCPU
                            ? std::string("the CPU")
                            : "device type " + std::to_string(t.device.deviceType);
    if (!offDevice)
      invalid(name + " must be on a CUDA device, it is on " + where);
    if (offDevice->empty())
      *offDevice = name + " must be a CUDA tensor, it is on " + where;
  }
  DeviceTensor out;
  out.dtype = dtype;
  int64_t elements = 1;
  for (int i = 0; i < t.ndim; ++i)
    elements *= t.shape[i];
  // Row-major: each stride is the product of the sizes after it (dimensions
  // of size 1, and tensors without elements, may have any strides).
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0 && elements > 0 && t.strides; --i) {
    if (t.shape[i] > 1 && t.strides[i] != expected) {
      std::string shape, strides;
      for (int d = 0; d < t.ndim; ++d) {
        shape += (d ? ", " : "") + std::to_string(t.shape[d]);
        strides += (d ? ", " : "") + std::to_string(t.strides[d]);
      }
      invalid(name + " must be contiguous (row-major): shape [" + shape + "] has strides [" +
              strides + "]; call .contiguous() first");
    }
    expected *= t.shape[i];
  }
  out.shape.assign(t.shape, t.shape + t.ndim);
  out.data = reinterpret_cast<uint64_t>(static_cast<char *>(t.data) + t.byteOffset);
  if (elements == 0 && !out.data)
    out.data = 16; // an empty tensor may have no storage: any aligned non-null address
  return out;
}

EPSpec specFrom(const py::dict &d) {
  EPSpec s;
  s.ranks = field<int>(d, "num_ranks");
  s.experts = field<int>(d, "num_experts");
  s.topk = field<int>(d, "num_topk");
  s.hidden = field<int>(d, "hidden");
  s.dtype = field<std::string>(d, "dtype");
  s.scalePacks = field<int>(d, "num_scale_packs");
  s.expertAlignment = field<int>(d, "expert_alignment");
  s.expanded = field<bool>(d, "do_expand");
  s.maxTokensPerRank = field<int>(d, "num_max_tokens_per_rank");
  s.numSms = field<int>(d, "num_sms", 0);
  s.scaleupRanks = field<int>(d, "num_scaleup_ranks", 0);
  s.hybrid = field<bool>(d, "hybrid", false);
  s.timeoutMs = field<int64_t>(d, "timeout_ms", int64_t(0));
  s.validate();
  return s;
}

/// The request of `kind` for Python's spec and variant dicts.
KernelRequest requestFrom(const std::string &kind, const py::dict &spec, const py::dict &variant) {
  EPSpec s = specFrom(spec);
  switch (kindNamed(kind)) {
  case KernelKind::dispatch:
    return dispatchRequest(s, dispatchVariantFrom(variant));
  case KernelKind::combine:
    return combineRequest(s, combineVariantFrom(variant));
  case KernelKind::groupedGemm:
    return groupedGemmRequest(s, field<int64_t>(variant, "n"),
                              field<std::string>(variant, "out_dtype"), "",
                              field<int64_t>(variant, "k", int64_t(0)));
  case KernelKind::swiglu:
    return swigluRequest(s, field<int64_t>(variant, "n"), field<std::string>(variant, "in_dtype"),
                         field<std::string>(variant, "out_dtype"));
  case KernelKind::dispatchGemm:
    return dispatchGemmRequest(s, dispatchVariantFrom(variant), field<int64_t>(variant, "n"),
                               field<std::string>(variant, "out_dtype"));
  case KernelKind::gemmCombine:
    return gemmCombineRequest(s, field<int>(variant, "biases"));
  case KernelKind::moeLayer:
    return moeLayerRequest(s, dispatchVariantFrom(variant).topkIdxBits,
                           field<int64_t>(variant, "n"));
  case KernelKind::dispatchLayout:
    return dispatchLayoutRequest(s, field<int>(variant, "topk_idx_bits"));
  case KernelKind::engramFetch:
    return engramFetchRequest(s);
  case KernelKind::lowLatencyDispatch: {
    DispatchVariant v = lowLatencyVariantFrom(variant);
    return lowLatencyDispatchRequest(s, v.topkIdxBits, v.roundScale, v.useUe8m0);
  }
  case KernelKind::lowLatencyCombine:
    return lowLatencyCombineRequest(s, lowLatencyVariantFrom(variant).topkIdxBits);
  }
  invalid("unknown kind \"" + kind + "\"");
}

/// An op's calls from Python made typed, then checked (`host` null: the
/// records and the request only, no GPU needed) or planned on `host`. The
/// one place the op kinds are told apart.
py::object planOrCheck(KernelHost *host, const std::string &kind, const py::dict &spec,
                       const py::dict &variant, const py::list &calls, int blocks, void *stream) {
  EPSpec s = specFrom(spec);
  std::string offDevice; // the first tensor not in CUDA memory, refused after the rest
  // Without a host: what planning checks before it needs the GPU.
  auto check = [&](const auto &calls, auto &&record, auto &&request) -> py::object {
    recordsOf(calls, record);
    request();
    if (!offDevice.empty())
      invalid(offDevice);
    return py::none();
  };
  auto plan = [&](auto &&make) {
    if (!offDevice.empty())
      invalid(offDevice);
    return py::cast(make());
  };
  switch (kindNamed(kind)) {
  case KernelKind::dispatch: {
    DispatchVariant v = dispatchVariantFrom(variant);
    auto c = callsFrom(calls, kDispatchSlots, offDevice);
    if (host)
      return plan(
          [&] { return host->planDispatch(s, v, c, blocks, stream, slotNames(kDispatchSlots)); });
    return check(
        c, [&](const DispatchCall &call) { return dispatchRecord(s, v, call); },
        [&] { dispatchRequest(s, v); });
  }
  case KernelKind::combine: {
    CombineVariant v = combineVariantFrom(variant);
    auto c = callsFrom(calls, kCombineSlots, offDevice);
    if (host)
      return plan(
          [&] { return host->planCombine(s, v, c, blocks, stream, slotNames(kCombineSlots)); });
    return check(
        c, [&](const CombineCall &call) { return combineRecord(s, v, call); },
        [&] { combineRequest(s, v); });
  }
  case KernelKind::groupedGemm: {
    auto c = callsFrom(calls, kGroupedGemmSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planGroupedGemm(s, c, blocks, stream, slotNames(kGroupedGemmSlots));
      });
    return check(
        c, [&](const GroupedGemmCall &call) { return groupedGemmRecord(s, call); },
        [&] { checkRanksAgree(c, "the weights' shape or the output dtype", gemmOperands); });
  }
  case KernelKind::swiglu: {
    auto c = callsFrom(calls, kSwigluSlots, offDevice);
    if (host)
      return plan([&] { return host->planSwiglu(s, c, blocks, stream, slotNames(kSwigluSlots)); });
    return check(
        c, [&](const SwigluCall &call) { return swigluRecord(s, call); },
        [&] { checkRanksAgree(c, "the gate/up widths or the dtypes", swigluOperands); });
  }
  case KernelKind::dispatchGemm: {
    DispatchVariant v = dispatchVariantFrom(variant);
    auto c = callsFrom(calls, kDispatchGemmSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planDispatchGemm(s, v, c, blocks, stream, slotNames(kDispatchGemmSlots));
      });
    return check(
        c, [&](const DispatchGemmCall &call) { return dispatchGemmRecord(s, v, call); },
        [&] { checkRanksAgree(c, "the experts' shape or the output dtype", fusedGemmOperands); });
  }
  case KernelKind::gemmCombine: {
    int biases = field<int>(variant, "biases");
    auto c = callsFrom(calls, kGemmCombineSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planGemmCombine(s, biases, c, blocks, stream, slotNames(kGemmCombineSlots));
      });
    return check(
        c, [&](const GemmCombineCall &call) { return gemmCombineRecord(s, biases, call); }, [] {});
  }
  case KernelKind::moeLayer: {
    DispatchVariant v = dispatchVariantFrom(variant);
    auto c = callsFrom(calls, kMoeLayerSlots, offDevice);
    if (host)
      return plan(
          [&] { return host->planMoeLayer(s, v, c, blocks, stream, slotNames(kMoeLayerSlots)); });
    return check(
        c, [&](const MoeLayerCall &call) { return moeLayerRecord(s, v, call); },
        [&] {
          checkRanksAgree(c, "the experts' intermediate sizes", moeLayerOperands);
          moeLayerRequest(s, v.topkIdxBits, moeLayerOperands(c.front()));
        });
  }
  case KernelKind::dispatchLayout: {
    auto c = callsFrom(calls, kLayoutSlots, offDevice);
    if (host)
      return plan(
          [&] { return host->planDispatchLayout(s, c, blocks, stream, slotNames(kLayoutSlots)); });
    return check(
        c, [&](const LayoutCall &call) { return layoutRecord(s, call); },
        [&] { checkRanksAgree(c, "topk_idx's dtype", layoutOperands); });
  }
  case KernelKind::engramFetch: {
    // The tables' size: a call's value (the last engram_write's), not the kernels'.
    const auto entries = field<int64_t>(variant, "entries_per_rank");
    auto c = callsFrom(calls, kEngramSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planEngramFetch(s, entries, c, blocks, stream, slotNames(kEngramSlots));
      });
    return check(
        c, [&](const EngramCall &call) { return engramRecord(s, entries, 0, 0, call); },
        [&] { engramFetchRequest(s); });
  }
  case KernelKind::lowLatencyDispatch: {
    DispatchVariant v = lowLatencyVariantFrom(variant);
    const int parity = field<int>(variant, "parity");
    auto c = callsFrom(calls, kLowLatencyDispatchSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planLowLatencyDispatch(s, v, parity, c, blocks, stream,
                                            slotNames(kLowLatencyDispatchSlots));
      });
    return check(
        c,
        [&](const LowLatencyDispatchCall &call) {
          return lowLatencyDispatchRecord(s, v, parity, call);
        },
        [&] {
          checkRanksAgree(c, "topk_idx's dtype", lowLatencyOperands);
          lowLatencyDispatchRequest(s, c.front().topkIdx.dtype == "i32" ? 32 : 64, v.roundScale,
                                    v.useUe8m0);
        });
  }
  case KernelKind::lowLatencyCombine: {
    const int parity = field<int>(variant, "parity");
    auto c = callsFrom(calls, kLowLatencyCombineSlots, offDevice);
    if (host)
      return plan([&] {
        return host->planLowLatencyCombine(s, parity, c, blocks, stream,
                                           slotNames(kLowLatencyCombineSlots));
      });
    return check(
        c,
        [&](const LowLatencyCombineCall &call) { return lowLatencyCombineRecord(s, parity, call); },
        [&] {
          checkRanksAgree(c, "topk_idx's dtype", lowLatencyCombineOperands);
          lowLatencyCombineRequest(s, c.front().topkIdx.dtype == "i32" ? 32 : 64);
        });
  }
  }
  invalid("unknown kind \"" + kind + "\"");
}

/// (name, dtype, shape) of what a call of `kind` writes, for the caller to allocate.
py::list outputsOf(const std::string &kind, const py::dict &spec, const py::dict &variant,
                   int64_t tokens) {
  EPSpec s = specFrom(spec);
  std::vector<TensorSpec> specs;
  if (kind == "dispatch")
    specs = dispatchOutputs(s, dispatchVariantFrom(variant), tokens);
  else if (kind == "combine")
    specs = combineOutputs(s, combineVariantFrom(variant), tokens);
  else
    invalid("outputs of \"" + kind + "\": dispatch or combine");
  py::list out;
  for (const TensorSpec &t : specs)
    out.append(py::make_tuple(t.name, t.dtype, py::tuple(py::cast(t.shape))));
  return out;
}

/// The tensor slots of an op kind's calls, in the order a plan binds them.
std::vector<std::string> slotNamesOf(const std::string &kind) {
  if (kind == "dispatch")
    return slotNames(kDispatchSlots);
  if (kind == "combine")
    return slotNames(kCombineSlots);
  if (kind == "grouped_gemm")
    return slotNames(kGroupedGemmSlots);
  if (kind == "swiglu")
    return slotNames(kSwigluSlots);
  if (kind == "dispatch_gemm")
    return slotNames(kDispatchGemmSlots);
  if (kind == "gemm_combine")
    return slotNames(kGemmCombineSlots);
  if (kind == "moe_layer")
    return slotNames(kMoeLayerSlots);
  if (kind == "dispatch_layout")
    return slotNames(kLayoutSlots);
  if (kind == "engram_fetch")
    return slotNames(kEngramSlots);
  if (kind == "low_latency_dispatch")
    return slotNames(kLowLatencyDispatchSlots);
  if (kind == "low_latency_combine")
    return slotNames(kLowLatencyCombineSlots);
  invalid("no op kind \"" + kind + "\"");
}

} // namespace epic::python
