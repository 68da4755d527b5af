//===- Passes.h - epic conversion passes ------------------------*- C++ -*-===//

#ifndef EPIC_CONVERSION_PASSES_H
#define EPIC_CONVERSION_PASSES_H

#include "epic/Dialect/Comm/IR/CommDialect.h"
#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class LLVMTypeConverter;
class RewritePatternSet;
class TypeConverter;
} // namespace mlir

namespace epic {

/// Where comm ops go: the NCCL device API or the one-GPU virtual world.
enum class CommBackend { nccl, virtual_ };

/// The most bytes a kernel's parameter table (comm.param_table) may have:
/// CUDA's 32,764 bytes of kernel parameters, less the device communicator
/// and window pointers before the 64-byte aligned table, rounded down to 64.
constexpr int64_t kMaxParamTableBytes = 32640;

/// The prefix of the device-shim functions of a backend: "__epic_nccl_" or
/// "__epic_virtual_".
llvm::StringRef getShimPrefix(CommBackend backend);

/// Adds the comm type conversions (dev_comm/window -> !llvm.ptr, team ->
/// struct) to `converter`.
void populateCommToNVVMTypeConversions(mlir::TypeConverter &converter);

/// Patterns that lower every comm op for `backend`.
void populateCommToNVVMConversionPatterns(mlir::TypeConverter &converter,
                                          mlir::RewritePatternSet &patterns, CommBackend backend);

/// The patterns of convert-ep-to-comm: one per ep op with kernels, each
/// replacing the entry function that holds its op (see Passes.td) with the
/// op's kernels (in the module's `gpu.module @ep_kernels`, which must exist)
/// and their launch function; blocks of `threads` threads.
void populateEPToCommConversionPatterns(mlir::RewritePatternSet &patterns, unsigned threads,
                                        bool onePassDispatch, bool onePassCombine = false);

#define GEN_PASS_DECL
#include "epic/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "epic/Conversion/Passes.h.inc"

} // namespace epic

#endif // EPIC_CONVERSION_PASSES_H
