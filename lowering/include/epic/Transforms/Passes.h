//===- Passes.h - epic transformation passes --------------------*- C++ -*-===//

#ifndef EPIC_TRANSFORMS_PASSES_H
#define EPIC_TRANSFORMS_PASSES_H

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

namespace epic {

#define GEN_PASS_DECL
#include "epic/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "epic/Transforms/Passes.h.inc"

} // namespace epic

#endif // EPIC_TRANSFORMS_PASSES_H
