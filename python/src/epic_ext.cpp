//===- epic_ext.cpp - epic._C: the runtime for Python ---------------------===//
//
// The extension binds the C++ runtime (no MLIR, no libtorch): ElasticBuffers
// of a virtual world or an NCCL communicator, the typed dispatch/combine
// calls, the sizing models and the kernel provider. Tensors arrive as DLPack
// capsules with the dtype name the Python side read from the framework;
// outputs are allocated by the caller (torch), so every tensor stays owned
// by Python. std::invalid_argument becomes ValueError, naming the argument.
//
//===----------------------------------------------------------------------===//

#include "Buffer.h"
#include "DLPack.h"

#include "epic/Dialect/EP/IR/EPWindow.h"
#include "epic/runtime/Calls.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/KernelRequest.h"
#include "epic/runtime/Models.h"
#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/Reference.h"
#include "epic/runtime/VirtualBuffer.h"

#include <cuda_runtime.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

namespace py = pybind11;
using namespace epic::runtime;
using namespace epic::python;
namespace dl = epic::python::dlpack;

namespace {

[[noreturn]] void invalid(const std::string &message) { throw std::invalid_argument(message); }

/// A (capsule, dtype name) pair from Python as the runtime's DeviceTensor.
/// Checks what DLPack can tell: contiguous rows, element width matching the
/// dtype name; where the tensor is not in CUDA memory, `offDevice` (if still
/// empty) gets the error to raise once every other check has passed.
DeviceTensor tensorFrom(const std::string &name, const py::handle &entry,
                        std::string *offDevice = nullptr) {
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

/// Field `key` of a spec or variant dict as T (bool, an integer type or std::string): a
/// missing field (without `fallback`), a value of another type or one T cannot hold is
/// refused naming the field, before anything else reads it.
template <typename T>
T field(const py::dict &d, const char *key, std::optional<T> fallback = std::nullopt) {
  if (!d.contains(key)) {
    if (fallback)
      return *fallback;
    throw py::value_error(std::string("missing field '") + key + "'");
  }
  py::handle v = d[key];
  auto typeName = [&] { return std::string(py::str(py::type::handle_of(v).attr("__name__"))); };
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(v))
      throw py::type_error(std::string(key) + ": expected a bool, got " + typeName());
    return v.cast<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
      throw py::type_error(std::string(key) + ": expected an int, got " + typeName());
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow || x < (long long)std::numeric_limits<T>::min() ||
        x > (long long)std::numeric_limits<T>::max())
      throw py::value_error(std::string(key) + ": " + std::string(py::str(v)) +
                            " is out of range [" +
                            std::to_string((long long)std::numeric_limits<T>::min()) + ", " +
                            std::to_string((long long)std::numeric_limits<T>::max()) + "]");
    return T(x);
  } else {
    if (!py::isinstance<py::str>(v))
      throw py::type_error(std::string(key) + ": expected a str, got " + typeName());
    return v.cast<std::string>();
  }
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
    EPIC_SLOT(GroupedGemmCall, "x", x), EPIC_SLOT(GroupedGemmCall, "weights", weights),
    EPIC_SLOT(GroupedGemmCall, "out", out),
    EPIC_SLOT(GroupedGemmCall, "psum_num_recv_tokens_per_expert", psumNumRecvTokensPerExpert)};
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
                              field<std::string>(variant, "out_dtype"));
  case KernelKind::dispatchGemm:
    return dispatchGemmRequest(s, dispatchVariantFrom(variant), field<int64_t>(variant, "n"),
                               field<std::string>(variant, "out_dtype"));
  case KernelKind::gemmCombine:
    return gemmCombineRequest(s, field<int>(variant, "biases"));
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

