// RUN: epic-opt %s --split-input-file --canonicalize | FileCheck %s

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>

// A +0.0 bias changes no bit of the combine (the sum starts at +0.0): dropped.
// CHECK-LABEL: func.func @drop_positive_zero_bias
// CHECK-SAME: (%[[Y:.*]]: tensor<?x128xbf16>, %[[H:.*]]: !ep.handle<#{{.*}}>, %[[B:.*]]: tensor<16x128xbf16>)
func.func @drop_positive_zero_bias(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>,
                                   %b: tensor<16x128xbf16>) -> tensor<16x128xbf16> {
  %zero = arith.constant dense<0.0> : tensor<16x128xbf16>
  // CHECK-NOT: arith.constant
  // CHECK: %[[OUT:.*]] = ep.combine %[[Y]], %[[H]] bias(%[[B]] : tensor<16x128xbf16>)
  %out = ep.combine %y, %h bias(%zero, %b : tensor<16x128xbf16>, tensor<16x128xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<16x128xbf16>
  // CHECK: return %[[OUT]]
  return %out : tensor<16x128xbf16>
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>

// CHECK-LABEL: func.func @drop_both_zero_biases
func.func @drop_both_zero_biases(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>) -> tensor<16x128xbf16> {
  %zero = arith.constant dense<0.0> : tensor<16x128xbf16>
  // CHECK: ep.combine %{{.*}}, %{{.*}} : tensor<?x128xbf16>
  // CHECK-NOT: bias
  %out = ep.combine %y, %h bias(%zero, %zero : tensor<16x128xbf16>, tensor<16x128xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<16x128xbf16>
  return %out : tensor<16x128xbf16>
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>

// -0.0 is kept: +0.0 + -0.0 = +0.0, so it would change the sign of zero rows.
// Other constants are real biases.
// CHECK-LABEL: func.func @keep_other_biases
func.func @keep_other_biases(%y: tensor<?x128xbf16>, %h: !ep.handle<#c>) -> tensor<16x128xbf16> {
  // CHECK-DAG: %[[NEG:.*]] = arith.constant dense<-0.000000e+00>
  // CHECK-DAG: %[[ONE:.*]] = arith.constant dense<1.000000e+00>
  %neg = arith.constant dense<-0.0> : tensor<16x128xbf16>
  %one = arith.constant dense<1.0> : tensor<16x128xbf16>
  // CHECK: ep.combine %{{.*}}, %{{.*}} bias(%[[NEG]], %[[ONE]] :
  %out = ep.combine %y, %h bias(%neg, %one : tensor<16x128xbf16>, tensor<16x128xbf16>)
      : tensor<?x128xbf16>, !ep.handle<#c> -> tensor<16x128xbf16>
  return %out : tensor<16x128xbf16>
}

// -----

#c = #ep.config<ranks = 8, experts = 64, topk = 4, hidden = 128, dtype = bf16, max_tokens_per_rank = 64>

// Dispatch has effects (it is a collective): unused results do not erase it.
// The layout computation is pure: unused, it goes.
// CHECK-LABEL: func.func @dce
func.func @dce(%x: tensor<?x128xbf16>, %idx: tensor<?x4xi64>) {
  // CHECK-NOT: ep.dispatch_layout
  %r, %e, %in = ep.dispatch_layout %idx config #c
      : tensor<?x4xi64> -> tensor<8xi32>, tensor<64xi32>, tensor<?x8xi1>
  // CHECK: ep.dispatch
  %rx, %ri, %hh = ep.dispatch %x topk(%idx : tensor<?x4xi64>) config #c
      : tensor<?x128xbf16> -> tensor<?x128xbf16>, tensor<?x4xi64>, !ep.handle<#c>
  return
}
