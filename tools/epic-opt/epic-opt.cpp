//===- epic-opt.cpp - mlir-opt with epic's dialects and passes ------------===//
//
// Parses, verifies, transforms and prints IR in the ep and comm dialects and
// the upstream dialects epic lowers through, like mlir-opt.
//
//===----------------------------------------------------------------------===//

#include "epic/Conversion/Passes.h"
#include "epic/InitAllDialects.h"
#include "epic/Pipelines/EpicToPTX.h"
#include "epic/Support/LargeStack.h"
#include "epic/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  epic::registerAllDialects(registry);
  epic::registerCompilerExtensions(registry);

  // Upstream passes used around epic's own: canonicalize, cse, inlining, ...
  // and the GPU / NVVM conversions of the PTX pipeline.
  mlir::registerTransformsPasses();
  mlir::registerGPUPasses();
  mlir::registerConversionPasses();
  epic::registerEpicConversionPasses();
  epic::registerEpicTransformsPasses();
  epic::registerEpicToPTXPipeline();

  return epic::runWithLargeStack([&] {
    return mlir::asMainReturnCode(
        mlir::MlirOptMain(argc, argv, "epic optimizer driver (ep and comm dialects)\n", registry));
  });
}
