//===- RunProgram.h - executing epic-run programs ---------------*- C++ -*-===//
//
// An epic-run program (an .mlir `func.func @main()` of run and ep ops, see
// the run dialect) reaches the runtime as a run plan: the JSON that
// `epic-compile --run-plan` writes (lowering/lib/RunPlan). The plan is parsed
// and checked here, its inputs are generated here (deterministically, the
// same on every machine), and executePlan runs it on an ElasticBuffer:
// every ep op through the typed dispatch/combine API, every result read back
// for printing and, if asked, checked against DeepEP's semantics
// (Reference.h). No MLIR: this is what runs on a GPU machine.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_RUNPROGRAM_H
#define EPIC_RUNTIME_RUNPROGRAM_H

#include "epic/runtime/Calls.h"
#include "epic/runtime/KernelRequest.h"
#include "epic/runtime/Json.h"
#include "epic/runtime/Reference.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace epic::runtime {

class KernelHost;

struct RunStep {
  std::string op;  ///< tokens, constant, dim, random, routing, dispatch, combine, print
  std::string loc; ///< the op's source location in the program
  Json fields;
  int64_t integer(const char *name) const { return fields.at(name).integer(); }
};

/// An ep op of the plan with what its kernels are specialized on.
struct PlanKernel {
  KernelKind kind = KernelKind::dispatch;
  EPSpec spec;
  DispatchVariant dispatchVariant;
  CombineVariant combineVariant;
  int64_t gemmN = 0;        ///< grouped_gemm, dispatch_gemm: N of the expert weights;
                            ///< moe_layer: the intermediate size I
  std::string gemmOutDtype; ///< and the GEMM's output dtype
  int64_t gemmK = 0;        ///< grouped_gemm: the rows' width K (0: the hidden size)
  std::string gemmInDtype;  ///< swiglu: the gate/up rows' dtype (gemmN: its I)
  std::string loc;
  /// The kernels the runtime asks for it.
  KernelRequest request() const;
};

struct RunPlan {
  int ranks = 1;
  int gpusPerNode = 1; ///< ranks per node (NVLink domain); == ranks on one node
  int64_t values = 0;
  std::vector<RunStep> steps;

  /// Parses and checks a plan: known ops, every value defined before use and
  /// of the kind its use needs, specs valid. Throws std::runtime_error naming
  /// the step and its source location.
  static RunPlan parse(const std::string &text);
  /// The ep ops, in program order.
  std::vector<PlanKernel> kernels() const;
};

/// Whether `step` runs an ep op's kernels (one PlanKernel each, in order).
bool isKernelStep(const RunStep &step);

/// `rows` x `cols` values of `dtype`: `normal` N(0, scale^2) or `uniform`
/// [0, scale), from a counter-based generator of (seed, rank, element).
HostTensor randomTensor(const std::string &distribution, double scale, int64_t seed, int rank,
                        int64_t rows, int64_t cols, const std::string &dtype);
/// `rows` x `topk` i64: distinct experts per row, each masked (-1) with
/// probability `masked`; deterministic in (seed, rank, row).
HostTensor randomRouting(int64_t experts, double masked, int64_t seed, int rank, int64_t rows,
                         int64_t topk);

/// A sum of per-row hashes: the same for any order of the rows.
uint64_t rowChecksum(const HostTensor &tensor, const std::vector<int64_t> &rows);
/// Prints `tensor`'s shape, its checksum over `rows` (all rows if empty and
/// `allRows`), and the first `show` of `rows`.
void printTensor(std::FILE *out, const HostTensor &tensor, const std::vector<int64_t> &rows,
                 int64_t show);

struct RunOptions {
  bool check = false;      ///< compare every ep op with DeepEP's semantics
  std::FILE *out = stdout; ///< where prints and the check report go
};

struct RunSummary {
  int checks = 0;   ///< ep ops checked
  int failures = 0; ///< of them, with problems
};

/// Runs `plan` on `buffer`, which must serve all of the plan's ranks (a
/// virtual world of plan.ranks, or NCCL with one rank). Throws for invalid
/// calls (std::invalid_argument, naming the argument and the op's source
/// location) and CUDA errors; check failures are reported, not thrown.
RunSummary executePlan(const RunPlan &plan, KernelHost &buffer, const RunOptions &options);

} // namespace epic::runtime

#endif // EPIC_RUNTIME_RUNPROGRAM_H
