// The entry function's epic.timeout_ms bounds every device-side wait of its
// kernels (DeepEP's num_gpu_timeout_secs); without it the bound is 100 s.
// RUN: epic-opt %s --split-input-file --convert-ep-to-comm | FileCheck %s

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>

// CHECK-LABEL: gpu.func @short_send(
// CHECK: comm.wait_flag {{.*}} timeout_ms 5000
// CHECK: comm.wait_flag {{.*}} timeout_ms 5000
// CHECK-LABEL: func.func @short(
// CHECK-SAME: epic.timeout_ms = 5000 : i64
func.func @short(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) attributes {epic.timeout_ms = 5000 : i64} {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h : tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}

// -----

#cfg = #ep.config<ranks = 4, experts = 16, topk = 4, hidden = 256, dtype = bf16,
                  max_tokens_per_rank = 64>
// The op's default bound (100 s) is not printed.
// CHECK-LABEL: gpu.func @default_send(
// CHECK: comm.wait_flag {{.*}} scope sys : !llvm.ptr<1>, i64
// CHECK-LABEL: func.func @default(
// CHECK-SAME: epic.timeout_ms = 100000 : i64
func.func @default(%x: tensor<?x256xbf16>, %idx: tensor<?x4xi64>)
    -> (tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>) {
  %rx, %ri, %h = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #cfg
      : tensor<?x256xbf16> -> tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
  return %rx, %ri, %h : tensor<?x256xbf16>, tensor<?x4xi64>, !ep.handle<#cfg>
}
