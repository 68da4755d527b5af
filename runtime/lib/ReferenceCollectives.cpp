//===- ReferenceCollectives.cpp - AGRS results checked on the host --------===//
//
// The C++ twin of epic.reference's all_gather and reduce_scatter (Reference.h):
// epic-run checks its AGRS steps with it on machines without Python.

#include "epic/runtime/Reference.h"

#include <cstring>
#include <stdexcept>
#include <string>

using namespace epic::runtime;

namespace {

std::string shapeText(const HostTensor &t) {
  std::string s = t.dtype + "[";
  for (size_t i = 0; i < t.shape.size(); ++i)
    s += (i ? "x" : "") + std::to_string(t.shape[i]);
  return s + "]";
}

/// Every rank's input of rank 0's dtype and shape.
void requireSameInputs(const std::vector<HostTensor> &inputs, const char *what) {
  if (inputs.empty())
    throw std::invalid_argument(std::string(what) + ": no ranks");
  for (size_t r = 1; r < inputs.size(); ++r)
    if (inputs[r].dtype != inputs[0].dtype || inputs[r].shape != inputs[0].shape)
      throw std::invalid_argument(std::string(what) + ": rank " + std::to_string(r) +
                                  "'s input is " + shapeText(inputs[r]) + ", rank 0's " +
                                  shapeText(inputs[0]) + " (every rank's must be alike)");
}

size_t firstDifference(const uint8_t *a, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i])
      return i;
  return n;
}

} // namespace

std::vector<std::string> epic::runtime::checkAllGather(const std::vector<HostTensor> &inputs,
                                                       const std::vector<HostTensor> &gathered,
                                                       size_t limit) {
  requireSameInputs(inputs, "all_gather");
  std::vector<std::string> problems;
  const int64_t R = int64_t(inputs.size());
  const size_t slot = inputs[0].data.size();
  std::vector<int64_t> want{R};
  want.insert(want.end(), inputs[0].shape.begin(), inputs[0].shape.end());
  for (size_t r = 0; r < gathered.size() && problems.size() < limit; ++r) {
    const HostTensor &g = gathered[r];
    if (g.dtype != inputs[0].dtype || g.shape != want) {
      problems.push_back("rank " + std::to_string(r) + ": gathered is " + shapeText(g) +
                         ", expected " + inputs[0].dtype + " of " + std::to_string(R) +
                         " x the input's shape");
      continue;
    }
    for (int64_t s = 0; s < R && problems.size() < limit; ++s) {
      size_t at = firstDifference(g.data.data() + size_t(s) * slot, inputs[s].data.data(), slot);
      if (at < slot)
        problems.push_back("rank " + std::to_string(r) + ": gathered[" + std::to_string(s) +
                           "] differs from rank " + std::to_string(s) + "'s input at byte " +
                           std::to_string(at));
    }
  }
  if (gathered.size() != inputs.size())
    problems.push_back(std::to_string(gathered.size()) + " gathered tensors for " +
                       std::to_string(inputs.size()) + " ranks");
  return problems;
}

std::vector<HostTensor>
epic::runtime::referenceReduceScatter(const std::vector<HostTensor> &inputs) {
  requireSameInputs(inputs, "reduce_scatter");
  const HostTensor &first = inputs[0];
  if (first.dtype != "bf16" && first.dtype != "f16" && first.dtype != "f32")
    throw std::invalid_argument("reduce_scatter: sums bf16, f16 or f32, got " + first.dtype);
  const int64_t R = int64_t(inputs.size());
  if (first.shape.empty() || first.shape[0] % R)
    throw std::invalid_argument("reduce_scatter: the input's first dimension (" + shapeText(first) +
                                ") must be a multiple of the " + std::to_string(R) + " ranks");
  const int64_t rowsPerBlock = first.shape[0] / R;
  const size_t blockBytes = first.data.size() / size_t(R);
  std::vector<HostTensor> out;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<HostTensor> parts; // block r of every rank, in rank order
    for (const HostTensor &input : inputs) {
      HostTensor part(first.dtype, first.shape);
      part.shape[0] = rowsPerBlock;
      part.data.assign(input.data.begin() + r * blockBytes,
                       input.data.begin() + (r + 1) * blockBytes);
      parts.push_back(std::move(part));
    }
    out.push_back(sumInRankOrder(parts));
  }
  return out;
}

HostTensor epic::runtime::sumInRankOrder(const std::vector<HostTensor> &parts) {
  requireSameInputs(parts, "a rank-order sum");
  HostTensor sum(parts[0].dtype, parts[0].shape);
  const int bytes = dtypeBytes(sum.dtype);
  const int64_t n = int64_t(sum.data.size()) / bytes;
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.0f; // +0.0, then every part in order, in f32
    for (const HostTensor &part : parts)
      acc += float(part.at(i));
    storeElement(sum.dtype, double(acc), sum.data.data() + size_t(i) * bytes);
  }
  return sum;
}

std::vector<std::string> epic::runtime::checkReduceScatter(const std::vector<HostTensor> &inputs,
                                                           const std::vector<HostTensor> &results,
                                                           size_t limit) {
  std::vector<HostTensor> want = referenceReduceScatter(inputs);
  std::vector<std::string> problems;
  if (results.size() != want.size())
    problems.push_back(std::to_string(results.size()) + " results for " +
                       std::to_string(want.size()) + " ranks");
  const int bytes = dtypeBytes(inputs[0].dtype);
  for (size_t r = 0; r < std::min(results.size(), want.size()) && problems.size() < limit; ++r) {
    if (results[r].dtype != want[r].dtype || results[r].shape != want[r].shape) {
      problems.push_back("rank " + std::to_string(r) + ": result is " + shapeText(results[r]) +
                         ", expected " + shapeText(want[r]));
      continue;
    }
    size_t at = firstDifference(results[r].data.data(), want[r].data.data(), want[r].data.size());
    if (at < want[r].data.size()) {
      const int64_t i = int64_t(at) / bytes;
      problems.push_back("rank " + std::to_string(r) + ": element " + std::to_string(i) + " is " +
                         std::to_string(results[r].at(i)) + ", expected " +
                         std::to_string(want[r].at(i)) +
                         " (the f32 sum in rank order, rounded once)");
    }
  }
  return problems;
}
