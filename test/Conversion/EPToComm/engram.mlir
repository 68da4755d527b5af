// ep.engram_fetch: one kernel, a warp per fetched row. The row's id is split
// into owner and entry; a valid id reads the entry from the owner's table at
// entry x align(row bytes, 32) of the owner's table (the record's own_table
// for the own table, the owner's NVLink pointer at table_offset otherwise),
// anything else writes zeros.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 4, experts = 4, topk = 1, hidden = 200, dtype = bf16>

// CHECK-LABEL: gpu.module @ep_kernels
// CHECK: gpu.func @fetch_fetch(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window, %{{.*}}: !llvm.ptr) kernel
// CHECK-SAME: comm.param_table = #comm.param_table<arg = 2, stride = 64, ranks = 4>
// The record's fields by offset: the ids (0), the output (40), the own table (32), N_e (16) ...
// CHECK: %[[IDS_AT:.*]] = llvm.getelementptr %{{.*}}[%c0_i64]
// CHECK: %[[IDS:.*]] = llvm.load %[[IDS_AT]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK: %[[OUT_AT:.*]] = llvm.getelementptr %{{.*}}[%c40_i64]
// CHECK: %[[OUT:.*]] = llvm.load %[[OUT_AT]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK: %[[OWN_AT:.*]] = llvm.getelementptr %{{.*}}[%c32_i64]
// CHECK: %[[OWN:.*]] = llvm.load %[[OWN_AT]] {alignment = 8 : i64} : !llvm.ptr -> !llvm.ptr<1>
// CHECK: %[[ENTRIES_AT:.*]] = llvm.getelementptr %{{.*}}[%c16_i64]
// CHECK: %[[ENTRIES:.*]] = llvm.load %[[ENTRIES_AT]] {alignment = 8 : i64} : !llvm.ptr -> i32
// ... and the table offset (24), all 64 bits of it.
// CHECK: %[[OFFSET_AT:.*]] = llvm.getelementptr %{{.*}}[%c24_i64]
// CHECK: %[[OFFSET:.*]] = llvm.load %[[OFFSET_AT]] {alignment = 8 : i64} : !llvm.ptr -> i64
// A warp per row, up to num_rows (field 1).
// CHECK: scf.for %[[ROW:.*]] = %{{.*}} to %{{.*}} step
// CHECK: %[[ID_AT:.*]] = llvm.getelementptr %[[IDS]]
// CHECK: %[[ID:.*]] = llvm.load %[[ID_AT]] {alignment = 4 : i64} : !llvm.ptr<1> -> i32
// CHECK: %[[OWNER:.*]] = arith.divui %[[ID]], %{{.*}} : i32
// CHECK: arith.cmpi ne, %[[ENTRIES]], %c0_i32
// CHECK: arith.cmpi ult, %[[OWNER]], %c4_i32
// Output rows are dense: 200 x 2 = 400 bytes apart.
// CHECK: %[[DST_AT:.*]] = arith.muli %{{.*}}, %c400_i64
// CHECK: %[[DST:.*]] = llvm.getelementptr %[[OUT]][%[[DST_AT]]]
// CHECK: scf.if
// Table entries are 32-byte aligned: 416 bytes apart; the own table through
// the record's pointer, another rank's at the table offset of its window.
// CHECK: %[[IN_TABLE:.*]] = arith.muli %{{.*}}, %c416_i64
// CHECK: arith.cmpi eq, %[[OWNER]], %{{.*}} : i32
// CHECK: llvm.getelementptr %[[OWN]][%[[IN_TABLE]]]
// CHECK: %[[AT:.*]] = arith.addi %[[OFFSET]], %[[IN_TABLE]] : i64
// CHECK: comm.peer_ptr %{{.*}}[%[[AT]]], %{{.*}}, %[[OWNER]]
// The 25 16-byte chunks of the row, loaded and stored.
// CHECK: scf.for %{{.*}} = %{{.*}} to %c25_i32
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: llvm.getelementptr %[[DST]]
// CHECK-NEXT: llvm.store %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK: } else {
// An invalid id: zeros.
// CHECK: llvm.store %cst{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// The launch: not cooperative, the record's fields by name.
// CHECK: func.func @fetch(%{{.*}}: !comm.dev_comm, %{{.*}}: !comm.window, %{{.*}}: !llvm.ptr, %{{.*}}: index)
// CHECK-SAME: epic.cooperative = 0 : i64, epic.entry = "engram_fetch", epic.kernels = ["fetch_fetch"]
// CHECK-SAME: epic.param_fields = ["indices", "num_rows", "entries_per_rank", "table_offset", "own_table", "out"]
// CHECK-SAME: epic.window_bytes = 0 : i64
func.func @fetch(%ids: tensor<?x?xi32>) -> tensor<?x?xbf16> {
  %rows = ep.engram_fetch %ids config #cfg : tensor<?x?xi32> -> tensor<?x?xbf16>
  return %rows : tensor<?x?xbf16>
}
