// A launch function's metadata is checked against LaunchMetadata.def when it is compiled (not
// when the runtime loads it on a GPU): an epic.* attribute that is no launch field, one of the
// wrong kind, and a required field missing are refused naming the attribute.
// RUN: split-file %s %t
// RUN: not epic-compile %t/unknown.mlir --no-cubin -o %t/out 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not epic-compile %t/kind.mlir --no-cubin -o %t/out 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not epic-compile %t/flag.mlir --no-cubin -o %t/out 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not epic-compile %t/maps.mlir --no-cubin -o %t/out 2>&1 | FileCheck %s --check-prefix=MAPS
// RUN: not epic-compile %t/missing.mlir --no-cubin -o %t/out 2>&1 | FileCheck %s --check-prefix=MISSING

// UNKNOWN: unknown.mlir:{{[0-9]+}}:{{[0-9]+}}: error: 'epic.thread' is not a launch attribute (LaunchMetadata.def names the fields the runtime reads)
// KIND: kind.mlir:{{[0-9]+}}:{{[0-9]+}}: error: launch attribute 'epic.param_fields' must be a list of strings, not ["x", 1]
// FLAG: flag.mlir:{{[0-9]+}}:{{[0-9]+}}: error: launch attribute 'epic.cooperative' must be 0 or 1, not 2 : i64
// MAPS: maps.mlir:{{[0-9]+}}:{{[0-9]+}}: error: launch attribute 'epic.tensor_maps' must be a list of tensor maps
// MISSING: missing.mlir:{{[0-9]+}}:{{[0-9]+}}: error: the launch function lacks 'epic.param_stride', a field every entry's metadata has

//--- unknown.mlir
func.func @launch() attributes {epic.entry = "dsl", epic.kernels = ["k"], epic.thread = 128 : i64,
    epic.threads = 128 : i64, epic.param_fields = ["x"], epic.param_stride = 64 : i64,
    epic.window_bytes = 0 : i64, epic.max_blocks_per_rank = 8 : i64, epic.cooperative = 1 : i64} {
  return
}
//--- kind.mlir
func.func @launch() attributes {epic.entry = "dsl", epic.kernels = ["k"],
    epic.threads = 128 : i64, epic.param_fields = ["x", 1], epic.param_stride = 64 : i64,
    epic.window_bytes = 0 : i64, epic.max_blocks_per_rank = 8 : i64, epic.cooperative = 1 : i64} {
  return
}
//--- flag.mlir
func.func @launch() attributes {epic.entry = "dsl", epic.kernels = ["k"],
    epic.threads = 128 : i64, epic.param_fields = ["x"], epic.param_stride = 64 : i64,
    epic.window_bytes = 0 : i64, epic.max_blocks_per_rank = 8 : i64, epic.cooperative = 2 : i64} {
  return
}
//--- maps.mlir
// A map without its swizzle.
func.func @launch() attributes {epic.entry = "dsl", epic.kernels = ["k"],
    epic.threads = 128 : i64, epic.param_fields = ["x"], epic.param_stride = 256 : i64,
    epic.window_bytes = 0 : i64, epic.max_blocks_per_rank = 8 : i64, epic.cooperative = 0 : i64,
    epic.tensor_maps = [{field = "x", offset = 64 : i64, rows = "n", cols = 64 : i64,
                         elem_bytes = 2 : i64, box_rows = 64 : i64, box_cols = 64 : i64}]} {
  return
}
//--- missing.mlir
func.func @launch() attributes {epic.entry = "dsl", epic.kernels = ["k"],
    epic.threads = 128 : i64, epic.param_fields = ["x"],
    epic.window_bytes = 0 : i64, epic.max_blocks_per_rank = 8 : i64, epic.cooperative = 1 : i64} {
  return
}
