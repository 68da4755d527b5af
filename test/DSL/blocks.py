# Blocks are per-thread vectors; pointer blocks become vector loads and stores, 16-byte aligned
# where the specialization proves it, masked only at the ragged edge of the block. `scale` is
# test/python/dsl_kernels.py's (the pytest suites run it too).
# RUN: %python -m epic.dsl %S/../python/dsl_kernels.py scale --arg x_ptr='*f32' --arg y_ptr='*f32' --arg n=i32 \
# RUN:     --arg factor=f32 --arg BLOCK=1024 | epic-opt | FileCheck %s
# RUN: %python -m epic.dsl %S/../python/dsl_kernels.py scale --arg x_ptr='*f32' --arg y_ptr='*f32' --arg n=i32 \
# RUN:     --arg factor=f32 --arg BLOCK=64 | FileCheck %s --check-prefix=SMALL
# RUN: %python -m epic.dsl %s shifted --arg x_ptr='*bf16' --arg y_ptr='*bf16' --arg start=i32 \
# RUN:     --arg BLOCK=1024 | FileCheck %s --check-prefix=UNALIGNED
# RUN: %python -m epic.dsl %s shifted --arg x_ptr='*bf16' --arg y_ptr='*bf16' \
# RUN:     --arg start=i32=32 --arg BLOCK=1024 | FileCheck %s --check-prefix=MULTIPLE
# RUN: %python -m epic.dsl %S/../python/dsl_kernels.py scale --arg x_ptr='*f32' --arg y_ptr='*f32' --arg n=i32 \
# RUN:     --arg factor=f32 --arg BLOCK=1024 --emit ptx | FileCheck %s --check-prefix=PTX

import epic
import epic.language as el


@epic.jit
def shifted(x_ptr, y_ptr, start, BLOCK: el.constexpr):
    offsets = start + el.arange(0, BLOCK)
    el.store(y_ptr + offsets, el.load(x_ptr + offsets))

# 1024 elements over 128 threads: 8 contiguous elements per thread.
# CHECK-LABEL: gpu.func @scale(
# CHECK-SAME:      %[[DEV:.*]]: !comm.dev_comm, %[[X:.*]]: !llvm.ptr<1>, %[[Y:.*]]: !llvm.ptr<1>, %[[N:.*]]: i32, %[[F:.*]]: f32) kernel
# CHECK:         %[[TID:.*]] = gpu.thread_id x
# CHECK:         %[[LANES:.*]] = arith.constant dense<[0, 1, 2, 3, 4, 5, 6, 7]> : vector<8xi32>
# CHECK:         %[[NS:.*]] = vector.broadcast %[[N]] : i32 to vector<8xi32>
# CHECK:         %[[MASK:.*]] = arith.cmpi slt, %{{.*}}, %[[NS]] : vector<8xi32>
# CHECK:         %[[XB:.*]] = llvm.getelementptr %[[X]]
# CHECK:         %[[XS:.*]] = llvm.getelementptr %[[XB]]
# CHECK:         %[[ALL:.*]] = vector.reduction <and>, %[[MASK]] : vector<8xi1> into i1
# CHECK:         %[[V:.*]] = scf.if %[[ALL]] -> (vector<8xf32>) {
# CHECK:           %[[W:.*]] = llvm.load %[[XS]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xf32>
# CHECK:           scf.yield %[[W]]
# CHECK:         } else {
# CHECK:           %[[M:.*]] = llvm.intr.masked.load %[[XS]], %[[MASK]], %{{.*}} {alignment = 4 : i32}
# CHECK:           scf.yield %[[M]]
# CHECK:         }
# CHECK:         %[[FS:.*]] = vector.broadcast %[[F]] : f32 to vector<8xf32>
# CHECK:         %[[P:.*]] = arith.mulf %[[V]], %[[FS]] : vector<8xf32>
# CHECK:         scf.if
# CHECK:           llvm.store %[[P]], %{{.*}} {alignment = 16 : i64}
# CHECK:         } else {
# CHECK:           llvm.intr.masked.store %[[P]], %{{.*}}, %[[MASK]] {alignment = 4 : i32}
# CHECK:         gpu.return

# Fewer elements than threads: one element per thread, the threads past the block masked off.
# SMALL-LABEL: gpu.func @scale(
# SMALL:         %[[INSIDE:.*]] = arith.cmpi slt, %{{.*}}, %{{.*}} : i32
# SMALL-NOT:     scf.if
# SMALL:         llvm.intr.masked.load {{.*}} vector<1xf32>

# An offset of unknown divisibility: element-aligned (LLVM splits the access).
# UNALIGNED-LABEL: gpu.func @shifted(
# UNALIGNED:         llvm.load %{{.*}} {alignment = 2 : i64} : !llvm.ptr<1> -> vector<8xbf16>
# A multiple of 16 (Triton's specialization): 16-byte accesses.
# MULTIPLE-LABEL: gpu.func @shifted(
# MULTIPLE:         llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
# MULTIPLE:         llvm.store %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>

# PTX-LABEL: .entry scale(
# PTX:         ld.global.v4.b32
# PTX:         st.global.v4.b32
