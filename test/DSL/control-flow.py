# Python control flow in kernels: `for range` -> scf.for carrying what the body reassigns,
# `while` -> scf.while, `if` on a scalar -> scf.if, el.static_range unrolled; reductions go
# through the thread, the warp (shuffles) and shared memory.
# RUN: %python -m epic.dsl %s loops --arg x_ptr='*f32' --arg out_ptr='*f32' --arg n=i32 \
# RUN:     --arg limit=f32 --arg BLOCK=512 | epic-opt | FileCheck %s
# RUN: %python -m epic.dsl %s offsets --arg counts='*i32' --arg out='*i32' --arg BLOCK=256 \
# RUN:     | epic-opt | FileCheck %s --check-prefix=SCAN

import epic
import epic.language as el


@epic.jit
def loops(x_ptr, out_ptr, n, limit, BLOCK: el.constexpr):
    acc = el.zeros((BLOCK,), el.float32)
    for i in range(0, n, BLOCK):
        offsets = i + el.arange(0, BLOCK)
        acc += el.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    total = el.sum(acc)
    steps = 0
    while total > limit:
        total = total / 2.0
        steps += 1
    if el.program_id(0) == 0:
        el.store(out_ptr, steps)
    for j in el.static_range(2):
        el.store(out_ptr + 1 + j, total)


@epic.jit
def offsets(counts, out, BLOCK: el.constexpr):
    c = el.load(counts + el.arange(0, BLOCK))
    el.store(out + el.arange(0, BLOCK), el.cumsum(c) - c)

# CHECK-LABEL: gpu.func @loops(
# CHECK-SAME:      %{{.*}}: !comm.dev_comm, %[[X:.*]]: !llvm.ptr<1>, %[[OUT:.*]]: !llvm.ptr<1>, %[[N:.*]]: i32, %[[LIMIT:.*]]: f32)
# CHECK:         %[[ZERO:.*]] = vector.broadcast %{{.*}} : f32 to vector<4xf32>
# CHECK:         %[[ACC:.*]] = scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[A:.*]] = %[[ZERO]]) -> (vector<4xf32>) {
# CHECK:           %[[V:.*]] = scf.if
# CHECK:           %[[NEXT:.*]] = arith.addf %[[A]], %[[V]] : vector<4xf32>
# CHECK:           scf.yield %[[NEXT]] : vector<4xf32>
# CHECK:         %[[PART:.*]] = vector.reduction <add>, %[[ACC]] : vector<4xf32> into f32
# CHECK-COUNT-5: gpu.shuffle  xor
# CHECK:         memref.store %{{.*}}, %{{.*}}[%{{.*}}] : memref<4xf32, #gpu.address_space<workgroup>>
# CHECK:         gpu.barrier
# CHECK:         %[[LOOP:.*]]:2 = scf.while (%[[T:.*]] = %{{.*}}, %[[S:.*]] = %{{.*}}) : (f32, i32) -> (f32, i32) {
# CHECK:           %[[GT:.*]] = arith.cmpf ogt, %[[T]], %[[LIMIT]] : f32
# CHECK:           scf.condition(%[[GT]]) %[[T]], %[[S]] : f32, i32
# CHECK:         } do {
# CHECK:           arith.divf
# CHECK:           arith.addi
# CHECK:           scf.yield
# CHECK:         scf.if
# CHECK:           %[[STEPS:.*]] = arith.sitofp %[[LOOP]]#1 : i32 to f32
# CHECK:           llvm.store %[[STEPS]], %[[OUT]]
# CHECK-COUNT-2: llvm.store %[[LOOP]]#0

# 256 elements over 128 threads: 2 per thread, scanned in the thread, then across the warp
# (shuffle up; the lanes below the offset add nothing), then the earlier warps' totals.
# SCAN-LABEL: gpu.func @offsets(
# SCAN:         %[[E0:.*]] = vector.extract %[[C:.*]][0] : i32 from vector<2xi32>
# SCAN:         %[[E1:.*]] = vector.extract %[[C]][1] : i32 from vector<2xi32>
# SCAN:         %[[R1:.*]] = arith.addi %[[E0]], %[[E1]] : i32
# SCAN:         %[[UP:.*]], %[[VALID:.*]] = gpu.shuffle  up %[[R1]]
# SCAN:         arith.select %[[VALID]], %[[UP]]
# SCAN-COUNT-5: gpu.shuffle  up
# SCAN:         memref.store %{{.*}} : memref<4xi32, #gpu.address_space<workgroup>>
# SCAN:         gpu.barrier
# SCAN-COUNT-3: memref.load
# SCAN:         gpu.barrier
# SCAN:         vector.insert
