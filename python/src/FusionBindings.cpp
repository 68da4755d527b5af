//===- FusionBindings.cpp - the fusion cost model for the Python API ------===//
//
// _C.predict_fusion: the same prediction ep-fuse-dispatch-gemm and
// ep-fuse-gemm-combine make (epic/runtime/FusionCostModel.h), for
// ElasticBuffer.dispatch_gemm / gemm_combine with fusion="auto", which decide
// per call between the fused kernel and the two steps it replaces.
//
//===----------------------------------------------------------------------===//

#include "Buffer.h"

#include "epic/runtime/FusionCostModel.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>

namespace py = pybind11;
namespace fusion = epic::fusion;

namespace {
double number(const py::dict &shape, const char *name) {
  if (!shape.contains(name))
    throw py::value_error(std::string("predict_fusion: shape needs '") + name + "'");
  const double value = shape[name].cast<double>();
  if (!(value >= 0))
    throw py::value_error(std::string("predict_fusion: shape['") + name + "'] must be >= 0, got " +
                          std::to_string(value));
  return value;
}
} // namespace

void epic::python::bindFusionModel(py::module_ &m) {
  m.def(
      "predict_fusion",
      [](const std::string &pair, const py::dict &shape, const std::string &chip) -> py::object {
        std::optional<fusion::Costs> costs = fusion::costsOf(chip);
        if (!costs)
          return py::none();
        fusion::Shape s;
        s.ranks = number(shape, "ranks");
        s.experts = number(shape, "experts");
        s.topk = number(shape, "topk");
        s.hidden = number(shape, "hidden");
        s.n = number(shape, "n");
        s.elementBytes = number(shape, "element_bytes");
        s.tokens = number(shape, "tokens");
        s.ranksPerDevice = number(shape, "ranks_per_device");
        if (s.ranks < 1 || s.experts < 1 || s.topk < 1)
          throw py::value_error("predict_fusion: ranks, experts and topk must be >= 1");
        fusion::Prediction p;
        if (pair == "dispatch_gemm")
          p = fusion::predictDispatchGemm(*costs, s);
        else if (pair == "gemm_combine")
          p = fusion::predictGemmCombine(*costs, s);
        else
          throw py::value_error("predict_fusion: pair must be 'dispatch_gemm' or 'gemm_combine', "
                                "got '" +
                                pair + "'");
        py::dict out;
        out["fused_us"] = p.fusedUs;
        out["steps_us"] = p.stepsUs;
        out["fuse"] = p.pays();
        out["why"] = p.describe() + " (" + chip + ")";
        return std::move(out);
      },
      py::arg("pair"), py::arg("shape"), py::arg("chip"),
      "The fusion cost model's prediction for one call: {'fused_us', 'steps_us', 'fuse', 'why'}, "
      "or None where FusionCosts.def has no row for `chip` (e.g. 'sm_90a'). shape: ranks, "
      "experts, topk, hidden, n (the GEMM's output columns), element_bytes, tokens (per rank), "
      "ranks_per_device (0: every rank on this GPU, a virtual world).");
}
