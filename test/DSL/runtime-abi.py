# abi=runtime: what the runtime launches on an ElasticBuffer. Arguments come from the rank's
# 128-byte record of the by-value parameter table (comm.param_table, comm.rank_params), the
# window is the buffer's, and a launch function carries the metadata the runtime reads (like
# convert-ep-to-comm's entry functions).
# RUN: env EPIC_CACHE_DIR=%t %python -m epic.dsl %s copy_rows --arg src='*bf16' --arg dst='*bf16' \
# RUN:     --arg rows=i32 --arg win=window --arg H=7168 --arg BH=1024 --abi runtime --ranks 4 \
# RUN:     | epic-opt | FileCheck %s

import epic
import epic.language as el


@epic.jit
def copy_rows(src, dst, rows, win, H: el.constexpr, BH: el.constexpr):
    for r in range(el.program_id(0), rows, el.num_programs(0)):
        for h in range(0, H, BH):
            offsets = h + el.arange(0, BH)
            el.store(dst + r * H + offsets, el.load(src + r * H + offsets))
    el.barrier()

# CHECK-LABEL: gpu.func @copy_rows(
# CHECK-SAME:      %[[DEV:.*]]: !comm.dev_comm, %[[WIN:.*]]: !comm.window, %[[TABLE:.*]]: !llvm.ptr) kernel
# CHECK-SAME:      comm.param_table = #comm.param_table<arg = 2, stride = 128, ranks = 4>
# CHECK:         %[[RECORD:.*]] = comm.rank_params %[[TABLE]] stride 128 via %[[DEV]] : !llvm.ptr
# CHECK:         %[[F0:.*]] = llvm.getelementptr %[[RECORD]][0]
# CHECK:         %[[SRC:.*]] = llvm.load %[[F0]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
# CHECK:         %[[F1:.*]] = llvm.getelementptr %[[RECORD]][1]
# CHECK:         %[[DST:.*]] = llvm.load %[[F1]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
# CHECK:         %[[F2:.*]] = llvm.getelementptr %[[RECORD]][2]
# CHECK:         %[[ROWS:.*]] = llvm.load %[[F2]] {alignment = 8 : i64} : !llvm.ptr -> i32
# Rows of 7168 bf16 and tensors specialized as 16-byte aligned: 16-byte accesses.
# CHECK:         llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<8xbf16>
# CHECK:         llvm.store %{{.*}} {alignment = 16 : i64} : vector<8xbf16>, !llvm.ptr<1>
# CHECK:         comm.barrier
# CHECK-LABEL: func.func @copy_rows_launch(
# CHECK-SAME:      %[[D:.*]]: !comm.dev_comm, %[[W:.*]]: !comm.window, %[[T:.*]]: !llvm.ptr, %[[BLOCKS:.*]]: index)
# CHECK-SAME:      epic.cooperative = 1 : i64, epic.entry = "dsl", epic.kernels = ["copy_rows"]
# CHECK-SAME:      epic.param_fields = ["src", "dst", "rows"], epic.param_stride = 128 : i64, epic.threads = 128 : i64
# CHECK:         gpu.launch_func @dsl_kernels::@copy_rows blocks in (%[[BLOCKS]], %{{.*}}, %{{.*}}) threads in (%{{.*}}, %{{.*}}, %{{.*}}) args(%[[D]] : !comm.dev_comm, %[[W]] : !comm.window, %[[T]] : !llvm.ptr)
