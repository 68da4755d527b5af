//===- CopyEngineBindings.cpp - epic._C.Buffer's AGRS sessions and PP -----===//
//
// DeepEP's AGRS and PP calls on a buffer (runtime/include/epic/runtime/
// Agrs.h, Pp.h), which move data with copy engines and stream memory
// operations: epic.ElasticBuffer adapts tensors to device addresses and
// builds the gathered views of the window from the blocks returned here.

#include "Buffer.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace py = pybind11;
using namespace epic::runtime;

namespace {

void *streamOf(uintptr_t stream) { return reinterpret_cast<void *>(stream); }

std::vector<std::tuple<int64_t, int64_t>> blocksOf(const std::vector<AgrsBlock> &blocks) {
  std::vector<std::tuple<int64_t, int64_t>> out;
  for (const AgrsBlock &b : blocks)
    out.emplace_back(b.offset, b.slotBytes);
  return out;
}

} // namespace

void epic::python::bindCopyEngineOps(py::class_<Buffer> &buffer) {
  buffer.attr("AGRS_DATA_OFFSET") = epic::ep::window::kControlEnd;
  buffer
      .def(
          "agrs_set_config",
          [](Buffer &b, int64_t maxSessionBytes, int maxOps) {
            b.sessions().setConfig(maxSessionBytes, maxOps);
          },
          py::arg("num_max_session_bytes"), py::arg("num_max_all_gathers_per_session"))
      .def("agrs_create", [](Buffer &b) { b.sessions().create(); })
      .def(
          "agrs_destroy",
          [](Buffer &b, uintptr_t stream) { b.sessions().destroy(streamOf(stream)); },
          py::arg("stream"))
      .def(
          "agrs_reserve_inplace",
          [](Buffer &b, const std::vector<int64_t> &bytes) {
            return blocksOf(b.sessions().reserveInplace(bytes));
          },
          py::arg("bytes"),
          "Blocks [(offset, slot bytes)] of the next all-gather; this rank's slot of block i "
          "is at offset + rank * slot bytes.")
      .def(
          "agrs_all_gather",
          [](Buffer &b, const std::vector<std::vector<uint64_t>> &inputs,
             const std::vector<int64_t> &bytes, uintptr_t stream, uintptr_t commStream,
             bool scatter) {
            AgrsSessions &s = b.sessions();
            AgrsSessions::Issued issued =
                scatter ? s.scatterBlocks(inputs, bytes, streamOf(stream), streamOf(commStream))
                        : s.allGather(inputs, bytes, streamOf(stream), streamOf(commStream));
            return std::make_tuple(blocksOf(issued.blocks), issued.sequence);
          },
          py::arg("inputs"), py::arg("bytes"), py::arg("stream"), py::arg("comm_stream"),
          py::arg("scatter") = false,
          "inputs[served rank][tensor]: device addresses. Copies on comm_stream after stream's "
          "work; returns ([(offset, slot bytes)], the sequence number agrs_wait waits for). "
          "scatter: block r of each input goes to rank r (reduce-scatter's transport).")
      .def(
          "agrs_wait",
          [](Buffer &b, uint32_t sequence, uintptr_t stream) {
            b.sessions().wait(sequence, streamOf(stream));
          },
          py::arg("sequence"), py::arg("stream"));

  buffer
      .def_static("pp_region_bytes", &PpChannels::regionBytes, py::arg("num_max_tensor_bytes"),
                  py::arg("num_max_inflight_tensors"),
                  "Window bytes PP's slots take after the control region.")
      .def(
          "pp_set_config",
          [](Buffer &b, int64_t maxBytes, int inflight) {
            b.channels().setConfig(maxBytes, inflight);
          },
          py::arg("num_max_tensor_bytes"), py::arg("num_max_inflight_tensors"))
      .def(
          "pp_send",
          [](Buffer &b, int servedRank, uint64_t src, int64_t bytes, int dst, uintptr_t stream) {
            b.channels().send(servedRank, src, bytes, dst, streamOf(stream));
          },
          py::arg("served_rank"), py::arg("src"), py::arg("bytes"), py::arg("dst_rank"),
          py::arg("stream"))
      .def(
          "pp_recv",
          [](Buffer &b, int servedRank, uint64_t dst, int64_t bytes, int src, uintptr_t stream) {
            b.channels().recv(servedRank, dst, bytes, src, streamOf(stream));
          },
          py::arg("served_rank"), py::arg("dst"), py::arg("bytes"), py::arg("src_rank"),
          py::arg("stream"))
      .def(
          "pp_counts",
          [](Buffer &b, int servedRank) {
            PpChannels &c = b.channels();
            return std::make_tuple(c.sentCount(servedRank, 0), c.sentCount(servedRank, 1),
                                   c.receivedCount(servedRank, 0), c.receivedCount(servedRank, 1),
                                   c.inflight());
          },
          py::arg("served_rank"),
          "(sent to next, sent to previous, received from previous, received from next, "
          "in flight allowed) of a served rank.");
}
