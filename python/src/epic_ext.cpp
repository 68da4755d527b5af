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
#include "OpCalls.h"

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
      .def(py::init<const std::string &, const std::string &, const std::string &, bool>(),
           py::arg("backend"), py::arg("cache_dir") = "", py::arg("compiler") = "",
           py::arg("staged") = false,
           "staged (virtual): the kernels that stage rows in the window, as across processes")
      .def_property_readonly("staged", [](Runtime &r) { return r.provider.settings().staged; })
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
  m.def("slots", &slotNamesOf, py::arg("kind"),
        "The tensor slots of an op's calls, in the order a plan binds them.");
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
  bindFusionModel(m);
}
