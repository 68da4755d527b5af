//===- InitAllDialects.h - register epic's and the used upstream dialects -===//

#ifndef EPIC_INITALLDIALECTS_H
#define EPIC_INITALLDIALECTS_H

#include "mlir/IR/DialectRegistry.h"

namespace epic {
/// epic's own dialects (ep, comm, run).
void registerEpicDialects(mlir::DialectRegistry &registry);
/// epic's dialects plus every upstream dialect epic produces or consumes:
/// func, arith, scf, cf, memref, tensor, vector, gpu, nvgpu, nvvm, llvm.
void registerAllDialects(mlir::DialectRegistry &registry);
/// What lowering to PTX needs beyond the dialects: every upstream dialect
/// extension (to-LLVM interfaces, the NVVM target) and the translations of
/// the LLVM, NVVM, GPU and builtin dialects to LLVM IR.
void registerCompilerExtensions(mlir::DialectRegistry &registry);
} // namespace epic

#endif // EPIC_INITALLDIALECTS_H