const char *sourceName(KernelCache::Source source) {
  switch (source) {
  case KernelCache::Source::memory:
    return "memory";
  case KernelCache::Source::disk:
    return "disk";
  default:
    return "compiled";
  }
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "epic's C++ runtime (ElasticBuffers, kernel cache, models); see epic.buffer";

  py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
  py::register_exception<NcclError>(m, "NcclError", PyExc_RuntimeError);

  py::class_<Runtime, std::shared_ptr<Runtime>>(m, "Runtime")
      .def(py::init<const std::string &, const std::string &, const std::string &>(),
           py::arg("backend"), py::arg("cache_dir") = "", py::arg("compiler") = "")
      .def_property_readonly("cache_dir", [](Runtime &r) { return r.cache.directory(); })
      .def(
          "kernels",
          [](Runtime &r, const py::dict &spec, const py::dict &variant, const std::string &kind) {
            KernelInput input(requestFrom(kind, spec, variant));
            KernelProvider::Result result = r.provider.get(input);
            py::dict out;
            out["request"] = input.text();
            out["ptx"] = result.module->ptx;
            out["metadata"] = result.module->metadataJson;
            out["cubin_bytes"] = result.module->cubin.size();
            out["key"] = result.key;
            out["source"] = sourceName(result.source);
            out["seconds"] = result.seconds;
            return out;
          },
          py::arg("spec"), py::arg("variant"), py::arg("kind"),
          "Compiles (or loads) the kernels of one op; no GPU needed.")
      .def(
          "entry_ir",
          [](Runtime &r, const py::dict &spec, const py::dict &variant, const std::string &kind) {
            return r.provider.entryIR(requestFrom(kind, spec, variant));
          },
          py::arg("spec"), py::arg("variant"), py::arg("kind"),
          "The entry IR (the ep op) the compiler builds for one op's kernels; needs the "
          "compiler.")
      .def(
          "kernels_for_ir",
          [](Runtime &r, const std::string &ir) {
            KernelProvider::Result result = r.provider.get(KernelInput::fromIR(ir));
            py::dict out;
            out["key"] = result.key;
            out["source"] = sourceName(result.source);
            out["seconds"] = result.seconds;
            return out;
          },
          py::arg("ir"), "Compiles (or loads) the kernels of entry IR into the kernel cache.")
      // The DSL compiles a kernel in process (epic._ir: the compiler epic-compile runs, with the
      // same options the key names); these let that one compile fill the kernel cache instead
      // of the provider running epic-compile on the same IR again.
      .def(
          "cached_kernels",
          [](Runtime &r, const std::string &ir) -> py::object {
            std::optional<CompiledModule> module =
                r.cache.load(r.provider.keyFor(KernelInput::fromIR(ir)));
            if (!module)
              return py::none();
            py::dict out;
            out["ptx"] = module->ptx;
            out["cubin"] = py::bytes(module->cubin);
            out["metadata"] = module->metadataJson;
            return out;
          },
          py::arg("ir"),
          "The kernels of entry IR from the kernel cache (ptx, cubin, metadata), or None; "
          "never compiles.")
      .def(
          "store_kernels",
          [](Runtime &r, const std::string &ir, const std::string &ptx, const py::bytes &cubin,
             const std::string &metadata) {
            std::string key = r.provider.keyFor(KernelInput::fromIR(ir));
            // An entry already there (another process's) is as good as this one.
            r.cache.get(key, [&] { return CompiledModule{std::string(cubin), ptx, metadata}; });
            return key;
          },
          py::arg("ir"), py::arg("ptx"), py::arg("cubin"), py::arg("metadata"),
          "Puts kernels compiled in process for entry IR into the kernel cache (its key).");

  py::class_<KernelHost::Prepared>(m, "Prepared")
      .def_property_readonly("key", [](const KernelHost::Prepared &p) { return p.info().key; })
      .def_property_readonly(
          "source", [](const KernelHost::Prepared &p) { return sourceName(p.info().source); })
      .def_property_readonly("seconds",
                             [](const KernelHost::Prepared &p) { return p.info().seconds; })
      .def_property_readonly("blocks_per_rank", &KernelHost::Prepared::blocksPerRank);

  py::class_<KernelHost::Plan>(m, "Plan",
                               "A call whose signature was checked once (see KernelHost::Plan)")
      .def_property_readonly("key",
                             [](const KernelHost::Plan &p) { return p.prepared().info().key; })
      .def_property_readonly(
          "source",
          [](const KernelHost::Plan &p) { return sourceName(p.prepared().info().source); })
      .def_property_readonly("seconds",
                             [](const KernelHost::Plan &p) { return p.prepared().info().seconds; })
      .def_property_readonly("blocks_per_rank",
                             [](const KernelHost::Plan &p) { return p.prepared().blocksPerRank(); })
      .def_property_readonly("slots_per_rank", &KernelHost::Plan::slotsPerRank)
      .def(
          "launch",
          [](KernelHost::Plan &p, const std::vector<uint64_t> &addresses, uintptr_t stream,
             int first, int kernels) {
            p.launch(addresses.data(), addresses.size(), reinterpret_cast<void *>(stream), first,
                     kernels);
          },
          py::arg("addresses"), py::arg("stream"), py::arg("first") = 0, py::arg("kernels") = -1,
          "Binds every served rank's tensor addresses (slot order, 0 for none) and launches on "
          "`stream`: no allocation, no copy, no synchronization (graph-capturable). `first`, "
          "`kernels`: only those of the entry's kernels (-1: the rest), e.g. a receive phase.");

  py::class_<Buffer> buffer(m, "Buffer");
  buffer
      .def_static(
          "virtual_world",
          [](std::shared_ptr<Runtime> runtime, int ranks, int64_t bytes, int blocks,
             std::optional<int> gpusPerNode, int64_t cpuBytes) {
            auto b = std::make_unique<Buffer>();
            b->runtime = std::move(runtime);
            b->host = std::make_unique<VirtualElasticBuffer>(ranks, bytes, b->runtime->provider,
                                                             blocks, gpusPerNode, cpuBytes);
            return b;
          },
          py::arg("runtime"), py::arg("num_ranks"), py::arg("num_bytes"),
          py::arg("blocks_per_rank"), py::arg("gpus_per_node") = py::none(),
          py::arg("num_cpu_bytes") = 0,
          "num_ranks ranks on one GPU, in nodes of gpus_per_node (None: one node of all); "
          "num_cpu_bytes of host memory after each rank's window (Engram's tables)")
      .def_static(
          "nccl",
          [](std::shared_ptr<Runtime> runtime, int worldSize, int rank, py::bytes uniqueId,
             uintptr_t splitComm, int64_t bytes, int blocks, double timeout, int64_t cpuBytes) {
            auto b = std::make_unique<Buffer>();
            b->runtime = std::move(runtime);
            b->comm = splitComm
                          ? Communicator::splitOf(reinterpret_cast<ncclComm_t>(splitComm), timeout)
                          : std::make_unique<Communicator>(worldSize, rank, std::string(uniqueId),
                                                           timeout);
            b->host = std::make_unique<NcclElasticBuffer>(*b->comm, bytes, b->runtime->provider,
                                                          blocks, cpuBytes);
            return b;
          },
          py::arg("runtime"), py::arg("world_size"), py::arg("rank"), py::arg("unique_id"),
          py::arg("comm_ptr"), py::arg("num_bytes"), py::arg("blocks_per_rank"),
          py::arg("timeout_secs") = 300.0, py::arg("num_cpu_bytes") = 0,
          "Collective. comm_ptr: a communicator (PyTorch's) to split epic's from, or 0 for a "
          "new one from unique_id; timeout_secs bounds every host wait on it.")
      .def_property_readonly("world_size", [](Buffer &b) { return b.host->worldSize(); })
      .def_property_readonly("window_bytes", [](Buffer &b) { return b.host->windowBytes(); })
      .def(
          "set_stream_wait_timeout",
          [](Buffer &b, double secs) {
            if (!(secs > 0))
              throw std::invalid_argument("the stream wait timeout must be positive seconds");
            b.host->setStreamWaitTimeout(secs);
          },
          py::arg("secs"),
          "After how long an AGRS or PP stream wait on a peer's flag is reported (stderr, "
          "stream_wait_reports()).")
      .def_property_readonly(
          "host_segment_bytes", [](Buffer &b) { return b.host->hostSegmentBytes(); },
          "Bytes of host memory after each window (num_cpu_bytes), at offset window_bytes.")
      .def_property_readonly(
          "window_stride", [](Buffer &b) { return b.host->windowStride(); },
          "Bytes from one served rank's window to the next's (device part and host segment).")
      .def(
          "window_address",
          [](Buffer &b, int servedRank) {
            return reinterpret_cast<uintptr_t>(b.host->windowMemory(servedRank));
          },
          py::arg("served_rank"),
          "Device address of a served rank's window (virtual world: rank r; NCCL: 0).")
      .def_property_readonly("blocks_per_rank", [](Buffer &b) { return b.host->blocks(); })
      .def_property_readonly(
          "gpus_per_node", [](Buffer &b) { return b.host->gpusPerNode(); },
          "Ranks per node (NVLink domain) of the buffer's world: a virtual world's, or NCCL's "
          "LSA team size.")
      .def(
          "take_traffic",
          [](Buffer &b) {
            VirtualElasticBuffer &world = b.virtualWorld("take_traffic");
            std::vector<uint64_t> counts = world.takeTraffic();
            py::ssize_t r = world.ranks();
            py::array_t<int64_t> out({r, r, py::ssize_t(3)});
            std::copy(counts.begin(), counts.end(), out.mutable_data());
            return out;
          },
          "A virtual world's network traffic since the last call, then zero: int64 [R, R, 3], "
          "[from, to] = (put bytes, put_value bytes, signal operations). Waits for the device.")
      .def(
          "set_drop_network_from",
          [](Buffer &b, int rank, bool afterEntry) {
            b.virtualWorld("set_drop_network_from").setDropNetworkFrom(rank, afterEntry);
          },
          py::arg("rank"), py::arg("after_entry") = false,
          "A virtual world whose rank `rank` (-1: none) stalls: its put, put_value and signal "
          "do nothing from now on (after the device's work so far). after_entry: it still joins "
          "the ep kernels' entry barriers, so it stalls inside an op, where the wait that "
          "misses it names it.")
      .def_property_readonly("device_api",
                             [](Buffer &b) -> py::object {
                               auto *nccl = dynamic_cast<NcclElasticBuffer *>(b.host.get());
                               if (!nccl)
                                 return py::none();
                               const DeviceApiInfo &i = nccl->info();
                               py::dict d;
                               d["nccl_version"] = i.version;
                               d["lsa_size"] = i.lsaSize;
                               d["gin"] = i.gin;
                               d["gin_type"] = i.ginType;
                               d["gin_probed"] = i.ginProbed;
                               d["text"] = i.describe();
                               return d;
                             })
      .def(
          "plan",
          [](Buffer &b, const std::string &kind, const py::dict &spec, const py::dict &variant,
             const py::list &calls, int blocks, uintptr_t stream) {
            return planOrCheck(b.host.get(), kind, spec, variant, calls, blocks,
                               reinterpret_cast<void *>(stream));
          },
          py::arg("kind"), py::arg("spec"), py::arg("variant"), py::arg("calls"),
          py::arg("blocks_per_rank") = 0, py::arg("stream") = 0,
          "Checks one call per served rank of an op (dispatch, combine, grouped_gemm, "
          "dispatch_gemm, gemm_combine) and loads its kernels: a Plan. `calls`: dicts of "
          "(DLPack capsule, dtype name) by slot name; `stream`: where it will launch (loading "
          "kernels is refused while it is being captured).")
      .def(
          "prepare_entry",
          [](Buffer &b, const std::string &ir,
             const std::vector<std::map<std::string, uint64_t>> &records, int blocks) {
            std::vector<ParamRecord> typed;
            for (const auto &record : records)
              typed.emplace_back(record.begin(), record.end());
            return b.host->prepare(KernelInput::fromIR(ir), typed, blocks);
          },
          py::arg("ir"), py::arg("records"), py::arg("blocks_per_rank") = 0,
          "Kernels of any entry IR with a launch function (e.g. an @epic.jit kernel's), one "
          "parameter record per served rank (field name -> 64-bit value).")
      .def(
          "launch",
          [](Buffer &b, const KernelHost::Prepared &prepared, uintptr_t stream) {
            b.host->launch(prepared, reinterpret_cast<void *>(stream));
          },
          py::arg("prepared"), py::arg("stream"),
          "Queues the kernels on `stream`; no host synchronization (graph-capturable).")
      .def(
          "set_kernel_timing", [](Buffer &b, bool on) { b.host->setKernelTiming(on); },
          py::arg("on"),
          "Records CUDA events around every kernel launched from now on (not while capturing).")
      .def(
          "take_kernel_times", [](Buffer &b) { return b.host->takeKernelTimes(); },
          "[(kernel name, seconds)] of the kernels timed since the last call, in launch order "
          "(waits for them).")
      .def(
          "barrier",
          [](Buffer &b, uintptr_t stream) { b.host->barrier(reinterpret_cast<void *>(stream)); },
          py::arg("stream"))
      .def("destroy", [](Buffer &b) {
        b.agrs.reset();
        b.pp.reset();
        b.host.reset();
        b.comm.reset();
      });

  m.def(
      "nccl_unique_id", [] { return py::bytes(Communicator::newUniqueId()); },
      "128 bytes naming a new NCCL communicator (rank 0 makes it, every rank uses it).");
  m.def(
      "receive_rows", [](const py::dict &spec) { return receiveRows(specFrom(spec)); },
      "Rows a receive buffer needs for this configuration (the worst case).");
  m.def(
      "record_bytes",
      [](const py::dict &spec) {
        EPSpec s = specFrom(spec);
        namespace window = epic::ep::window;
        const window::DispatchRecord d(s.hidden, dtypeBytes(s.dtype), s.scalePacks, s.topk);
        const window::CombineRecord c(s.hidden, s.topk);
        py::dict out;
        out["dispatch"] = d.bytes;
        out["combine"] = c.bytes;
        out["combine_row"] = c.rowBytes;
        out["staging_per_warp"] = window::stagingPerWarp(d, c);
        return out;
      },
      py::arg("spec"),
      "Bytes of this configuration's records in the window (EPWindow.h): a dispatch record, a "
      "combine record and its row part, and a warp's staging slots across nodes; what a record "
      "put to another node costs on the network (epic.reference.expected_network_bytes).");
  m.def(
      "check",
      [](const std::string &kind, const py::dict &spec, const py::dict &variant,
         const py::list &calls) { planOrCheck(nullptr, kind, spec, variant, calls, 0, nullptr); },
      py::arg("kind"), py::arg("spec"), py::arg("variant"), py::arg("calls"),
      "The checks Buffer.plan makes, without a GPU (raises ValueError naming the argument).");
  m.def(
      "check_topk_indices",
      [](const py::dict &spec, const py::buffer &routing, const std::string &name) {
        py::buffer_info info = routing.request();
        // Signed 8-byte integers: "q" or, where long is 64-bit, "l".
        if (info.itemsize != 8 || (info.format != "q" && info.format != "l") || info.ndim != 2)
          invalid(name + ": expected a 2-D int64 array of the routing");
        EPSpec s = specFrom(spec);
        if (info.shape[1] != s.topk || info.strides[1] != 8 || info.strides[0] != 8 * s.topk)
          invalid(name + ": expected a contiguous [tokens, " + std::to_string(s.topk) + "] array");
        checkTopkIndices(s, static_cast<const int64_t *>(info.ptr), info.shape[0], name);
      },
      py::arg("spec"), py::arg("routing"), py::arg("name"),
      "Every expert id of `routing` (host memory) in [-1, num_experts), else ValueError "
      "naming name[t][j].");
  m.def("stream_wait_reports", &streamWaitReports,
        "Every report of an AGRS or PP stream wait that outlasted its bound, in order.");
  m.def(
      "slots",
      [](const std::string &kind) -> std::vector<std::string> {
        if (kind == "dispatch")
          return slotNames(kDispatchSlots);
        if (kind == "combine")
          return slotNames(kCombineSlots);
        if (kind == "grouped_gemm")
          return slotNames(kGroupedGemmSlots);
        if (kind == "dispatch_gemm")
          return slotNames(kDispatchGemmSlots);
        if (kind == "gemm_combine")
          return slotNames(kGemmCombineSlots);
        if (kind == "dispatch_layout")
          return slotNames(kLayoutSlots);
        if (kind == "engram_fetch")
          return slotNames(kEngramSlots);
        if (kind == "low_latency_dispatch")
          return slotNames(kLowLatencyDispatchSlots);
        if (kind == "low_latency_combine")
          return slotNames(kLowLatencyCombineSlots);
        invalid("no op kind \"" + kind + "\"");
      },
      py::arg("kind"), "The tensor slots of an op's calls, in the order a plan binds them.");
  m.def("outputs", &outputsOf, py::arg("kind"), py::arg("spec"), py::arg("variant"),
        py::arg("tokens"),
        "[(name, dtype, shape)] of the tensors a dispatch or combine of `tokens` tokens writes "
        "(worst-case shapes), which the caller allocates.");
  m.def(
      "low_latency_layout",
      [](int64_t experts, int64_t ranks, int64_t topk, int64_t hidden) {
        epic::ep::window::LowLatencyLayout ll(experts, ranks, topk, hidden);
        py::dict out;
        out["control_at"] = ll.controlAt(0);
        out["control_bytes"] = 2 * ll.control; // both parities' control blocks
        out["base_bytes"] = ll.bytes(0);
        out["bytes_per_token"] = ll.bytesPerToken();
        return out;
      },
      py::arg("num_experts"), py::arg("num_ranks"), py::arg("num_topk"), py::arg("hidden"),
      "Low-latency mode's window (EPWindow.h): where its control blocks lie (zeroed by "
      "clean_low_latency_buffer) and the bytes a cap needs (base + cap x per token).");
  m.def(
      "buffer_size_hint",
      [](int nodes, int perNode, bool hybrid, int64_t tokens, int64_t hidden, int topk, bool fp8,
         bool multipleReduction, int blocksPerRank) {
        Topology t = Topology::nodes(nodes, perNode, hybrid);
        return elasticBufferBytes(t, tokens, hidden, topk, fp8, multipleReduction, blocksPerRank);
      },
      py::arg("num_nodes"), py::arg("gpus_per_node"), py::arg("allow_hybrid_mode"),
      py::arg("num_max_tokens_per_rank"), py::arg("hidden"), py::arg("num_topk"),
      py::arg("use_fp8_dispatch"), py::arg("allow_multiple_reduction"),
      py::arg("blocks_per_rank") = 0,
      "DeepEP's get_buffer_size_hint, or more where epic's kernels need more window (across "
      "nodes: the staging of blocks_per_rank blocks).");
  m.def(
      "theoretical_num_sms",
      [](int nodes, int perNode, bool hybrid, int experts, int topk, double rdma, double nvlink,
         int deviceSms, bool overlap, double smRead, double smWrite) {
        Topology t = Topology::nodes(nodes, perNode, hybrid);
        return theoreticalNumSms(t, experts, topk, rdma, nvlink, deviceSms, overlap, smRead,
                                 smWrite);
      },
      py::arg("num_nodes"), py::arg("gpus_per_node"), py::arg("allow_hybrid_mode"),
      py::arg("num_experts"), py::arg("num_topk"), py::arg("rdma_gbs"), py::arg("nvlink_gbs"),
      py::arg("device_sms"), py::arg("prefer_overlap_with_compute"), py::arg("sm_read_gbs"),
      py::arg("sm_write_gbs"));
  m.def(
      "theoretical_num_qps",
      [](int nodes, int perNode, bool hybrid, int sms, int allocated) {
        Topology t = Topology::nodes(nodes, perNode, hybrid);
        return theoreticalNumQps(t, sms, allocated);
      },
      py::arg("num_nodes"), py::arg("gpus_per_node"), py::arg("allow_hybrid_mode"),
      py::arg("num_sms"), py::arg("num_allocated_qps"));
  m.def("take_device_wait_reports", &epic::runtime::takeDeviceWaitReports,
        "Timeout reports of call-free device waits (fused GEMM kernels) since the last call, "
        "'; '-separated, and clears them (runtime errors already include them)");
  m.def("cuda_device_count", [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
  });
  m.def("nccl_version", &ncclVersion);
  m.def("nccl_loaded_version", &Communicator::loadedVersion,
        "NCCL_VERSION_CODE of the NCCL library loaded in this process (ncclGetVersion).");
  bindCopyEngineOps(buffer);
}
