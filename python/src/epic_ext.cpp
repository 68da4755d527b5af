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

#include "DLPack.h"

#include "epic/runtime/Calls.h"
#include "epic/runtime/EntryIR.h"
#include "epic/runtime/KernelCache.h"
#include "epic/runtime/KernelProvider.h"
#include "epic/runtime/Models.h"
#include "epic/runtime/NcclBuffer.h"
#include "epic/runtime/Reference.h"
#include "epic/runtime/VirtualBuffer.h"

#include <cuda_runtime.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <memory>

namespace py = pybind11;
using namespace epic::runtime;
namespace dl = epic::python::dlpack;

namespace {

[[noreturn]] void invalid(const std::string &message) { throw std::invalid_argument(message); }

/// A (capsule, dtype name) pair from Python as the runtime's DeviceTensor.
/// Checks what DLPack can tell: a CUDA device, contiguous rows, element
/// width matching the dtype name.
DeviceTensor tensorFrom(const std::string &name, const py::handle &entry) {
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
  if (t.device.deviceType != dl::kCUDA && t.device.deviceType != dl::kCUDAManaged)
    invalid(name + " must be on a CUDA device, it is on " +
            (t.device.deviceType == dl::kCPU ? std::string("the CPU")
                                             : "device type " +
                                                   std::to_string(t.device.deviceType)));
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

DeviceTensor field(const py::dict &call, const char *name) {
  return call.contains(name) ? tensorFrom(name, call[name]) : DeviceTensor{};
}

Handle handleFrom(const py::dict &call) {
  return Handle{field(call, "topk_idx"),
                field(call, "dst_buffer_slot_idx"),
                field(call, "recv_src_metadata"),
                field(call, "psum_num_recv_tokens_per_rank"),
                field(call, "num_recv_tokens_per_expert"),
                field(call, "psum_num_recv_tokens_per_expert")};
}

EPSpec specFrom(const py::dict &d) {
  EPSpec s;
  s.ranks = d["num_ranks"].cast<int>();
  s.experts = d["num_experts"].cast<int>();
  s.topk = d["num_topk"].cast<int>();
  s.hidden = d["hidden"].cast<int>();
  s.dtype = d["dtype"].cast<std::string>();
  s.scalePacks = d["num_scale_packs"].cast<int>();
  s.expertAlignment = d["expert_alignment"].cast<int>();
  s.expanded = d["do_expand"].cast<bool>();
  s.maxTokensPerRank = d["num_max_tokens_per_rank"].cast<int>();
  s.numSms = d.contains("num_sms") ? d["num_sms"].cast<int>() : 0;
  s.timeoutMs = d.contains("timeout_ms") ? d["timeout_ms"].cast<int64_t>() : 0;
  s.validate();
  return s;
}

/// The tensors of each op's call by the names the Python side uses.
template <typename Call> using Fields = std::vector<std::pair<const char *, DeviceTensor Call::*>>;
const Fields<DispatchCall> kDispatchFields = {
    {"x", &DispatchCall::x},
    {"x_scale_packs", &DispatchCall::scalePacks},
    {"topk_weights", &DispatchCall::topkWeights},
    {"recv_x", &DispatchCall::recvX},
    {"recv_x_scale_packs", &DispatchCall::recvScalePacks},
    {"recv_topk_idx", &DispatchCall::recvTopkIdx},
    {"recv_topk_weights", &DispatchCall::recvTopkWeights},
    {"host_counts", &DispatchCall::hostCounts}};
const Fields<CombineCall> kCombineFields = {
    {"x", &CombineCall::x},
    {"topk_weights", &CombineCall::topkWeights},
    {"bias_0", &CombineCall::bias0},
    {"bias_1", &CombineCall::bias1},
    {"combined_x", &CombineCall::combinedX},
    {"combined_topk_weights", &CombineCall::combinedTopkWeights}};

/// One call per rank (a dict of tensors each), with the handle's tensors.
template <typename Call>
std::vector<Call> callsFrom(const py::list &calls, const Fields<Call> &fields) {
  std::vector<Call> out;
  for (const py::handle &item : calls) {
    auto call = item.cast<py::dict>();
    Call c;
    for (const auto &[name, member] : fields)
      c.*member = field(call, name);
    c.handle = handleFrom(call);
    out.push_back(std::move(c));
  }
  return out;
}

DispatchVariant dispatchVariantFrom(const py::dict &d) {
  DispatchVariant v;
  v.weights = d["weights"].cast<bool>();
  v.cached = d["cached"].cast<bool>();
  v.zeroPadding = d["zero_padding"].cast<bool>();
  return v;
}

CombineVariant combineVariantFrom(const py::dict &d) {
  CombineVariant v;
  v.weights = d["weights"].cast<bool>();
  v.biases = d["biases"].cast<int>();
  return v;
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

/// The kernel cache and provider of one backend, shared by buffers.
struct Runtime {
  KernelCache cache;
  KernelProvider provider;
  Runtime(const std::string &backend, const std::string &cacheDir, const std::string &compiler)
      : cache(cacheDir), provider(cache, CompileSettings{backend, "sm_90a", compiler}) {}
};

/// An ElasticBuffer of either kind, with what it depends on kept alive.
struct Buffer {
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<KernelHost> host;
};

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
            EPSpec s = specFrom(spec);
            std::string ir;
            if (kind == "dispatch") {
              ir = dispatchEntryIR(s, dispatchVariantFrom(variant), kDispatchEntryName);
            } else if (kind == "combine") {
              ir = combineEntryIR(s, combineVariantFrom(variant), kCombineEntryName);
            } else if (kind == "dispatch_gemm") {
              ir = dispatchGemmEntryIR(s, dispatchVariantFrom(variant),
                                       variant["n"].cast<int64_t>(),
                                       variant["out_dtype"].cast<std::string>(),
                                       kDispatchGemmEntryName);
            } else if (kind == "gemm_combine") {
              ir = gemmCombineEntryIR(s, variant["biases"].cast<int>(), kGemmCombineEntryName);
            } else if (kind == "grouped_gemm") {
              ir = groupedGemmEntryIR(s, variant["n"].cast<int64_t>(),
                                      variant["out_dtype"].cast<std::string>(),
                                      kGroupedGemmEntryName);
            } else {
              invalid("kind must be \"dispatch\", \"combine\" or \"grouped_gemm\", got \"" +
                      kind + "\"");
            }
            KernelProvider::Result result = r.provider.get(ir);
            py::dict out;
            out["ir"] = ir;
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
          "kernels_for_ir",
          [](Runtime &r, const std::string &ir) {
            KernelProvider::Result result = r.provider.get(ir);
            py::dict out;
            out["key"] = result.key;
            out["source"] = sourceName(result.source);
            out["seconds"] = result.seconds;
            return out;
          },
          py::arg("ir"), "Compiles (or loads) the kernels of entry IR into the kernel cache.");

  py::class_<KernelHost::Prepared>(m, "Prepared")
      .def_property_readonly("key", [](const KernelHost::Prepared &p) { return p.info().key; })
      .def_property_readonly("source",
                             [](const KernelHost::Prepared &p) { return sourceName(p.info().source); })
      .def_property_readonly("seconds",
                             [](const KernelHost::Prepared &p) { return p.info().seconds; })
      .def_property_readonly("blocks_per_rank", &KernelHost::Prepared::blocksPerRank);

  py::class_<Buffer>(m, "Buffer")
      .def_static(
          "virtual_world",
          [](std::shared_ptr<Runtime> runtime, int ranks, int64_t bytes, int blocks) {
            auto b = std::make_unique<Buffer>();
            b->runtime = std::move(runtime);
            b->host = std::make_unique<VirtualElasticBuffer>(ranks, bytes, b->runtime->provider,
                                                             blocks);
            return b;
          },
          py::arg("runtime"), py::arg("num_ranks"), py::arg("num_bytes"),
          py::arg("blocks_per_rank"))
      .def_static(
          "nccl",
          [](std::shared_ptr<Runtime> runtime, int worldSize, int rank, py::bytes uniqueId,
             uintptr_t adoptComm, int64_t bytes, int blocks) {
            auto b = std::make_unique<Buffer>();
            b->runtime = std::move(runtime);
            b->comm = adoptComm ? std::make_unique<Communicator>(
                                      reinterpret_cast<ncclComm_t>(adoptComm))
                                : std::make_unique<Communicator>(worldSize, rank,
                                                                 std::string(uniqueId));
            b->host = std::make_unique<NcclElasticBuffer>(*b->comm, bytes, b->runtime->provider,
                                                          blocks);
            return b;
          },
          py::arg("runtime"), py::arg("world_size"), py::arg("rank"), py::arg("unique_id"),
          py::arg("comm_ptr"), py::arg("num_bytes"), py::arg("blocks_per_rank"))
      .def_property_readonly("world_size", [](Buffer &b) { return b.host->worldSize(); })
      .def_property_readonly("window_bytes", [](Buffer &b) { return b.host->windowBytes(); })
      .def(
          "window_address",
          [](Buffer &b, int servedRank) {
            return reinterpret_cast<uintptr_t>(b.host->windowMemory(servedRank));
          },
          py::arg("served_rank"),
          "Device address of a served rank's window (virtual world: rank r; NCCL: 0).")
      .def_property_readonly("blocks_per_rank", [](Buffer &b) { return b.host->blocks(); })
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
                               d["text"] = i.describe();
                               return d;
                             })
      .def(
          "prepare_dispatch",
          [](Buffer &b, const py::dict &spec, const py::dict &variant, const py::list &calls,
             int blocks) {
            return b.host->prepareDispatch(specFrom(spec), dispatchVariantFrom(variant),
                                           callsFrom(calls, kDispatchFields), blocks);
          },
          py::arg("spec"), py::arg("variant"), py::arg("calls"), py::arg("blocks_per_rank") = 0)
      .def(
          "prepare_combine",
          [](Buffer &b, const py::dict &spec, const py::dict &variant, const py::list &calls,
             int blocks) {
            return b.host->prepareCombine(specFrom(spec), combineVariantFrom(variant),
                                          callsFrom(calls, kCombineFields), blocks);
          },
          py::arg("spec"), py::arg("variant"), py::arg("calls"), py::arg("blocks_per_rank") = 0)
      .def(
          "prepare_dispatch_gemm",
          [](Buffer &b, const py::dict &spec, const py::dict &variant, const py::list &calls,
             int blocks) {
            std::vector<DispatchCall> dispatches = callsFrom(calls, kDispatchFields);
            std::vector<DispatchGemmCall> out;
            for (size_t i = 0; i < dispatches.size(); ++i) {
              auto call = calls[i].cast<py::dict>();
              out.push_back(DispatchGemmCall{dispatches[i], field(call, "experts"),
                                             field(call, "gemm_out")});
            }
            return b.host->prepareDispatchGemm(specFrom(spec), dispatchVariantFrom(variant), out,
                                               blocks);
          },
          py::arg("spec"), py::arg("variant"), py::arg("calls"), py::arg("blocks_per_rank") = 0,
          "An expanded dispatch fused with the expert GEMM on its rows (ep.dispatch_gemm).")
      .def(
          "prepare_gemm_combine",
          [](Buffer &b, const py::dict &spec, int biases, const py::list &calls, int blocks) {
            std::vector<CombineCall> combines = callsFrom(calls, kCombineFields);
            std::vector<GemmCombineCall> out;
            for (size_t i = 0; i < combines.size(); ++i) {
              auto call = calls[i].cast<py::dict>();
              out.push_back(GemmCombineCall{combines[i], field(call, "lhs"),
                                            field(call, "weights")});
            }
            return b.host->prepareGemmCombine(specFrom(spec), biases, out, blocks);
          },
          py::arg("spec"), py::arg("biases"), py::arg("calls"), py::arg("blocks_per_rank") = 0,
          "The expert GEMM fused with the combine of its output (ep.gemm_combine).")
      .def(
          "prepare_grouped_gemm",
          [](Buffer &b, const py::dict &spec, const py::list &calls, int blocks) {
            std::vector<GroupedGemmCall> out;
            for (const py::handle &item : calls) {
              auto call = item.cast<py::dict>();
              out.push_back(GroupedGemmCall{field(call, "x"), field(call, "weights"),
                                            field(call, "out"),
                                            field(call, "psum_num_recv_tokens_per_expert")});
            }
            return b.host->prepareGroupedGemm(specFrom(spec), out, blocks);
          },
          py::arg("spec"), py::arg("calls"), py::arg("blocks_per_rank") = 0,
          "ep.grouped_gemm of each rank's expanded rows (TMA descriptors encoded per call).")
      .def(
          "prepare_entry",
          [](Buffer &b, const std::string &ir, const std::vector<ParamRecord> &records,
             int blocks) { return b.host->prepare(ir, records, blocks); },
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
        b.host.reset();
        b.comm.reset();
      });

  m.def("nccl_unique_id", [] { return py::bytes(Communicator::newUniqueId()); },
        "128 bytes naming a new NCCL communicator (rank 0 makes it, every rank uses it).");
  m.def("receive_rows", [](const py::dict &spec) { return receiveRows(specFrom(spec)); },
        "Rows a receive buffer needs for this configuration (the worst case).");
  m.def(
      "buffer_size_hint",
      [](int scaleout, int scaleup, bool hybrid, int64_t tokens, int64_t hidden, int topk,
         bool fp8, bool multipleReduction) {
        Topology t = scaleout > 1 ? Topology::nodes(scaleout, scaleup, hybrid)
                                  : Topology::singleDomain(scaleup);
        return elasticBufferBytes(t, tokens, hidden, topk, fp8, multipleReduction);
      },
      py::arg("num_scaleout_ranks"), py::arg("num_scaleup_ranks"), py::arg("hybrid"),
      py::arg("num_max_tokens_per_rank"), py::arg("hidden"), py::arg("num_topk"),
      py::arg("use_fp8_dispatch"), py::arg("allow_multiple_reduction"),
      "DeepEP's get_buffer_size_hint, or more where epic's kernels need more window.");
  m.def(
      "theoretical_num_sms",
      [](int scaleout, int scaleup, bool hybrid, int experts, int topk, double rdma,
         double nvlink, int deviceSms, bool overlap, double smRead, double smWrite) {
        Topology t = scaleout > 1 ? Topology::nodes(scaleout, scaleup, hybrid)
                                  : Topology::singleDomain(scaleup);
        return theoreticalNumSms(t, experts, topk, rdma, nvlink, deviceSms, overlap, smRead,
                                 smWrite);
      },
      py::arg("num_scaleout_ranks"), py::arg("num_scaleup_ranks"), py::arg("hybrid"),
      py::arg("num_experts"), py::arg("num_topk"), py::arg("rdma_gbs"), py::arg("nvlink_gbs"),
      py::arg("device_sms"), py::arg("prefer_overlap_with_compute"), py::arg("sm_read_gbs"),
      py::arg("sm_write_gbs"));
  m.def(
      "theoretical_num_qps",
      [](int scaleout, int scaleup, bool hybrid, int sms, int allocated) {
        Topology t = scaleout > 1 ? Topology::nodes(scaleout, scaleup, hybrid)
                                  : Topology::singleDomain(scaleup);
        return theoreticalNumQps(t, sms, allocated);
      },
      py::arg("num_scaleout_ranks"), py::arg("num_scaleup_ranks"), py::arg("hybrid"),
      py::arg("num_sms"), py::arg("num_allocated_qps"));
  m.def("take_device_wait_reports", &epic::runtime::takeDeviceWaitReports,
        "Timeout reports of call-free device waits (fused GEMM kernels) since the last call, "
        "'; '-separated, and clears them (runtime errors already include them)");
  m.def("cuda_device_count", [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
  });
  m.def("nccl_version", &ncclVersion);
}
