// epic-run programs run ep-fuse-moe-layer first: the FP8 layer written as five
// ops on one handle, in a function with ep.fusion = "always", becomes one
// moe_layer step (its inputs mapped to the program's values, I = 256), and
// the runtime asks for the one persistent kernel. Where the program reads an
// intermediate value (the SwiGLU's scales are printed), the layer stays five
// steps, and so it does without the attribute (mode=auto fuses no layer yet).
// RUN: epic-compile %S/../../examples/run/fp8_moe_layer_fused.mlir --run-plan -o - \
// RUN:   | FileCheck %s
// RUN: rm -rf %t.cache && epic-run %S/../../examples/run/fp8_moe_layer_fused.mlir \
// RUN:   --compile-only --cache-dir=%t.cache | FileCheck %s --check-prefix=KERNELS
// RUN: epic-compile %S/../../examples/run/fp8_moe_layer.mlir --run-plan -o - \
// RUN:   | FileCheck %s --check-prefix=READ
// RUN: sed 's/ attributes {ep.fusion = "always"}//' \
// RUN:   %S/../../examples/run/fp8_moe_layer_fused.mlir > %t.auto.mlir
// RUN: epic-compile %t.auto.mlir --run-plan -o - | FileCheck %s --check-prefix=READ

// CHECK: "op": "routing",
// CHECK-NEXT: "result": [[IDX:[0-9]+]],
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[W:[0-9]+]],
// CHECK: "op": "constant",
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[WGU:[0-9]+]],
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[SGU:[0-9]+]],
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[WD:[0-9]+]],
// CHECK: "op": "random",
// CHECK-NEXT: "result": [[SD:[0-9]+]],
// CHECK: "combined_x": [[OUT:[0-9]+]],
// CHECK-NEXT: "down_scales": [[SD]],
// CHECK-NEXT: "down_weights": [[WD]],
// CHECK-NEXT: "gate_up_scales": [[SGU]],
// CHECK-NEXT: "gate_up_weights": [[WGU]],
// CHECK-NEXT: "loc": "{{.*}}fp8_moe_layer_fused.mlir:{{[0-9]+}}:{{[0-9]+}}",
// CHECK-NEXT: "n": 256,
// CHECK-NEXT: "op": "moe_layer",
// CHECK: "topk_idx": [[IDX]],
// CHECK-NEXT: "topk_weights": [[W]],
// CHECK-NOT: "op": "dispatch",
// CHECK-NOT: "op": "grouped_gemm",
// CHECK-NOT: "op": "swiglu",
// CHECK-NOT: "op": "combine",
// CHECK: "value": [[OUT]],

// KERNELS: kernels of ep.moe_layer at {{.*}}fp8_moe_layer_fused.mlir:{{[0-9]+}}:{{[0-9]+}}: compiled
// KERNELS-NOT: kernels of

// READ-NOT: "op": "moe_layer",
// READ: "op": "dispatch",
// READ: "op": "grouped_gemm",
// READ: "op": "swiglu",
// READ: "op": "grouped_gemm",
// READ: "op": "combine",
// READ-NOT: "op": "moe_layer",
