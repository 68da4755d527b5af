# Calls between @epic.jit functions are inlined where they are made: a value, a tuple, a
# constexpr parameter, a helper calling a helper (test/python/dsl_kernels.py's split_doubled);
# the example's copy_row keeps its four loads ahead of the stores; recursion, an early return
# and a wrong call fail with the line (dsl_kernels.py's; the pytest suites check which).
# RUN: %python -m epic.dsl %S/../python/dsl_kernels.py split_doubled --arg x_ptr='*f32' \
# RUN:     --arg lo_ptr='*f32' --arg hi_ptr='*f32' --arg n=i32 --arg limit=f32 --arg BLOCK=256 \
# RUN:     | epic-opt | FileCheck %s
# RUN: %python -m epic.dsl %S/../../examples/dsl/dispatch_combine.py dispatch_copy --arg win=window \
# RUN:     --arg recv_x='*bf16' --arg recv_meta='*i32' --arg recv_idx='*i64' --arg recv_w='*f32' \
# RUN:     --arg count_out='*i32' --arg H=7168 --arg K=8 --arg BK=8 --arg BM=16 --arg BH=2048 \
# RUN:     --arg ROWS=16 --arg META=4096 --arg LOCAL=8192 --arg WEIGHTS=12288 --num-warps 8 \
# RUN:     --emit ptx | FileCheck %s --check-prefix=COPY
# RUN: not %python -m epic.dsl %S/../python/dsl_kernels.py calls_countdown --arg x_ptr='*i32' \
# RUN:     --arg n=i32 2>&1 | FileCheck %s --check-prefix=RECURSION
# RUN: not %python -m epic.dsl %S/../python/dsl_kernels.py calls_returns_early --arg x_ptr='*i32' \
# RUN:     2>&1 | FileCheck %s --check-prefix=EARLY
# RUN: not %python -m epic.dsl %S/../python/dsl_kernels.py calls_with_too_many --arg x_ptr='*i32' \
# RUN:     2>&1 | FileCheck %s --check-prefix=ARGS

# One kernel, no calls left: load_part's masked load, twice's multiply, split_at's two halves.
# CHECK-LABEL: gpu.func @split_doubled(
# CHECK-NOT:     func.call
# CHECK:         %[[X:.*]] = scf.if %{{.*}} -> (vector<2xf32>) {
# CHECK:         %[[D:.*]] = arith.mulf %[[X]], %{{.*}} : vector<2xf32>
# CHECK:         %[[BELOW:.*]] = arith.cmpf olt, %[[D]], %{{.*}} : vector<2xf32>
# CHECK:         %[[LO:.*]] = arith.select %[[BELOW]], %[[D]], %{{.*}} : vector<2xi1>, vector<2xf32>
# CHECK:         %[[HI:.*]] = arith.select %[[BELOW]], %{{.*}}, %[[D]] : vector<2xi1>, vector<2xf32>
# CHECK:         llvm.store %[[LO]], %{{.*}} {alignment = 8 : i64}
# CHECK:         llvm.store %[[HI]], %{{.*}} {alignment = 8 : i64}
# CHECK:         gpu.return
# CHECK-NOT:   gpu.func

# copy_row inlined: four 16-byte loads per thread in flight before the first store.
# COPY-LABEL: .entry dispatch_copy(
# COPY-NOT:     st.global.v4
# COPY:         ld.global.v4.b32
# COPY-NOT:     st.global.v4
# COPY:         ld.global.v4.b32
# COPY-NOT:     st.global.v4
# COPY:         ld.global.v4.b32
# COPY-NOT:     st.global.v4
# COPY:         ld.global.v4.b32
# COPY:         st.global.v4.b32

# RECURSION: error: {{.*}}dsl_kernels.py:{{[0-9]+}}: recursive call of countdown (calls_countdown -> countdown -> countdown): calls of @epic.jit functions are inlined
# RECURSION-NEXT: in countdown, called at {{.*}}dsl_kernels.py:{{[0-9]+}}
# EARLY: error: {{.*}}dsl_kernels.py:{{[0-9]+}}: returns_early: a return inside a loop or a branch (or before the end) of an @epic.jit function called from a kernel is not supported
# ARGS: error: {{.*}}dsl_kernels.py:{{[0-9]+}}: twice(x): too many positional arguments
